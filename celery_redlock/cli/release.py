"""Deleting one lock on every node: only where it holds a given token, or forced;
and a limited key's permits: one holder's (by token), or all of them (forced).

The library under ``release``. Fence counters are never deleted (fence numbers must
never go backwards). No click here; imports common.py, permits.py and the lock's own
modules.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

import redis

from ..lock import scripts
from ..lock.commands import release_command
from ..lock.redlock import tombstone
from ..lock.stored import LIMIT, WAKE_SUFFIX, permit_full, split_value
from ..wire.node_set import Node
from .common import error_text, on_each_node, text
from .permits import KINDS, permit_name, scan_key_permits

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
    #: The limit slot the token held there (its number), when the key is limited.
    permit: Optional[int] = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "result": self.result,
            "holder": self.holder,
            "token": self.token,
            "error": self.error,
            "permit": self.permit,
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


def release_permit_with_token(node: Node, key: str, token: str) -> NodeRelease:
    """Delete the limit permit of ``key`` that holds ``token`` on ``node``, as the
    permit's own lease releases it (the RELEASE_PERMIT script: compare-and-delete,
    then ``key``'s waiters are woken). A rate's starts are never released: they leave
    the window when it passes."""
    client = node.client()
    slots = []
    for name in scan_key_permits(client, key):
        permit = permit_name(name)
        if permit is not None and permit[1] == LIMIT and permit[2] is not None:
            slots.append((permit[2], name))
    values = client.mget([name for _, name in slots]) if slots else []
    for (slot, name), value in zip(slots, values):
        stored = text(value)
        stored_token, holder = split_value(stored)
        if stored is None or token not in (stored, stored_token):
            continue
        command = release_command(name, stored, 1.0)  # the lease's own release
        deleted = client.eval(*command.eval_args())
        result = DELETED if deleted == 1 else OTHER_HOLDER
        return NodeRelease(node.address, result, holder, stored_token, permit=slot)
    return NodeRelease(node.address, ABSENT)


def release_token(node: Node, key: str, token: str) -> NodeRelease:
    """The release of ``key`` where it holds ``token`` on ``node``; where ``key``
    itself is absent, the release of its limit permit that holds ``token``."""
    released = release_with_token(node, key, token)
    if released.result != ABSENT:
        return released
    return release_permit_with_token(node, key, token)


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
        results = on_each_node(nodes, lambda node: release_token(node, key, wanted), timeout)
    else:
        results = on_each_node(nodes, lambda node: force_release(node, key), timeout)
    return [
        NodeRelease(node.address, FAILED, error=error_text(r))
        if isinstance(r, BaseException)
        else r
        for node, r in zip(nodes, results)
    ]


@dataclass
class PermitsDeletion:
    """What deleting every permit of a key did on one node (``release --all-permits``)."""

    node: str
    result: str  # DELETED, ABSENT or FAILED
    #: Slots deleted per kind (``limit``, ``rate``), and the terms records deleted.
    slots: dict[str, int]
    records: int = 0
    holders: tuple[str, ...] = ()  # who held the deleted limit slots
    error: Optional[str] = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "result": self.result,
            "slots": self.slots,
            "records": self.records,
            "holders": list(self.holders),
            "error": self.error,
        }


def delete_permits(node: Node, key: str) -> PermitsDeletion:
    """Delete every permit slot of ``key`` and its terms records on ``node``, whoever
    holds them, in one transaction, with the nodes' notes about them (which slot each
    token got, that every slot is taken); then wake ``key``'s waiters. The slots'
    fence counters are kept; tombstones expire by themselves."""
    client = node.client()
    names = scan_key_permits(client, key, grants=True)
    if not names:
        return PermitsDeletion(node.address, ABSENT, dict.fromkeys(KINDS, 0))
    pipe = client.pipeline(transaction=True)
    for name in names:
        pipe.get(name)
        pipe.delete(name)
    for kind in KINDS:
        pipe.delete(permit_full(key, kind))  # slots freed: no longer full
    replies = pipe.execute(raise_on_error=False)  # a value of another type: holder unknown
    slots = dict.fromkeys(KINDS, 0)
    records = 0
    holders = []
    for i, name in enumerate(names):
        value, deleted = replies[2 * i], replies[2 * i + 1]
        permit = permit_name(name)
        if not deleted or permit is None:  # a grant note goes with its slot
            continue
        _, kind, slot = permit
        if slot is None:
            records += 1
            continue
        slots[kind] += 1
        if kind == LIMIT:
            token, holder = split_value(value)
            holders.append(holder or token or "?")
    with contextlib.suppress(redis.RedisError):  # no PUBLISH allowed: waiters poll
        client.publish(key + WAKE_SUFFIX, "")
    result = DELETED if records or any(slots.values()) else ABSENT
    return PermitsDeletion(node.address, result, slots, records, tuple(sorted(set(holders))))


def delete_permits_on_each_node(
    nodes: Sequence[Node], key: str, timeout: float
) -> list[PermitsDeletion]:
    """``delete_permits`` on every node at once; a node that fails or hangs is FAILED."""
    results = on_each_node(nodes, lambda node: delete_permits(node, key), timeout)
    return [
        PermitsDeletion(node.address, FAILED, dict.fromkeys(KINDS, 0), error=error_text(r))
        if isinstance(r, BaseException)
        else r
        for node, r in zip(nodes, results)
    ]
