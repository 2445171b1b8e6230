"""Operators' bulk deletion: ``clear_matching``, the SCAN behind ``clear``.

``Redlock.clear`` and ``AsyncRedlock.clear`` delete every lock key matching a glob,
node by node with SCAN and plain clients (the asyncio lock on a worker thread): not
a round, so not steps. The other calls that need no lease (``extend_value``,
``locked``, ``force_release``) are steps of rules.py, driven by each lock. Fence
counters are never deleted (fences must never go backwards) and tombstones expire
by themselves: both sit behind a NUL (see stored.py) and are skipped. Each deleted
key is published on its wake channel, as a release's deletion is, so an acquire
blocked on it wakes at once.

Must not import rules.py, redlock.py or Celery.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, Protocol

from ..errors import QuorumUnavailable
from .stored import is_lock_key, wake_channel

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
            gone = [n for n, went in zip(batch, pipe.execute()) if went]
            deleted.update(gone)
            batch.clear()
            _wake(client, gone)

    for name in client.scan_iter(match=match, count=BATCH):
        raw = name if isinstance(name, bytes) else str(name).encode()
        if is_lock_key(raw.decode("utf-8", "replace")):
            batch.append(raw)
            if len(batch) >= BATCH:
                flush()
    flush()
    return deleted


def _wake(client: Any, names: list[bytes]) -> None:
    """Tell the blocked acquires of each deleted key that it is free, as a release
    does (scripts.publish_wake); a refused PUBLISH (ACL) is ignored there too."""
    if not names:
        return
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.publish(wake_channel(name), b"")
    # A hint: the keys are gone whatever becomes of it, and a waiter not woken still
    # gets the key at its next attempt; the node's clearing stands.
    with contextlib.suppress(Exception):
        pipe.execute(raise_on_error=False)


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
