"""Who holds which lock, read from every node: the library under ``show`` and, with
listing.py, ``ls``.

A holder string is split into task, worker and pid; many keys are read with one
transaction per node, so a hung node costs the timeout once, not once per key.
No click here; imports common.py and the lock's own modules (nodes, redlock).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

from ..lock.redlock import HolderInfo, NodeHolding
from ..lock.stored import split_value
from ..wire.node_set import Node
from .common import error_text, on_each_node


@dataclass(frozen=True)
class Holder:
    """A holder string split into its parts: ``task-id@worker:pid`` as the task stores it.

    ``hostname:pid`` (a plain ``Redlock.acquire``) has no task id; a bare task id (a
    queued-copy lock) has no worker.
    """

    raw: Optional[str]
    task_id: Optional[str] = None
    worker: Optional[str] = None
    pid: Optional[int] = None

    @classmethod
    def parse(cls, holder: Optional[str]) -> Holder:
        if not holder:
            return cls(None)
        task_id, at, rest = holder.partition("@")
        if not at:
            task_id, rest = "", holder
        worker, colon, pid = rest.rpartition(":")
        if colon and pid.isdigit() and worker:
            return cls(holder, task_id or None, worker, int(pid))
        if at:
            return cls(holder, task_id or None, rest or None)
        return cls(holder, task_id=holder)

    def as_dict(self) -> dict[str, Any]:
        return {"holder": self.raw, "task_id": self.task_id, "worker": self.worker, "pid": self.pid}


def agreeing(info: HolderInfo) -> tuple[Optional[str], int]:
    """The token most nodes hold for the key, and on how many nodes."""
    tokens = Counter(n.token for n in info.nodes if n.token)
    if not tokens:
        return None, 0
    token, count = tokens.most_common(1)[0]
    return token, count


def holding_document(holding: NodeHolding) -> dict[str, Any]:
    """One node's view of a key, as ``show --json`` prints it."""
    return {
        "node": holding.node,
        "token": holding.token,
        "holder": holding.holder,
        # A value without an expiry reads as ttl None too: say which it is.
        "ttl": holding.ttl,
        "no_expiry": holding.token is not None and holding.ttl is None,
        "error": None if holding.error is None else error_text(holding.error),
    }


def holder_document(info: HolderInfo) -> dict[str, Any]:
    """Who holds a key and whether a quorum agrees, as ``show --json`` prints it."""
    token, count = agreeing(info)
    holder = next((n.holder for n in info.nodes if token and n.token == token), None)
    return {
        "key": info.key,
        **Holder.parse(holder).as_dict(),
        "token": token,
        "agreeing_nodes": count,
        "nodes_total": len(info.nodes),
        "quorum": info.quorum,
        "quorum_agrees": count >= info.quorum,
        "ttl": info.ttl,
        "nodes": [holding_document(n) for n in info.nodes],
    }


def read_holdings(node: Node, keys: Sequence[str]) -> list[NodeHolding]:
    """Value and TTL of each key on one node: one MULTI/EXEC, so each pair is consistent.

    Per node rather than one ``Redlock.holder`` round per key: a hung node then costs
    the timeout once for the whole listing, not once per key.
    """
    pipe = node.client().pipeline(transaction=True)
    for key in keys:
        pipe.get(key)
        pipe.pttl(key)
    replies = pipe.execute(raise_on_error=False)
    holdings = []
    for i in range(len(keys)):
        value, pttl = replies[2 * i], replies[2 * i + 1]
        if isinstance(value, BaseException):
            holdings.append(NodeHolding(node.address, error=value))
            continue
        token, holder = split_value(value)
        ttl = pttl / 1000.0 if isinstance(pttl, int) and pttl >= 0 else None
        holdings.append(NodeHolding(node.address, token, holder, ttl))
    return holdings


def read_holders(
    nodes: Sequence[Node],
    keys: Sequence[str],
    reachable: Sequence[object],
    need: int,
    timeout: float,
) -> list[HolderInfo]:
    """``HolderInfo`` of every key, reading each node once; nodes whose entry in
    ``reachable`` is an exception are not asked again (their error is reported)."""
    if not keys:
        return []
    asked = [n for n, r in zip(nodes, reachable) if not isinstance(r, BaseException)]
    answers = dict(zip(asked, on_each_node(asked, lambda n: read_holdings(n, keys), timeout)))
    per_node: list[list[NodeHolding]] = []
    for node, earlier in zip(nodes, reachable):
        answer = answers.get(node, earlier)
        if isinstance(answer, BaseException):
            per_node.append([NodeHolding(node.address, error=answer)] * len(keys))
        else:
            assert isinstance(answer, list)
            per_node.append(answer)
    return [
        HolderInfo(key, tuple(holdings[i] for holdings in per_node), need)
        for i, key in enumerate(keys)
    ]
