"""``celery -A proj redlock doctor | ls | show | release`` against real redis-server nodes.

Each command runs at least once through the real ``celery`` program in a subprocess
(``-A tests.apps.cliapp``, nodes passed by environment: entry point discovery, app loading and
exit codes as an operator sees them). The rest invoke the ``redlock`` click group
in-process with click's CliRunner and the same context object Celery's own group
builds (``CLIContext``), which is faster and lets a test answer the --force prompt.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_redlock import Redlock
from celery_redlock.cli import Holder, full_key, inspect_node, judge_node
from celery_redlock.cli.checks import (
    check_maxmemory_policy,
    check_persistence,
    check_quorum,
    check_reachable,
    check_role,
)
from celery_redlock.cli.common import configured_nodes
from celery_redlock.cli.doctor import inspect_nodes
from celery_redlock.tasks.config import app_config
from celery_redlock.testing import (
    RedisNodes,
    RedisNodesFactory,
    RedisServer,
    RedisServerFactory,
    ShardedCluster,
    ShardedClusterFactory,
)
from celery_redlock.testing.sharded import claim_cluster_port
from tests.support.cli import doc, invoke, make_app, run_celery

KEY = "redlock:import:42"
HOLDER = "task-1@worker-a:42"
#: The TTL take_lock gives its lock.
LOCK_TTL = 30.0


@pytest.fixture
def nodes(module_nodes: RedisNodes) -> RedisNodes:
    """Three healthy independent masters, emptied for each test."""
    module_nodes.flushall()
    return module_nodes


def node_checks(report: Any, address: str) -> dict[str, dict[str, Any]]:
    (node,) = [n for n in report["nodes"] if n["node"] == address]
    return {c["check"]: c for c in node["checks"]}


def cluster_checks(report: Any) -> dict[str, dict[str, Any]]:
    return {c["check"]: c for c in report["checks"]}


def address(server: RedisServer) -> str:
    return f"127.0.0.1:{server.port}/0"


def take_lock(urls: list[str], key: str = KEY, *, fencing: bool = False) -> str:
    """Acquire ``key`` for LOCK_TTL s as HOLDER; returns the token."""
    lock = Redlock(urls, fencing=fencing)
    try:
        lease = lock.acquire(key, ttl=LOCK_TTL, holder=HOLDER)
        assert lease is not None
        return lease.token
    finally:
        lock.close()


def ttl_floor(taken_from: float, shown_to: float = 0.001) -> float:
    """The least TTL a node can report now for a lock take_lock began taking at
    ``taken_from`` (``time.monotonic()``): LOCK_TTL less the time since, less the
    report's rounding (PTTL counts whole milliseconds; the ls table shows tenths)."""
    return LOCK_TTL - (time.monotonic() - taken_from) - shown_to


def present(cluster: RedisNodes, key: str = KEY) -> list[bool]:
    return [bool(server.client().exists(key)) for server in cluster]


# -- doctor ------------------------------------------------------------------------------


def test_doctor_passes_healthy_masters_through_the_celery_program(nodes: RedisNodes) -> None:
    proc = run_celery(nodes.urls, "doctor", "--json")
    assert proc.returncode == 0, proc.stderr
    report = doc(proc.stdout)
    assert report["summary"]["ERROR"] == 0
    # Test servers run without an AOF: a warning, not an error.
    assert report["status"] == "WARNING"
    assert report["quorum"] == 2
    for server in nodes:
        checks = node_checks(report, address(server))
        assert {n: c["status"] for n, c in checks.items()} == {
            "reachable": "OK",
            "permissions": "OK",
            "latency": "OK",
            "version": "OK",
            "role": "OK",
            "maxmemory-policy": "OK",
            "persistence": "WARNING",
            "clock": "OK",
            "lock-keys": "OK",
        }
    assert {c["status"] for c in report["checks"]} == {"OK"}


def test_doctor_table_warns_about_persistence_with_the_redis_io_advice(
    nodes: RedisNodes,
) -> None:
    result = invoke(nodes.urls, "doctor")
    assert result.exit_code == 0, result.output
    assert "appendonly no" in result.output
    assert "delayed restarts" in result.output
    assert "longer than the largest lock TTL (redlock_ttl is 30 s" in result.output
    assert "Performance, crash-recovery and fsync" in result.output
    assert result.output.rstrip().endswith("0 error(s), 3 warning(s), 28 OK -> WARNING")


def test_doctor_is_all_ok_with_appendfsync_always(
    redis_nodes_factory: RedisNodesFactory,
) -> None:
    cluster = redis_nodes_factory(3, appendonly=True)
    result = invoke(cluster.urls, "doctor", "--json")
    assert result.exit_code == 0, result.output
    report = doc(result.stdout)
    assert report["status"] == "OK"
    assert node_checks(report, address(cluster[0]))["persistence"]["message"] == (
        "appendonly yes, appendfsync always"
    )


def test_doctor_flags_a_replica_used_as_a_lock_node(
    redis_server_factory: RedisServerFactory,
) -> None:
    master = redis_server_factory()
    other = redis_server_factory()
    replica = redis_server_factory(extra_args=["--replicaof", "127.0.0.1", str(master.port)])
    result = invoke([master.url, replica.url, other.url], "doctor", "--json")
    assert result.exit_code == 1, result.output
    report = doc(result.stdout)
    role = node_checks(report, address(replica))["role"]
    assert role["status"] == "ERROR"
    assert f"replica of 127.0.0.1:{master.port}" in role["message"]
    # The replica does not count towards the quorum; the two masters still make one.
    assert cluster_checks(report)["quorum"]["message"].startswith("2 of 3 nodes usable")
    assert cluster_checks(report)["quorum"]["status"] == "OK"


def test_doctor_flags_eviction_policies_that_may_drop_lock_keys(
    redis_server_factory: RedisServerFactory,
) -> None:
    allkeys = redis_server_factory(extra_args=["--maxmemory-policy", "allkeys-lru"])
    volatile = redis_server_factory(extra_args=["--maxmemory-policy", "volatile-lru"])
    fine = redis_server_factory()
    result = invoke([allkeys.url, volatile.url, fine.url], "doctor", "--json")
    assert result.exit_code == 1, result.output
    report = doc(result.stdout)
    flagged = node_checks(report, address(allkeys))["maxmemory-policy"]
    assert flagged["status"] == "ERROR"
    assert flagged["message"].startswith("allkeys-lru")
    assert "may evict any key" in flagged["message"]
    flagged = node_checks(report, address(volatile))["maxmemory-policy"]
    assert flagged["status"] == "ERROR"
    assert "evicts keys that have a TTL, which is every lock key" in flagged["message"]
    assert node_checks(report, address(fine))["maxmemory-policy"]["status"] == "OK"


@pytest.fixture
def socket_dir() -> Iterator[str]:
    # Short: a unix socket path must fit in 108 bytes.
    path = tempfile.mkdtemp(prefix="rl-cli-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_doctor_flags_the_same_server_listed_twice(
    redis_server_factory: RedisServerFactory, socket_dir: str
) -> None:
    sock = os.path.join(socket_dir, "redis.sock")
    twice = redis_server_factory(extra_args=["--unixsocket", sock, "--unixsocketperm", "700"])
    other = redis_server_factory()
    # TCP and unix socket: different addresses, so the configuration accepts them.
    urls = [twice.url, f"unix://{sock}?db=0", other.url]
    result = invoke(urls, "doctor", "--json")
    assert result.exit_code == 1, result.output
    report = doc(result.stdout)
    distinct = cluster_checks(report)["distinct-servers"]
    assert distinct["status"] == "ERROR"
    assert f"{address(twice)} and unix:{sock}/0 are the same server" in distinct["message"]
    assert cluster_checks(report)["quorum"]["message"].startswith("2 of 3 nodes usable")


def test_doctor_flags_lock_keys_without_a_ttl_but_not_fence_counters(
    nodes: RedisNodes,
) -> None:
    take_lock(nodes.urls, fencing=True)  # leaves KEY:fence (no TTL, by design)
    client = nodes[1].client()
    for i in range(12):
        client.set(f"redlock:stuck:{i:02d}", "token|gone@worker:1")
    client.set("unrelated:no-ttl", "x")  # outside the prefix: not ours to judge
    result = invoke(nodes.urls, "doctor", "--json")
    assert result.exit_code == 1, result.output
    report = doc(result.stdout)
    (node,) = [n for n in report["nodes"] if n["node"] == address(nodes[1])]
    assert node["keys_without_ttl_count"] == 12
    assert len(node["keys_without_ttl"]) == 10
    assert all(k.startswith("redlock:stuck:") for k in node["keys_without_ttl"])
    assert node["fence_keys"] == 1
    check = node_checks(report, address(nodes[1]))["lock-keys"]
    assert check["status"] == "ERROR"
    assert "12 key(s) under 'redlock:' without a TTL" in check["message"]
    assert "and 2 more" in check["message"]
    # The other nodes hold the fenced lock and its counter only: fine.
    assert node_checks(report, address(nodes[0]))["lock-keys"]["status"] == "OK"


def test_doctor_reports_an_unreachable_node_then_the_loss_of_quorum(
    redis_nodes_factory: RedisNodesFactory,
) -> None:
    cluster = redis_nodes_factory(3)
    cluster[0].stop()
    result = invoke(cluster.urls, "doctor", "--json")
    assert result.exit_code == 1, result.output
    report = doc(result.stdout)
    reachable = node_checks(report, address(cluster[0]))["reachable"]
    assert reachable["status"] == "ERROR"
    assert "unreachable" in reachable["message"]
    assert cluster_checks(report)["quorum"]["status"] == "OK"

    cluster[1].stop()
    result = invoke(cluster.urls, "doctor")
    assert result.exit_code == 1
    assert "1 of 3 nodes usable (reachable, standalone master, distinct), quorum 2" in result.output
    assert "no lock can be taken" in result.output


def test_a_hung_node_costs_each_command_its_timeout_once(
    redis_nodes_factory: RedisNodesFactory,
) -> None:
    # A command pays the hung node's timeout once: paying it per step (every command
    # has two or more) would take 2 x timeout at least. Its other work (milliseconds)
    # must fit in a second timeout: 5 s leaves a scheduler stall of a loaded machine
    # that much room.
    timeout = 5.0
    cluster = redis_nodes_factory(3)
    token = take_lock(cluster.urls)
    cluster[2].pause()
    try:
        for args in (
            ("doctor", "--json"),
            ("ls", "--json"),
            ("show", KEY, "--json"),
            ("release", KEY, "--token", token, "--json"),
        ):
            started = time.monotonic()
            result = invoke(cluster.urls, *args, "--timeout", f"{timeout:g}")
            elapsed = time.monotonic() - started
            assert timeout <= elapsed < 2 * timeout, (args, elapsed)  # paid once, not per step
            report = doc(result.stdout)
            if args[0] == "doctor":
                assert result.exit_code == 1
                reachable = node_checks(report, address(cluster[2]))["reachable"]
                assert f"no reply within {timeout:g} s" in reachable["message"]
                continue
            assert result.exit_code == 0, result.output
            if args[0] == "ls":
                (held,) = report["keys"]
                assert held["agreeing_nodes"] == 2
                assert f"no reply within {timeout:g} s" in held["nodes"][2]["error"]
            elif args[0] == "show":
                assert report["agreeing_nodes"] == 2
                assert f"no reply within {timeout * 1000:.0f} ms" in report["nodes"][2]["error"]
            else:
                assert [n["result"] for n in report["nodes"]] == ["deleted", "deleted", "error"]
    finally:
        cluster[2].resume()
    # The hung node got the release too: it applies it when it wakes, else the key
    # expires there. Either way the two answering nodes no longer hold it.
    assert present(cluster)[:2] == [False, False]


def test_doctor_reports_invalid_settings_as_an_error() -> None:
    result = invoke(["http://127.0.0.1:1/0"], "doctor", "--json")
    assert result.exit_code == 1
    (check,) = doc(result.stdout)["checks"]
    assert check["check"] == "configuration"
    assert "is not a Redis URL" in check["message"]


# -- ls and show -------------------------------------------------------------------------


def test_ls_through_the_celery_program_shows_holder_and_ttls(nodes: RedisNodes) -> None:
    taken_from = time.monotonic()
    take_lock(nodes.urls)
    proc = run_celery(nodes.urls, "ls")  # a `celery` process: seconds under load
    least = ttl_floor(taken_from, shown_to=0.05)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["KEY", "TASK", "WORKER", "QUORUM", "TTL", "s", "per", "node"]
    row = lines[1].split()
    assert row[:6] == [KEY, "task-1", "worker-a", "(pid", "42)", "yes"]
    assert row[6] == "3/3"
    assert all(least <= float(ttl) <= LOCK_TTL for ttl in row[7:10]), (least, row)


def test_ls_json_lists_locks_with_quorum_agreement_and_skips_fence_counters(
    nodes: RedisNodes,
) -> None:
    taken_from = time.monotonic()
    take_lock(nodes.urls, fencing=True)
    take_lock(nodes.urls, "redlock:report:daily")
    nodes[0].client().set("redlock:minority", "tok|someone@host:7", px=20_000)
    result = invoke(nodes.urls, "ls", "--json")
    least = ttl_floor(taken_from)
    assert result.exit_code == 0, result.output
    listing = doc(result.stdout)
    by_key = {k["key"]: k for k in listing["keys"]}
    assert sorted(by_key) == ["redlock:import:42", "redlock:minority", "redlock:report:daily"]
    held = by_key[KEY]
    assert (held["task_id"], held["worker"], held["pid"]) == ("task-1", "worker-a", 42)
    assert held["quorum_agrees"] is True
    assert held["agreeing_nodes"] == 3
    assert [n["node"] for n in held["nodes"]] == [address(s) for s in nodes]
    assert all(least <= n["ttl"] <= LOCK_TTL for n in held["nodes"]), (least, held)
    minority = by_key["redlock:minority"]
    assert minority["quorum_agrees"] is False
    assert minority["agreeing_nodes"] == 1
    assert [n["ttl"] is None for n in minority["nodes"]] == [False, True, True]

    result = invoke(nodes.urls, "ls", "--pattern", "report:*", "--json")
    assert [k["key"] for k in doc(result.stdout)["keys"]] == ["redlock:report:daily"]


def test_ls_lists_from_the_nodes_that_answer_and_fails_when_none_do(
    redis_nodes_factory: RedisNodesFactory,
) -> None:
    cluster = redis_nodes_factory(3)
    take_lock(cluster.urls)
    cluster[0].stop()
    result = invoke(cluster.urls, "ls", "--json")
    assert result.exit_code == 0, result.output
    listing = doc(result.stdout)
    (held,) = listing["keys"]
    assert (held["key"], held["agreeing_nodes"], held["quorum_agrees"]) == (KEY, 2, True)
    assert "Connection refused" in held["nodes"][0]["error"]
    assert list(listing["errors"]) == [address(cluster[0])]

    cluster[1].stop()
    cluster[2].stop()
    result = invoke(cluster.urls, "ls")
    assert result.exit_code == 1
    assert result.output.count("could not list keys") == 3


def test_ls_with_no_locks_says_so(nodes: RedisNodes) -> None:
    result = invoke(nodes.urls, "ls")
    assert result.exit_code == 0
    assert "no lock keys match 'redlock:*' on 3 nodes" in result.output


def test_show_through_the_celery_program_takes_a_key_relative_to_the_prefix(
    nodes: RedisNodes,
) -> None:
    token = take_lock(nodes.urls)
    proc = run_celery(nodes.urls, "show", "import:42")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"key       {KEY}" in out
    assert "holder    task-1@worker-a:42 (task task-1, worker worker-a, pid 42)" in out
    assert "quorum    held: 3 of 3 nodes agree, 2 needed; frees in" in out
    assert f"token     {token}" in out
    for server in nodes:
        assert f"{address(server)}  {HOLDER}  {token[:8]}..." in out


def test_show_json_per_node_with_a_node_down(redis_nodes_factory: RedisNodesFactory) -> None:
    cluster = redis_nodes_factory(3)
    taken_from = time.monotonic()
    token = take_lock(cluster.urls)
    cluster[1].stop()
    result = invoke(cluster.urls, "show", KEY, "--json")
    least = ttl_floor(taken_from)
    assert result.exit_code == 0, result.output
    shown = doc(result.stdout)
    assert shown["key"] == KEY
    assert shown["quorum_agrees"] is True
    assert shown["token"] == token
    assert shown["agreeing_nodes"] == 2
    assert least <= shown["ttl"] <= LOCK_TTL
    up, down, _ = shown["nodes"]
    assert (up["holder"], up["token"], up["error"]) == (HOLDER, token, None)
    assert down["token"] is None
    assert "Connection refused" in down["error"]


def test_show_a_free_key(nodes: RedisNodes) -> None:
    result = invoke(nodes.urls, "show", "nothing:here", "--json")
    assert result.exit_code == 0
    shown = doc(result.stdout)
    assert shown["key"] == "redlock:nothing:here"
    assert (shown["quorum_agrees"], shown["token"], shown["agreeing_nodes"]) == (False, None, 0)


# -- release -----------------------------------------------------------------------------


def test_release_with_the_right_token_through_the_celery_program(nodes: RedisNodes) -> None:
    token = take_lock(nodes.urls, fencing=True)
    proc = run_celery(nodes.urls, "release", "import:42", f"--token={token}", "--json")
    assert proc.returncode == 0, proc.stderr
    outcome = doc(proc.stdout)
    assert outcome["deleted"] == 3
    assert [n["result"] for n in outcome["nodes"]] == ["deleted"] * 3
    assert present(nodes) == [False] * 3
    assert present(nodes, KEY + "\x00fence") == [True] * 3  # fencing stays monotonic


def test_release_with_a_wrong_token_deletes_nothing(nodes: RedisNodes) -> None:
    take_lock(nodes.urls)
    result = invoke(nodes.urls, "release", KEY, "--token", "not-the-token")
    assert result.exit_code == 1
    assert result.output.count("left alone: held with another token") == 3
    assert "nothing deleted on any node" in result.output
    assert present(nodes) == [True] * 3


def test_release_accepts_the_whole_stored_value_as_token(nodes: RedisNodes) -> None:
    token = take_lock(nodes.urls)
    result = invoke(nodes.urls, "release", KEY, "--token", f"{token}|{HOLDER}", "--json")
    assert result.exit_code == 0, result.output
    assert doc(result.stdout)["deleted"] == 3
    assert present(nodes) == [False] * 3


def test_release_of_a_free_key_exits_non_zero(nodes: RedisNodes) -> None:
    result = invoke(nodes.urls, "release", "import:7", "--token", "t", "--json")
    assert result.exit_code == 1
    assert [n["result"] for n in doc(result.stdout)["nodes"]] == ["absent"] * 3


def test_forced_release_asks_first_and_a_no_keeps_the_lock(nodes: RedisNodes) -> None:
    take_lock(nodes.urls)
    result = invoke(nodes.urls, "release", KEY, "--force", input="n\n")
    assert result.exit_code == 1
    assert f"Delete lock {KEY} on 3 nodes, whoever holds it (now: {HOLDER})?" in result.output
    assert "Aborted" in result.output
    assert present(nodes) == [True] * 3

    result = invoke(nodes.urls, "release", KEY, "--force", input="y\n")
    assert result.exit_code == 0, result.output
    assert present(nodes) == [False] * 3


def test_forced_release_with_yes_deletes_on_every_node_without_asking(
    nodes: RedisNodes,
) -> None:
    take_lock(nodes.urls)
    result = invoke(nodes.urls, "release", "import:42", "--force", "--yes", "--json")
    assert result.exit_code == 0, result.output
    outcome = doc(result.stdout)
    assert (outcome["mode"], outcome["deleted"]) == ("force", 3)
    assert {n["holder"] for n in outcome["nodes"]} == {HOLDER}
    assert present(nodes) == [False] * 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "Missing argument 'KEY'"),
        ((KEY,), "give --token TOKEN"),
        ((KEY, "--token", "t", "--force"), "--token and --force are mutually exclusive"),
        ((KEY, "--token", "t", "--yes"), "--yes only applies to --force"),
    ],
)
def test_release_usage_errors_name_the_option(
    nodes: RedisNodes, args: tuple[str, ...], message: str
) -> None:
    result = invoke(nodes.urls, "release", *args)
    assert result.exit_code == 2
    assert message in result.output
    assert "Usage:" in result.output


def test_invalid_settings_exit_with_ex_config() -> None:
    result = invoke(["http://127.0.0.1:1/0"], "ls")
    assert result.exit_code == 78
    assert "is not a Redis URL" in result.output


# -- helpers -----------------------------------------------------------------------------


def test_holder_strings_split_into_task_worker_and_pid() -> None:
    assert Holder.parse("t1@celery@host-1:42") == Holder(
        "t1@celery@host-1:42", "t1", "celery@host-1", 42
    )
    assert Holder.parse("host:7") == Holder("host:7", None, "host", 7)
    assert Holder.parse("queued-task-id") == Holder("queued-task-id", task_id="queued-task-id")
    assert Holder.parse(None) == Holder(None)


def test_keys_are_taken_full_or_relative_to_the_prefix() -> None:
    assert full_key("redlock:import:42", "redlock") == "redlock:import:42"
    assert full_key("import:42", "redlock") == "redlock:import:42"


# -- doctor as a library -----------------------------------------------------------------


def test_doctor_checks_judge_the_facts_read_from_a_real_node(
    redis_server_factory: RedisServerFactory,
) -> None:
    server = redis_server_factory(
        extra_args=["--maxmemory-policy", "volatile-lru", "--appendonly", "yes"]
    )
    config = app_config(make_app([server.url]))
    (node,) = configured_nodes(config.redlock(2.0, False))
    facts = inspect_node(node, config.key_prefix, 2.0)
    assert facts.reachable and facts.role == "master" and facts.appendfsync == "everysec"
    assert check_role(facts, config).status == "OK"
    assert check_maxmemory_policy(facts, config).status == "ERROR"
    persistence = check_persistence(facts, config)
    assert persistence.status == "WARNING"
    assert "appendfsync everysec" in persistence.message
    assert persistence.advice is not None and "delayed restarts" in persistence.advice
    assert [c.name for c in judge_node(facts, config)] == [
        "permissions",
        "latency",
        "version",
        "role",
        "maxmemory-policy",
        "persistence",
        "clock",
        "lock-keys",
    ]


def test_cluster_checks_count_only_the_nodes_that_answered(
    redis_nodes_factory: RedisNodesFactory,
) -> None:
    cluster = redis_nodes_factory(3)
    cluster[0].stop()
    cluster[1].stop()
    config = app_config(make_app(cluster.urls))
    facts = inspect_nodes(configured_nodes(config.redlock(1.0, False)), "redlock", 1.0)
    assert [f.reachable for f in facts] == [False, False, True]
    assert check_reachable(facts[0], config).message.startswith("unreachable: ")
    assert check_reachable(facts[2], config).status == "OK"
    verdict = check_quorum(facts)
    assert verdict.status == "ERROR"
    assert verdict.message == (
        "1 of 3 nodes usable (reachable, standalone master, distinct), quorum 2; 1 reachable: "
        "no lock can be taken"
    )


def test_doctor_flags_a_redis_cluster_node_not_as_a_permission_problem(
    redis_server_factory: RedisServerFactory, tmp_path: Path
) -> None:
    """A cluster-enabled node refuses the lock's scripts (their keys span slots): the
    role check says why, and the probe's failure is not taken for an ACL's."""
    masters = [redis_server_factory(), redis_server_factory()]
    # A cluster node's bus listens on its port + 10000.
    clustered = redis_server_factory(
        port=claim_cluster_port(),
        extra_args=["--cluster-enabled", "yes", "--cluster-config-file", str(tmp_path / "n.conf")],
    )
    result = invoke([m.url for m in masters] + [clustered.url], "doctor", "--json")
    assert result.exit_code == 1, result.output
    checks = node_checks(doc(result.stdout), address(clustered))
    assert checks["role"]["status"] == "ERROR"
    assert "a Redis Cluster server named as a plain master" in checks["role"]["message"]
    assert "redis+cluster://HOST:PORT" in checks["role"]["message"]
    assert checks["permissions"]["status"] == "ERROR"
    assert "ACL" not in checks["permissions"]["message"]
    assert "see role" in checks["permissions"]["message"]
    # It cannot vote: the two standalone masters make the quorum.
    assert cluster_checks(doc(result.stdout))["quorum"]["message"].startswith("2 of 3 nodes usable")


def test_doctor_reports_a_cluster_named_as_one_node_and_counts_its_keys_on_every_shard(
    sharded_cluster_factory: ShardedClusterFactory,
) -> None:
    cluster = sharded_cluster_factory(3, replicas=1)
    lock = Redlock([cluster.lock_url], node_timeout=0.5)  # its first round finds the map
    leases = [lock.acquire(f"redlock:task:{n}", ttl=60) for n in range(9)]
    try:
        result = invoke([cluster.lock_url], "doctor", "--json")
        report = doc(result.stdout)
        (node,) = report["nodes"]
        checks = node_checks(report, node["node"])
        assert node["cluster_shards"] == 3 and node["cluster_replicas"] == 3
        assert checks["role"]["status"] == "WARNING"
        assert (
            "a Redis Cluster of 3 shard(s) and 3 replica(s) as one lock node"
            in (checks["role"]["message"])
        )
        assert checks["permissions"]["status"] == "OK", checks["permissions"]
        assert node["lock_keys"] == 9  # on every shard, found under their tags
        assert cluster_checks(report)["quorum"]["message"].startswith("1 of 1 nodes usable")
    finally:
        for lease in leases:
            assert lease is not None and lease.release()
        lock.close()


def stored_tasks(cluster: ShardedCluster) -> set[str]:
    """The task lock keys the cluster's masters themselves hold (tagged names)."""
    found: set[str] = set()
    for master in cluster:
        names: list[bytes] = master.client().keys("{redlock:task:*}")  # type: ignore[assignment]
        found.update(name.decode() for name in names)
    return found


def test_ls_show_release_and_clear_read_a_cluster_node_by_the_names_the_lock_gives(
    sharded_cluster_factory: ShardedClusterFactory,
) -> None:
    cluster = sharded_cluster_factory(3)
    url = cluster.lock_url
    lock = Redlock([url])
    try:
        held = [lock.acquire(f"redlock:task:{n}", ttl=60, holder=f"w{n}") for n in range(6)]
        permit = Redlock([url]).acquire("redlock:api", ttl=60, limit=2, holder="p1")
        assert all(held) and permit is not None
        listing = invoke([url], "ls", "--json")
        report = doc(listing.stdout)
        assert sorted(k["key"] for k in report["keys"]) == [f"redlock:task:{n}" for n in range(6)]
        assert [p["key"] for p in report["permits"]] == ["redlock:api"]
        shown = invoke([url], "show", "redlock:api")
        assert "limit 2" in shown.output and "p1" in shown.output, shown.output
        token = held[0].token  # type: ignore[union-attr]
        released = invoke([url], "release", "redlock:task:0", f"--token={token}")
        assert released.exit_code == 0 and "deleted" in released.output, released.output
        forced = invoke([url], "release", "redlock:task:1", "--force", "--yes")
        assert forced.exit_code == 0 and "deleted (held by w1)" in forced.output, forced.output
        # What the servers themselves hold (an observer apart from the lock):
        assert stored_tasks(cluster) == {f"{{redlock:task:{n}}}" for n in range(2, 6)}
        assert lock.clear("redlock:task:*") == 4
        assert stored_tasks(cluster) == set()
    finally:
        lock.close()
