"""The Markdown report of ``python -m bench limits`` (bench/limits.py makes the numbers)."""

from __future__ import annotations

from typing import Any, Optional

__all__ = ["render_markdown"]


def _us(value: float) -> str:
    return f"{value:,.1f}"


def _maybe(value: Optional[float], suffix: str = "") -> str:
    return "-" if value is None else f"{value:g}{suffix}"


def _failed(row: dict[str, Any]) -> str:
    failures = row.get("failures") or {}
    return ", ".join(f"{kind} x{count}" for kind, count in failures.items()) or "0"


def _overhead(report: dict[str, Any]) -> list[str]:
    plan = report["plan"]
    lines = [
        f"Overhead per operation, one thread, uncontended; {plan['iterations']:,} timed "
        f"operations per row in {plan['rounds']} interleaved rounds; µs. Floor: bare sockets, "
        "hand-packed RESP, the same nodes, a quorum of replies: `SET NX PX` + `DEL` beside "
        "acquire + release, one `SET PX` round beside admit. Load average "
        f"{report['loadavg_after_overhead']} after this section.",
        "",
        "| nodes | operation | p50 | p99 | ops/s | ÷ floor p50 | ÷ floor p99 "
        "| ÷ our mutex p50 | ÷ our mutex p99 | failed |",
        "|--:|---|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    for row in report["overhead"]:
        floor = row["slug"].startswith("floor")
        lines.append(
            f"| {row['nodes']} | {row['name']} | {_us(row['p50_us'])} | {_us(row['p99_us'])} "
            f"| {row['ops_per_s']:,.0f} | {'' if floor else row['over_floor_p50']} "
            f"| {'' if floor else row['over_floor_p99']} | {row['over_mutex_p50']} "
            f"| {row['over_mutex_p99']} | {_failed(row)} |"
        )
    return lines


def _limit(report: dict[str, Any]) -> list[str]:
    rows = report["precision"]["limit"]
    first = rows[0]
    lines = [
        "",
        f"Limit under contention: {first['threads']} threads on one key with a limit of "
        f"{first['limit']}, each holding {first['hold_ms']:g} ms then releasing, for "
        f"{report['plan']['limit_duration_s']:g} s. Inside = an occupancy counter on an "
        "observer Redis, INCRed after the limiter let the thread in and DECRed before it "
        "let go (each change logged with the observer's `TIME`). Busy share = "
        "time-weighted mean occupancy / N. Polling callers retry after 0.5-1.5 ms. Round "
        "trips: what node 0 served per hold (`INFO commandstats`: EVALSHA for ours, one per "
        "round; GET, EXEC, DECR for the INCR counter), tries included. Left: once every thread "
        "let go, what the nodes still count (ours: permits holding a value, per node; the "
        "INCR counter: its value); a permit left holds its slot until its TTL.",
        "",
        "| limiter | nodes | max inside | entries | entries over N | busy share "
        "| holds/s (ideal) | round trips / hold, node 0 | left, per node | failed |",
        "|---|--:|--:|--:|--:|--:|--:|--:|---|--:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['limiter']} | {row['nodes']} | **{row['max_inside']}** | {row['entries']:,} "
            f"| {row['entries_over_limit']:,} | {row['busy_share']:.0%} "
            f"| {row['holds_per_s']:,.0f} ({row['ideal_holds_per_s']:,.0f}) "
            f"| {_maybe(row['round_trips_node0_per_entries'])} | {row.get('left', '-')} "
            f"| {row['failed']} |"
        )
    return lines


def _rate(report: dict[str, Any]) -> list[str]:
    rows = report["precision"]["rate"]
    plan = report["plan"]
    count, period = plan["rate_count"], plan["rate_period_s"]
    lines = [
        "",
        f"Rate, saturated: {rows[0]['threads']} threads start under {count}/{period:g}s on "
        f"one key for {plan['rate_duration_s']:g} s, each waiting as the limiter says; "
        "starts logged with the observer's `TIME` after the limiter said yes. Window = any "
        f"{period:g} s from a start (sliding). Achieved = period / effective period, the "
        f"time {count} starts took in the steady state (first start to the "
        f"({count}k + 1)-th, over k).",
        "",
        f"| limiter | nodes | starts | max in any window (R = {count}) "
        f"| shortest span of {count + 1} starts | effective period | achieved / R "
        "| starts/s over the run | round trips / start, node 0 | failed |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['limiter']} | {row['nodes']} | {row['starts']:,} "
            f"| **{row['max_in_window']}** | {_maybe(row['shortest_span_of_r_plus_1_ms'], ' ms')} "
            f"| {_maybe(row['effective_period_s'], ' s')} | {_maybe(row['achieved_fraction'])} "
            f"| {row['starts_per_s_over_the_run']:g} "
            f"| {_maybe(row['round_trips_node0_per_starts'])} | {row['failed']} |"
        )
    bursts = report["precision"]["bursts"]
    lines += [
        "",
        f"Rate, two bursts: {count} single tries (no waiting) {bursts[0]['gap_ms'] / 2:g} ms "
        f"before a whole {period:g} s of the caller's clock and {count} more as long after, "
        f"on a fresh key, {rows[0]['threads']} threads (a fixed window admits both bursts):",
        "",
        "| limiter | nodes | admitted, first burst | admitted, second burst "
        "| max in any window | failed |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for row in bursts:
        lines.append(
            f"| {row['limiter']} | {row['nodes']} | {row['admitted_first']} "
            f"| {row['admitted_second']} | **{row['max_in_window']}** | {row['failed']} |"
        )
    return lines


def _tasks(report: dict[str, Any]) -> list[str]:
    row = report.get("tasks")
    if row is None:
        return ["", "Tasks: not run (`--no-tasks`)."]
    return [
        "",
        f'Tasks: {row["copies"]} copies of one `RedlockTask` (`redlock_rate="{row["rate"]}"`, '
        '`redlock_limit="unlimited"`, one key) published at once to '
        f"{row['workers']} {row['pool']} workers x {row['concurrency']} on the same lock "
        "nodes; a copy over the rate is published again with a countdown. Starts from the "
        "bodies' CLOCK_MONOTONIC stamps on an observer Redis; messages = the copies + every "
        "`bench.rate` message the workers published (`after_task_publish`); sent back = "
        '`lock_contended` signals with action "wait".',
        "",
        "| copies | started (each once) | first to last start | starts/s | achieved / R "
        "| max in any window | broker messages | per task | sent back |",
        "|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
        f"| {row['copies']} | {row['started']} ({'yes' if row['ran_once'] else 'NO'}) "
        f"| {row['first_to_last_start_s']:g} s | {_maybe(row['starts_per_s'])} "
        f"| {_maybe(row['achieved_fraction'])} | {row['max_in_window']} "
        f"| {row['broker_messages']:,} | {row['messages_per_task']:g} "
        f"| {row['sent_back_signalled']:,} |",
    ]


def render_markdown(report: dict[str, Any]) -> str:
    machine = report["machine"]
    libs = machine["libraries"]
    lines = [
        "### Limits and rates benchmark",
        "",
        f"`python -m bench limits`, {report['started_at']}: {machine['cpu']}, "
        f"{machine['cpus']} CPUs, {machine['python']}, redis-server "
        f"{machine['redis_server']['version']} on loopback (5 lock nodes, an observer); "
        f"celery-redlock {libs['celery-redlock']}, redis-py {libs['redis']}. Ours: "
        f"`Redlock(urls, ttl={report['plan']['ttl']:g}, "
        f"node_timeout={report['plan']['node_timeout']:g})`. The INCR limiters are "
        "short re-implementations with redis-py (bench/limiters.py: heimdall's GET-then-INCR "
        "counter, a fixed-window counter), not those packages, on lock node "
        f"0. Load average {machine['loadavg_at_start'][0]:g} at the start, "
        f"{report['loadavg_at_end'][0]:g} at the end; took {report['duration_s']:g} s.",
        "",
    ]
    lines += _overhead(report)
    lines += _limit(report)
    lines += _rate(report)
    lines += _tasks(report)
    return "\n".join(lines) + "\n"
