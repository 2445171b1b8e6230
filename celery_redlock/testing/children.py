"""Child processes that die with us, and what /proc says about a process.

Every process the testing package starts (redis-server, ``celery worker``,
``celery beat``) is spawned with :func:`die_with_parent` as its ``preexec_fn``, so
a test run that is SIGKILLed leaves nothing behind. Standard library only.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from typing import Callable, Optional

__all__ = ["die_with_parent", "process_state", "wait_for_state"]

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _load_prctl() -> Optional[Callable[..., int]]:
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return prctl


# Resolved once here: the child between fork and exec must not load libraries.
_prctl = _load_prctl()


def die_with_parent() -> Optional[Callable[[], None]]:
    """A preexec_fn asking Linux to SIGKILL the child when we die, or None elsewhere.

    The kernel sends the signal when the *thread* that spawned the child exits, not
    the process: start children from a thread that lives as long as they do
    (pytest's main thread does)::

        subprocess.Popen(args, preexec_fn=die_with_parent())
    """
    prctl = _prctl
    if prctl is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
        if os.getppid() != parent:  # we died before prctl took hold
            os._exit(1)

    return preexec


def process_state(pid: int) -> Optional[str]:
    """The Linux scheduler state of a process ('R', 'S', 'T' stopped, 'Z' zombie...),
    or None where /proc cannot tell (no such process, or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read()
    except OSError:
        return None
    # "pid (comm) state ...": comm may hold spaces and parentheses.
    return fields[fields.rindex(b")") + 2 :][:1].decode()


#: How long :func:`wait_for_state` waits before it gives up: a hang guard, not a
#: speed claim (a signal is delivered within a scheduler tick or so, even under load).
STATE_WITHIN = 30.0


def wait_for_state(pid: int, stopped: bool, within: float = STATE_WITHIN) -> None:
    """Wait until ``pid`` is stopped, or running again; raise ``TimeoutError`` naming
    the last state seen if it is not so after ``within`` seconds.

    SIGSTOP and SIGCONT are delivered asynchronously; a test that pauses a server
    and then sends a command must not find it still answering. A process that is
    gone (or a system without /proc) ends the wait at once: there is nothing to see.
    """
    give_up = time.monotonic() + within
    while True:
        state = process_state(pid)
        if state is None or (state == "T") == stopped:
            return
        if time.monotonic() >= give_up:
            wanted = "stopped" if stopped else "running again"
            raise TimeoutError(f"process {pid} not {wanted} after {within} s (state {state!r})")
        time.sleep(0.001)
