"""The Redlock algorithm: quorum acquire, extend and release over N Redis masters.

Acquire is one round to every node at once (see nodes.py): it succeeds iff a
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
holders.py; the ``Lease`` a caller holds is lease.py; calls that need no lease
(``locked``, ``extend_value``, ``force_release``, ``clear``) and how a round's
replies read as True, False or ``QuorumUnavailable`` are admin.py; what each
operation sends, for one key or a set of keys, is commands.py; talking to the
nodes is nodes.py; the Lua is scripts.py. This module knows nothing about Celery and must not
import it; lease.py, holders.py and watchdog.py must not import this module.
"""

from __future__ import annotations

import logging
import random
import secrets
import time
from contextlib import contextmanager
from typing import Callable, Iterator, Optional, Sequence, Union

from . import scripts, validate
from .admin import LockQueries, is_one, lease_value, token_argument
from .commands import (
    Keys,
    acquire_command,
    extend_command,
    fence_command,
    lease_name,
    lock_keys,
    release_command,
)
from .errors import (
    AlreadyHeld,
    ConfigurationError,
    LockContended,
    LockLost,
    QuorumUnavailable,
    RedlockError,
)
from .extension import extension_outcome, extension_ttl
from .holders import (
    FENCE,
    INTERNAL,
    TOMBSTONE,
    HolderInfo,
    NodeHolding,
    default_holder,
    fence_counter,
    is_lock_key,
    read_holding,
    tombstone,
)
from .lease import Duration, Extension, Lease
from .nodes import Command, NodeSet
from .reentry import HeldLeases, Reentry, current_execution
from .refusal import Attempt, is_granted, why_not
from .renewals import extend_batch
from .watchdog import get_watchdog

# FENCE ... tombstone: what is stored under a lock key lives in holders.py; they stay
# importable from here.
__all__ = [
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

logger = logging.getLogger(__name__)

#: Redis expires a key up to 1 ms early; one more ms for our own clock's granularity.
CLOCK_PRECISION = 0.002


def quorum(n: int) -> int:
    """How many of ``n`` nodes make a majority."""
    return n // 2 + 1


class Redlock(Reentry, LockQueries):
    """The Redlock distributed lock over N independent Redis masters.

    ``nodes``: Redis URLs (``redis://``, ``rediss://``, ``unix://``) or ``redis.Redis``
    clients, N >= 1, each a separate master (never a replica of another).
    ``ttl``: default lease length, seconds (default 30).
    ``node_timeout``: deadline of one round to all nodes, seconds (default 0.05),
    connection set-up included; must be well below ``ttl``.
    ``drift_factor``: clock-rate error allowed for, as a fraction of ttl (default 0.01).
    ``retry_count`` / ``retry_delay``: a blocking acquire without a ``timeout`` tries
    ``1 + retry_count`` times, waiting ``retry_delay`` x random 0.5..1.5 in between
    (defaults 3 and 0.2 s), less when the holder's lock expires sooner.
    ``fencing``: give every lease a fence number that strictly increases per key
    (costs a second round; default off). Fences are at least the wall-clock time in
    microseconds, so they also rise across a lock node that restarted without its
    counters (see SAFETY.md).
    ``max_hold``: bound on the total hold time through ``extend``, seconds (default
    None: unbounded; the Celery integration always sets one).
    ``clock`` / ``sleep``: monotonic clock and sleep, injectable for tests.
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
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if isinstance(nodes, (str, bytes)) or not isinstance(nodes, Sequence):
            raise ConfigurationError(
                "nodes must be a list of Redis URLs or redis.Redis clients "
                f"(one per independent master), got {type(nodes).__name__}: {nodes!r}"
            )
        if not nodes:
            raise ConfigurationError("nodes must list at least one Redis master, got none")
        self.ttl = validate.seconds("ttl", ttl)
        self.node_timeout = validate.seconds("node_timeout", node_timeout)
        if self.node_timeout >= self.ttl:
            raise ConfigurationError(
                f"node_timeout ({self.node_timeout}s) must be smaller than ttl ({self.ttl}s); "
                "keep it a small fraction of ttl (e.g. 5-50 ms for a 10 s ttl)"
            )
        self.drift_factor = validate.fraction("drift_factor", drift_factor)
        self.retry_count = validate.count("retry_count", retry_count)
        self.retry_delay = validate.seconds("retry_delay", retry_delay, minimum=">= 0")
        self.fencing = bool(fencing)
        self.max_hold = None if max_hold is None else validate.seconds("max_hold", max_hold)
        self._clock = clock
        self._sleep = sleep
        self._wall_us: Callable[[], int] = lambda: time.time_ns() // 1000
        self._nodes = NodeSet(nodes, clock=clock)
        self._held = HeldLeases()  # which leases each execution won through this lock
        self.quorum = quorum(len(self._nodes))
        # Noes that rule a quorum out: a round can stop there.
        self._enough_no = len(self._nodes) - self.quorum + 1

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

    def _margin(self, ttl: float) -> float:
        return ttl * self.drift_factor + CLOCK_PRECISION

    def _quorum_round(
        self, command: Command, is_yes: Callable[[object], bool], timeout: float
    ) -> list[object]:
        """One round that stops as soon as a quorum said yes, or can no longer."""
        return self._nodes.round(
            command, timeout, is_yes=is_yes, enough_yes=self.quorum, enough_no=self._enough_no
        )

    def close(self) -> None:
        """Close every connection (they reopen on next use)."""
        self._nodes.close()

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

        ``blocking=False``: one attempt. Blocking without ``timeout``: ``1 +
        retry_count`` attempts; with ``timeout`` (seconds): attempts until it runs
        out. Between attempts a random wait, cut short when the holder's lock expires
        sooner. ``holder`` is stored beside the token so contention can name us
        (default ``hostname:pid``). ``token``: the lease's token, chosen by the
        caller (16..256 characters, no ``|``; default 20 random bytes), so that
        another process knowing it can ``extend_value`` / ``release_value`` the
        lease; it must be unique to this acquisition. ``timeout`` with
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
        if attempt.unavailable is not None:
            raise attempt.unavailable
        return attempt.lease

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
        if attempt.unavailable is not None:
            raise attempt.unavailable
        if attempt.lease is None:
            raise LockContended(lease_name(lock_keys(key)), attempt.holder, attempt.holder_ttl)
        return attempt.lease

    def _acquire(
        self,
        key: Union[str, Sequence[str]],
        ttl: Optional[Duration],
        blocking: bool,
        timeout: Optional[Duration],
        holder: Optional[str],
        token: Optional[str],
        reentrant: bool = False,
    ) -> Attempt:
        keys = lock_keys(key)
        reentrant = validate.flag("reentrant", reentrant)
        if reentrant and len(keys) > 1:
            raise ConfigurationError(
                f"reentrant=True takes one key, got key={list(keys)!r}: a lease on "
                "several keys is not re-entered (take the set once)"
            )
        lease_ttl = self.ttl if ttl is None else validate.seconds("ttl", ttl)
        if lease_ttl <= self.node_timeout:
            raise ConfigurationError(
                f"ttl ({lease_ttl}s) must be larger than node_timeout ({self.node_timeout}s)"
            )
        limit = validate.optional_seconds("timeout", timeout, minimum=">= 0")
        if not blocking and limit is not None:
            raise ConfigurationError(
                f"timeout={timeout!r} needs blocking=True (blocking=False makes one "
                "attempt): drop timeout or set blocking=True"
            )
        if token is not None:
            token = token_argument(token)
        if holder is not None and (not isinstance(holder, str) or "\n" in holder):
            raise ConfigurationError(f"holder must be a one-line str, got {holder!r}")
        if holder is not None:
            validate.utf8_text("holder", holder)
        who = holder or default_holder()
        held = self._held.live(keys)
        if held is not None:
            if not reentrant or held.keys != keys:
                mine = next(k for k in keys if k in held.keys)
                raise AlreadyHeld(mine, current_execution())
            lease, results = self._reenter(held, lease_ttl)
            if lease is None:
                return self._why_not(keys, results)
            self._held.add(lease)
            return Attempt(lease)
        give_up = None if limit is None else self._clock() + limit
        attempts = 0
        while True:
            attempt = self._attempt(keys, lease_ttl, who, token)
            if attempt.lease is not None:
                self._held.add(attempt.lease)
                return attempt
            attempts += 1
            if not blocking:
                return attempt
            if give_up is None and attempts > self.retry_count:
                return attempt
            delay = random.uniform(0.5, 1.5) * self.retry_delay
            if attempt.holder_ttl is not None:
                # The holder's lock frees sooner: come back just after it does.
                delay = min(delay, attempt.holder_ttl + random.uniform(0.001, 0.005))
            if give_up is not None:
                left = give_up - self._clock()
                if left <= 0:
                    return attempt
                delay = min(delay, left)
            self._sleep(delay)

    def _attempt(self, keys: Keys, ttl: float, holder: str, chosen: Optional[str]) -> Attempt:
        token = chosen or secrets.token_urlsafe(20)
        value = f"{token}|{holder}"
        command = acquire_command(keys, value, ttl, self.fencing)
        started = self._clock()
        results = self._quorum_round(command, is_granted, self.node_timeout)
        granted = [r for r in results if is_granted(r)]
        deadline = started + ttl - self._margin(ttl)
        if len(granted) >= self.quorum and self._clock() < deadline:
            fence = self._fence(keys, value, granted, deadline) if self.fencing else None
            if fence is not None or not self.fencing:
                lease = Lease(
                    self, self._clock, lease_name(keys), token, holder, ttl, started, deadline,
                    fence, self.max_hold, keys=keys,
                )  # fmt: skip
                return Attempt(lease)
        # Lost: undo on every node, without waiting for anyone.
        self._nodes.round(release_command(keys, value, ttl), 0.0, wait=False, deliver=True)
        return self._why_not(keys, results)

    def _fence(
        self, keys: Keys, value: str, granted: list[object], deadline: float
    ) -> Optional[int]:
        """Second round of a fenced acquire: the fence T, recorded on every node that
        still holds our token; counts only with a majority within validity.

        T = max(1 + the highest counter the granting quorum reported, wall-clock
        microseconds). Any later holder's quorum shares a node with the majority that
        recorded T, so it reads a counter >= T and picks a larger fence -- as long as
        that node kept its counter. A node restarted without persistence has lost it
        (a delayed restart protects lock keys, not counters), and the shared node may
        be exactly that one: the model checker finds that trace. The clock term covers
        it: the next holder's grant comes after the restart delay (longer than the
        largest TTL), so its clock reads past T as long as clients' clocks agree to
        within that delay. With persisted counters, T rises whatever the clocks say.
        A lease on several keys records T on every key's counter, from the highest
        of their counters: T then orders the holders of each key.
        """
        counters = [int(r[1]) for r in granted if isinstance(r, list)]
        fence = max(max(counters, default=0) + 1, self._wall_us())
        left = deadline - self._clock()
        if left <= 0:
            return None
        command = fence_command(keys, value, fence)
        results = self._quorum_round(command, is_one, min(self.node_timeout, left))
        recorded = sum(1 for r in results if r == 1)
        if recorded >= self.quorum and self._clock() < deadline:
            return fence
        return None

    def _why_not(self, keys: Keys, results: list[object]) -> Attempt:
        return why_not(lease_name(keys), results, self.nodes, self.quorum)

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
            released = lease.release()
        except QuorumUnavailable as exc:
            if lost is not None:
                raise LockLost(lease.key, lost) from exc
            raise
        if lost is not None or not released:
            raise LockLost(lease.key, lost or "the key no longer held this lease's token")

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
        """Push ``lease``'s expiry to ``ttl`` seconds from now on every node.

        What the round asks for and what its replies mean: extension.py (shared
        with the watchdog's batched renewal, renewals.py).
        """
        started = self._clock()
        deadline = lease.deadline
        asked = extension_ttl(lease, ttl, started, self._margin)
        if isinstance(asked, Extension):
            return asked
        command = extend_command(lease.keys, lease.value, asked, lease.hold)
        results = self._quorum_round(command, is_one, min(self.node_timeout, deadline - started))
        return extension_outcome(
            results, self.quorum, asked, started, self._clock(), deadline,
            self._margin(asked), self.node_timeout,
        )  # fmt: skip

    def _extend_leases(self, leases: Sequence[Lease]) -> list[Extension]:
        """Extend each of ``leases`` (granted by this lock) by its own ttl, all in
        one round; one outcome per lease, as ``_extend_lease`` would give it. The
        watchdog's batched renewal (renewals.py)."""
        return extend_batch(
            self._nodes, leases, quorum=self.quorum, node_timeout=self.node_timeout,
            margin=self._margin, clock=self._clock,
        )  # fmt: skip

    def _release_lease(self, lease: Lease) -> bool:
        self._held.forget(lease)
        return self._release(lease.keys, lease.value, lease.ttl, lease.hold)

    def _release(self, keys: Keys, value: str, ttl: float, hold: Optional[str] = None) -> bool:
        # Stops at a quorum of deletions; otherwise hears every node (or times out),
        # to tell "not ours any more" from "too few answered".
        results = self._nodes.round(
            release_command(keys, value, ttl, hold),
            self.node_timeout,
            is_yes=is_one,
            enough_yes=self.quorum,
            deliver=True,  # every node, also those the round stops waiting for
        )
        return self._agreed(lease_name(keys), results, is_one)

    def holder(self, key: str) -> HolderInfo:
        """Who holds ``key``, per node (for logs and the CLI). One read round."""
        key = validate.lock_key_name(key, reserved=INTERNAL)
        results = self._nodes.round(Command(scripts.HOLDER, [key], []), self.node_timeout)
        holdings = []
        for node, reply in zip(self._nodes.nodes, results):
            if isinstance(reply, BaseException):
                holdings.append(NodeHolding(node.address, error=reply))
                continue
            value, pttl = reply if isinstance(reply, list) else (None, -2)
            holdings.append(read_holding(node.address, value, pttl))
        return HolderInfo(key, tuple(holdings), self.quorum)
