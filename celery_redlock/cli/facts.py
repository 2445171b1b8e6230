"""What ``doctor`` reads from one node: settings, role, clock, the lock keys, and
whether this user may run the lock's own scripts.

Reading only: judging the facts is checks.py. No click here; imports redis, scripts,
common.py, permits.py (permit names) and redlock (key names).
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import redis

from ..lock import scripts
from ..lock.redlock import FENCE, tombstone
from ..lock.stored import LIMIT, RATE
from ..wire.cluster import tagged
from ..wire.cluster_node import ClusterNode
from ..wire.node_set import Node
from .common import error_text, lock_keys, prefix_match, text
from .permits import describe_name, permit_name, read_terms

#: INFO's ``server_name`` -> the server's name in doctor's report. Redis leaves the
#: field out; Valkey says ``valkey`` and reports its own ``valkey_version`` beside the
#: Redis version it is compatible with (``redis_version:7.2.4``).
SERVER_NAMES = {"redis": "Redis", "valkey": "Valkey"}

#: Lock keys without a TTL listed by doctor (all of them are counted).
NO_TTL_SHOWN = 10
#: The scan for keys without a TTL stops at this fraction of the node's budget, so
#: a huge keyspace shortens the scan instead of losing the node's whole report.
SCAN_BUDGET = 0.6


@dataclass
class NodeFacts:
    """What one node told us (the raw material of its checks)."""

    address: str
    reachable: bool = False
    error: Optional[str] = None
    latency_ms: Optional[float] = None
    #: The server software ("Redis", "Valkey") and its own version.
    server: Optional[str] = None
    version: Optional[str] = None
    #: The Redis version the server reports (a Valkey node: the one it is compatible with).
    redis_version: Optional[str] = None
    run_id: Optional[str] = None
    role: Optional[str] = None
    master: Optional[str] = None
    cluster_enabled: bool = False
    replicas: int = 0
    maxmemory: Optional[int] = None
    maxmemory_policy: Optional[str] = None
    appendonly: Optional[bool] = None
    appendfsync: Optional[str] = None
    appendfsync_error: Optional[str] = None
    clock_offset: Optional[float] = None
    lock_keys: int = 0
    fence_keys: int = 0
    #: Permit slots (limits' and rates'), and the keys with a limit or a rate.
    permit_slots: int = 0
    limited_keys: int = 0
    rated_keys: int = 0
    #: The longest TTL left on a lock key or a limit's slot, seconds.
    longest_ttl: Optional[float] = None
    #: The longest period a rate's terms record names, seconds.
    longest_rate_period: Optional[float] = None
    keys_without_ttl: list[str] = field(default_factory=list)
    keys_without_ttl_count: int = 0
    scan_complete: bool = True
    lock_scripts_error: Optional[str] = None
    restricted: bool = False  # answered, but this user may not inspect it
    #: The master name, for a node whose Sentinels say where the master is.
    sentinel_master: Optional[str] = None
    #: Where the Sentinels said the master was, when doctor looked (host:port).
    master_address: Optional[str] = None
    #: A Redis Cluster as one node (redis+cluster://): its masters and their replicas.
    cluster_shards: Optional[int] = None
    cluster_replicas: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "node": self.address,
            "reachable": self.reachable,
            "error": self.error,
            "latency_ms": None if self.latency_ms is None else round(self.latency_ms, 3),
            "server": self.server,
            "server_version": self.version,
            "redis_version": self.redis_version,
            "run_id": self.run_id,
            "role": self.role,
            "master": self.master,
            "cluster_enabled": self.cluster_enabled,
            "connected_replicas": self.replicas,
            "maxmemory": self.maxmemory,
            "maxmemory_policy": self.maxmemory_policy,
            "appendonly": self.appendonly,
            "appendfsync": self.appendfsync,
            "clock_offset_s": None if self.clock_offset is None else round(self.clock_offset, 6),
            "lock_keys": self.lock_keys,
            "fence_keys": self.fence_keys,
            "permit_slots": self.permit_slots,
            "limited_keys": self.limited_keys,
            "rated_keys": self.rated_keys,
            "longest_ttl_s": self.longest_ttl,
            "longest_rate_period_s": self.longest_rate_period,
            "keys_without_ttl": self.keys_without_ttl,
            "keys_without_ttl_count": self.keys_without_ttl_count,
            "scan_complete": self.scan_complete,
            "lock_scripts_error": self.lock_scripts_error,
            "sentinel_master": self.sentinel_master,
            "master_address": self.master_address,
            "cluster_shards": self.cluster_shards,
            "cluster_replicas": self.cluster_replicas,
        }


def inspect_node(node: Node, prefix: str, budget: float) -> NodeFacts:
    """Read everything doctor judges from one node; raises if it cannot be reached.

    ``budget``: the seconds this node gets; the key scan stops early to fit in it.
    """
    started = time.monotonic()
    if isinstance(node, ClusterNode):
        return _inspect_cluster(node, prefix, budget)
    facts = NodeFacts(node.address)
    client = node.client()
    client.ping()  # connects: not part of the round trip measured below
    facts.reachable = True
    if node.sentinel is not None:
        facts.sentinel_master = node.sentinel.master_name
        host, port = client.connection_pool.get_master_address()  # type: ignore[attr-defined]
        facts.master_address = f"{host}:{port}"
    facts.latency_ms = _round_trip_ms(client)
    _read_info(client, facts)
    facts.clock_offset = _clock_offset(client)
    key = f"{prefix}:doctor-probe:{os.getpid()}:{time.monotonic_ns()}"
    facts.lock_scripts_error = _probe_lock_scripts(client, key)
    _scan_lock_keys(client, prefix, facts, started + budget * SCAN_BUDGET)
    return facts


def _inspect_cluster(node: ClusterNode, prefix: str, budget: float) -> NodeFacts:
    """A Redis Cluster as one node: settings from its first master, the probe lock on
    the master of its key's slot (the names tagged as the lock tags them), lock keys
    counted on every master."""
    started = time.monotonic()
    facts = NodeFacts(node.address)
    masters = node.masters(budget)
    client = masters[0].client()
    client.ping()
    facts.reachable = True
    facts.cluster_shards = len(masters)
    facts.latency_ms = _round_trip_ms(client)
    _read_info(client, facts)
    facts.cluster_replicas = sum(
        int(m.client().info("replication").get("connected_slaves") or 0) for m in masters
    )
    facts.clock_offset = _clock_offset(client)
    probe = f"{prefix}:doctor-probe:{os.getpid()}:{time.monotonic_ns()}"
    owner = node.master_of_name(tagged(probe), budget).client()
    facts.lock_scripts_error = _probe_lock_scripts(owner, probe, tagged)
    stop_at = started + budget * SCAN_BUDGET
    for master in masters:
        _scan_lock_keys(master.client(), prefix, facts, stop_at, match="{" + prefix_match(prefix))
        if not facts.scan_complete:
            break
    return facts


def _round_trip_ms(client: redis.Redis) -> float:
    trips = []
    for _ in range(5):
        before = time.perf_counter()
        client.ping()
        trips.append(time.perf_counter() - before)
    return statistics.median(trips) * 1000


def _read_info(client: redis.Redis, facts: NodeFacts) -> None:
    """Version, role, memory and persistence settings."""
    server = client.info("server")
    facts.server, facts.version = server_identity(server)
    facts.redis_version = text(server.get("redis_version"))
    facts.run_id = text(server.get("run_id"))
    replication = client.info("replication")
    facts.role = text(replication.get("role"))
    if facts.role == "slave":
        facts.master = f"{replication.get('master_host')}:{replication.get('master_port')}"
    facts.replicas = int(replication.get("connected_slaves") or 0)
    facts.cluster_enabled = bool(int(client.info("cluster").get("cluster_enabled") or 0))
    memory = client.info("memory")
    facts.maxmemory = int(memory.get("maxmemory") or 0)
    facts.maxmemory_policy = text(memory.get("maxmemory_policy"))
    persistence = client.info("persistence")
    facts.appendonly = bool(int(persistence.get("aof_enabled") or 0))
    try:
        # Not in INFO; CONFIG may be renamed or refused on managed Redis.
        facts.appendfsync = text(client.config_get("appendfsync").get("appendfsync"))
    except redis.ResponseError as exc:
        facts.appendfsync_error = error_text(exc)


def server_identity(info_server: dict[str, Any]) -> tuple[str, Optional[str]]:
    """The server's name and its own version, from ``INFO server``."""
    name = text(info_server.get("server_name")) or "redis"
    version = text(info_server.get(f"{name}_version")) or text(info_server.get("redis_version"))
    return SERVER_NAMES.get(name, name), version


def _clock_offset(client: redis.Redis) -> float:
    """Seconds the node's TIME is ahead of this host's clock (midpoint of the call)."""
    before = time.time()
    seconds, micros = client.time()
    after = time.time()
    return float(seconds + micros / 1e6 - (before + after) / 2)


def _probe_lock_scripts(
    client: redis.Redis, key: str, rename: Callable[[str], str] = str
) -> Optional[str]:
    """Take and release a probe lock on ``key`` with the lock's own commands (SCRIPT
    LOAD, then EVALSHA of the acquire and release scripts): None when this user may,
    else why not. Inspection alone cannot tell: an ACL may allow INFO and forbid
    EVALSHA or DEL. ``rename``: the names as the node stores them (a cluster's)."""
    value = "doctor-probe|celery redlock doctor"
    try:
        for script in (scripts.ACQUIRE, scripts.RELEASE):
            client.script_load(script.source)
        names = (rename(key), rename(tombstone(key, value)))
        taken = client.evalsha(scripts.ACQUIRE.sha, 2, *names, value, 5000)
        if taken != 1:
            return f"the probe lock {key} was not granted ({taken!r})"
        released = client.evalsha(scripts.RELEASE.sha, 2, *names, value, 5000)
        if released != 1:
            return f"the probe lock {key} was not released ({released!r})"
    except redis.RedisError as exc:
        return error_text(exc)
    return None


def _scan_lock_keys(
    client: redis.Redis,
    prefix: str,
    facts: NodeFacts,
    stop_at: float,
    match: Optional[str] = None,
) -> None:
    """Count lock keys, permits and fence keys, find lock keys and permit slots without
    a TTL, and note the longest TTL and rate period, until ``stop_at``. ``match``:
    the SCAN pattern (default: the prefix's; a cluster's names begin with ``{``)."""
    match = match or prefix_match(prefix)
    permits: dict[str, set[str]] = {LIMIT: set(), RATE: set()}
    cursor = 0
    try:
        while True:
            cursor, batch = client.scan(cursor, match=match, count=1000)
            names = [text(k) or "" for k in batch]
            facts.fence_keys += sum(1 for k in names if k.endswith(FENCE))
            keys = lock_keys(names)
            facts.lock_keys += len(keys)
            slots: list[str] = []
            rate_records: list[str] = []
            for name in names:
                permit = permit_name(name)
                if permit is None:
                    continue
                key, kind, slot = permit
                permits[kind].add(key)
                if slot is not None:
                    slots.append(name)
                elif kind == RATE:
                    rate_records.append(name)
            facts.permit_slots += len(slots)
            _read_ttls(client, keys + slots, rate_records, facts)
            if cursor == 0:
                return
            if time.monotonic() > stop_at:
                facts.scan_complete = False
                return
    finally:
        facts.limited_keys, facts.rated_keys = len(permits[LIMIT]), len(permits[RATE])


def _read_ttls(
    client: redis.Redis, names: list[str], rate_records: list[str], facts: NodeFacts
) -> None:
    """The TTL of each lock key and permit slot in ``names``, and the period each rate
    record names."""
    if names:
        pipe = client.pipeline(transaction=False)
        for name in names:
            pipe.pttl(name)
        for name, pttl in zip(names, pipe.execute()):
            if pttl == -1:
                facts.keys_without_ttl_count += 1
                if len(facts.keys_without_ttl) < NO_TTL_SHOWN:
                    facts.keys_without_ttl.append(describe_name(name))
            elif isinstance(pttl, int) and pttl > 0 and not _is_rate_slot(name):
                facts.longest_ttl = max(facts.longest_ttl or 0.0, pttl / 1000.0)
    if rate_records:
        pipe = client.pipeline(transaction=False)
        for record in rate_records:
            pipe.get(record)
        # A record of another type (left by hand) reads as no period, not as a failure.
        for value in pipe.execute(raise_on_error=False):
            recorded = text(value) if isinstance(value, (bytes, str)) else None
            period = read_terms(RATE, recorded)[1]
            if period is not None:
                facts.longest_rate_period = max(facts.longest_rate_period or 0.0, period)


def _is_rate_slot(name: str) -> bool:
    # A rate's slot lives for the period: that is the rate's time, not a lock's TTL.
    permit = permit_name(name)
    return permit is not None and permit[1] == RATE
