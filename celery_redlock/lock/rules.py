"""The Redlock rules both drivers share: what each operation sends, what replies mean.

The synchronous lock (redlock.py, queries.py) and the asyncio one (asyncio/) differ
only in how a round's I/O is done. Everything decided from a round's replies lives
here once, in ``LockRules``, the base both lock classes share: the settings and
their checks, the steps of every operation (acquire, re-acquire, fence, extend,
release, queries), and who holds a key. The pure pieces they use have their own
rooms: quorum.py (arithmetic, reply predicates, argument checks, the step types),
commands.py (what each operation sends, for one key or a set of keys), acquire_replies.py
(granted, or why not: ``Attempt``, ``why_not``), extend_replies.py (what an extension
asks for and what its replies mean), reentry.py (which execution holds which key,
how a REENTER reply reads).

How an operation is written: *steps*, a generator that yields what it needs done
and returns the operation's value. It yields

- ``Ask``: one round -- the command to every node, its deadline, when it is decided
  (``is_yes``, ``enough_yes``/``enough_no``), and an ``undo`` sent without waiting
  if the round is abandoned (a cancelled asyncio acquire); it is sent the round's
  per-node results, in node order (a reply, or a redis-py error);
- ``Pause``: a wait between acquire attempts, which a driver that hears releases
  (redlock.py through wake.py) ends at the key's release; sent ``[]``;
- ``Settle``: wait until no extension round of a lease is in flight; sent ``[]``.

A driver runs the steps with its own I/O: ``quorum.drive`` for a blocking round
function (queries.py's ``LockQueries._drive``), an ``await`` per round in
asyncio/redlock.py's ``AsyncRedlock._drive``::

    results = yield Ask(command, self.node_timeout)   # sync: NodeSet.round(...)

Steps compose with ``yield from`` (an acquire is attempts, an attempt may be
followed by its fence round, a re-acquire is a ``Settle`` then a round), so both
drivers run every operation unchanged. To extend: what a round *sends* is a
builder in commands.py (one key or a set of keys: ``acquire(["a", "b"])`` passes
``Keys`` through the same steps, and the multi-key scripts reply in the single-key
shapes, so the judging here is shared); what a new operation *decides* is one more
generator here; a new kind of round (e.g. several commands per node) is a new
field of ``Ask`` or a new step type in quorum.py and one branch in each driver's
``_drive`` (quorum.drive, ``AsyncRedlock._drive``). No sockets: reads the lock's
clock (injectable) only. Must not import node_set.py, redlock.py, queries.py, asyncio
or Celery.
"""

from __future__ import annotations

import functools
import random
import secrets
import time
from collections import Counter
from collections.abc import Sequence
from typing import Callable, Optional, Protocol, TypeVar, Union

from ..errors import AlreadyHeld, ConfigurationError, QuorumUnavailable
from ..wire.resp import Command
from ..wire.round import NOT_AWAITED
from . import scripts, validate
from .acquire_replies import Attempt, is_granted, why_not
from .commands import (
    Keys,
    acquire_command,
    extend_command,
    fence_command,
    lease_name,
    lock_keys,
    owned_command,
    owned_judge,
    reenter_command,
    release_command,
)
from .extend_replies import extension_outcome, extension_ttl
from .lease import Duration, Extension, Lease
from .quorum import CLOCK_PRECISION, is_answer, is_one, lease_value, quorum, token_argument
from .reentry import Reentry, is_reentered
from .steps import Ask, Pause, Settle, Steps
from .stored import INTERNAL, HolderInfo, NodeHolding, default_holder, read_holding

__all__ = ["LockRules"]

T = TypeVar("T")


class _Addressed(Protocol):
    @property
    def address(self) -> str: ...


class _Nodes(Protocol):
    @property
    def nodes(self) -> Sequence[_Addressed]: ...


class LockRules(Reentry):
    """What ``Redlock`` and ``AsyncRedlock`` share: settings, checks, the steps of
    every operation, and how a round's replies read."""

    ttl: float
    node_timeout: float
    drift_factor: float
    retry_count: int
    retry_delay: float
    fencing: bool
    max_hold: Optional[float]
    quorum: int
    _enough_no: int
    _clock: Callable[[], float]
    _wall_us: Callable[[], int]
    _nodes: _Nodes

    def _configure(
        self,
        nodes: Sequence[object],
        ttl: Duration,
        node_timeout: Duration,
        drift_factor: float,
        retry_count: int,
        retry_delay: Duration,
        fencing: bool,
        max_hold: Optional[Duration],
    ) -> None:
        """Check and keep the constructor's settings (the nodes are the driver's)."""
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
        self._wall_us = lambda: time.time_ns() // 1000

    def _count_nodes(self, count: int) -> None:
        self.quorum = quorum(count)
        # Noes that rule a quorum out: a round can stop there.
        self._enough_no = count - self.quorum + 1

    def _margin(self, ttl: float) -> float:
        return ttl * self.drift_factor + CLOCK_PRECISION

    def _quorum_ask(
        self,
        command: Command,
        is_yes: Callable[[object], bool],
        timeout: float,
        undo: Optional[Callable[[], Command]] = None,
    ) -> Ask:
        """A round that stops as soon as a quorum said yes, or can no longer."""
        return Ask(command, timeout, is_yes, self.quorum, self._enough_no, undo=undo)

    # -- acquire ------------------------------------------------------------------

    def _acquire_arguments(
        self,
        key: Union[str, Sequence[str]],
        ttl: Optional[Duration],
        blocking: bool,
        timeout: Optional[Duration],
        holder: Optional[str],
        token: Optional[str],
        reentrant: bool,
    ) -> tuple[Keys, float, Optional[float], Optional[str], str]:
        """acquire's arguments, checked: keys, lease ttl, timeout, token, holder."""
        keys = lock_keys(key)
        if validate.flag("reentrant", reentrant) and len(keys) > 1:
            raise ConfigurationError(
                f"reentrant=True takes one key, got key={list(keys)!r}: a lease on "
                "several keys is not re-entered (take the set once)"
            )
        lease_ttl = self.ttl if ttl is None else validate.seconds("ttl", ttl)
        if lease_ttl <= self.node_timeout:
            raise ConfigurationError(
                f"ttl ({lease_ttl}s) must be larger than node_timeout ({self.node_timeout}s)"
            )
        limit = validate.wait_limit("timeout", timeout)
        if not blocking and timeout is not None:
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
        return keys, lease_ttl, limit, token, holder or default_holder()

    def _acquire_steps(
        self,
        owner: object,
        lease_class: Callable[..., Lease],
        key: Union[str, Sequence[str]],
        ttl: Optional[Duration],
        blocking: bool,
        timeout: Optional[Duration],
        holder: Optional[str],
        token: Optional[str],
        reentrant: bool = False,
    ) -> Steps[Attempt]:
        """Attempts until won, or until ``blocking`` / ``timeout`` say to give up
        (``timeout=None`` or ``inf``: until won; ``retry_count`` then bounds only
        the attempts in a row that reached too few nodes, an outage). Between them
        a ``Pause``: a driver that hears releases waits for one, at most until the
        holder's lock expires; one that does not polls (``retry_delay`` x random
        0.5..1.5, less when the holder's lock expires sooner). The leases are
        ``lease_class(owner, ...)``.

        ``key``: one key, or a list of keys taken together (commands.py). A key this
        execution holds already (``_held``): ``AlreadyHeld`` at once, or with
        ``reentrant`` one more hold of its lease (``_reenter_steps``)."""
        keys, lease_ttl, limit, token, who = self._acquire_arguments(
            key, ttl, blocking, timeout, holder, token, reentrant
        )
        held = self._held.live(keys)
        if held is not None:
            if not reentrant or held.keys != keys:
                mine = next(k for k in keys if k in held.keys)
                raise AlreadyHeld(mine, self._held.execution())
            attempt = yield from self._reenter_steps(owner, lease_class, held, lease_ttl)
            if attempt.lease is not None:
                self._held.add(attempt.lease)
            return attempt
        give_up = None if limit is None else self._clock() + limit
        outages = 0
        while True:
            attempt = yield from self._attempt(owner, lease_class, keys, lease_ttl, who, token)
            if attempt.lease is not None:
                self._held.add(attempt.lease)
                return attempt
            if not blocking:
                return attempt
            outages = outages + 1 if attempt.unavailable is not None else 0
            if give_up is None and outages > self.retry_count:
                return attempt  # an outage, not contention: QuorumUnavailable
            pause = self._pause(keys, attempt.holder_ttl, give_up)
            if pause is None:
                return attempt
            yield pause

    def _pause(
        self, keys: Keys, holder_ttl: Optional[float], give_up: Optional[float]
    ) -> Optional[Pause]:
        """The wait after a refused attempt, or None when the timeout has run out."""
        poll = random.uniform(0.5, 1.5) * self.retry_delay
        longest = poll
        if holder_ttl is not None:
            # The holder's lock frees by then: come back just after it does.
            longest = holder_ttl + random.uniform(0.001, 0.005)
            poll = min(poll, longest)
        if give_up is not None:
            left = give_up - self._clock()
            if left <= 0:
                return None
            poll, longest = min(poll, left), min(longest, left)
        return Pause(poll, tuple(keys), longest)

    def _attempt(
        self, owner: object, lease_class: Callable[..., Lease], keys: Keys, ttl: float,
        holder: str, chosen: Optional[str],
    ) -> Steps[Attempt]:  # fmt: skip
        token = chosen or secrets.token_urlsafe(20)
        value = f"{token}|{holder}"
        command = acquire_command(keys, value, ttl, self.fencing)
        # Built only when needed (a lost or cancelled round): not on the hot path.
        undo = functools.partial(release_command, keys, value, ttl)
        started = self._clock()
        results = yield self._quorum_ask(command, is_granted, self.node_timeout, undo=undo)
        granted = [r for r in results if is_granted(r)]
        deadline = started + ttl - self._margin(ttl)
        if len(granted) >= self.quorum and self._clock() < deadline:
            fence = None
            if self.fencing:
                fence = yield from self._fence(keys, value, granted, deadline, undo)
            if fence is not None or not self.fencing:
                lease = lease_class(
                    owner, self._clock, lease_name(keys), token, holder, ttl, started, deadline,
                    fence, self.max_hold, keys=keys,
                )  # fmt: skip
                return Attempt(lease)
        # Lost: undo on every node, without waiting for anyone.
        yield Ask(undo(), 0.0, wait=False, deliver=True)
        return self._why_not(keys, results)

    def _fence(
        self,
        keys: Keys,
        value: str,
        granted: list[object],
        deadline: float,
        undo: Callable[[], Command],
    ) -> Steps[Optional[int]]:
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
        results = yield self._quorum_ask(command, is_one, min(self.node_timeout, left), undo)
        recorded = sum(1 for r in results if r == 1)
        if recorded >= self.quorum and self._clock() < deadline:
            return fence
        return None

    def _why_not(self, keys: Keys, results: list[object]) -> Attempt:
        """Contention or an outage? (acquire_replies.py)"""
        addresses = [n.address for n in self._nodes.nodes]
        return why_not(lease_name(keys), results, addresses, self.quorum)

    def _reenter_steps(
        self, owner: object, lease_class: Callable[..., Lease], held: Lease, ttl: float
    ) -> Steps[Attempt]:
        """One more hold of ``held``'s value (reentry.py): a new lease with ``held``'s
        token and fence, its validity never beyond ``held``'s (which the other holds
        keep up); or why not. One round, no retries."""
        yield Settle(held)  # no extension of the plain kind may land after REENTER
        held.count_holds()  # from now on its extends and release count holds too
        hold = secrets.token_urlsafe(9)
        started = self._clock()
        command = reenter_command(held.key, held.value, hold, ttl)
        undo = functools.partial(release_command, held.key, held.value, ttl, hold)
        results = yield self._quorum_ask(command, is_reentered, self.node_timeout, undo=undo)
        deadline = min(started + ttl - self._margin(ttl), held.deadline)
        if sum(1 for r in results if is_reentered(r)) >= self.quorum and self._clock() < deadline:
            lease = lease_class(
                owner, self._clock, held.key, held.token, held.holder, ttl, started, deadline,
                held.fence, self.max_hold,
            )  # fmt: skip
            lease.hold = hold
            return Attempt(lease)
        yield Ask(undo(), 0.0, wait=False, deliver=True)
        return self._why_not(held.keys, results)

    # -- extend, release, queries -----------------------------------------------------

    def _extend_steps(self, lease: Lease, ttl: float) -> Steps[Extension]:
        """Push ``lease``'s expiry to ``ttl`` seconds from now on every node (one
        round; its holds too, once re-entered). What the round asks for and what its
        replies mean: extend_replies.py (shared with the watchdog's batched renewal)."""
        started = self._clock()
        deadline = lease.deadline
        asked = extension_ttl(lease, ttl, started, self._margin)
        if isinstance(asked, Extension):
            return asked
        command = extend_command(lease.keys, lease.value, asked, lease.hold)
        timeout = min(self.node_timeout, deadline - started)
        results = yield self._quorum_ask(command, is_one, timeout)
        return extension_outcome(
            results, self.quorum, asked, started, self._clock(), deadline,
            self._margin(asked), self.node_timeout,
        )  # fmt: skip

    def _release_lease_steps(self, lease: Lease) -> Steps[bool]:
        """Release ``lease`` (one hold of it, once re-entered); this execution no
        longer holds it."""
        self._held.forget(lease)
        return (yield from self._release_steps(lease.keys, lease.value, lease.ttl, lease.hold))

    def _release_steps(
        self, keys: Keys, value: str, ttl: float, hold: Optional[str] = None
    ) -> Steps[bool]:
        # Stops at a quorum of deletions; otherwise hears every node (or times out),
        # to tell "not ours any more" from "too few answered".
        results = yield Ask(
            release_command(keys, value, ttl, hold),
            self.node_timeout,
            is_yes=is_one,
            enough_yes=self.quorum,
            deliver=True,  # every node, also those the round stops waiting for
        )
        return self._agreed(lease_name(keys), results, is_one)

    def _holder_steps(self, key: str) -> Steps[HolderInfo]:
        key = validate.lock_key_name(key, reserved=INTERNAL)
        results = yield Ask(Command(scripts.HOLDER, [key], []), self.node_timeout)
        holdings = []
        for node, reply in zip(self._nodes.nodes, results):
            if isinstance(reply, BaseException):
                holdings.append(NodeHolding(node.address, error=reply))
                continue
            value, pttl = reply if isinstance(reply, list) else (None, -2)
            holdings.append(read_holding(node.address, value, pttl))
        return HolderInfo(key, tuple(holdings), self.quorum)

    def _extend_value_steps(
        self, key: Union[str, Sequence[str]], value: str, ttl: Optional[Duration]
    ) -> Steps[bool]:
        keys = lock_keys(key)
        value = lease_value(value)
        new_ttl = self.ttl if ttl is None else validate.seconds("ttl", ttl)
        command = extend_command(keys, value, new_ttl)
        results = yield Ask(command, self.node_timeout, is_one, self.quorum)
        return self._agreed(lease_name(keys), results, is_one)

    def _locked_steps(self, key: str) -> Steps[bool]:
        key = validate.lock_key_name(key, reserved=INTERNAL)
        results = yield Ask(Command(scripts.HOLDER, [key], []), self.node_timeout)
        held = Counter(r[0] for r in results if isinstance(r, list) and r and r[0])
        top = held.most_common(1)[0][0] if held else None
        return self._agreed(
            key, results, lambda r: top is not None and isinstance(r, list) and r[0] == top
        )

    def _force_release_steps(self, key: str) -> Steps[int]:
        key = validate.lock_key_name(key, reserved=INTERNAL)
        self._forget_held(key=key)
        command = Command(scripts.FORCE_RELEASE, [key], [])
        results = yield Ask(command, self.node_timeout, deliver=True)
        self._answered_by_quorum(key, results)
        return sum(1 for r in results if r == 1)

    def _owned_steps(self, lease: Lease) -> Steps[bool]:
        command = owned_command(lease.keys, lease.value)
        results = yield Ask(command, self.node_timeout)
        return self._agreed(lease.key, results, owned_judge(lease.keys, lease.value))

    def _agreed(self, key: str, results: list[object], is_yes: Callable[[object], bool]) -> bool:
        """True when a quorum of ``results`` is yes; False when enough nodes answered
        no that a quorum of yes is impossible; otherwise the failures left it open:
        ``QuorumUnavailable``."""
        yes = sum(1 for r in results if is_answer(r) and is_yes(r))
        if yes >= self.quorum:
            return True
        no = sum(1 for r in results if is_answer(r) and r is not NOT_AWAITED and not is_yes(r))
        if no > len(results) - self.quorum:
            return False
        raise self._unavailable(key, results)

    def _answered_by_quorum(self, key: str, results: list[object]) -> None:
        if sum(1 for r in results if is_answer(r)) < self.quorum:
            raise self._unavailable(key, results)

    def _unavailable(self, key: str, results: list[object]) -> QuorumUnavailable:
        errors = {
            node.address: r
            for node, r in zip(self._nodes.nodes, results)
            if isinstance(r, BaseException)
        }
        return QuorumUnavailable(key, errors, self.quorum)
