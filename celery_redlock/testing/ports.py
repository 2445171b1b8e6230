"""Free loopback ports for servers and proxies, and the URL of a port.

A port handed out stays claimed until released, so two servers spawned before
either has bound are never given the same one. Standard library only.
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Optional
from urllib.parse import quote

__all__ = ["LOOPBACK", "claim_free_port", "claim_port", "redis_url", "release_port"]

#: Every server and proxy listens here, and only here.
LOOPBACK = "127.0.0.1"

_claimed_lock = threading.Lock()
_claimed_ports: set[int] = set()


def claim_free_port() -> int:
    """A loopback port nobody listens on now and no server of ours was given."""
    with _claimed_lock:
        for _ in range(100):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.bind((LOOPBACK, 0))
                port: int = probe.getsockname()[1]
            if port not in _claimed_ports:
                _claimed_ports.add(port)
                return port
    raise RuntimeError("could not find a free loopback port")


def claim_port(port: int) -> bool:
    """Claim this port if nobody listens on it now and no server of ours was given it
    (a Redis Cluster node's bus port, its port + 10000): True when claimed."""
    with _claimed_lock:
        if port in _claimed_ports:
            return False
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((LOOPBACK, port))
            except OSError:
                return False
        _claimed_ports.add(port)
        return True


def release_port(port: int) -> None:
    with _claimed_lock:
        _claimed_ports.discard(port)


def redis_url(port: int, password: Optional[str]) -> str:
    """``redis://127.0.0.1:PORT/0``, with the password when there is one."""
    auth = f":{quote(password, safe='')}@" if password else ""
    return f"redis://{auth}{LOOPBACK}:{port}/0"


def _forget_parents_ports() -> None:
    # A forked child (a prefork worker, say) does not own its parent's ports.
    global _claimed_lock
    _claimed_lock = threading.Lock()
    _claimed_ports.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_parents_ports)
