"""Pieces of ``python -m bench limits`` that run cheaply: the observer's arithmetic
(occupancy over time, starts per window), the INCR contenders, the overhead section
and the precision runs on real nodes with a few operations, and the report.

No figure is judged (speed lives in bench/, not in tests): these check that the bench
runs and reports what it saw. The one bound asserted is a safety one that holds at any
speed: the observer counts a holder only while it holds a permit.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from bench import limits_report
from bench.limiters import FixedWindowRate, IncrCounter, Observer
from bench.limits import QUICK
from bench.limits_contention import _ours_enter, _ours_start
from bench.limits_overhead import overhead
from bench.limits_precision import limit_run, occupancy_stats, rate_run, window_stats
from celery_redlock import Redlock
from celery_redlock.testing import RedisNodesFactory, RedisServer


def test_occupancy_is_weighted_by_time_and_entries_over_the_limit_are_counted() -> None:
    log = [(10, 1), (20, 2), (30, 3), (40, 2), (60, 1), (80, 0)]
    row = occupancy_stats(log, 0, 100, 2)
    assert (row["max_inside"], row["entries"], row["entries_over_limit"]) == (3, 3, 1)
    assert row["mean_occupancy"] == (10 + 20 + 30 + 40 + 20) / 100
    assert row["busy_share"] == 0.6
    assert occupancy_stats([], 0, 100, 2)["busy_share"] == 0.0


def test_windows_count_from_every_start_and_the_effective_period_spans_r_starts() -> None:
    steady = [0, 100_000, 1_000_000, 1_100_000, 2_000_000, 2_100_000]
    row = window_stats(steady, 2, 1.0)
    assert (row["starts"], row["max_in_window"]) == (6, 2)
    assert row["shortest_span_of_r_plus_1_ms"] == 1000.0
    assert (row["effective_period_s"], row["achieved_fraction"]) == (1.0, 1.0)
    double = window_stats([900_000, 950_000, 1_000_000, 1_050_000], 2, 1.0)
    assert double["max_in_window"] == 4
    assert double["shortest_span_of_r_plus_1_ms"] == 100.0
    assert window_stats([], 2, 1.0)["achieved_fraction"] is None


def test_the_incr_contenders_admit_up_to_their_count_then_refuse(
    redis_server: RedisServer,
) -> None:
    client = redis_server.client()
    counter = IncrCounter(client, "counter", 2, 10.0)
    assert [counter.try_acquire() for _ in range(3)] == [True, True, False]
    counter.release()
    assert counter.try_acquire()
    window = FixedWindowRate(client, "window", 2, 3600.0)
    admitted = [window.admit() for _ in range(3)]
    assert admitted[:2] == [0.0, 0.0]
    assert 0 < admitted[2] <= 3600.0


def test_overhead_has_every_row_beside_its_floor_and_our_mutex(
    redis_nodes_factory: RedisNodesFactory,
) -> None:
    nodes = redis_nodes_factory(5)
    plan = replace(QUICK, iterations=4, rounds=1, warmup=0, occupancies=(10,))
    rows = overhead(nodes, lambda *parts: ":".join(["t", *map(str, parts)]), plan, print)
    by_slug = {row["slug"]: row for row in rows}
    for n in (1, 3, 5):
        assert {f"floor2_{n}", f"floor1_{n}", f"mutex_{n}", f"limit_{n}", f"admit_{n}"} <= set(
            by_slug
        )
        assert by_slug[f"mutex_{n}"]["over_mutex_p50"] == 1.0
    assert {"incr_counter", "fixed_window", "admit_5_taken_10"} <= set(by_slug)
    assert by_slug["admit_5_taken_10"]["fill"]["taken"] == 10
    assert all(row["operations"] >= 1 for row in rows)


def test_precision_runs_report_what_the_observer_saw(
    redis_nodes_factory: RedisNodesFactory, redis_server: RedisServer
) -> None:
    nodes = redis_nodes_factory(3)
    lock = Redlock(nodes.urls, ttl=5.0, node_timeout=0.5)
    observer = Observer(redis_server.client(), "test")
    try:
        enter = _ours_enter(lock, "inside", 2, polling=False)
        row = limit_run(enter, observer, 3, 2, 0.002, 0.3)
        assert row["entries"] >= 1
        assert row["max_inside"] <= 2
        # The run is shorter than the period: every start is in one window.
        starts = rate_run(_ours_start(lock, "rate", (5, 1.0)), observer, 3, 5, 1.0, 0.3)
        assert 1 <= starts["starts"] <= 5
    finally:
        lock.close()
    text = limits_report.render_markdown(_report(row, starts))
    for heading in ("| nodes | operation |", "| limiter | nodes | max inside |", "| copies |"):
        assert heading in text


def _report(limit_row: dict[str, Any], rate_row: dict[str, Any]) -> dict[str, Any]:
    machine = {
        "cpu": "cpu",
        "cpus": 2,
        "python": "CPython",
        "redis_server": {"version": "7"},
        "libraries": {"celery-redlock": "0", "redis": "8"},
        "loadavg_at_start": [1.0, 1.0, 1.0],
    }
    summary = {"p50_us": 100.0, "p99_us": 200.0, "ops_per_s": 1e4, "failures": {}}
    overhead_row = {
        "slug": "mutex_1", "name": "ours", "nodes": 1, **summary,
        "over_floor_p50": 2.0, "over_floor_p99": 2.0, "over_mutex_p50": 1.0,
        "over_mutex_p99": 1.0,
    }  # fmt: skip
    burst = {"limiter": "ours", "nodes": 3, "gap_ms": 150.0, "admitted_first": 5,
             "admitted_second": 0, "max_in_window": 5, "failed": 0}  # fmt: skip
    tasks = {
        "copies": 10, "rate": "20/s", "workers": 1, "pool": "prefork", "concurrency": 2,
        "started": 10, "ran_once": True, "first_to_last_start_s": 0.1, "starts_per_s": 90.0,
        "achieved_fraction": None, "max_in_window": 10, "broker_messages": 10,
        "messages_per_task": 1.0, "sent_back_signalled": 0,
    }  # fmt: skip
    return {
        "started_at": "now",
        "duration_s": 1.0,
        "machine": machine,
        "loadavg_at_end": [1.0, 1.0, 1.0],
        "loadavg_after_overhead": 1.0,
        "plan": {**vars(QUICK)},
        "overhead": [overhead_row],
        "precision": {
            "limit": [
                {"limiter": "ours", "nodes": 3, "round_trips_node0_per_entries": 3.0, **limit_row}
            ],
            "rate": [
                {"limiter": "ours", "nodes": 3, "round_trips_node0_per_starts": 2.0, **rate_row}
            ],
            "bursts": [burst],
        },
        "tasks": tasks,
    }
