"""Queue-once places that a newer copy replaces (``redlock_on_queued="replace"``), the
lock nodes' side (no Celery).

A queue place is an ordinary lock key (``<key>:queued``) whose value names the queued
copy (``token|task id``). Replacing the queued copy V by a newer copy N is decided by
V's *fate*: a claim record per node (the hand-off claim of waiters.py, keyed by V's
task id under the place), written once with SET NX and never changed. V claims its
own fate when it starts; a replacer claims V's fate for N. Whoever the claim verdict
names decides: N -> V never runs its body; V -> V has started and cannot be replaced.
Two replacers of V cannot both win, and neither can V and a replacer. The place
itself then names N (:func:`swap`, best effort: a replacer that finds the place still
naming V follows V's fate to N).

The protocol, its model and what it does not promise: SAFETY.md, "Replacing the
pending copy"; the Celery side is tasks/replace.py.

Imports node_set.py, resp.py, scripts.py, commands.py and waiters.py only.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..wire.node_set import NodeSet
from ..wire.resp import Command
from . import scripts, waiters
from .commands import ms

__all__ = ["fate", "swap", "swap_command"]


def fate(
    nodes: NodeSet,
    quorum: int,
    place: str,
    copy: str,
    claimant: str,
    ttl: float,
    timeout: float,
) -> waiters.Claim:
    """Claim ``copy``'s fate for ``claimant`` (``copy`` itself when it starts, a newer
    copy replacing it) on every node, kept ``ttl`` s: the claim's verdict and winner."""
    return waiters.claim(nodes, quorum, place, copy, claimant, ttl, timeout)


def swap_command(place: str, holders: Sequence[str], value: str, ttl: float) -> Command:
    return Command(scripts.SWAP_PLACE, [place], [value, ms(ttl), *holders])


def swap(
    nodes: NodeSet,
    quorum: int,
    place: str,
    holders: Sequence[str],
    value: str,
    ttl: float,
    timeout: float,
) -> bool:
    """Make ``place`` hold ``value`` for ``ttl`` s on every node where it names one of
    ``holders`` (copies replaced, or started) or is free: True when a quorum did."""
    results = nodes.round(swap_command(place, holders, value, ttl), timeout, deliver=True)
    return sum(1 for r in results if r == 1) >= quorum
