"""The Redlock algorithm: quorum acquire, extend and release over N Redis masters.

Acquire is one round to every node at once (see node_set.py): it succeeds iff a
majority (N//2+1) set the key and the lease is still valid once the round is over::

    validity = ttl - elapsed - (ttl * drift_factor + 2 ms)

``elapsed`` comes from a monotonic clock started *before* the first byte goes out;
the 2 ms covers Redis' own expiry precision (a key may expire up to 1 ms early) and
the drift term the rate difference between our clock and the nodes'. On failure the
key is released on all nodes -- also those that said no or did not answer, since a
reply may have been lost after the SET happened.

With ``fencing=True`` a second round makes ``lease.fence`` strictly increase from
one holder to the next (see ``Redlock.acquire``).

How it is put together: a ``Redlock`` *has* its ``Settings`` (settings.py: the
constructor's arguments, checked once, frozen) inside its ``LockRules`` (rules.py:
the settings, the node addresses, the held-lease record and the clock, and the
steps of every operation, shared with the asyncio driver), its ``NodeSet``
(wire/node_set.py: the round's I/O) and its ``Wakeups`` (wake.py). Every method
here is the rules' steps driven by ``steps.drive`` over ``NodeSet.round``; what is
left here is what only the blocking driver does: hearing releases while blocked,
``lock()`` with the watchdog, the watchdog's batched renewal (renewals.py), and
``clear``'s SCAN (clear.py). The ``Lease`` a caller holds is lease.py; what is
stored under a key (token|holder, tombstones, fence counters) stored.py; the Lua
scripts.py. This module knows nothing about Celery and must not import it;
lease.py, stored.py, rules.py and watchdog.py must not import this module.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from typing import Callable, Iterator, Optional, Sequence, TypeVar, Union

from ..errors import QuorumUnavailable, RedlockError
from ..wire.node_set import NodeSet
from .acquire_replies import Attempt
from .clear import clear_matching
from .commands import lock_keys
from .lease import Duration, Extension, Lease, LeaseState
from .quorum import CLOCK_PRECISION, clear_match, judge_exit, lease_value, quorum
from .reentry import HeldLeases
from .renewals import extend_batch
from .rules import LockRules
from .settings import DEFAULTS, Settings, ShowsSettings
from .steps import Ask, Pause, Steps, drive
from .stored import (
    FENCE,
    INTERNAL,
    TOMBSTONE,
    HolderInfo,
    NodeHolding,
    default_holder,
    fence_counter,
    is_lock_key,
    tombstone,
)
from .wake import Listener, Wakeups
from .watchdog import get_watchdog

# FENCE ... tombstone: what is stored under a lock key lives in stored.py; they stay
# importable from here.
__all__ = [
    "CLOCK_PRECISION",
    "FENCE",
    "INTERNAL",
    "TOMBSTONE",
    "Duration",
    "HolderInfo",
    "Lease",
    "NodeHolding",
    "Redlock",
    "default_holder",
    "fence_counter",
    "is_lock_key",
    "quorum",
    "tombstone",
]

# The name the logger had before the package was split into folders: users filter on it.
logger = logging.getLogger("celery_redlock.redlock")

_SLEEP = time.sleep  # the default: waits are the lock's own, releases are heard

T = TypeVar("T")


class Redlock(ShowsSettings):
    """The Redlock distributed lock over N independent Redis masters.

    ``nodes``: Redis URLs (``redis://``, ``rediss://``, ``unix://``) or ``redis.Redis``
    clients, N >= 1, each a separate master (never a replica of another).
    ``ttl``: default lease length, seconds (default 30).
    ``node_timeout``: deadline of one round to all nodes, seconds (default 0.05),
    connection set-up included; must be well below ``ttl``.
    ``drift_factor``: clock-rate error allowed for, as a fraction of ttl (default 0.01).
    ``retry_count``: how many attempts in a row that reached too few nodes (an
    outage, not contention) a blocking acquire without a ``timeout`` retries before
    it raises ``QuorumUnavailable`` (default 3); contention is waited out.
    ``retry_delay``: between attempts, when a release cannot be heard (see
    ``acquire``), wait ``retry_delay`` x random 0.5..1.5 (default 0.2 s), less when
    the holder's lock expires sooner.
    ``fencing``: give every lease a fence number that strictly increases per key
    (costs a second round; default off). Fences are at least the wall-clock time in
    microseconds, so they also rise across a lock node that restarted without its
    counters (see SAFETY.md).
    ``max_hold``: bound on the total hold time through ``extend``, seconds (default
    None: unbounded; the Celery integration always sets one).
    ``clock`` / ``sleep``: monotonic clock and sleep, injectable for tests (with
    an injected ``sleep`` a blocked acquire polls through it instead of listening
    for releases).

    The settings are attributes (``redlock.ttl`` and its siblings, settings.py):
    assigning one checks it with the others, as the constructor does.
    """

    _rules: LockRules

    def __init__(
        self,
        nodes: Sequence[object],
        ttl: Duration = DEFAULTS.ttl,
        node_timeout: Duration = DEFAULTS.node_timeout,
        drift_factor: float = DEFAULTS.drift_factor,
        retry_count: int = DEFAULTS.retry_count,
        retry_delay: Duration = DEFAULTS.retry_delay,
        *,
        fencing: bool = DEFAULTS.fencing,
        max_hold: Optional[Duration] = DEFAULTS.max_hold,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = _SLEEP,
    ) -> None:
        settings = Settings.checked(
            nodes, ttl, node_timeout, drift_factor, retry_count, retry_delay, fencing, max_hold
        )
        self._sleep = sleep
        self._nodes = NodeSet(nodes, clock=clock)
        # Which leases each execution (thread, task run) won: in the rules' record.
        self._rules = LockRules(settings, self.nodes, HeldLeases(), clock)
        # A blocked acquire hears releases (wake.py), unless waits were injected.
        self._wakeups: Optional[Wakeups] = None
        if sleep is _SLEEP or sleep is time.sleep:  # not injected (gevent may patch later)
            heard_enough = self._rules.enough_no
            self._wakeups = Wakeups(self._nodes.nodes, heard_enough, settings.node_timeout)

    def __repr__(self) -> str:
        addresses = ", ".join(n.address for n in self._nodes.nodes)
        return f"<Redlock [{addresses}] ttl={self.ttl}s>"

    @property
    def nodes(self) -> list[str]:
        """The node addresses, in the order given."""
        return [n.address for n in self._nodes.nodes]

    @property
    def node_set(self) -> NodeSet:
        """The nodes themselves (``node_set.nodes``, in the order given), for
        inspection: the CLI reads them with plain clients. Lock operations go
        through this lock's methods."""
        return self._nodes

    def close(self) -> None:
        """Close every connection (they reopen on next use)."""
        self._nodes.close()
        if self._wakeups is not None:
            self._wakeups.close()

    def _drive(self, steps: Steps[T]) -> T:
        """Run an operation's steps (rules.py), each round on this lock's nodes."""
        return drive(steps, self._round_trip, self._sleep)

    def _round_trip(self, ask: Ask) -> list[object]:
        return self._nodes.round(
            ask.command, ask.timeout, ask.is_yes, ask.enough_yes, ask.enough_no, ask.wait,
            ask.deliver, ask.settled,
        )  # fmt: skip

    # -- acquire ------------------------------------------------------------------

    def acquire(
        self,
        key: Union[str, Sequence[str]],
        ttl: Optional[Duration] = None,
        blocking: bool = True,
        timeout: Optional[Duration] = None,
        holder: Optional[str] = None,
        token: Optional[str] = None,
        *,
        reentrant: bool = False,
        limit: int = 1,
    ) -> Optional[Lease]:
        """Try to win ``key`` for ``ttl`` seconds; the Lease, or ``None`` if not won.

        ``blocking=False``: one attempt. Blocking: attempts until won, or until
        ``timeout`` seconds ran out (``None``, the default, or ``float("inf")``:
        no limit; only an outage -- ``retry_count`` attempts in a row that reached
        too few nodes -- ends the wait, with ``QuorumUnavailable``). Between
        attempts it listens for the key's release on every node (wake.py) and
        tries again as soon as one is heard, at the latest when the holder's lock
        expires; nodes it cannot listen to (an ACL without pub/sub, a node down)
        leave it polling every ``retry_delay`` x 0.5..1.5. ``holder`` is stored
        beside the token so contention can name us (default ``hostname:pid``).
        ``token``: the lease's token, chosen by the caller (16..256 characters, no
        ``|``; default 20 random bytes), so that another process knowing it can
        ``extend_value`` / ``release_value`` the lease; it must be unique to this
        acquisition. ``timeout`` with
        ``blocking=False`` is refused (one attempt has nothing to time out).

        Raises ``QuorumUnavailable`` (not ``None``) when the last attempt failed
        because too few nodes answered, rather than because someone holds the key.

        When this execution (this thread; in a Celery task, the task run) holds
        ``key`` already: ``AlreadyHeld`` at once, or with ``reentrant=True`` one more
        hold of the same lease, counted on the nodes (one round, no waiting; its
        ``holder``/``token`` are the held lease's). Each hold is a Lease of its own
        with the same token and fence, released on its own; the key goes with the
        last hold. Its validity never reaches past the held lease's at the time.

        ``key`` may be a list of keys to take together (at most ``MAX_KEYS``,
        distinct): every key or none, on each node in one script, in sorted order,
        so two sets that overlap never deadlock. ``lease.keys`` lists them and
        ``lease.key`` joins them with ``+``; extend and release cover the whole
        set, and a fenced lease's fence orders the holders of each of its keys.
        Not with ``reentrant=True``; re-acquiring any key of a held set raises
        ``AlreadyHeld``.

        ``limit=N`` (1 to ``MAX_PERMITS``): at most N leases on ``key`` at once,
        across every caller; the lease is on one of its N permits (``lease.key`` is
        ``key``, ``lease.keys`` the permit's slot), extended, fenced and released like
        any lease, and a blocked acquire wakes when any permit frees. Every caller of
        one key must give the same ``limit`` (``ConfigurationError`` otherwise). One
        key, not with ``reentrant=True``. SAFETY.md "Limits (N at a time)".
        """
        attempt = self._acquire(key, ttl, blocking, timeout, holder, token, reentrant, limit)
        return attempt.outcome(key, False)

    def try_acquire(
        self,
        key: Union[str, Sequence[str]],
        ttl: Optional[Duration] = None,
        blocking: bool = True,
        timeout: Optional[Duration] = None,
        holder: Optional[str] = None,
        token: Optional[str] = None,
        *,
        reentrant: bool = False,
        limit: int = 1,
    ) -> Lease:
        """Like ``acquire`` but raises ``LockContended`` (holder, its remaining TTL;
        with a ``limit``, what was reached) instead of returning ``None``."""
        attempt = self._acquire(key, ttl, blocking, timeout, holder, token, reentrant, limit)
        lease = attempt.outcome(key, True)
        assert lease is not None
        return lease

    def _acquire(
        self,
        key: Union[str, Sequence[str]],
        ttl: Optional[Duration],
        blocking: bool,
        timeout: Optional[Duration],
        holder: Optional[str],
        token: Optional[str],
        reentrant: bool,
        limit: int = 1,
    ) -> Attempt[Lease]:
        # The attempts, the waits between them and the checks are the rules' (rules.py).
        steps = self._rules.acquire_steps(
            self, Lease, key, ttl, blocking, timeout, holder, token, reentrant, limit
        )
        wakeups = self._wakeups
        if not blocking or wakeups is None:
            return self._drive(steps)
        listening: list[Listener] = []  # made at the first pause: none when won at once

        def pause(step: Pause) -> None:
            if not listening:
                listening.append(wakeups.listener(self._rules.clock, self._sleep))
            listening[0].pause(step)

        try:
            return drive(steps, self._round_trip, self._sleep, pause)
        finally:
            if listening:
                listening[0].close()

    @contextmanager
    def lock(
        self,
        key: Union[str, Sequence[str]],
        ttl: Optional[Duration] = None,
        timeout: Optional[Duration] = None,
        blocking: bool = True,
        auto_extend: bool = False,
        holder: Optional[str] = None,
        *,
        reentrant: bool = False,
        limit: int = 1,
    ) -> Iterator[Lease]:
        """``with redlock.lock(key) as lease:`` -- hold ``key`` for the block.

        Raises ``LockContended`` (with the holder and its remaining TTL) when not won
        in time. ``auto_extend=True`` has the process's watchdog renew the lease at
        ttl/3 while the block runs; if a renewal fails the lease is marked lost
        (``lease.held`` turns False, ``lease.ensure_held()`` raises ``LockLost``).
        Released on exit, also on error. Leaving the block normally raises
        ``LockLost`` when the lease was lost meanwhile (the block's work was not
        exclusive to the end) and ``QuorumUnavailable`` when the release could not
        reach a quorum; when the block raised, its exception propagates and a failed
        release is only logged.
        """
        lease = self.try_acquire(
            key, ttl=ttl, blocking=blocking, timeout=timeout, holder=holder,
            reentrant=reentrant, limit=limit,
        )  # fmt: skip
        watchdog = None
        if auto_extend:
            watchdog = get_watchdog()
            watchdog.watch(lease)
        try:
            yield lease
        except BaseException:
            if watchdog is not None:
                watchdog.unwatch(lease)
            try:
                lease.release()
            except RedlockError as exc:  # the block's own error is the one to see
                logger.warning("releasing lock %s after an error failed: %s", key, exc)
            raise
        if watchdog is not None:
            watchdog.unwatch(lease)
        if lease.released:
            return  # released in the block: its outcome was the block's to read
        lost = lease.lost_reason
        try:
            released: Union[bool, QuorumUnavailable] = lease.release()
        except QuorumUnavailable as exc:
            released = exc
        judge_exit(lease, lost, released)

    def admit(
        self,
        key: str,
        rate: Union[str, tuple[int, float]],
        *,
        timeout: Optional[Duration] = 0,
        holder: Optional[str] = None,
        reserve: Optional[bool] = None,
    ) -> float:
        """A start under ``rate`` on ``key``: at most R starts per period across every
        caller, in any window of that length (``"10/s"``, ``"100/m"``, ``"1000/h"``,
        ``"5/10s"`` or a ``(count, seconds)`` pair; the nodes' clocks, never ours).

        Returns 0.0 when a start was admitted and counted: start now. Otherwise the
        seconds until the window admits one, nothing counted -- after waiting up to
        ``timeout`` seconds for it (default 0: one try; ``None``: until admitted).
        Raises ``QuorumUnavailable`` when too few nodes answered. Every caller of
        one key must give the same rate (``ConfigurationError`` otherwise). A start
        cannot be taken back: its place in the window frees when the window passes.

        ``reserve=True`` (the default when ``timeout`` is not 0): a refused caller
        takes a *turn* -- the wait returned is until its turn, a slot's lifetime
        (the period and its margins) / R after the turn handed out before it -- so
        callers that come back when told arrive at the rate, not all at once. Take
        turns only when you do come back (a turn nobody uses is a gap in the pace).
        """
        return self._drive(self._rules.admit_steps(key, rate, holder, timeout, reserve))

    # -- release, inspection and operators' deletions ------------------------------

    def release_value(self, key: Union[str, Sequence[str]], value: str) -> bool:
        """Compare-and-delete ``key`` on all nodes if it still holds ``value`` (a
        lease's ``token|holder``): releases a lock taken by another process that
        handed its value over, e.g. in a message header. Never touches another
        holder's lock. ``key`` may be the list of keys a lease took together.
        Returns and raises as ``Lease.release``."""
        steps = self._rules.release_steps(lock_keys(key), lease_value(value), self.ttl)
        return self._drive(steps)

    def extend_value(
        self, key: Union[str, Sequence[str]], value: str, ttl: Optional[Duration] = None
    ) -> bool:
        """Push ``key``'s expiry to ``ttl`` seconds from now (default: this lock's
        ttl) on all nodes where it still holds ``value`` (a lease's ``token|holder``),
        for a process that holds no ``Lease`` but was handed the value. ``key`` may be
        the list of keys a lease took together (each node extends all or none). A
        re-entered key (``reentrant=True``) is extended as its holds are: never
        sooner than it expired, its holds renewed with it.

        True when a quorum extended it; False when it is no longer that holder's
        (too many nodes answered that it is not); ``QuorumUnavailable`` when too few
        answered to tell. Unlike ``Lease.extend`` there is no local validity to
        check: the caller knows nothing of the round that won the lock.
        """
        return self._drive(self._rules.extend_value_steps(key, value, ttl))

    def holder(self, key: str) -> HolderInfo:
        """Who holds ``key``, per node (for logs and the CLI). One read round."""
        return self._drive(self._rules.holder_steps(key))

    def locked(self, key: str) -> bool:
        """True when a quorum of nodes holds ``key`` under one value (someone holds
        the lock); False when too many nodes answered otherwise for that to be so.
        One read round; ``QuorumUnavailable`` when too few nodes answered to tell."""
        return self._drive(self._rules.locked_steps(key))

    def force_release(self, key: str) -> int:
        """Delete ``key`` on every node whoever holds it; how many nodes deleted it.

        For operators (a stuck lock): it ends mutual exclusion for a holder that may
        still be working. Its fence counter is kept -- fences never go backwards --
        and tombstones expire by themselves. ``QuorumUnavailable`` when fewer than a
        quorum answered (the lock may still be held).
        """
        return self._drive(self._rules.force_release_steps(key))

    def clear(self, match: str = "*") -> int:
        """Force-release every lock key matching the glob ``match`` on every node
        (SCAN per node); how many distinct keys were deleted. Fence counters and
        tombstones are skipped (see ``force_release``); every other matching key
        goes, so on nodes shared with other data pass the locks' prefix (the
        Celery integration's keys start with ``redlock_key_prefix``).
        ``QuorumUnavailable`` when fewer than a quorum of nodes could be cleared."""
        match = clear_match(match)
        self._rules.held.forget_keys(match=match)
        return clear_matching(self._nodes.nodes, match, self._rules.quorum)

    def hand_over(self, lease: LeaseState) -> None:
        """``lease``'s value goes to another execution (in a message header, to
        another process, or left to expire): this one no longer holds it, so taking
        the key again contends as usual instead of raising ``AlreadyHeld``."""
        self._rules.held.forget(lease)

    # -- what a Lease asks of the lock (lease.LeaseOwner) ---------------------------

    def _extend_lease(self, lease: Lease, ttl: float) -> Extension:
        """One extension round (see ``LockRules.extend_steps``)."""
        return self._drive(self._rules.extend_steps(lease, ttl))

    def _extend_leases(self, leases: Sequence[Lease]) -> list[Extension]:
        """Extend each of ``leases`` (granted by this lock) by its own ttl, all in
        one round; one outcome per lease, as ``_extend_lease`` would give it. The
        watchdog's batched renewal (renewals.py)."""
        rules = self._rules
        if self._nodes.clustered:  # a cluster node takes one key per round
            return [self._extend_lease(lease, lease.ttl) for lease in leases]
        return extend_batch(
            self._nodes, leases, quorum=rules.quorum, node_timeout=rules.settings.node_timeout,
            margin=rules.settings.margin, clock=rules.clock,
        )  # fmt: skip

    def _release_lease(self, lease: Lease) -> bool:
        return self._drive(self._rules.release_lease_steps(lease))

    def _owned_lease(self, lease: Lease) -> bool:
        return self._drive(self._rules.owned_steps(lease))
