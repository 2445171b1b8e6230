"""Deleting one lock on every node: only where it holds a given token, or forced.

The library under ``release``. Fence counters are never deleted (fence numbers must
never go backwards). No click here; imports common.py and the lock's own modules.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

from ..lock import scripts
from ..lock.redlock import tombstone
from ..lock.stored import split_value
from ..wire.node_set import Node
from .common import error_text, on_each_node, text

# What a release did on one node.
DELETED = "deleted"
ABSENT = "absent"
OTHER_HOLDER = "other-holder"
FAILED = "error"


@dataclass
class NodeRelease:
    """The result of a release on one node, and who held the key there."""

    node: str
    result: str  # DELETED, ABSENT, OTHER_HOLDER or FAILED
    holder: Optional[str] = None
    token: Optional[str] = None
    error: Optional[str] = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "result": self.result,
            "holder": self.holder,
            "token": self.token,
            "error": self.error,
        }


def release_with_token(node: Node, key: str, token: str) -> NodeRelease:
    """Delete ``key`` on ``node`` only if it holds ``token`` (or the exact value
    ``token|holder``).

    Reads the stored value, then deletes with the RELEASE script (compare-and-delete
    of that whole value): if the key changed hands in between, nothing is deleted.
    """
    client = node.client()
    value = client.get(key)
    if value is None:
        return NodeRelease(node.address, ABSENT)
    stored = text(value) or ""
    stored_token, holder = split_value(stored)
    stored_token = stored_token or ""
    wanted = stored if "|" in token else stored_token
    if wanted != token:
        return NodeRelease(node.address, OTHER_HOLDER, holder, stored_token)
    # The key exists, so no tombstone is left (1 s is its TTL if it vanished meanwhile).
    deleted = client.eval(scripts.RELEASE.source, 2, key, tombstone(key, stored), stored, 1000)
    result = DELETED if deleted == 1 else OTHER_HOLDER
    return NodeRelease(node.address, result, holder, stored_token)


def force_release(node: Node, key: str) -> NodeRelease:
    """Delete ``key`` on ``node`` whoever holds it (its fence counter is kept).

    The deletion of ``Redlock.force_release`` (the FORCE_RELEASE script), node by
    node, so the report can say who held the key on each one.
    """
    pipe = node.client().pipeline(transaction=True)
    pipe.get(key)
    pipe.eval(scripts.FORCE_RELEASE.source, 1, key)
    value, deleted = pipe.execute()
    if not deleted:
        return NodeRelease(node.address, ABSENT)
    stored_token, holder = split_value(value)
    return NodeRelease(node.address, DELETED, holder, stored_token)


def release_on_each_node(
    nodes: Sequence[Node], key: str, token: Optional[str], timeout: float
) -> list[NodeRelease]:
    """Release ``key`` on every node at once: where it holds ``token``, or whoever
    holds it when ``token`` is None. A node that fails or hangs is a FAILED entry."""
    if token is not None:
        wanted = token
        results = on_each_node(nodes, lambda node: release_with_token(node, key, wanted), timeout)
    else:
        results = on_each_node(nodes, lambda node: force_release(node, key), timeout)
    return [
        NodeRelease(node.address, FAILED, error=error_text(r))
        if isinstance(r, BaseException)
        else r
        for node, r in zip(nodes, results)
    ]
