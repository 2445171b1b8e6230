"""Replies a round stopped waiting for: read them soon, from one thread per process.

A round returns once its outcome is decided, so the slowest nodes' replies are still
owed when the caller moves on. Usually the next round on the same connection reads
them. But a release must also *happen* on those nodes: if a node answers NOSCRIPT
(an operator ran SCRIPT FLUSH), the command has to be sent again as EVAL, and if the
connection was still being set up, the command still has to go out. Left to the
next round, that waits as long as the process stays idle, and the released key
lingers until its TTL, costing the next acquirer that node.

So a pool whose connections still owe replies after a round is ``note``\\ d here, and
one daemon thread sweeps the noted pools ``FINISH_AFTER`` seconds later, then every
``FINISH_AFTER`` while some connection still owes: it reads what arrived, resends
NOSCRIPT as EVAL, moves connection set-up along, and puts the connections back. The
hot path pays a set lookup per round; the thread wakes at most once per period, and
sleeps for good once nothing is owed. What a sweep does to one pool is the pool's
business (``Pool.finish_owed``, node_set.py): this room only schedules.

Fork-aware: a child process gets its own thread and an empty set. The thread is
made by background.py. Imports nothing else from the package.
"""

from __future__ import annotations

import os
from typing import Final, Optional, Protocol

from .background import new_condition, new_lock, start_daemon_thread

__all__ = ["FINISH_AFTER", "Finisher", "Pool", "note"]

#: How long after a round a connection's owed replies are left to the next round on
#: it before the finisher reads them, in seconds; also the sweep period.
FINISH_AFTER: Final = 0.01


class Pool(Protocol):
    def finish_owed(self, older_than: float) -> bool:
        """Read what idle connections owe for longer than ``older_than`` seconds;
        True while some connection still owes replies."""


class Finisher:
    """One daemon thread that sweeps the pools with owed replies."""

    def __init__(self, period: float = FINISH_AFTER) -> None:
        self.period = period
        self._owing: set[Pool] = set()
        self._awake = False  # a sweep is coming: noting costs a set lookup only
        self._cond = new_condition()
        self._started = False

    def note(self, pool: Pool) -> None:
        """``pool`` has connections that owe replies: sweep it soon."""
        if self._awake and pool in self._owing:
            return
        with self._cond:
            self._owing.add(pool)
            if not self._awake:
                self._awake = True
                if not self._started:
                    self._started = True
                    start_daemon_thread(self._run, "celery-redlock-finisher")
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._owing:
                    self._awake = False
                    self._cond.wait()
                # Nobody notifies while awake: this waits the whole period (and
                # sleeps on background.py's condition, not on this module's clock).
                self._cond.wait(self.period)
            self.sweep()

    def sweep(self) -> None:
        """Sweep every noted pool once; keep those that still owe."""
        with self._cond:
            owing, self._owing = self._owing, set()
        still = []
        for pool in owing:
            try:
                if pool.finish_owed(self.period):
                    still.append(pool)
            except Exception:  # never let one pool stop the thread that serves them all
                continue
        if still:
            with self._cond:
                self._owing.update(still)


_finisher: Optional[Finisher] = None
_finisher_lock = new_lock()


def _forget_after_fork() -> None:
    # The parent's thread did not survive the fork, its pools are the parent's, and
    # its lock may have been held.
    global _finisher, _finisher_lock
    _finisher = None
    _finisher_lock = new_lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def note(pool: Pool) -> None:
    """Tell the process's finisher that ``pool`` owes replies."""
    global _finisher
    finisher = _finisher
    if finisher is None:
        with _finisher_lock:
            if _finisher is None:
                _finisher = Finisher()
            finisher = _finisher
    finisher.note(pool)
