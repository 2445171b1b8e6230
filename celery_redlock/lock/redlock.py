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

Rooms: what is stored under a key (token|holder, tombstones, fence counters) is
stored.py; the ``Lease`` a caller holds is lease.py; calls that need no lease
(``locked``, ``extend_value``, ``force_release``, ``clear``) and how a round's
replies read as True, False or ``QuorumUnavailable`` are queries.py; the steps of
each operation, shared with the asyncio driver, are rules.py (what each operation
sends, for one key or a set of keys, commands.py; reentrancy's record reentry.py,
refusals acquire_replies.py, extension arithmetic extend_replies.py, the watchdog's batched
renewal renewals.py); talking to the nodes is node_set.py; the Lua is scripts.py.
This module knows nothing about Celery and must not import it; lease.py,
stored.py and watchdog.py must not import this module.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from typing import Callable, Iterator, Optional, Sequence, Union

from ..errors import QuorumUnavailable, RedlockError
from ..wire.node_set import NodeSet
from .acquire_replies import Attempt
from .commands import Keys, lock_keys
from .lease import Duration, Extension, Lease
from .queries import LockQueries
from .quorum import CLOCK_PRECISION, judge_exit, lease_value, quorum
from .reentry import HeldLeases
from .renewals import extend_batch
from .steps import Pause, drive
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


class Redlock(LockQueries):
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
    """

    def __init__(
        self,
        nodes: Sequence[object],
        ttl: Duration = 30.0,
        node_timeout: Duration = 0.05,
        drift_factor: float = 0.01,
        retry_count: int = 3,
        retry_delay: Duration = 0.2,
        *,
        fencing: bool = False,
        max_hold: Optional[Duration] = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = _SLEEP,
    ) -> None:
        self._configure(
            nodes, ttl, node_timeout, drift_factor, retry_count, retry_delay, fencing, max_hold
        )
        self._clock = clock
        self._sleep = sleep
        self._nodes = NodeSet(nodes, clock=clock)
        self._held = HeldLeases()  # which leases each execution (thread, task run) won
        self._count_nodes(len(self._nodes))
        # A blocked acquire hears releases (wake.py), unless waits were injected.
        self._wakeups: Optional[Wakeups] = None
        if sleep is _SLEEP or sleep is time.sleep:  # not injected (gevent may patch later)
            heard_enough = len(self._nodes) - self.quorum + 1
            self._wakeups = Wakeups(self._nodes.nodes, heard_enough, self.node_timeout)

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
        """
        attempt = self._acquire(key, ttl, blocking, timeout, holder, token, reentrant)
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
    ) -> Lease:
        """Like ``acquire`` but raises ``LockContended`` (holder, its remaining TTL)
        instead of returning ``None``."""
        attempt = self._acquire(key, ttl, blocking, timeout, holder, token, reentrant)
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
    ) -> Attempt:
        # The attempts, the waits between them and the checks are LockRules' (rules.py).
        steps = self._acquire_steps(
            self, Lease, key, ttl, blocking, timeout, holder, token, reentrant
        )
        wakeups = self._wakeups
        if not blocking or wakeups is None:
            return self._drive(steps)
        listening: list[Listener] = []  # made at the first pause: none when won at once

        def pause(step: Pause) -> None:
            if not listening:
                listening.append(wakeups.listener(self._clock, self._sleep))
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
            key, ttl=ttl, blocking=blocking, timeout=timeout, holder=holder, reentrant=reentrant
        )
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

    # -- release and inspection ------------------------------------------------------

    def release_value(self, key: Union[str, Sequence[str]], value: str) -> bool:
        """Compare-and-delete ``key`` on all nodes if it still holds ``value`` (a
        lease's ``token|holder``): releases a lock taken by another process that
        handed its value over, e.g. in a message header. Never touches another
        holder's lock. ``key`` may be the list of keys a lease took together.
        Returns and raises as ``Lease.release``."""
        return self._release(lock_keys(key), lease_value(value), self.ttl)

    # -- what a Lease asks of the lock (lease.LeaseOwner) ---------------------------

    def _extend_lease(self, lease: Lease, ttl: float) -> Extension:
        """One extension round (see ``LockRules._extend_steps``)."""
        return self._drive(self._extend_steps(lease, ttl))

    def _extend_leases(self, leases: Sequence[Lease]) -> list[Extension]:
        """Extend each of ``leases`` (granted by this lock) by its own ttl, all in
        one round; one outcome per lease, as ``_extend_lease`` would give it. The
        watchdog's batched renewal (renewals.py)."""
        return extend_batch(
            self._nodes, leases, quorum=self.quorum, node_timeout=self.node_timeout,
            margin=self._margin, clock=self._clock,
        )  # fmt: skip

    def _release_lease(self, lease: Lease) -> bool:
        return self._drive(self._release_lease_steps(lease))

    def _release(self, keys: Keys, value: str, ttl: float) -> bool:
        return self._drive(self._release_steps(keys, value, ttl))

    def holder(self, key: str) -> HolderInfo:
        """Who holds ``key``, per node (for logs and the CLI). One read round."""
        return self._drive(self._holder_steps(key))
