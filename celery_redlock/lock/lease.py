"""A lock we won: its state (``LeaseState``), and the ``Lease`` a blocking holder uses.

A lease counts its validity down on the lock's monotonic clock from the moment the
acquire round started; once it reaches zero another client may hold the key. It is
*lost* when it ends without being released (validity ran out, a majority refused an
extension, or no extension could get through in time): its ``on_lost`` callbacks run
once, and ``held`` / ``ensure_held()`` tell the holder. An extension round that only
met slow or unreachable nodes while validity remains does not lose the lease: it
says by when to try again (``retry_by``), and the watchdog does.

``LeaseState`` is everything a lease is without I/O: key, token, fence, validity,
lost or released, its callbacks and the bookkeeping of an extension's outcome. The
rounds belong to the lock that granted the lease, and how they are waited for to
the lease's kind: ``Lease`` (``Redlock``'s) blocks, asking its lock through
``LeaseOwner``; ``AsyncLease`` (``celery_redlock.asyncio``) awaits. Code that reads
a lease of either kind (the rules, ``judge_exit``, the held-lease record) takes a
``LeaseState``.

This module knows no nodes and imports nothing from redlock.py or node_set.py (nor
Celery, nor asyncio).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any, Callable, NamedTuple, Optional, Protocol, TypeVar, Union

from ..errors import LockLost
from ..wire.background import in_hub, new_rlock
from . import validate
from .stored import FIRST_HOLD

__all__ = [
    "Duration",
    "Extension",
    "Lease",
    "LeaseOwner",
    "LeaseState",
    "next_renewal",
    "renewal_interval",
]

# The name the logger had before the package was split into folders: users filter on it.
logger = logging.getLogger("celery_redlock.lease")

Duration = Union[float, int, timedelta]

#: A lease of either kind, as its own callbacks see it.
L = TypeVar("L", bound="LeaseState")


class Extension(NamedTuple):
    """What one extension round achieved."""

    #: The new deadline when a majority extended the lease in time, else None.
    deadline: Optional[float] = None
    #: Why it was not extended (None at ``max_hold``).
    reason: Optional[str] = None
    #: Not extended, but it may still be: try again by then (lock's clock). None
    #: when the lease is lost (a majority refused, or no time left for a round).
    retry_by: Optional[float] = None


def renewal_interval(ttl: float) -> float:
    """How often a kept-alive lease of ``ttl`` seconds is renewed: every ttl/3, so a
    renewal that met only slow nodes still leaves time for more before it runs out."""
    return ttl / 3


def next_renewal(lease: LeaseState, every: float, extended: bool, now: float) -> Optional[float]:
    """When a kept-alive ``lease`` is renewed next (on its lock's clock), after a
    renewal that ``extended`` it or not; None: no more (released, or lost and so
    marked). The schedule both drivers keep (watchdog.py, asyncio's ``keep_alive``):

    - extended: ``every`` seconds on;
    - only slow or unreachable nodes met, validity left (``retry_by``): again after
      every/3, or at ``retry_by`` if that is sooner;
    - at ``max_hold`` (not extended, nothing wrong): no round until validity runs
      out; that renewal then marks it lost ("max_hold reached", extend_replies.py),
      so a holder that has not released learns it."""
    if extended:
        return now + every
    if lease.released or lease.lost_reason is not None:
        return None
    if lease.retry_by is not None:
        return min(now + every / 3, lease.retry_by)
    return max(lease.deadline, now + 0.001)


class LeaseOwner(Protocol):
    """What a lease asks of the lock that granted it."""

    def _extend_lease(self, lease: Lease, ttl: float) -> Extension:
        """One extension round (see ``Extension``); all None at ``max_hold``."""

    def _release_lease(self, lease: Lease) -> bool:
        """Compare-and-delete the lease's key on every node (see ``Lease.release``)."""

    def _owned_lease(self, lease: Lease) -> bool:
        """Whether a quorum of nodes still holds the lease's value (one read round)."""


class LeaseState:
    """A lock we won: key, token, fence and how long it is guaranteed ours; no I/O.

    ``validity`` counts down from the moment the acquire round started; once it
    reaches zero another client may hold the key. ``owner`` is the lock that granted
    it; what the lease asks of it is its subclass's (``Lease``, ``AsyncLease``).
    """

    _owner: object

    def __init__(
        self,
        owner: object,
        clock: Callable[[], float],
        key: str,
        token: str,
        holder: str,
        ttl: float,
        started: float,
        deadline: float,
        fence: Optional[int],
        max_hold: Optional[float],
        *,
        keys: Optional[tuple[str, ...]] = None,
    ) -> None:
        self._owner = owner
        self._clock = clock
        self.key = key
        #: Every key the lease holds, in canonical (sorted) order: ``(key,)`` for a
        #: lease on one key; for one on several (``acquire(["a", "b"])``), ``key`` is
        #: their names joined by ``+``, a name for logs rather than a key on the nodes.
        self.keys = keys or (key,)
        self.token = token
        self.holder = holder
        self.value = f"{token}|{holder}"
        self.ttl = ttl
        self.fence = fence
        self.acquired_at = started
        self.extensions = 0
        #: After an ``extend()`` that failed but may still succeed (nodes slow or
        #: unreachable, validity left): try again by then, on the lock's clock.
        self.retry_by: Optional[float] = None
        self.max_hold = max_hold
        self._deadline = deadline
        self._released = False
        self._lost_reason: Optional[str] = None
        # Each takes the lease itself (its own kind: see ``on_lost``).
        self._on_lost: list[Callable[[Any], Any]] = []
        self._on_extended: list[Callable[[Any], Any]] = []
        self._lost_fired = False
        self._lock = new_rlock()  # an original lock: the watchdog's OS thread takes it
        #: Reentrancy (reentry.py): this lease's hold of its value once the value was
        #: re-acquired (None: a plain lease), and the execution that won it.
        self.hold: Optional[str] = None
        self.execution: Optional[str] = None

    def __repr__(self) -> str:
        state = "released" if self._released else f"validity={self.validity:.3f}s"
        fence = f" fence={self.fence}" if self.fence is not None else ""
        return f"<Lease {self.key!r}{fence} {state}>"

    @property
    def validity(self) -> float:
        """Seconds of guaranteed exclusivity left (<= 0: no longer guaranteed)."""
        if self._released or self._lost_reason is not None:
            return 0.0
        return self._deadline - self._clock()

    @property
    def owner(self) -> object:
        """The lock that granted the lease: its rounds go through it."""
        return self._owner

    @property
    def deadline(self) -> float:
        """When validity runs out, on the lock's monotonic clock."""
        return self._deadline

    @property
    def released(self) -> bool:
        return self._released

    @property
    def held(self) -> bool:
        """True while the lease is guaranteed ours (not released, lost or expired)."""
        return self.validity > 0

    @property
    def lost(self) -> bool:
        """True when the lease ended without being released: expired or not renewed."""
        return not self._released and self.validity <= 0

    @property
    def lost_reason(self) -> Optional[str]:
        if self._lost_reason is not None:
            return self._lost_reason
        if self.lost:
            return "validity ran out"
        return None

    def ensure_held(self) -> None:
        """Raise ``LockLost`` unless the lease is still guaranteed ours.

        Call it at checkpoints of long work: a paused or slow holder learns it must
        stop before it writes.
        """
        if not self.held:
            self.mark_lost(self.lost_reason or "released")
            raise LockLost(self.key, self.lost_reason or "released")

    def on_lost(self: L, callback: Callable[[L], Any]) -> None:
        """Call ``callback(lease)`` once, when the lease is found lost."""
        with self._lock:
            self._on_lost.append(callback)

    def on_extended(self: L, callback: Callable[[L], Any]) -> None:
        """Call ``callback(lease)`` after each successful extension."""
        with self._lock:
            self._on_extended.append(callback)

    def mark_lost(self, reason: str) -> None:
        """Record that the lease is gone and run the ``on_lost`` callbacks once."""
        with self._lock:
            if self._released or self._lost_fired:
                return
            if self._lost_reason is None:
                self._lost_reason = reason
            self._lost_fired = True
            callbacks = list(self._on_lost)
        if callbacks:
            in_hub(lambda: self._run(callbacks, "lock_lost"))

    def count_holds(self) -> None:
        """The value is being re-acquired (reentrancy): from now on this lease's
        extends and release count as its first hold. Waits for an extension round in
        flight, so none of the plain kind is sent after this."""
        with self._lock:
            if self.hold is None:
                self.hold = FIRST_HOLD

    def _record(self, outcome: Extension) -> list[Callable[[Any], Any]]:
        """Note what an extension round achieved (under ``_lock``); the callbacks to run."""
        self.retry_by = outcome.retry_by
        if outcome.deadline is not None:
            self._deadline = outcome.deadline
            self.extensions += 1
        return list(self._on_extended)

    def _announce(self, outcome: Extension, callbacks: list[Callable[[Any], Any]]) -> bool:
        """After ``_record``: mark the lease lost, or run the ``on_extended`` callbacks."""
        if outcome.deadline is None:
            if outcome.reason is not None and outcome.retry_by is None:
                self.mark_lost(outcome.reason)
            return False
        if callbacks:
            in_hub(lambda: self._run(callbacks, "lock_extended"))
        return True

    def _run(self, callbacks: list[Callable[[Any], Any]], what: str) -> None:
        # Under gevent or eventlet, from the watchdog's OS thread: handed to the hub
        # (by in_hub), since callbacks log, send signals and take green locks.
        for callback in callbacks:
            try:
                callback(self)
            except Exception:
                logger.exception("%s callback failed for %s", what, self.key)


class Lease(LeaseState):
    """A lock won by ``Redlock``: a ``LeaseState`` whose ``extend``, ``release`` and
    ``owned`` are blocking rounds, asked of its lock (``LeaseOwner``), and a context
    manager that releases it."""

    _owner: LeaseOwner

    @property
    def owner(self) -> LeaseOwner:
        """The lock that granted the lease: its rounds go through it."""
        return self._owner

    def extend(self, ttl: Optional[Duration] = None) -> bool:
        """Push expiry to ``ttl`` seconds from now (default: the lease's ttl) on all nodes.

        True only if a majority extended it within the remaining validity; the new
        validity counts from the start of this round. Bounded by ``max_hold``: past
        it, the lease is extended only up to the bound, then no further (returns False).

        One round. When a majority refused (the key is no longer ours there) or no
        time is left for another round, the lease is marked lost -- keep the work
        fenced or stop. When the round only met slow or unreachable nodes, False
        with ``retry_by`` set: the lease holds until its deadline; call again (the
        watchdog does).
        """
        new_ttl = self.ttl if ttl is None else validate.seconds("ttl", ttl)
        if not self._hold_for_extension():
            return False
        try:
            outcome = self._owner._extend_lease(self, new_ttl)
        except BaseException:
            self._lock.release()
            raise
        return self._finish_extension(outcome)

    def _hold_for_extension(self) -> bool:
        """Take the lease's lock for an extension round (``extend``'s, or a batch the
        watchdog runs for many leases), so that no other extension or release of it
        interleaves. False, and the lock not kept, when released or lost already;
        otherwise ``_finish_extension`` (or ``_let_go``) must follow."""
        self._lock.acquire()
        if self._released or self._lost_reason is not None:
            self._lock.release()
            return False
        return True

    def _let_go(self) -> None:
        """Let go of the lock ``_hold_for_extension`` took, no round having run."""
        self._lock.release()

    def _finish_extension(self, outcome: Extension) -> bool:
        """Record the round's ``outcome``, let go of the lock ``_hold_for_extension``
        took, then mark the lease lost or run its ``on_extended`` callbacks."""
        try:
            callbacks = self._record(outcome)
        finally:
            self._lock.release()
        return self._announce(outcome, callbacks)

    def release(self) -> bool:
        """Delete the key on all nodes where it still holds our token.

        True when a quorum of nodes deleted our value; False when it was no longer
        ours (enough nodes answered that they did not hold it that no quorum could
        have: it expired or another holder took it); ``QuorumUnavailable`` when too
        few nodes answered to tell (the key frees itself at its TTL). Idempotent: a
        later call sends nothing and returns False (it released nothing).

        Returns once a quorum deleted it (never waits for hung nodes then): the
        others get the command too, and the process's finisher reads their replies
        soon after (resending it as EVAL to a node that forgot the script).
        """
        with self._lock:
            if self._released:
                return False
            self._released = True
        return self._owner._release_lease(self)

    def owned(self) -> bool:
        """Whether a quorum of nodes still holds our token: the nodes' view, one read
        round (``held`` is the local guarantee, with no round). ``QuorumUnavailable``
        when too few nodes answered to tell."""
        return self._owner._owned_lease(self)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()
