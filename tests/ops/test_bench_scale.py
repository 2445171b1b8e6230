"""Pieces of ``python -m bench scale`` that run cheaply: the library hand-off
measurement on real nodes, the hot-key arithmetic, and the report (tables and, when
matplotlib is installed, the figure) from a small made-up run.

No figure is judged: these check that the bench runs and reports what it saw (speed
lives in bench/, not in tests).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import scale_handoff, scale_report
from bench.scale_tasks import _busy_share, _overlaps, _rank_correlation
from celery_redlock.testing import RedisNodesFactory
from tests.support.observe import settles


@pytest.mark.slow
def test_handoff_measure_takes_every_sample_through_the_public_api(
    redis_nodes_factory: RedisNodesFactory,
) -> None:
    cluster = redis_nodes_factory(3)
    result = scale_handoff.measure(cluster.urls, 3, "bench-test:handoff")
    assert (result["samples"], result["missed"], result["nodes"]) == (3, 0, 3)
    assert 0 < result["p50_ms"] <= result["p95_ms"] <= result["max_ms"]
    clients = [server.client() for server in cluster]  # the last release returned at quorum
    settles(
        lambda: [c.exists("bench-test:handoff") for c in clients],
        [0, 0, 0],
        "the key released on every node",
    )


def test_busy_share_and_overlaps_come_from_the_body_spans() -> None:
    spans = [("a", 0, 10), ("b", 20, 30), ("c", 25, 40)]
    assert _busy_share(spans) == pytest.approx(35 / 40)
    assert _overlaps(spans) == 1
    assert _overlaps(spans[:2]) == 0
    assert _busy_share([]) == 0.0


def test_fairness_is_the_rank_correlation_of_run_order_with_arrival() -> None:
    assert _rank_correlation(["a", "b", "c"], ["a", "b", "c"]) == 1.0
    assert _rank_correlation(["a", "b", "c"], ["c", "b", "a"]) == -1.0
    assert _rank_correlation(["a", "b", "c", "d"], ["a", "b", "d"]) == 1.0  # c never ran


def _summary(p50: float) -> dict[str, Any]:
    return {"p50_us": p50, "p95_us": 2 * p50, "ops_per_s": 1e6 / p50}


def _report() -> dict[str, Any]:
    machine = {
        "cpu": "cpu",
        "cpus": 2,
        "python": "CPython",
        "redis_server": {"version": "7"},
        "libraries": {"celery-redlock": "0", "redis": "8", "pottery": "3"},
        "loadavg_at_start": [1.0, 1.0, 1.0],
    }
    hot = {
        "duplicates": 10,
        "body_s": 0.1,
        "busy_share": 0.9,
        "span_s": 1.1,
        "broker_messages": 30,
        "messages_per_task": 3.0,
        "ran_once": 10,
        "ran_twice_or_more": 0,
        "overlapping_bodies": 0,
        "timed_out": False,
    }
    return {
        "started_at": "now",
        "duration_s": 1.0,
        "machine": machine,
        "loadavg_at_end": [1.0, 1.0, 1.0],
        "plan": {"hot_workers": 1, "hot_concurrency": 2, "hot_body_s": 0.1},
        "latency_vs_nodes": {
            "loadavg": [1.0, 1.0],
            "rows": [
                {
                    "nodes": n,
                    "ours": _summary(100.0 * n),
                    "floor": _summary(80.0 * n),
                    "pottery": _summary(900.0 * n),
                    "ours_over_floor_p50": 1.25,
                    "pottery_over_ours_p50": 9.0,
                }
                for n in (1, 3)
            ],
        },
        "ops_vs_threads": {
            "loadavg": [1.0, 1.0],
            "names": {"ours": "ours", "theirs": "theirs"},
            "rows": [
                {
                    "threads": t,
                    "loadavg": 1.0,
                    "ours": _summary(100.0 if t == 1 else 200.0),
                    "theirs": _summary(900.0),
                }
                for t in (1, 8)
            ],
        },
        "renewals": [
            {
                "leases": n,
                "renewals_per_s": n,
                "cpu_share_of_a_core": 0.001 * n,
                "cpu_us_per_renewal": 30.0,
                "lost": 0,
                "loadavg": 1.0,
            }
            for n in (10, 100)
        ],
        "hot_key": [{**hot, "handoff": True}, {**hot, "handoff": False, "busy_share": 0.1}],
        "handoff_latency": [
            {
                "lock": lock,
                "nodes": nodes,
                "samples": 3,
                "missed": 0,
                "p50_ms": p50,
                "p95_ms": 2 * p50,
                "max_ms": 3 * p50,
                "loadavg": 1.0,
            }
            for lock, nodes, p50 in (("ours", 5, 50.0), ("theirs", 1, 1.0))
        ],
    }


def test_report_has_a_table_per_section_and_draws_the_figure(tmp_path: Path) -> None:
    report = _report()
    text = scale_report.render_markdown(report)
    for heading in ("| nodes |", "| threads |", "| leases held |", "| duplicates |"):
        assert heading in text
    assert "| lock | nodes |" in text
    # Each one's ops/s with 8 threads over its own with 1.
    assert "| threads | ours | theirs |\n|--:|--:|--:|\n| 8 | 0.50 | 1.00 |" in text
    pytest.importorskip("matplotlib", reason="matplotlib (the bench extra) is not installed")
    scale_report.plot(report, tmp_path / "scale.png")
    assert (tmp_path / "scale.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
