"""``doctor`` as a library: inspect every node at once, run the checks, and build the
JSON document that ``doctor --json`` prints (printing.py renders it as text).

    document = run_doctor(app_config(app), timeout=2.0)
    document["status"]  # "OK", "WARNING" or "ERROR"

No click here; imports common.py, facts.py, checks.py, config and redlock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any, Callable

import redis

from ..lock.redlock import quorum
from ..tasks.config import AppConfig
from ..wire.node_set import Node
from .checks import (
    ERROR,
    OK,
    WARNING,
    Check,
    check_clock,
    check_distinct_servers,
    check_latency,
    check_limits,
    check_lock_keys,
    check_maxmemory_policy,
    check_node_count,
    check_permissions,
    check_persistence,
    check_quorum,
    check_reachable,
    check_role,
    check_sentinel,
    check_version,
    worst,
)
from .common import configured_nodes, error_text, on_each_node
from .facts import NodeFacts, inspect_node

#: The checks of a reachable node, in the order doctor prints them.
NODE_CHECKS: tuple[Callable[[NodeFacts, AppConfig], Check], ...] = (
    check_permissions,
    check_latency,
    check_version,
    check_role,
    check_maxmemory_policy,
    check_persistence,
    check_clock,
    check_lock_keys,
)


#: The checks of a reachable Sentinel-managed node, after NODE_CHECKS.
SENTINEL_CHECKS: tuple[Callable[[NodeFacts, AppConfig], Check], ...] = (check_sentinel,)


def judge_node(facts: NodeFacts, config: AppConfig) -> list[Check]:
    """The checks of one reachable node, from its facts."""
    checks = NODE_CHECKS + (SENTINEL_CHECKS if facts.sentinel_master else ())
    return [check(facts, config) for check in checks]


def judge_cluster(facts: Sequence[NodeFacts], config: AppConfig) -> list[Check]:
    """Checks across nodes: node count, distinct servers, reachable quorum, and what
    limits and rates cost."""
    return [
        check_node_count(facts),
        *check_distinct_servers(facts),
        check_quorum(facts),
        check_limits(facts, config),
    ]


def inspect_nodes(nodes: Sequence[Node], prefix: str, timeout: float) -> list[NodeFacts]:
    """The facts of every node, read at once; a node that failed or hung is unreachable."""
    results = on_each_node(nodes, lambda node: inspect_node(node, prefix, timeout), timeout)
    return [
        _unreachable(node, result) if isinstance(result, BaseException) else result
        for node, result in zip(nodes, results)
    ]


def _unreachable(node: Node, error: BaseException) -> NodeFacts:
    # NoPermissionError: it answered, only this user may not inspect it (a lock-only
    # ACL user).
    restricted = isinstance(error, redis.exceptions.NoPermissionError)
    return NodeFacts(node.address, error=error_text(error), restricted=restricted)


def _node_document(facts: NodeFacts, checks: list[Check]) -> dict[str, Any]:
    return {
        **facts.as_dict(),
        "status": worst(checks),
        "checks": [c.as_dict() for c in checks],
    }


def _summary(checks: Sequence[Check]) -> dict[str, int]:
    counts = Counter(c.status for c in checks)
    return {status: counts.get(status, 0) for status in (OK, WARNING, ERROR)}


def run_doctor(config: AppConfig, timeout: float) -> dict[str, Any]:
    """Every check, as the JSON document ``doctor --json`` prints.

    Raises ConfigurationError when the settings name no valid nodes.
    """
    nodes = configured_nodes(config.redlock(timeout, False))
    facts = inspect_nodes(nodes, config.key_prefix, timeout)
    per_node = [
        [check_reachable(f, config), *(judge_node(f, config) if f.reachable else [])] for f in facts
    ]
    cluster = judge_cluster(facts, config)
    every = [c for checks in per_node for c in checks] + cluster
    return {
        "status": worst(every),
        "key_prefix": config.key_prefix,
        "quorum": quorum(len(nodes)),
        "nodes": [_node_document(f, checks) for f, checks in zip(facts, per_node)],
        "checks": [c.as_dict() for c in cluster],
        "summary": _summary(every),
    }


def configuration_error_document(message: str) -> dict[str, Any]:
    """The document of a doctor run stopped by invalid settings (one ERROR)."""
    check = Check("configuration", ERROR, message)
    return {
        "status": ERROR,
        "key_prefix": None,
        "quorum": None,
        "nodes": [],
        "checks": [check.as_dict()],
        "summary": _summary([check]),
    }
