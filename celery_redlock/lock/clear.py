"""Operators' bulk deletion: ``clear_matching``, the SCAN behind ``clear``.

``Redlock.clear`` and ``AsyncRedlock.clear`` delete every lock key matching a glob,
node by node with SCAN and plain clients (the asyncio lock on a worker thread): not
a round, so not steps. The other calls that need no lease (``extend_value``,
``locked``, ``force_release``) are steps of rules.py, driven by each lock. Fence
counters are never deleted (fences must never go backwards) and tombstones expire
by themselves: both sit behind a NUL (see stored.py) and are skipped.

Must not import rules.py, redlock.py or Celery.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from ..errors import QuorumUnavailable
from .stored import is_lock_key

__all__ = ["clear_matching"]

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
