"""The Redlock rules both drivers share: what each operation sends, what replies mean.

The synchronous lock (redlock.py) and the asyncio one (asyncio/) differ only in how
a round's I/O is done. Everything decided from a round's replies lives here once, in
``LockRules``: an object each lock *has* (``redlock._rules``), holding the lock's
``Settings`` (settings.py), its node addresses and their count (so the quorum), the
record of the leases each execution holds (``HeldLeases``, reentry.py) and the
lock's clock, and writing the steps of every operation (acquire, re-acquire, fence,
extend, release, holder, locked, force_release, owned, extend_value) as generator
methods. The pure pieces they use have their own rooms: quorum.py (arithmetic,
reply predicates, argument checks), steps.py (the step types), commands.py (what
each operation sends, for one key or a set of keys), acquire_replies.py (granted,
or why not: ``Attempt``, ``why_not``), extend_replies.py (what an extension asks for
and what its replies mean), reentry.py (which execution holds which key, how a
REENTER reply reads).

How an operation is written: *steps*, a generator that yields what it needs done
and returns the operation's value. It yields

- ``Ask``: one round -- the command to every node, its deadline, when it is decided
  (``is_yes``, ``enough_yes``/``enough_no``), and an ``undo`` sent without waiting
  if the round is abandoned (a cancelled asyncio acquire); it is sent the round's
  per-node results, in node order (a reply, a redis-py error, or ``NOT_AWAITED``);
- ``Pause``: a wait between acquire attempts, which a driver that hears releases
  (redlock.py through wake.py) ends at the key's release; sent ``[]``;
- ``Settle``: wait until no extension round of a lease is in flight; sent ``[]``.

A driver runs the steps with its own I/O: ``steps.drive`` over ``NodeSet.round``
(``Redlock._drive``), an ``await`` per round in asyncio/redlock.py's
``AsyncRedlock._drive``::

    results = yield Ask(command, settings.node_timeout)   # sync: NodeSet.round(...)

Steps compose with ``yield from`` (an acquire is attempts, an attempt may be
followed by its fence round, a re-acquire is a ``Settle`` then a round), so both
drivers run every operation unchanged, and tests drive them with scripted replies
and a fake clock (tests/lock/test_steps.py). To extend: what a round *sends* is a
builder in commands.py (one key or a set of keys: ``acquire(["a", "b"])`` passes
``Keys`` through the same steps, and the multi-key scripts reply in the single-key
shapes, so the judging here is shared); what a new operation *decides* is one more
generator here; a new kind of round (e.g. several commands per node) is a new
field of ``Ask`` or a new step type in steps.py and one branch in each driver's
``_drive`` (``steps.drive``, ``AsyncRedlock._drive``). No sockets: reads the
clocks it was given only. Must not import node_set.py, redlock.py, clear.py,
asyncio or Celery.
"""

from __future__ import annotations

import functools
import random
import secrets
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any, Callable, Optional, TypeVar, Union

from ..errors import AlreadyHeld, QuorumUnavailable
from ..wire.resp import Command
from ..wire.round import NOT_AWAITED
from . import permit_steps, scripts, validate
from .acquire_replies import UNAVAILABLE, Attempt, is_granted, is_refused, why_not
from .commands import (
    Keys,
    acquire_command,
    extend_command,
    extend_value_command,
    fence_command,
    lease_name,
    lock_keys,
    owned_command,
    owned_judge,
    reenter_command,
    release_command,
)
from .extend_replies import extension_outcome, extension_ttl
from .lease import Duration, Extension, LeaseState
from .permit_steps import permit_attempt_steps
from .permits import Terms
from .quorum import enough_no, is_answer, is_one, lease_value, quorum
from .reentry import HeldLeases, is_reentered
from .settings import Settings, holder_argument
from .steps import Ask, Pause, Settle, Steps
from .stored import INTERNAL, HolderInfo, NodeHolding, read_holding

__all__ = ["LockRules", "wall_clock_us"]

#: The kind of lease an acquire makes (``Lease``, ``AsyncLease``).
L = TypeVar("L", bound=LeaseState)


def wall_clock_us() -> int:
    """Wall-clock microseconds: a fence's lower bound (see ``LockRules.fence_steps``)."""
    return time.time_ns() // 1000


class LockRules:
    """The steps of every operation of one lock, and what they read: the lock's
    settings, node addresses, held leases and clocks (shared by ``Redlock`` and
    ``AsyncRedlock``, each of which has one and drives its steps)."""

    __slots__ = ("addresses", "clock", "enough_no", "held", "quorum", "settings", "wall_us")

    def __init__(
        self,
        settings: Settings,
        addresses: Sequence[str],
        held: HeldLeases,
        clock: Callable[[], float],
        wall_us: Callable[[], int] = wall_clock_us,
    ) -> None:
        self.settings = settings
        #: The nodes' addresses, in node order: a round's results come in this order.
        self.addresses = tuple(addresses)
        self.quorum = quorum(len(self.addresses))
        #: Noes that rule a quorum out: a round can stop there.
        self.enough_no = enough_no(len(self.addresses))
        #: Which leases each execution won through this lock (reentry.py).
        self.held = held
        #: The lock's monotonic clock: validity counts on it.
        self.clock = clock
        #: Wall-clock microseconds, a fence's lower bound.
        self.wall_us = wall_us

    def quorum_ask(
        self,
        command: Command,
        is_yes: Callable[[object], bool],
        timeout: float,
        undo: Optional[Callable[[], Command]] = None,
    ) -> Ask:
        """A round that stops as soon as a quorum said yes, or can no longer."""
        return Ask(command, timeout, is_yes, self.quorum, self.enough_no, undo=undo)

    # -- acquire ------------------------------------------------------------------

    def acquire_steps(
        self,
        owner: object,
        lease_class: Callable[..., L],
        key: Union[str, Sequence[str]],
        ttl: Optional[Duration],
        blocking: bool,
        timeout: Optional[Duration],
        holder: Optional[str],
        token: Optional[str],
        reentrant: bool = False,
        limit: object = 1,
    ) -> Steps[Attempt[L]]:
        """Attempts until won, or until ``blocking`` / ``timeout`` say to give up
        (``timeout=None`` or ``inf``: until won; ``retry_count`` then bounds only
        the attempts in a row that reached too few nodes, an outage -- never a
        split vote, see acquire_replies.py). Between them
        a ``Pause``: a driver that hears releases waits for one, at most until the
        holder's lock expires; one that does not polls (``retry_delay`` x random
        0.5..1.5, less when the holder's lock expires sooner). The leases are
        ``lease_class(owner, ...)``.

        ``key``: one key, or a list of keys taken together (commands.py). A key this
        execution holds already (``held``): ``AlreadyHeld`` at once, or with
        ``reentrant`` one more hold of its lease (``reenter_steps``).

        ``limit``: how many may hold ``key`` at once (permits.py); above 1 the lease
        is on one of its permits (one key, not re-entered)."""
        keys, lease_ttl, wait, token, who = self.settings.acquire_arguments(
            key, ttl, blocking, timeout, holder, token, reentrant
        )
        terms = self.settings.permit_terms(keys, limit, reentrant)
        held = self.held.live(keys)
        if held is not None:
            if not reentrant or held.keys != keys:
                mine = next(k for k in keys if k in held.keys)
                raise AlreadyHeld(mine, self.held.execution())
            attempt = yield from self.reenter_steps(owner, lease_class, held, lease_ttl)
            if attempt.lease is not None:
                self.held.add(attempt.lease)
            return attempt
        give_up = None if wait is None else self.clock() + wait
        outages = 0
        while True:
            if terms is None:
                attempt = yield from self.attempt_steps(
                    owner, lease_class, keys, lease_ttl, who, token
                )
            else:
                attempt = yield from permit_attempt_steps(
                    self, owner, lease_class, keys[0], terms, lease_ttl, who, token
                )
            if attempt.lease is not None:
                self.held.add(attempt.lease)
                return attempt
            if not blocking:
                return attempt
            # Only an outage counts; a split vote (a quorum answered, nobody won) is
            # contention, however many nodes are down besides.
            outages = outages + 1 if attempt.verdict == UNAVAILABLE else 0
            if give_up is None and outages > self.settings.retry_count:
                return attempt  # an outage, not contention: QuorumUnavailable
            pause = self.pause(keys, attempt.holder_ttl, give_up)
            if pause is None:
                return attempt
            # Refused by a quorum: only what frees on a refusing node can let the next
            # attempt win (wake.py).
            pause = pause._replace(wake_on=attempt.refused_on)
            if terms is not None and attempt.split:
                # Callers that split the permits all lost: each backs off at random,
                # not woken together by the next release (they would split again).
                # The whole poll, not a few rounds: the callers asleep are out of
                # the race (16 threads on a limit of 3 held 2 ms each got 3x fewer
                # holds when split callers came back within a few rounds).
                pause = pause._replace(keys=())
            yield pause

    def pause(
        self, keys: Keys, holder_ttl: Optional[float], give_up: Optional[float]
    ) -> Optional[Pause]:
        """The wait after a refused attempt, or None when the timeout has run out."""
        poll = random.uniform(0.5, 1.5) * self.settings.retry_delay
        longest = poll
        if holder_ttl is not None:
            # The holder's lock frees by then: come back just after it does.
            longest = holder_ttl + random.uniform(0.001, 0.005)
            poll = min(poll, longest)
        if give_up is not None:
            left = give_up - self.clock()
            if left <= 0:
                return None
            poll, longest = min(poll, left), min(longest, left)
        return Pause(poll, tuple(keys), longest)

    def attempt_steps(
        self, owner: object, lease_class: Callable[..., L], keys: Keys, ttl: float,
        holder: str, chosen: Optional[str],
    ) -> Steps[Attempt[L]]:  # fmt: skip
        """One acquire round (and a fenced lock's fence round): the lease, or why not;
        a lost round is undone on every node, unless every node refused it."""
        settings = self.settings
        token = chosen or secrets.token_urlsafe(20)
        value = f"{token}|{holder}"
        command = acquire_command(keys, value, ttl, settings.fencing)
        # Built only when needed (a lost or cancelled round): not on the hot path.
        undo = functools.partial(release_command, keys, value, ttl)
        clock = self.clock
        started = clock()
        results = yield self.quorum_ask(command, is_granted, settings.node_timeout, undo=undo)
        granted = [r for r in results if is_granted(r)]
        deadline = started + ttl - settings.margin(ttl)
        if len(granted) >= self.quorum and clock() < deadline:
            fence = None
            if settings.fencing:
                fence = yield from self.fence_steps(keys, value, granted, deadline, undo)
            if fence is not None or not settings.fencing:
                lease = lease_class(
                    owner, clock, lease_name(keys), token, holder, ttl, started, deadline,
                    fence, settings.max_hold, keys=keys,
                )  # fmt: skip
                return Attempt(lease)
        # Lost: undo on every node, without waiting for anyone -- unless every node
        # refused (each ran the script and set nothing of ours; a node not heard
        # from may still apply our SET, hence the undo's tombstone). A refusal used
        # to cost a second script on every node.
        if not all(map(is_refused, results)):
            yield Ask(undo(), 0.0, wait=False, deliver=True)
        return self.why_not(keys, results)

    def fence_steps(
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
        fence = max(max(counters, default=0) + 1, self.wall_us())
        left = deadline - self.clock()
        if left <= 0:
            return None
        command = fence_command(keys, value, fence)
        results = yield self.quorum_ask(
            command, is_one, min(self.settings.node_timeout, left), undo
        )
        recorded = sum(1 for r in results if r == 1)
        if recorded >= self.quorum and self.clock() < deadline:
            return fence
        return None

    def why_not(self, keys: Keys, results: list[object]) -> Attempt[Any]:
        """Contention, a split vote or an outage? (acquire_replies.py)"""
        return why_not(lease_name(keys), results, self.addresses, self.quorum)

    def reenter_steps(
        self, owner: object, lease_class: Callable[..., L], held: LeaseState, ttl: float
    ) -> Steps[Attempt[L]]:
        """One more hold of ``held``'s value (reentry.py): a new lease with ``held``'s
        token and fence, its validity never beyond ``held``'s (which the other holds
        keep up); or why not. One round, no retries."""
        yield Settle(held)  # no extension of the plain kind may land after REENTER
        held.count_holds()  # from now on its extends and release count holds too
        hold = secrets.token_urlsafe(9)
        started = self.clock()
        command = reenter_command(held.key, held.value, hold, ttl)
        undo = functools.partial(release_command, held.key, held.value, ttl, hold)
        results = yield self.quorum_ask(
            command, is_reentered, self.settings.node_timeout, undo=undo
        )
        deadline = min(started + ttl - self.settings.margin(ttl), held.deadline)
        if sum(1 for r in results if is_reentered(r)) >= self.quorum and self.clock() < deadline:
            lease = lease_class(
                owner, self.clock, held.key, held.token, held.holder, ttl, started, deadline,
                held.fence, self.settings.max_hold,
            )  # fmt: skip
            lease.hold = hold
            return Attempt(lease)
        yield Ask(undo(), 0.0, wait=False, deliver=True)
        return self.why_not(held.keys, results)

    def admit_steps(
        self, key: str, rate: object, holder: Optional[str], timeout: object,
        reserve: Optional[bool] = None,
    ) -> Steps[float]:  # fmt: skip
        """Tries to start under ``rate`` on ``key`` (permit_steps.admit_steps), with
        a ``Pause`` until the window admits one, for up to ``timeout`` seconds
        (None: until admitted): 0.0 once admitted, else the wait still needed.
        ``reserve`` (default: when it waits) takes a turn when refused."""
        key = validate.lock_key_name(key, reserved=INTERNAL)
        terms = Terms.rate(rate)
        who = holder_argument(holder)
        limit = validate.wait_limit("timeout", timeout)
        turns = limit != 0 if reserve is None else validate.flag("reserve", reserve)
        give_up = None if limit is None else self.clock() + limit
        while True:
            wait = yield from permit_steps.admit_steps(self, key, terms, who, turns)
            if wait == 0.0:
                return 0.0
            if give_up is not None and give_up - self.clock() < wait:
                return wait
            yield Pause(wait)

    # -- extend, release, queries -----------------------------------------------------

    def extend_steps(self, lease: LeaseState, ttl: float) -> Steps[Extension]:
        """Push ``lease``'s expiry to ``ttl`` seconds from now on every node (one
        round; its holds too, once re-entered). What the round asks for and what its
        replies mean: extend_replies.py (shared with the watchdog's batched renewal)."""
        started = self.clock()
        deadline = lease.deadline
        asked = extension_ttl(lease, ttl, started, self.settings.margin)
        if isinstance(asked, Extension):
            return asked
        command = extend_command(lease.keys, lease.value, asked, lease.hold)
        timeout = min(self.settings.node_timeout, deadline - started)
        results = yield self.quorum_ask(command, is_one, timeout)
        return extension_outcome(
            results, self.quorum, asked, started, self.clock(), deadline,
            self.settings.margin(asked), self.settings.node_timeout,
        )  # fmt: skip

    def release_lease_steps(self, lease: LeaseState) -> Steps[bool]:
        """Release ``lease`` (one hold of it, once re-entered); this execution no
        longer holds it."""
        self.held.forget(lease)
        return (yield from self.release_steps(lease.keys, lease.value, lease.ttl, lease.hold))

    def release_steps(
        self, keys: Keys, value: str, ttl: float, hold: Optional[str] = None
    ) -> Steps[bool]:
        # Stops at a quorum of deletions; otherwise hears every node (or times out),
        # to tell "not ours any more" from "too few answered".
        results = yield Ask(
            release_command(keys, value, ttl, hold),
            self.settings.node_timeout,
            is_yes=is_one,
            enough_yes=self.quorum,
            deliver=True,  # every node, also those the round stops waiting for
        )
        return self.agreed(lease_name(keys), results, is_one)

    def holder_steps(self, key: str) -> Steps[HolderInfo]:
        key = validate.lock_key_name(key, reserved=INTERNAL)
        results = yield Ask(Command(scripts.HOLDER, [key], []), self.settings.node_timeout)
        holdings = []
        for address, reply in zip(self.addresses, results):
            if isinstance(reply, BaseException):
                holdings.append(NodeHolding(address, error=reply))
                continue
            value, pttl = reply if isinstance(reply, list) else (None, -2)
            holdings.append(read_holding(address, value, pttl))
        return HolderInfo(key, tuple(holdings), self.quorum)

    def extend_value_steps(
        self, key: Union[str, Sequence[str]], value: str, ttl: Optional[Duration]
    ) -> Steps[bool]:
        keys = lock_keys(key)
        value = lease_value(value)
        new_ttl = self.settings.ttl if ttl is None else validate.seconds("ttl", ttl)
        command = extend_value_command(keys, value, new_ttl)
        results = yield Ask(command, self.settings.node_timeout, is_one, self.quorum)
        return self.agreed(lease_name(keys), results, is_one)

    def locked_steps(self, key: str) -> Steps[bool]:
        key = validate.lock_key_name(key, reserved=INTERNAL)
        results = yield Ask(Command(scripts.HOLDER, [key], []), self.settings.node_timeout)
        held = Counter(r[0] for r in results if isinstance(r, list) and r and r[0])
        top = held.most_common(1)[0][0] if held else None
        return self.agreed(
            key, results, lambda r: top is not None and isinstance(r, list) and r[0] == top
        )

    def force_release_steps(self, key: str) -> Steps[int]:
        key = validate.lock_key_name(key, reserved=INTERNAL)
        self.held.forget_keys(key=key)
        command = Command(scripts.FORCE_RELEASE, [key], [])
        results = yield Ask(command, self.settings.node_timeout, deliver=True)
        self.answered_by_quorum(key, results)
        return sum(1 for r in results if r == 1)

    def owned_steps(self, lease: LeaseState) -> Steps[bool]:
        command = owned_command(lease.keys, lease.value)
        results = yield Ask(command, self.settings.node_timeout)
        return self.agreed(lease.key, results, owned_judge(lease.keys, lease.value))

    def agreed(self, key: str, results: list[object], is_yes: Callable[[object], bool]) -> bool:
        """True when a quorum of ``results`` is yes; False when enough nodes answered
        no that a quorum of yes is impossible; otherwise the failures left it open:
        ``QuorumUnavailable``."""
        yes = len([r for r in results if is_answer(r) and is_yes(r)])
        if yes >= self.quorum:
            return True
        no = sum(1 for r in results if is_answer(r) and r is not NOT_AWAITED and not is_yes(r))
        if no >= enough_no(len(results), self.quorum):
            return False
        raise self.unavailable(key, results)

    def answered_by_quorum(self, key: str, results: list[object]) -> None:
        if sum(1 for r in results if is_answer(r)) < self.quorum:
            raise self.unavailable(key, results)

    def unavailable(self, key: str, results: list[object]) -> QuorumUnavailable:
        errors = {
            address: r
            for address, r in zip(self.addresses, results)
            if isinstance(r, BaseException)
        }
        return QuorumUnavailable(key, errors, self.quorum)
