"""The checks of ``doctor``: each one judges facts already read (facts.py) and
returns a :class:`Check` (OK, WARNING or ERROR, and why).

Node checks share one signature, ``(NodeFacts, AppConfig) -> Check``, so doctor.py
runs them as a list; the cluster checks take every node's facts. Pure functions: no
I/O, no click, no redis; imports facts.py, config (types) and redlock.quorum.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

from ..lock.redlock import quorum
from ..tasks.config import AppConfig
from .facts import NodeFacts

OK = "OK"
WARNING = "WARNING"
ERROR = "ERROR"
#: Each status by severity (also the value doctor's Prometheus gauges report).
RANK = {OK: 0, WARNING: 1, ERROR: 2}

#: Redis TIME this far from local time (seconds) earns a WARNING.
CLOCK_OFFSET_WARNING = 0.5
#: SET key value NX PX (and Lua) arrived in Redis 2.6.12.
MIN_REDIS_VERSION = (2, 6, 12)

REDIS_IO_ADVICE = (
    "Without appendfsync always, a node that crashes (power loss, SIGKILL) may "
    "restart without lock keys it had granted, and a second client can then win a "
    "quorum for a lock that is still held. Either set appendonly yes + appendfsync "
    "always (slow), or use delayed restarts: keep a crashed node down for a bit "
    "longer than the largest lock TTL{ttl_hint} before it rejoins, so every lock it "
    "took part in has expired (redis.io, 'Distributed locks with Redis': "
    "'Performance, crash-recovery and fsync')."
)


@dataclass
class Check:
    """One verdict: what was checked, OK / WARNING / ERROR, and why."""

    name: str
    status: str
    message: str
    advice: Optional[str] = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "check": self.name,
            "status": self.status,
            "message": self.message,
            "advice": self.advice,
        }


def worst(checks: Sequence[Check]) -> str:
    """The most severe status among ``checks`` (OK when there are none)."""
    return max((c.status for c in checks), key=RANK.__getitem__, default=OK)


# -- one node ------------------------------------------------------------------------------


def check_reachable(facts: NodeFacts, config: AppConfig) -> Check:
    """Whether the node answered, and if it answered, whether this user may inspect it."""
    if facts.reachable:
        return Check("reachable", OK, f"yes, run_id {str(facts.run_id)[:8]}")
    if facts.restricted:
        return Check(
            "reachable",
            ERROR,
            f"reachable, but this user may not inspect it ({facts.error}); run doctor "
            "as a user allowed PING, INFO, CONFIG GET, TIME, SCAN and PTTL",
        )
    return Check("reachable", ERROR, f"unreachable: {facts.error}")


def check_permissions(facts: NodeFacts, config: AppConfig) -> Check:
    """This user can take and release a lock (an ACL may allow INFO but not EVALSHA)."""
    if not facts.lock_scripts_error:
        return Check("permissions", OK, "a probe lock was taken and released")
    if facts.cluster_enabled and facts.cluster_shards is None:  # slots, not permission
        return Check(
            "permissions",
            ERROR,
            f"the probe lock failed ({facts.lock_scripts_error}): a Redis Cluster node, see role",
        )
    return Check(
        "permissions",
        ERROR,
        "this user cannot run the lock's commands: "
        f"{facts.lock_scripts_error}; an ACL user needs at least "
        f"~{config.key_prefix}:* +evalsha +script|load +get +set +exists +pttl "
        "+pexpire +del (and +eval to survive SCRIPT FLUSH, +sadd +scard +srem for "
        f"reentrant=True, +publish +subscribe +unsubscribe &{config.key_prefix}:* for "
        "blocked acquires to be woken by the release instead of polling)",
    )


def check_latency(facts: NodeFacts, config: AppConfig) -> Check:
    """The round trip leaves room within ``redlock_node_timeout``."""
    latency = facts.latency_ms or 0.0
    timeout_ms = config.task_defaults.node_timeout * 1000
    if latency <= timeout_ms / 2:
        return Check("latency", OK, f"round trip {latency:.2f} ms")
    return Check(
        "latency",
        WARNING,
        f"round trip {latency:.2f} ms is more than half of redlock_node_timeout "
        f"({timeout_ms:.0f} ms): lock rounds will often miss this node",
    )


def _version(version: Optional[str]) -> tuple[int, ...]:
    numbers = re.findall(r"\d+", version or "")
    return tuple(int(n) for n in numbers[:3])


def check_version(facts: NodeFacts, config: AppConfig) -> Check:
    """The server is new enough for SET NX PX: judged on the Redis version it reports
    (Valkey reports the one it is compatible with), named as itself."""
    named = f"{facts.server or 'Redis'} {facts.version}"
    if _version(facts.redis_version or facts.version) < MIN_REDIS_VERSION:
        if facts.redis_version and facts.redis_version != facts.version:
            named += f" (reports Redis {facts.redis_version})"
        return Check("version", ERROR, f"{named}: SET NX PX needs Redis >= 2.6.12")
    return Check("version", OK, named)


def check_role(facts: NodeFacts, config: AppConfig) -> Check:
    """An independent master: a replica or a Redis Cluster node is an ERROR, a master
    with replicas a WARNING."""
    if facts.cluster_shards is not None:
        return Check(
            "role",
            WARNING,
            f"a Redis Cluster of {facts.cluster_shards} shard(s) and "
            f"{facts.cluster_replicas} replica(s) as one lock node: each key's vote is "
            "the vote of its slot's master. Shards replicate asynchronously, so a "
            "failover inside the cluster (CLUSTER FAILOVER, a master lost) can lose a "
            "held lock, as with Sentinel; one cluster is one vote, so Redlock's "
            "guarantees need several independent clusters (or masters) as nodes",
        )
    if facts.cluster_enabled:
        return Check(
            "role",
            ERROR,
            "a Redis Cluster server named as a plain master (cluster-enabled yes): the "
            "lock scripts' keys span slots there (CROSSSLOT, MOVED), so it never votes. "
            "Name the cluster as one node, redis+cluster://HOST:PORT[;redis+cluster://"
            "HOST:PORT...], or give redlock_nodes standalone masters",
        )
    if facts.role == "slave":
        return Check(
            "role",
            ERROR,
            f"replica of {facts.master}: Redlock needs independent masters (a replica "
            "refuses the lock writes or keeps them apart from its master's)",
        )
    if facts.role != "master":
        return Check("role", WARNING, f"unexpected role {facts.role!r}")
    if facts.replicas:
        return Check(
            "role",
            WARNING,
            f"master with {facts.replicas} replica(s): replication is asynchronous, "
            "so a failover to a replica can lose lock keys it granted",
        )
    return Check("role", OK, "master")


SENTINEL_ADVICE = (
    "Sentinel replicates asynchronously: a lock key the old master granted may not "
    "have reached the replica it promotes, and a second client then wins the same "
    "lock on the new master while the first still holds it. The lock's safety rests "
    "on each node keeping what it granted, so prefer 3 or 5 independent masters "
    "without failover (Redlock tolerates a minority down by itself). If you keep "
    "Sentinel: WAIT / min-replicas-to-write narrow the window but cannot close it "
    "(replication stays asynchronous), and a delayed failover (down-after-milliseconds "
    "longer than the largest lock TTL{ttl_hint}) lets every granted lock expire first."
)


def check_sentinel(facts: NodeFacts, config: AppConfig) -> Check:
    """A Sentinel-managed master: a failover can lose a held lock (a WARNING)."""
    where = f", now at {facts.master_address}" if facts.master_address else ""
    hint = f" (redlock_ttl is {config.task_defaults.ttl:g} s; tasks may set more)"
    return Check(
        "sentinel",
        WARNING,
        f"managed by Sentinel (master {facts.sentinel_master!r}{where}): a failover to "
        "an asynchronously replicated replica can lose a held lock",
        SENTINEL_ADVICE.format(ttl_hint=hint),
    )


def check_maxmemory_policy(facts: NodeFacts, config: AppConfig) -> Check:
    """noeviction: any other policy may evict lock keys."""
    policy = facts.maxmemory_policy
    if policy == "noeviction":
        return Check("maxmemory-policy", OK, "noeviction")
    limit = f" (maxmemory {facts.maxmemory} bytes)" if facts.maxmemory else " (maxmemory unset)"
    if policy and policy.startswith("volatile-"):
        why = "evicts keys that have a TTL, which is every lock key"
    else:
        why = "may evict any key, lock keys included"
    return Check(
        "maxmemory-policy", ERROR, f"{policy}{limit}: {why}; set maxmemory-policy noeviction"
    )


def check_persistence(facts: NodeFacts, config: AppConfig) -> Check:
    """appendfsync always, else a WARNING with redis.io's advice on delayed restarts."""
    if facts.appendonly and facts.appendfsync == "always":
        return Check("persistence", OK, "appendonly yes, appendfsync always")
    if not facts.appendonly:
        message = "appendonly no: a crashed node restarts without its lock keys"
    elif facts.appendfsync is None:
        message = f"appendonly yes, appendfsync unknown ({facts.appendfsync_error})"
    else:
        message = (
            f"appendonly yes, appendfsync {facts.appendfsync}: a crash can lose the "
            "lock keys of the last writes"
        )
    hint = f" (redlock_ttl is {config.task_defaults.ttl:g} s; tasks may set more)"
    advice = REDIS_IO_ADVICE.format(ttl_hint=hint)
    return Check("persistence", WARNING, message + " (see Notes: delayed restarts)", advice)


def check_clock(facts: NodeFacts, config: AppConfig) -> Check:
    """A large offset from this host's clock hints at a clock that gets stepped."""
    offset = facts.clock_offset or 0.0
    if abs(offset) <= CLOCK_OFFSET_WARNING:
        return Check("clock", OK, f"offset {offset * 1000:+.1f} ms from this host")
    return Check(
        "clock",
        WARNING,
        f"Redis TIME is {offset:+.3f} s from this host's clock: Redlock only needs "
        "clocks to run at the same rate, but an offset this large hints at a clock "
        "that gets stepped (a step makes TTLs expire early or late)",
    )


def check_lock_keys(facts: NodeFacts, config: AppConfig) -> Check:
    """Every lock key has a TTL (one without is never freed)."""
    partial = "" if facts.scan_complete else " (scan stopped at the time budget)"
    slots = f" and {facts.permit_slots} permit slot(s)" if facts.permit_slots else ""
    if not facts.keys_without_ttl_count:
        return Check(
            "lock-keys",
            OK if facts.scan_complete else WARNING,
            f"{facts.lock_keys} lock key(s){slots} under '{config.key_prefix}:', all with a TTL"
            + partial,
        )
    shown = ", ".join(facts.keys_without_ttl)
    more = facts.keys_without_ttl_count - len(facts.keys_without_ttl)
    return Check(
        "lock-keys",
        ERROR,
        f"{facts.keys_without_ttl_count} key(s) under '{config.key_prefix}:' without "
        f"a TTL, never freed: {shown}" + (f" and {more} more" if more > 0 else "") + partial,
        advice="Remove them with: celery -A proj redlock release KEY --force (a key's "
        "permit slots: release KEY --force --all-permits)",
    )


# -- all nodes -----------------------------------------------------------------------------


def check_node_count(facts: Sequence[NodeFacts]) -> Check:
    """An odd number of nodes, more than one."""
    count = len(facts)
    need = quorum(count)
    if count == 1:
        return Check(
            "node-count",
            WARNING,
            "1 node: no fault tolerance (a crash loses every lock); use 3 or 5 independent masters",
        )
    if count % 2 == 0:
        return Check(
            "node-count",
            WARNING,
            f"{count} nodes: an even number tolerates no more failures than "
            f"{count - 1} ({count - need} down); prefer an odd number",
        )
    return Check("node-count", OK, f"{count} nodes, quorum {need}, tolerates {count - need} down")


def check_distinct_servers(facts: Sequence[NodeFacts]) -> list[Check]:
    """No server listed twice (same run_id): one ERROR per server that is."""
    by_run_id: dict[str, list[str]] = defaultdict(list)
    for node in facts:
        if node.run_id:
            by_run_id[node.run_id].append(node.address)
    duplicates = [addresses for addresses in by_run_id.values() if len(addresses) > 1]
    if not duplicates:
        return [Check("distinct-servers", OK, f"{len(by_run_id)} distinct servers answered")]
    return [
        Check(
            "distinct-servers",
            ERROR,
            f"{' and '.join(addresses)} are the same server (same run_id): it would "
            "vote more than once in every quorum",
        )
        for addresses in duplicates
    ]


def usable_nodes(facts: Sequence[NodeFacts]) -> int:
    """Nodes that can vote: reachable standalone masters and clusters named as one
    node, each server counted once."""
    seen: set[str] = set()
    usable = 0
    for node in facts:
        if (
            not node.reachable
            or node.role != "master"
            or (node.cluster_enabled and node.cluster_shards is None)
        ):
            continue
        if node.run_id:
            if node.run_id in seen:
                continue
            seen.add(node.run_id)
        usable += 1
    return usable


def check_quorum(facts: Sequence[NodeFacts]) -> Check:
    """At least a quorum of the nodes is usable."""
    count = len(facts)
    need = quorum(count)
    usable = usable_nodes(facts)
    reachable = sum(1 for n in facts if n.reachable)
    detail = (
        f"{usable} of {count} nodes usable (reachable, standalone master, distinct), quorum {need}"
    )
    if reachable < count or usable < reachable:
        detail += f"; {reachable} reachable"
    restricted = sum(1 for n in facts if n.restricted)
    if usable >= need:
        return Check("quorum", OK, detail)
    if restricted:
        return Check(
            "quorum",
            ERROR,
            f"{detail}; {restricted} answered but could not be inspected by this user: "
            "the quorum cannot be confirmed",
        )
    return Check("quorum", ERROR, detail + ": no lock can be taken")


LIMITS_ADVICE = (
    "A limited key's permit is won when a majority of the nodes ({need} of {count}) give "
    "the caller the same slot. Each node gives its first free slot from the caller's "
    "start, so callers racing for the last permits can split the vote: nobody wins, and "
    "each retries after a random pause. Each node down leaves less room to disagree (with"
    " 1 of 5 down, 3 of the 4 left must give the same slot), so splits come more often "
    "and limited tasks wait longer. A rate's starts hold their slots for the whole "
    "period: a lock node that restarts without its keys must stay down for at least "
    "max(largest TTL, longest rate period){restart_hint} before it rejoins (the delayed "
    "restart), otherwise a window can admit more than R starts."
)


def _seconds_text(seconds: float) -> str:
    for unit, size in (("h", 3600.0), ("min", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.3g} s"


def check_limits(facts: Sequence[NodeFacts], config: AppConfig) -> Check:
    """What limits and rates cost: a permit needs a majority on one slot (splits grow
    with every node down), and a rate's period lengthens the delayed restart."""
    count = len(facts)
    need = quorum(count)
    reachable = [f for f in facts if f.reachable]
    limited = max((f.limited_keys for f in reachable), default=0)
    rated = max((f.rated_keys for f in reachable), default=0)
    if not limited and not rated:
        return Check(
            "limits",
            OK,
            f"no limited or rated keys under '{config.key_prefix}:' (a permit needs "
            f"{need} of {count} nodes to give the same slot)",
        )
    ttl = max([config.task_defaults.ttl] + [f.longest_ttl or 0.0 for f in reachable])
    period = max([0.0] + [f.longest_rate_period or 0.0 for f in reachable])
    restart = max(ttl, period)
    hint = f" (here {_seconds_text(restart)}: redlock_ttl or a key's TTL, tasks may set more)"
    if period > ttl:
        hint = f" (here {_seconds_text(restart)}: the longest rate period)"
    message = f"{limited} limited and {rated} rated key(s); a permit needs {need} of {count} nodes"
    problems = []
    down = count - len(reachable)
    if down:
        problems.append(
            f"{down} of {count} nodes down: a permit needs {need} of the {count - down} "
            "left to give the same slot, so racing callers split more often (nobody "
            "wins; they retry)"
        )
    unsynced = any(not (f.appendonly and f.appendfsync == "always") for f in reachable)
    if period > ttl and unsynced:
        problems.append(
            f"the longest rate period ({_seconds_text(period)}) is longer than the "
            f"largest lock TTL ({_seconds_text(ttl)}): a node restarted without its keys "
            f"must stay down {_seconds_text(period)}, not the TTL"
        )
    advice = LIMITS_ADVICE.format(need=need, count=count, restart_hint=hint)
    if problems:
        return Check("limits", WARNING, f"{message}; " + "; ".join(problems), advice)
    return Check("limits", OK, message, advice)
