"""``celery -A proj redlock doctor --textfile PATH`` against real redis-server nodes:
the verdicts as Prometheus gauges, read back with prometheus_client's own parser."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from celery_redlock.cli.checks import ERROR, OK, RANK, WARNING
from celery_redlock.cli.doctor import configuration_error_document
from celery_redlock.cli.textfile import (
    CHECK_STATUS,
    KEYS_WITHOUT_TTL,
    LAST_RUN,
    METRICS,
    STATUS,
    doctor_samples,
    registry_of,
)
from celery_redlock.testing import RedisNodes, RedisNodesFactory, RedisServer
from tests.support.cli import invoke, run_celery

Labels = tuple[tuple[str, str], ...]


def read_gauges(text: str) -> dict[str, dict[Labels, float]]:
    """Each gauge's samples by their sorted labels, as Prometheus would read them."""
    gauges: dict[str, dict[Labels, float]] = {}
    for family in text_string_to_metric_families(text):
        assert family.type == "gauge", family.name
        for sample in family.samples:
            gauges.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return gauges


def on_node(server: RedisServer, check: str) -> Labels:
    return (("check", check), ("node", f"127.0.0.1:{server.port}/0"))


def across_nodes(check: str) -> Labels:
    return (("check", check), ("node", ""))


def test_doctor_writes_every_gauge_through_the_celery_program(
    module_nodes: RedisNodes, tmp_path: Path
) -> None:
    module_nodes.flushall()
    path = tmp_path / "celery_redlock.prom"
    started = time.time()
    proc = run_celery(module_nodes.urls, "doctor", "--textfile", str(path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("redlock doctor: 3 nodes")  # the report is printed too
    gauges = read_gauges(path.read_text())
    assert set(gauges) == set(METRICS)
    # Test servers run without an AOF: a warning, not an error.
    assert gauges[STATUS] == {(): RANK[WARNING]}
    for server in module_nodes:
        assert gauges[CHECK_STATUS][on_node(server, "persistence")] == RANK[WARNING]
        assert gauges[CHECK_STATUS][on_node(server, "lock-keys")] == RANK[OK]
        assert gauges[KEYS_WITHOUT_TTL][(("node", f"127.0.0.1:{server.port}/0"),)] == 0
    assert gauges[CHECK_STATUS][across_nodes("quorum")] == RANK[OK]
    assert started <= gauges[LAST_RUN][()] <= time.time()
    assert os.listdir(tmp_path) == [path.name]  # the partial file was renamed, not left


def test_doctor_counts_lock_keys_without_a_ttl_per_node_and_still_exits_1(
    module_nodes: RedisNodes, tmp_path: Path
) -> None:
    module_nodes.flushall()
    for i in range(12):
        module_nodes[1].client().set(f"redlock:stuck:{i:02d}", "token|gone@worker:1")
    path = tmp_path / "celery_redlock.prom"
    path.write_text("# the previous run's file, replaced whole\n")
    result = invoke(module_nodes.urls, "doctor", "--json", "--textfile", str(path))
    assert result.exit_code == 1, result.output
    gauges = read_gauges(path.read_text())
    assert gauges[STATUS] == {(): RANK[ERROR]}
    assert gauges[KEYS_WITHOUT_TTL] == {
        (("node", f"127.0.0.1:{s.port}/0"),): (12 if s is module_nodes[1] else 0)
        for s in module_nodes
    }
    assert gauges[CHECK_STATUS][on_node(module_nodes[1], "lock-keys")] == RANK[ERROR]
    assert gauges[CHECK_STATUS][on_node(module_nodes[0], "lock-keys")] == RANK[OK]


def test_doctor_reports_the_loss_of_quorum_and_no_key_count_for_unreachable_nodes(
    redis_nodes_factory: RedisNodesFactory, tmp_path: Path
) -> None:
    cluster = redis_nodes_factory(3)
    path = tmp_path / "celery_redlock.prom"
    cluster[0].stop()
    assert invoke(cluster.urls, "doctor", "--textfile", str(path)).exit_code == 1
    gauges = read_gauges(path.read_text())
    assert gauges[CHECK_STATUS][on_node(cluster[0], "reachable")] == RANK[ERROR]
    assert gauges[CHECK_STATUS][across_nodes("quorum")] == RANK[OK]
    # An unreachable node's keys were not counted: no sample, rather than a false 0.
    assert (("node", f"127.0.0.1:{cluster[0].port}/0"),) not in gauges[KEYS_WITHOUT_TTL]

    cluster[1].stop()
    invoke(cluster.urls, "doctor", "--textfile", str(path))
    gauges = read_gauges(path.read_text())
    assert gauges[CHECK_STATUS][across_nodes("quorum")] == RANK[ERROR]
    assert len(gauges[KEYS_WITHOUT_TTL]) == 1


def test_invalid_settings_are_one_failed_configuration_check() -> None:
    samples = doctor_samples(configuration_error_document("no nodes"), now=1700000000.5)
    gauges = read_gauges(generate_latest(registry_of(samples)).decode())
    assert gauges[STATUS] == {(): RANK[ERROR]}
    assert gauges[CHECK_STATUS] == {across_nodes("configuration"): RANK[ERROR]}
    assert gauges[LAST_RUN] == {(): 1700000000.5}


def test_a_check_named_twice_for_one_node_is_one_series_at_its_worst() -> None:
    # distinct-servers is one check per duplicated server; a series may appear once.
    node = 'unix:/tmp/a "b"\\c.sock/0'  # quotes and backslashes escaped in the label
    document = {
        "status": ERROR,
        "nodes": [
            {
                "node": node,
                "reachable": True,
                "keys_without_ttl_count": 0,
                "checks": [{"check": "reachable", "status": OK}],
            }
        ],
        "checks": [
            {"check": "distinct-servers", "status": ERROR},
            {"check": "distinct-servers", "status": OK},
        ],
    }
    gauges = read_gauges(generate_latest(registry_of(doctor_samples(document, now=0))).decode())
    assert gauges[CHECK_STATUS] == {
        (("check", "reachable"), ("node", node)): RANK[OK],
        across_nodes("distinct-servers"): RANK[ERROR],
    }


def test_without_prometheus_client_the_textfile_is_refused_naming_the_extra(
    module_nodes: RedisNodes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import fails
    path = tmp_path / "celery_redlock.prom"
    result = invoke(module_nodes.urls, "doctor", "--textfile", str(path))
    assert result.exit_code == 1, result.output
    assert "doctor --textfile needs prometheus-client" in result.output
    assert "celery-redlock[prometheus]" in result.output
    assert not path.exists()
