"""Asking the nodes without a lease, and operators' deletions: ``LockQueries``.

``Redlock`` inherits these calls: ``extend_value`` (a lease handed over by value),
``locked`` (does a quorum hold the key?), ``force_release`` (one key, no token
check) and ``clear`` (every lock key matching a glob, node by node with SCAN), run
on the synchronous driver; their steps, and the rule that turns a round's replies
into True, False or ``QuorumUnavailable``, are rules.py's (shared with asyncio/).
Fence counters are never deleted (fences must never go backwards) and tombstones
expire by themselves: both sit behind a NUL (see stored.py) and are skipped.

Must not import redlock.py or Celery.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable, Optional, Protocol, TypeVar, Union

from ..errors import QuorumUnavailable
from ..wire.node_set import NodeSet
from .commands import ms
from .lease import Duration, Lease
from .quorum import TOKEN_LENGTH, clear_match, is_answer, is_one, lease_value, token_argument
from .rules import LockRules
from .steps import Ask, Steps, drive
from .stored import is_lock_key

T = TypeVar("T")

__all__ = [
    "TOKEN_LENGTH",
    "LockQueries",
    "clear_matching",
    "is_answer",
    "is_one",
    "lease_value",
    "ms",
    "token_argument",
]

#: Keys deleted per DEL while clearing.
BATCH = 500


class InspectableNode(Protocol):
    address: str

    def client(self) -> Any: ...


def _clear_node(client: Any, match: str) -> set[bytes]:
    deleted: set[bytes] = set()
    batch: list[bytes] = []

    def flush() -> None:
        if batch:
            pipe = client.pipeline(transaction=False)
            for name in batch:
                pipe.delete(name)
            deleted.update(n for n, gone in zip(batch, pipe.execute()) if gone)
            batch.clear()

    for name in client.scan_iter(match=match, count=BATCH):
        raw = name if isinstance(name, bytes) else str(name).encode()
        if is_lock_key(raw.decode("utf-8", "replace")):
            batch.append(raw)
            if len(batch) >= BATCH:
                flush()
    flush()
    return deleted


def clear_matching(nodes: Sequence[InspectableNode], match: str, quorum: int) -> int:
    """Delete every lock key matching ``match`` on every node; how many distinct keys
    went. ``QuorumUnavailable`` when fewer than ``quorum`` nodes could be cleared
    (the others are cleared all the same)."""
    deleted: set[bytes] = set()
    errors: dict[str, object] = {}
    for node in nodes:
        try:
            deleted |= _clear_node(node.client(), match)
        except Exception as exc:  # redis errors, refused connections: name the node
            errors[node.address] = exc
    if len(nodes) - len(errors) < quorum:
        raise QuorumUnavailable(match, errors, quorum)
    return len(deleted)


class LockQueries(LockRules):
    """Rounds that need no lease of ours, run by the synchronous driver (their
    steps, and how a round's replies read, are ``LockRules``')."""

    _nodes: NodeSet
    _sleep: Callable[[float], None]

    def _drive(self, steps: Steps[T]) -> T:
        """Run an operation's steps, each round on this lock's nodes."""
        return drive(steps, self._round_trip, self._sleep)

    def _round_trip(self, ask: Ask) -> list[object]:
        return self._nodes.round(
            ask.command, ask.timeout, ask.is_yes, ask.enough_yes, ask.enough_no, ask.wait,
            ask.deliver,
        )  # fmt: skip

    def extend_value(
        self, key: Union[str, Sequence[str]], value: str, ttl: Optional[Duration] = None
    ) -> bool:
        """Push ``key``'s expiry to ``ttl`` seconds from now (default: this lock's
        ttl) on all nodes where it still holds ``value`` (a lease's ``token|holder``),
        for a process that holds no ``Lease`` but was handed the value. ``key`` may be
        the list of keys a lease took together (each node extends all or none).

        True when a quorum extended it; False when it is no longer that holder's
        (too many nodes answered that it is not); ``QuorumUnavailable`` when too few
        answered to tell. Unlike ``Lease.extend`` there is no local validity to
        check: the caller knows nothing of the round that won the lock.
        """
        return self._drive(self._extend_value_steps(key, value, ttl))

    def locked(self, key: str) -> bool:
        """True when a quorum of nodes holds ``key`` under one value (someone holds
        the lock); False when too many nodes answered otherwise for that to be so.
        One read round; ``QuorumUnavailable`` when too few nodes answered to tell."""
        return self._drive(self._locked_steps(key))

    def force_release(self, key: str) -> int:
        """Delete ``key`` on every node whoever holds it; how many nodes deleted it.

        For operators (a stuck lock): it ends mutual exclusion for a holder that may
        still be working. Its fence counter is kept -- fences never go backwards --
        and tombstones expire by themselves. ``QuorumUnavailable`` when fewer than a
        quorum answered (the lock may still be held).
        """
        return self._drive(self._force_release_steps(key))

    def clear(self, match: str = "*") -> int:
        """Force-release every lock key matching the glob ``match`` on every node
        (SCAN per node); how many distinct keys were deleted. Fence counters and
        tombstones are skipped (see ``force_release``); every other matching key
        goes, so on nodes shared with other data pass the locks' prefix (the
        Celery integration's keys start with ``redlock_key_prefix``).
        ``QuorumUnavailable`` when fewer than a quorum of nodes could be cleared."""
        match = clear_match(match)
        self._forget_held(match=match)
        return clear_matching(self._nodes.nodes, match, self.quorum)

    def _owned_lease(self, lease: Lease) -> bool:
        return self._drive(self._owned_steps(lease))
