"""Hand-off to waiting duplicates, the lock nodes' side (no Celery).

A copy of a task that meets a held lock *registers* as a waiter on every node
(``register``) before it publishes its fallback retry; the holder, once it has
released, *pops* the earliest live waiter (``pop_next``) and publishes the message
stored with it at once; a copy carrying a waiter id *claims* it (``claim``) before
anything else, so that of a waiter's wake copy and fallback copy exactly one goes
on. The protocol, its argument and its model: SAFETY.md, "Hand-off to waiting
duplicates", and ``tools/modelcheck/handoff.py``.

Internal keys sit behind a NUL, like the fence counter and the tombstones
(stored.py): ``<key>\\0waiters`` (sorted set of waiter ids, scored by arrival),
``<key>\\0waiter\\0<id>`` (the message to publish), ``<key>\\0claim\\0<id>`` (the
copy id that won). Every one of them expires.

Imports node_set.py, resp.py, scripts.py, commands.py, quorum.py, stored.py and
acquire_replies.py (the round verdict) only:
no Celery, no redlock.py.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import NamedTuple, Optional

from ..wire.node_set import NodeSet
from ..wire.resp import Command
from . import scripts
from .acquire_replies import CONTENDED, GRANTED, UNAVAILABLE, verdict
from .commands import ms
from .quorum import is_answer
from .stored import INTERNAL, LIMIT, permit_full

__all__ = [
    "CLAIM_LOST",
    "CLAIM_SPLIT",
    "CLAIM_UNDECIDED",
    "CLAIM_WON",
    "Registration",
    "Waiter",
    "claim",
    "claim_command",
    "claim_verdict",
    "claim_winner",
    "claimed_by_another",
    "may_be_claimed_by",
    "may_be_mine",
    "pop_command",
    "pop_next",
    "read_claim",
    "register",
    "register_command",
]

CLAIM_WON, CLAIM_LOST, CLAIM_UNDECIDED = "won", "lost", "undecided"
#: Undecided too, but a quorum answered: the ids split the nodes, no outage.
CLAIM_SPLIT = "split"


def queue_key(key: str) -> str:
    return f"{key}{INTERNAL}waiters"


def message_prefix(key: str) -> str:
    return f"{key}{INTERNAL}waiter{INTERNAL}"


def register_command(
    key: str, waiter: str, score: int, message: str, ttl: float, limit: Optional[int] = 1
) -> Command:
    """Put ``waiter`` in ``key``'s queue at ``score`` with ``message``, for ``ttl`` s,
    unless a copy of it has claimed it on that node; and tell whether ``key`` looks
    taken there (``limit`` 1: the lock key; N: the note that all N permits are taken;
    None: nothing to tell, as taken)."""
    keys = [queue_key(key), message_prefix(key) + waiter, claim_key(key, waiter)]
    if limit == 1:
        keys.append(key)
    elif limit is not None:
        keys.append(permit_full(key, LIMIT))
    return Command(scripts.REGISTER_WAITER, keys, [waiter, score, message, ms(ttl)])


def pop_command(key: str) -> Command:
    return Command(scripts.POP_WAITER, [queue_key(key)], [message_prefix(key)])


def claim_key(key: str, waiter: str) -> str:
    return f"{key}{INTERNAL}claim{INTERNAL}{waiter}"


def claim_command(key: str, waiter: str, copy: str, ttl: float) -> Command:
    return Command(
        scripts.CLAIM_WAITER,
        [claim_key(key, waiter), queue_key(key), message_prefix(key) + waiter],
        [copy, ms(ttl), waiter],
    )


def read_claim_command(key: str, waiter: str) -> Command:
    """Read-only: ``{copy id or nil, pttl}`` of ``waiter``'s claim."""
    return Command(scripts.HOLDER, [claim_key(key, waiter)], [])


@dataclass(frozen=True)
class Waiter:
    """A popped waiter: its id, its arrival score and the message to publish."""

    waiter: str
    score: float
    message: str


class Registration(NamedTuple):
    """A registration round's outcome."""

    #: The nodes that queued the waiter (a node where it is claimed does not).
    queued: int
    #: Of those, the nodes where the lock (with a limit, a permit) was free by then.
    free: int


def register(
    nodes: NodeSet, key: str, waiter: str, score: int, message: str, ttl: float,
    timeout: float, limit: Optional[int] = 1,
) -> Registration:  # fmt: skip
    """Register on every node (best effort: the queue is a hint), reading in the same
    script whether ``key`` is still taken there (see :func:`register_command`).

    A release between the waiter's refused attempt and its registration found it
    not queued and may have woken nobody; on a node where it did, the release came
    first, so the registration there sees the lock (a permit) free: the caller wakes
    the queue itself when a quorum of nodes does (``free``)."""
    command = register_command(key, waiter, score, message, ttl, limit)
    results = nodes.round(command, timeout)
    return Registration(
        queued=sum(1 for r in results if r in (1, 2)), free=sum(1 for r in results if r == 2)
    )


def pop_next(nodes: NodeSet, key: str, timeout: float) -> Optional[Waiter]:
    """Pop the earliest live waiter on each node; the earliest of those popped.

    Nodes may pop different waiters (a registration that reached only some nodes):
    the others stay queued where they were not popped and a later release wakes them.
    None when no node had a live waiter (or none answered).
    """
    popped = []
    for reply in nodes.round(pop_command(key), timeout, deliver=True):
        if isinstance(reply, list) and len(reply) == 3:
            waiter, score, message = (_text(part) for part in reply)
            popped.append(Waiter(waiter, float(score), message))
    return min(popped, key=lambda w: (w.score, w.waiter)) if popped else None


def claim_verdict(results: list[object], copy: str, quorum: int) -> str:
    """What a claim round's replies say for ``copy``: won, lost, split or undecided.

    Read with the one round verdict (acquire_replies.py), each reply naming the copy
    id a node keeps. A copy id held by a quorum wins; both copies cannot see that for
    different ids, because two quorums share a node and a node's claim never
    changes. When every node answered and no id has a quorum, the id on the most
    nodes wins, ties going to the smallest: the values are final, so every copy
    computes the same winner. Otherwise nobody can tell yet, and the copy tries
    again later: ``CLAIM_SPLIT`` when a quorum answered (the ids split the nodes,
    one node down besides: contention, not an outage), ``CLAIM_UNDECIDED`` when too
    few did (an outage).
    """
    judged = verdict(results, quorum, lambda r: _named(r) == copy, _named)
    if judged == GRANTED:
        return CLAIM_WON
    if judged == CONTENDED:
        return CLAIM_LOST
    if judged == UNAVAILABLE:
        return CLAIM_UNDECIDED
    winner = claim_winner(results, quorum)  # here: the plurality of a full claim
    if winner is not None:
        return CLAIM_WON if winner == copy else CLAIM_LOST
    return CLAIM_SPLIT


def _named(reply: object) -> Optional[str]:
    """The copy id a node's claim reply names, if it names one."""
    return _text(reply) if is_answer(reply) and isinstance(reply, (bytes, str)) else None


class Claim(NamedTuple):
    """A claim round's outcome: the verdict, each node that did not answer, and the
    copy id that won (None while undecided)."""

    verdict: str
    #: The silent or failing nodes (address -> error): why a claim is undecided.
    errors: dict[str, object]
    winner: Optional[str] = None


def claim_winner(results: list[object], quorum: int) -> Optional[str]:
    """The copy id a claim round's replies settle on: one on a quorum, or, when every
    node answered with one, the plurality (ties to the smallest); else None."""
    held = [n for n in map(_named, results) if n is not None]
    counts = Counter(held)
    for value, count in counts.items():
        if count >= quorum:
            return value
    if held and len(held) == len(results):
        return min(counts, key=lambda v: (-counts[v], v))
    return None


def claim(
    nodes: NodeSet, quorum: int, key: str, waiter: str, copy: str, ttl: float, timeout: float
) -> Claim:
    """Claim ``waiter`` for ``copy`` on every node (SET NX, kept ``ttl`` s): the verdict.

    The round waits for every node (up to ``timeout``): an early stop would turn a
    tie that every answer could settle into an undecided claim.
    """
    results = nodes.round(claim_command(key, waiter, copy, ttl), timeout, deliver=True)
    errors: dict[str, object] = {
        node.address: r for node, r in zip(nodes.nodes, results) if isinstance(r, BaseException)
    }
    return Claim(claim_verdict(results, copy, quorum), errors, claim_winner(results, quorum))


def read_claim(nodes: NodeSet, key: str, waiter: str, timeout: float) -> list[object]:
    """The copy id each node's claim of ``waiter`` holds (nil where none; the error
    where a node did not answer), in node order. One read round; changes nothing."""
    results = nodes.round(read_claim_command(key, waiter), timeout)
    return [r[0] if isinstance(r, list) and r else r for r in results]


def may_be_claimed_by(
    nodes: NodeSet, quorum: int, key: str, waiter: str, copy: str, timeout: float
) -> bool:
    """Whether ``waiter``'s claim is, or may yet prove to be, ``copy``'s (one read
    round, :func:`read_claim`, judged by :func:`may_be_mine`).

    A claim is final once set, and only the message that won it carries its copy id:
    when that message's run dies in the body and the broker delivers it again, no
    other copy of the waiter can ever run it (tasks/handoff.py, ``settle_by_claim``).
    """
    return may_be_mine(read_claim(nodes, key, waiter, timeout), copy, quorum)


def may_be_mine(values: list[object], copy: str, quorum: int) -> bool:
    """Whether the claim ``values`` read (:func:`read_claim`) is, or may yet prove to
    be, ``copy``'s: False only when they rule it out even if every node that did not
    answer names ``copy`` (another copy holds a quorum, or would win the plurality of
    a full claim), and no node that answered names it."""
    judged = claim_verdict(values, copy, quorum)
    if judged in (CLAIM_WON, CLAIM_UNDECIDED):
        return True
    if judged == CLAIM_LOST:
        return False
    if any(_named(value) == copy for value in values):
        return True
    # A split: the nodes that did not answer may hold ``copy``, which could then win
    # the plurality of a claim every node holds (their claims are final).
    silent = [copy if not is_answer(value) else value for value in values]
    return claim_verdict(silent, copy, quorum) == CLAIM_WON


def claimed_by_another(values: list[object], copy: str, quorum: int) -> Optional[str]:
    """The copy id other than ``copy`` that the claim ``values`` read
    (:func:`read_claim`) settle on for good -- one on a quorum, or the plurality of a
    claim every node answered -- else None. Claims never change once set, so every
    claim round of ``copy`` would lose to it: that copy ran the waiter, is running it,
    or gave it up."""
    winner = claim_winner(values, quorum)
    return winner if winner is not None and winner != copy else None


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
