"""Asking the nodes without a lease, and operators' deletions: ``LockQueries``.

``Redlock`` inherits these calls: ``extend_value`` (a lease handed over by value),
``locked`` (does a quorum hold the key?), ``force_release`` (one key, no token
check) and ``clear`` (every lock key matching a glob, node by node with SCAN), and
the rule that turns a round's replies into True, False or ``QuorumUnavailable``.
Fence counters are never deleted (fences must never go backwards) and tombstones
expire by themselves: both sit behind a NUL (see holders.py) and are skipped.

Must not import redlock.py or Celery.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any, Callable, Optional, Protocol, Union

from . import scripts, validate
from .commands import extend_command, lease_name, lock_keys, ms, owned_command, owned_judge
from .errors import ConfigurationError, QuorumUnavailable
from .holders import INTERNAL, is_lock_key
from .lease import Duration, Lease
from .nodes import NOT_AWAITED, Command, NodeSet

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


def is_one(reply: object) -> bool:
    return reply == 1


def is_answer(reply: object) -> bool:
    return not isinstance(reply, BaseException)


class InspectableNode(Protocol):
    address: str

    def client(self) -> Any: ...


#: Bounds of a caller-chosen token's length, in characters (ours: 27).
TOKEN_LENGTH = (16, 256)


def token_argument(token: object) -> str:
    """A caller-chosen token (``acquire(token=...)``), checked: it is stored before the
    ``|`` of ``token|holder``, so it may not contain one, and it must be long enough to
    be unique to one acquisition."""
    low, high = TOKEN_LENGTH
    if not isinstance(token, str):
        raise ConfigurationError(
            f"token must be a str of {low}..{high} characters without '|', "
            f"got {type(token).__name__}: {token!r}"
        )
    if not low <= len(token) <= high:
        raise ConfigurationError(
            f"token must be {low}..{high} characters long (unique to one acquisition, "
            f"e.g. secrets.token_urlsafe(20)), got {len(token)}"
        )
    if "|" in token or INTERNAL in token or "\n" in token:
        raise ConfigurationError(
            f"token must not contain '|' (it separates token and holder), NUL or a "
            f"newline, got {token!r}"
        )
    return validate.utf8_text("token", token)


def lease_value(value: object) -> str:
    """A lease's stored ``token|holder`` value as handed to another process, checked."""
    if not isinstance(value, str) or "|" not in value:
        raise ConfigurationError(
            f"value must be a lease's stored value, a 'token|holder' str, got {value!r}"
        )
    return value


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


class LockQueries:
    """Rounds that need no lease of ours, and how a round's replies are read."""

    ttl: float
    node_timeout: float
    quorum: int
    _nodes: NodeSet

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
        keys = lock_keys(key)
        value = lease_value(value)
        new_ttl = self.ttl if ttl is None else validate.seconds("ttl", ttl)
        command = extend_command(keys, value, new_ttl)
        results = self._nodes.round(command, self.node_timeout, is_one, self.quorum)
        return self._agreed(lease_name(keys), results, is_one)

    def locked(self, key: str) -> bool:
        """True when a quorum of nodes holds ``key`` under one value (someone holds
        the lock); False when too many nodes answered otherwise for that to be so.
        One read round; ``QuorumUnavailable`` when too few nodes answered to tell."""
        key = validate.lock_key_name(key, reserved=INTERNAL)
        results = self._nodes.round(Command(scripts.HOLDER, [key], []), self.node_timeout)
        held = Counter(r[0] for r in results if isinstance(r, list) and r and r[0])
        top = held.most_common(1)[0][0] if held else None
        return self._agreed(
            key, results, lambda r: top is not None and isinstance(r, list) and r[0] == top
        )

    def force_release(self, key: str) -> int:
        """Delete ``key`` on every node whoever holds it; how many nodes deleted it.

        For operators (a stuck lock): it ends mutual exclusion for a holder that may
        still be working. Its fence counter is kept -- fences never go backwards --
        and tombstones expire by themselves. ``QuorumUnavailable`` when fewer than a
        quorum answered (the lock may still be held).
        """
        key = validate.lock_key_name(key, reserved=INTERNAL)
        self._forget_held(key=key)
        command = Command(scripts.FORCE_RELEASE, [key], [])
        results = self._nodes.round(command, self.node_timeout, deliver=True)
        self._answered_by_quorum(key, results)
        return sum(1 for r in results if r == 1)

    def clear(self, match: str = "*") -> int:
        """Force-release every lock key matching the glob ``match`` on every node
        (SCAN per node); how many distinct keys were deleted. Fence counters and
        tombstones are skipped (see ``force_release``); every other matching key
        goes, so on nodes shared with other data pass the locks' prefix (the
        Celery integration's keys start with ``redlock_key_prefix``).
        ``QuorumUnavailable`` when fewer than a quorum of nodes could be cleared."""
        if not isinstance(match, str) or not match or INTERNAL in match:
            raise ConfigurationError(
                f"match must be a non-empty glob str without NUL (e.g. 'report:*'), got {match!r}"
            )
        validate.utf8_text("match", match)
        self._forget_held(match=match)
        return clear_matching(self._nodes.nodes, match, self.quorum)

    def _forget_held(self, key: Optional[str] = None, match: Optional[str] = None) -> None:
        """Deleted by an operator: forget which executions held these keys (the
        reentrancy record, see reentry.py); nothing to forget here."""

    def _owned_lease(self, lease: Lease) -> bool:
        judge = owned_judge(lease.keys, lease.value)
        results = self._nodes.round(owned_command(lease.keys, lease.value), self.node_timeout)
        return self._agreed(lease.key, results, judge)

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
