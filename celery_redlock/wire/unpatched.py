"""The interpreter's own sockets, poll, resolver, TLS and threads, also under gevent or eventlet.

``celery worker -P gevent|eventlet`` monkey-patches the standard library: sockets
and ``select`` become cooperative (eventlet removes ``select.poll`` outright), and
threads become greenlets. A lock round through patched sockets yields to the hub, so
other greenlets stretch it past ``node_timeout`` and healthy nodes look down; a
renewal "thread" that is a greenlet starves while a task computes. So rounds use the
original socket, ``select.poll``, ``getaddrinfo`` and ``ssl.SSLContext`` on purpose
(a round then blocks the hub for at most ``node_timeout``), and the background
threads are real OS threads on original locks.

Originals are found at call time through ``sys.modules`` (whatever was patched
before or after this module was imported) and cached until the patching changes.
This module never imports gevent or eventlet, and imports nothing from the package.

``USE_ORIGINALS = False`` makes rounds use whatever the process has (patched,
cooperative sockets under gevent): kept for measuring the two against each other
(tests/apps/green_rounds.py), not for production.
"""

from __future__ import annotations

import _thread
import select
import socket
import ssl
import sys
from typing import Any, Callable, Final

__all__ = [
    "POLL_READ",
    "POLL_WRITE",
    "USE_ORIGINALS",
    "allocate_lock",
    "get_ident",
    "getaddrinfo",
    "hub_kind",
    "new_rlock",
    "original",
    "poll",
    "socket_class",
    "ssl_context",
    "start_new_thread",
]

#: What a poll over lock connections waits for: bytes to read (or the peer gone), and
#: room to write (a connection being set up, a command written only in part).
POLL_READ: Final = select.POLLIN | select.POLLPRI | select.POLLERR | select.POLLHUP
POLL_WRITE: Final = select.POLLOUT | select.POLLERR | select.POLLHUP

#: False: rounds use the process's (possibly patched) socket and poll. Measurement only.
USE_ORIGINALS = True

_cache: dict[tuple[str, str], Any] = {}
_cache_key: tuple[object, ...] = ()


def hub_kind() -> str:
    """``"gevent"``, ``"eventlet"`` or ``""``: which library patched this process."""
    gevent_monkey = sys.modules.get("gevent.monkey")
    if gevent_monkey is not None and gevent_monkey.is_anything_patched():
        return "gevent"
    patcher = sys.modules.get("eventlet.patcher")
    if patcher is not None and any(
        patcher.is_monkey_patched(name) for name in ("socket", "thread", "select")
    ):
        return "eventlet"
    return ""


def original(module: str, name: str) -> Any:
    """``module.name`` as it was before any monkey-patching."""
    global _cache_key
    # What patching changes: while these stay the same objects, the cache holds.
    key = (socket.socket, _thread.start_new_thread, select.__dict__.get("poll"))
    if key != _cache_key:
        _cache.clear()
        _cache_key = key
    try:
        return _cache[(module, name)]
    except KeyError:
        pass
    value = _lookup(module, name)
    _cache[(module, name)] = value
    return value


def _lookup(module: str, name: str) -> Any:
    kind = hub_kind()
    if kind == "gevent":
        return sys.modules["gevent.monkey"].get_original(module, name)
    if kind == "eventlet":
        return getattr(sys.modules["eventlet.patcher"].original(module), name)
    return getattr(sys.modules[module], name)


def socket_class() -> Callable[..., socket.socket]:
    if not USE_ORIGINALS:
        return socket.socket
    return original("socket", "socket")  # type: ignore[no-any-return]


def getaddrinfo(*args: Any, **kwargs: Any) -> list[Any]:
    resolve = original("socket", "getaddrinfo") if USE_ORIGINALS else socket.getaddrinfo
    return resolve(*args, **kwargs)


def poll() -> Any:
    """A fresh ``select.poll()`` object (the original one)."""
    if not USE_ORIGINALS:
        return select.poll()
    return original("select", "poll")()


def ssl_context() -> ssl.SSLContext:
    """A client TLS context of the original class (like ``ssl.create_default_context()``):
    the sockets it wraps are plain, non-cooperative SSL sockets."""
    cls = original("ssl", "SSLContext") if USE_ORIGINALS else ssl.SSLContext
    context: ssl.SSLContext = cls(ssl.PROTOCOL_TLS_CLIENT)
    context.load_default_certs(ssl.Purpose.SERVER_AUTH)
    if sys.version_info >= (3, 13):  # as create_default_context does there
        context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN | ssl.VERIFY_X509_STRICT
    return context


def start_new_thread(target: Callable[[], None]) -> int:
    """Start ``target`` on a real OS thread; its ident."""
    start = original("_thread", "start_new_thread")
    return start(target, ())  # type: ignore[no-any-return]


def allocate_lock() -> Any:
    """A real (OS) lock: safe to share between a hub's greenlets and an OS thread."""
    return original("_thread", "allocate_lock")()


def new_rlock() -> Any:
    """A real reentrant lock (``_thread.RLock`` is patched by neither library)."""
    return _thread.RLock()


def get_ident() -> int:
    """The OS thread's ident (under gevent, ``threading.get_ident`` is the greenlet's)."""
    return original("_thread", "get_ident")()  # type: ignore[no-any-return]
