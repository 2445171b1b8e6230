"""Where the package makes its background threads and their locks.

Two rooms run a daemon thread per process: watchdog.py (lease renewal) and
late_replies.py (replies owed after a round returned). Both create their thread and the
condition it sleeps on here, so the choice is made once: real OS threads on
original locks (unpatched.py), also under gevent or eventlet, so that a greenlet
computing without yielding cannot starve a renewal.

Such a thread must not touch what belongs to the hub: green locks (eventlet hangs
when an OS thread takes one), logging handlers (their locks are green), Celery
signals, user callbacks. It hands those to the hub with ``in_hub``: under gevent
through the hub loop's ``run_callback_threadsafe``, under eventlet through a pipe a
green thread of the hub waits on; with no hub (prefork, threads, solo) it calls at once.

Imports only unpatched.py from the package.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections import deque
from typing import Any, Callable, Optional

from . import unpatched

__all__ = ["Condition", "in_hub", "new_condition", "new_lock", "new_rlock", "start_daemon_thread"]

#: OS thread ident -> the hand-over to the hub that started it (None: no hub).
_hand_overs: dict[int, Optional[Callable[[Callable[[], Any]], None]]] = {}

#: Hub thread ident -> its hand-over (made once per hub: one pipe under eventlet).
_hub_hand_overs: dict[int, Optional[Callable[[Callable[[], Any]], None]]] = {}


def _forget_after_fork() -> None:
    # A child's threads are its own (an ident may be reused), and so is its hub.
    _hand_overs.clear()
    _hub_hand_overs.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


class Condition:
    """A condition variable on original locks: an OS thread waits on it without a hub."""

    def __init__(self) -> None:
        self._lock = unpatched.allocate_lock()
        self._waiters: deque[Any] = deque()

    def __enter__(self) -> bool:
        return self._lock.__enter__()  # type: ignore[no-any-return]

    def __exit__(self, *exc_info: object) -> None:
        self._lock.release()

    def wait(self, timeout: Optional[float] = None) -> None:
        """Release the lock, sleep until notified or ``timeout`` passed, take it again."""
        waiter = unpatched.allocate_lock()
        waiter.acquire()
        self._waiters.append(waiter)
        self._lock.release()
        try:
            waiter.acquire(True, -1 if timeout is None else max(timeout, 0.0))
        finally:
            self._lock.acquire()
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)

    def notify(self) -> None:
        if self._waiters:
            self._waiters.popleft().release()


def new_condition() -> Condition:
    """A condition for a background thread to sleep on."""
    return Condition()


def new_lock() -> Any:
    """A lock shared with a background thread (an original one)."""
    return unpatched.allocate_lock()


def new_rlock() -> Any:
    """A reentrant lock a background thread may take (an original one)."""
    return unpatched.new_rlock()


def start_daemon_thread(target: Callable[[], None], name: str) -> None:
    """Start ``target`` on a daemon thread called ``name``: a real OS thread.

    Under a hub, what the new thread hands back (``in_hub``) goes to the hub of the
    thread that started it; started by one of ours (a round in the watchdog starting
    the finisher), to that one's hub.
    """
    kind = unpatched.hub_kind()
    if not kind:
        threading.Thread(target=target, name=name, daemon=True).start()
        return
    starter = unpatched.get_ident()
    if starter in _hand_overs:  # a round in one of ours started the other: same hub
        hand_over = _hand_overs[starter]
    else:
        if starter not in _hub_hand_overs:
            _hub_hand_overs[starter] = _hand_over_for(kind)
        hand_over = _hub_hand_overs[starter]
    registered = unpatched.allocate_lock()
    registered.acquire()

    def run() -> None:
        with registered:  # registered before it can ask for the hub
            pass
        target()

    _hand_overs[unpatched.start_new_thread(run)] = hand_over
    registered.release()


def in_hub(call: Callable[[], Any]) -> None:
    """Run ``call`` on the hub if this is one of our OS threads under a hub, else now."""
    hand_over = _hand_overs.get(unpatched.get_ident()) if _hand_overs else None
    if hand_over is None:
        call()
    else:
        hand_over(call)


def _hand_over_for(kind: str) -> Optional[Callable[[Callable[[], Any]], None]]:
    if kind == "gevent":
        loop = sys.modules["gevent.hub"].get_hub().loop
        return lambda call: loop.run_callback_threadsafe(_guarded, call)
    if kind == "eventlet":
        return _eventlet_hand_over()
    return None


def _guarded(call: Callable[[], Any]) -> None:
    try:
        call()
    except Exception:  # a callback's failure must not reach the hub loop
        import logging

        logging.getLogger("celery_redlock.background").exception("background call-back failed")


def _eventlet_hand_over() -> Callable[[Callable[[], Any]], None]:
    eventlet = sys.modules["eventlet"]
    trampoline = sys.modules["eventlet.hubs"].trampoline
    write = unpatched.original("os", "write")
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    calls: deque[Callable[[], Any]] = deque()

    def serve() -> None:  # a green thread of the hub: runs what OS threads hand over
        while True:
            trampoline(read_fd, read=True)
            with contextlib.suppress(BlockingIOError):
                os.read(read_fd, 4096)
            while calls:
                _guarded(calls.popleft())

    eventlet.spawn(serve)

    def hand_over(call: Callable[[], Any]) -> None:
        calls.append(call)
        write(write_fd, b"x")

    return hand_over
