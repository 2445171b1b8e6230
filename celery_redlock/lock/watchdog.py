"""One renewal thread per process for every lease that asks to be kept alive.

A lease with a short TTL survives long work because the watchdog extends it at about
ttl/3. A renewal that meets only slow or unreachable nodes (a round that timed out
because this thread was descheduled under CPU load, a node restarting) is tried
again every ttl/9 while the lease's validity leaves room for a round; a lease a
majority refused, or that could not be extended in time, is marked lost (its
``on_lost`` callbacks run once: the Celery integration turns that into the
``lock_lost`` signal and an ERROR log line), before its deadline. A lease at its
``max_hold`` bound is no longer extended; when its validity runs out it is marked
lost too, so the holder learns it.

Why one thread, not one per lease: a worker may hold many locks, and threads are
the scarce thing in a prefork child. Why batches: one round per lease does not
scale (1,000 leases at ttl 3 s are 1,000 rounds a second; with nodes 10 ms away they
no longer fit in the interval). When a lease falls due, every lease due within half
its own interval is renewed with it, in one round per lock (renewals.py); each lease
still gets its own outcome, and one found lost is reported alone.

Fork-aware: a child process that asks for the watchdog gets its own thread (threads
do not survive ``fork``) and never renews its parent's leases.

Under gevent or eventlet the thread is still a real OS thread (background.py), and
its rounds use unpatched sockets: a greenlet computing without yielding does not
starve it. While a round runs (at most ``node_timeout``), the leases in it are held
by this thread: a greenlet releasing one of them waits for that round, never for
the batch's other rounds (renewals.py). A
lease it finds lost is marked so at once (``held`` turns False in the task), but
its ``on_lost`` and ``on_extended`` callbacks, and its log lines, are handed to the
hub, so they run when the computing greenlet next yields.

Imports only lease.py, renewals.py and background.py (no Celery, not redlock.py: the
lock imports the watchdog).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import time
from typing import Callable, Optional

from ..wire.background import new_condition, new_lock, start_daemon_thread
from .lease import Lease, next_renewal, renewal_interval
from .renewals import renew

__all__ = ["Watchdog", "get_watchdog"]

# The name the logger had before the package was split into folders: users filter on it.
logger = logging.getLogger("celery_redlock.watchdog")


class Watchdog:
    """Keeps leases alive from one daemon thread."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._queue: list[tuple[float, int, Lease]] = []
        self._watched: dict[int, tuple[Lease, float]] = {}  # id -> (lease, interval)
        self._seq = itertools.count()
        self._cond = new_condition()
        self._started = False
        self._pid = os.getpid()

    def watch(self, lease: Lease, interval: Optional[float] = None) -> None:
        """Renew ``lease`` every ``interval`` seconds (default ttl/3: lease.py's
        ``renewal_interval``) until unwatched."""
        every = renewal_interval(lease.ttl) if interval is None else interval
        due = self._clock() + every
        with self._cond:
            self._watched[id(lease)] = (lease, every)
            earliest = not self._queue or due < self._queue[0][0]
            self._push(lease, due)
            self._ensure_thread()
            if earliest:  # otherwise the thread already wakes in time: let it sleep
                self._cond.notify()

    def unwatch(self, lease: Lease) -> None:
        """Stop renewing ``lease`` (its queue entry is dropped when it comes due)."""
        with self._cond:
            self._unwatch(lease)

    def _unwatch(self, lease: Lease) -> None:
        if self._is_watched(lease):
            del self._watched[id(lease)]
        if len(self._queue) > 2 * len(self._watched) + 64:
            # Released leases wait in the heap until due (ttl/3): at thousands of
            # tasks a second, drop them now rather than keep them alive.
            self._queue = [e for e in self._queue if self._is_watched(e[2])]
            heapq.heapify(self._queue)

    def watching(self, lease: Lease) -> bool:
        with self._cond:
            return self._is_watched(lease)

    def _is_watched(self, lease: Lease) -> bool:
        entry = self._watched.get(id(lease))  # ids are reused: compare the object too
        return entry is not None and entry[0] is lease

    def _push(self, lease: Lease, due: float) -> None:
        heapq.heappush(self._queue, (due, next(self._seq), lease))

    def _ensure_thread(self) -> None:
        if not self._started:  # the thread never ends (a fork gets a new Watchdog)
            self._started = True
            start_daemon_thread(self._run, "celery-redlock-watchdog")

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    now = self._clock()
                    if self._queue and self._queue[0][0] <= now:
                        due = self._take_due(now)
                        if due:
                            break
                        continue  # all unwatched meanwhile
                    wait = self._queue[0][0] - now if self._queue else None
                    self._cond.wait(wait)
            self._renew(due)

    def _take_due(self, now: float) -> list[tuple[Lease, float]]:
        """Take every watched lease due within half its interval from ``now``: they
        are renewed together, in one round per lock (renewals.py). Taken early, a
        lease's next renewal counts from this one, so leases renewed together stay
        together. Called with the condition held."""
        taken: list[tuple[Lease, float]] = []
        seen: set[int] = set()
        queue = self._queue
        while queue:
            due, _, lease = queue[0]
            entry = self._watched.get(id(lease))
            if entry is None or entry[0] is not lease or id(lease) in seen:
                heapq.heappop(queue)  # unwatched meanwhile, or watched twice
                continue
            if due > now + entry[1] / 2:
                break
            heapq.heappop(queue)
            seen.add(id(lease))
            taken.append((lease, entry[1]))
        return taken

    def _renew(self, due: list[tuple[Lease, float]]) -> None:
        live = []
        for lease, every in due:
            if lease.released:
                self.unwatch(lease)
            else:
                live.append((lease, every))
        extended = renew([lease for lease, _ in live])
        for (lease, every), ok in zip(live, extended):
            self._next(lease, every, ok)

    def _next(self, lease: Lease, every: float, extended: bool) -> None:
        """Schedule ``lease``'s next renewal after one that ``extended`` it or not
        (lease.py's ``next_renewal``, the schedule asyncio's keep-alive keeps too)."""
        due = next_renewal(lease, every, extended, self._clock())
        with self._cond:
            if due is None:
                self._unwatch(lease)  # lost (extend marked it) or released meanwhile
            elif id(lease) in self._watched:
                self._push(lease, due)


_watchdog: Optional[Watchdog] = None
_watchdog_lock = new_lock()


def _forget_after_fork() -> None:
    # The parent's thread did not survive the fork, and its lock may have been held.
    global _watchdog, _watchdog_lock
    _watchdog = None
    _watchdog_lock = new_lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def get_watchdog() -> Watchdog:
    """The process's watchdog (a new one after a fork)."""
    global _watchdog
    with _watchdog_lock:
        if _watchdog is None or _watchdog._pid != os.getpid():
            _watchdog = Watchdog()
        return _watchdog
