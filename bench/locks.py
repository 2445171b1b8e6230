"""Lock benchmark: celery-redlock against redis-py, pottery, python-redis-lock, aioredlock.

Run from the repository root::

    python -m bench locks                    # full run (~1 min), saves the results
    python -m bench locks --quick            # smoke run, nothing saved
    python -m bench locks --redis-server /usr/bin/redis-server

One run starts 5 redis-server masters on free loopback ports
(``celery_redlock.testing.RedisNodes``), measures every contender on them, tears
them down, prints a Markdown report and writes ``bench/results/locks.json`` (machine,
settings, every number) and ``bench/results/locks.md`` (the tables, which
docs/benchmarks/locks.md includes).

What is measured, all in the same run:

1. acquire + release latency (p50/p99, µs) and ops/s, one thread: our Redlock on 5
   and on 1 node, redis-py ``Lock`` (1 node), pottery ``Redlock`` (5 nodes),
   python-redis-lock (1 node). Non-blocking acquire, one uncontended key per
   contender; rounds are interleaved so drift on the machine hits all alike.
2. the same with 8 threads, each on its own key (throughput, not contention); our
   ``Redlock`` object is shared by the threads.
3. the physical floor: ``SET k v NX PX`` then ``DEL k`` over a bare socket with
   hand-packed RESP (1 node), and the same multiplexed to 5 nodes waiting for 3.
4. faults: one node of 5 SIGSTOPped (ours, and pottery with a capped budget), and
   three of 5 SIGSTOPped (time for our acquire to raise QuorumUnavailable).
5. top-level commands per node per acquire and per release (MONITOR + commandstats).
6. keys left on the nodes after every lease of runs 1 and 2 was released (ghosts).
7. asyncio (bench/async_locks.py): ``AsyncRedlock`` against pottery's ``AIORedlock``
   and aioredlock, 5 nodes each, one task and N tasks on one event loop.
8. ratios against targets, each marked PASS or MISS (plus two extra checks: free keys
   not won, ghosts left behind).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from celery_redlock import QuorumUnavailable
from celery_redlock.testing import REDIS_SERVER_ENV, RedisNodes

from . import async_locks
from .commands import CommandCount, count_commands, count_keys
from .contenders import Contender, Handle, OurRedlock, Pottery, PythonRedisLock, RedisPyLock
from .machine import RESULTS_DIR as RESULTS_DIR
from .machine import _dist_version as _dist_version
from .machine import _write as _write
from .machine import machine_info as machine_info
from .machine import pick_redis_server as pick_redis_server
from .machine import report_head
from .resp import FloorCycle, FloorQuorum
from .stats import Op, OpFailed, Summary, Timing, run_loop, run_threads, summarize

__all__ = ["FULL", "QUICK", "Plan", "main", "run"]


@dataclass(frozen=True)
class Plan:
    """How much of everything one run does."""

    #: Timed operations per fast contender, single thread (split over ``rounds``).
    iterations: int = 12000
    #: The same for pottery (a thread pool per operation: slower).
    pottery_iterations: int = 2000
    #: Interleaved rounds over all contenders, single thread.
    rounds: int = 4
    #: Untimed operations before the first round (per contender, per thread).
    warmup: int = 300
    threads: int = 8
    #: Timed operations per thread, 8-thread runs.
    thread_iterations: int = 2000
    pottery_thread_iterations: int = 250
    #: Our Redlock with one node SIGSTOPped (and its healthy twin, just before).
    hung_iterations: int = 5000
    #: pottery with one node SIGSTOPped: capped, every operation leaks a blocked thread.
    pottery_hung_iterations: int = 200
    pottery_hung_budget_s: float = 20.0
    #: Acquires timed with 3 of 5 nodes SIGSTOPped.
    quorum_loss_tries: int = 50
    #: Operations per library for the command counts.
    command_operations: int = 200
    ttl: float = 10.0
    node_timeout: float = 0.05


FULL = Plan()
QUICK = Plan(
    iterations=600,
    pottery_iterations=150,
    warmup=50,
    thread_iterations=100,
    pottery_thread_iterations=20,
    hung_iterations=300,
    pottery_hung_iterations=20,
    quorum_loss_tries=10,
    command_operations=20,
)

NODES = 5


# -- scenarios -----------------------------------------------------------------------


class _Keys:
    """Keys no earlier run (or other scenario of this one) has touched."""

    def __init__(self) -> None:
        self.run = secrets.token_hex(4)

    def __call__(self, *parts: object) -> str:
        return ":".join(["bench", self.run, *map(str, parts)])


def _single_thread(
    entries: list[tuple[str, Op, int]], plan: Plan, log: Callable[[str], None]
) -> tuple[dict[str, Summary], dict[str, list[float]]]:
    """Interleaved rounds: every entry runs ``iterations / rounds`` per round.

    Returns the pooled summaries and, per entry, each round's p50 (how stable it was).
    """
    timings = {slug: Timing([], 0) for slug, _, _ in entries}
    round_p50: dict[str, list[float]] = {slug: [] for slug, _, _ in entries}
    for number in range(plan.rounds):
        for slug, op, iterations in entries:
            warmup = plan.warmup if number == 0 else plan.warmup // 10
            timing = run_loop(op, max(1, iterations // plan.rounds), warmup)
            round_p50[slug].append(round(summarize(timing).p50_us, 1))
            timings[slug].extend(timing)
        log(f"  single thread: round {number + 1}/{plan.rounds} done")
    return {slug: summarize(timing) for slug, timing in timings.items()}, round_p50


def _left_behind(
    contender: Contender, addresses: list[tuple[str, int]], keys: _Keys, phase: str
) -> list[int]:
    """Keys of ``phase`` still on each node once every lease was released: ghosts (a
    SET that landed after its own release), each holding its key until its TTL.

    Counted right after the phase, well within the TTL, after 100 ms for in-flight
    commands to land.
    """
    time.sleep(0.1)
    pattern = f"*{keys(phase, contender.slug)}*"
    return count_keys(addresses[: contender.nodes], pattern, skip=("signal", "\x00"))


def _threaded(
    contenders: list[Contender],
    addresses: list[tuple[str, int]],
    keys: _Keys,
    plan: Plan,
    log: Callable[[str], None],
) -> tuple[dict[str, Summary], dict[str, list[int]]]:
    """Each contender with ``plan.threads`` threads, then its ghosts counted."""
    results: dict[str, Summary] = {}
    left: dict[str, list[int]] = {}
    for contender in contenders:
        iterations = (
            plan.pottery_thread_iterations
            if isinstance(contender, Pottery)
            else plan.thread_iterations
        )

        def make_op(index: int, contender: Contender = contender) -> Op:
            return contender.op(keys("threads", contender.slug, index))

        timing = run_threads(make_op, plan.threads, iterations, warmup=max(10, plan.warmup // 6))
        results[contender.slug] = summarize(timing)
        left[contender.slug] = _left_behind(contender, addresses, keys, "threads")
        log(f"  {plan.threads} threads: {contender.name} done")
    return results, left


def _commands(
    contender: Contender,
    addresses: list[tuple[str, int]],
    keys: _Keys,
    operations: int,
) -> dict[str, CommandCount]:
    warm = contender.op(keys("commands-warmup", contender.slug))
    run_loop(warm, 0, warmup=50)
    handles = [contender.handle(keys("commands", contender.slug, i)) for i in range(operations)]
    won: list[Handle] = []

    def acquire_all() -> None:
        for handle in handles:
            try:
                handle.acquire()
            except OpFailed:
                continue
            won.append(handle)

    def release_all() -> None:
        for handle in won:
            handle.release()

    acquired = count_commands(addresses, acquire_all, operations)
    acquired.failed = operations - len(won)
    return {"acquire": acquired, "release": count_commands(addresses, release_all, len(won))}


def _run_budgeted(op: Op, iterations: int, budget_s: float) -> tuple[Timing, bool]:
    """Up to ``iterations`` timed ops, stopping early once ``budget_s`` is spent."""
    clock = time.perf_counter_ns
    budget_ns = int(budget_s * 1e9)
    latencies: list[int] = []
    started = clock()
    while len(latencies) < iterations:
        t0 = clock()
        op()
        t1 = clock()
        latencies.append(t1 - t0)
        if t1 - started > budget_ns:
            return Timing(latencies, t1 - started), True
    return Timing(latencies, clock() - started), False


def _hung_one(
    cluster: RedisNodes,
    ours: OurRedlock,
    pottery: Pottery,
    keys: _Keys,
    plan: Plan,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """One node of 5 SIGSTOPped: acquire+release, against a healthy twin run just before."""
    victim = cluster[0]
    healthy = summarize(run_loop(ours.op(keys("hung1", "healthy")), plan.hung_iterations, 100))
    pottery_healthy = summarize(
        run_loop(pottery.op(keys("hung1", "pottery-healthy")), plan.pottery_hung_iterations, 20)
    )
    victim.pause()
    try:
        hung = summarize(run_loop(ours.op(keys("hung1", "hung")), plan.hung_iterations, 50))
        log("  one node hung: celery-redlock done")
        timing, capped = _run_budgeted(
            pottery.op(keys("hung1", "pottery-hung")),
            plan.pottery_hung_iterations,
            plan.pottery_hung_budget_s,
        )
        pottery_hung = summarize(timing)
        log("  one node hung: pottery done")
    finally:
        victim.resume()
    # pottery's blocked threads and connections now get their replies; let the node
    # work through them before anything else is measured.
    victim.client().ping()
    time.sleep(0.2)
    return {
        "victim": f"node 0 (port {victim.port})",
        "celery_redlock_5": {"healthy": healthy.as_dict(), "hung": hung.as_dict()},
        "pottery_5": {
            "healthy": pottery_healthy.as_dict(),
            "hung": pottery_hung.as_dict(),
            "stopped_by_budget": capped,
            "budget_s": plan.pottery_hung_budget_s,
            "note": "redis.Redis clients with default settings (socket_timeout="
            f"{pottery.socket_timeout}): each operation returns once a quorum answered but "
            "leaves a thread waiting on the stopped node until that timeout or SIGCONT",
        },
        "_summaries": (healthy, hung, pottery_healthy, pottery_hung, capped),
    }


def _hung_three(cluster: RedisNodes, ours: OurRedlock, keys: _Keys, plan: Plan) -> dict[str, Any]:
    """Three of 5 SIGSTOPped: how long until acquire raises QuorumUnavailable."""
    victims = list(cluster[:3])
    times_ms: list[float] = []
    outcomes: dict[str, int] = {}
    for victim in victims:
        victim.pause()
    try:
        for attempt in range(plan.quorum_loss_tries):
            t0 = time.perf_counter_ns()
            try:
                lease = ours.redlock.acquire(keys("hung3", attempt), blocking=False)
                outcome = "won (unexpected)" if lease is not None else "contended (unexpected)"
                if lease is not None:
                    lease.release()
            except QuorumUnavailable:
                outcome = "QuorumUnavailable"
            times_ms.append((time.perf_counter_ns() - t0) / 1e6)
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
    finally:
        for victim in victims:
            victim.resume()
    for victim in victims:
        victim.client().ping()
    ordered = sorted(times_ms)
    return {
        "victims": [f"node {i} (port {v.port})" for i, v in enumerate(victims)],
        "node_timeout_s": plan.node_timeout,
        "tries": len(times_ms),
        "outcomes": outcomes,
        "p50_ms": round(ordered[len(ordered) // 2], 3),
        "max_ms": round(ordered[-1], 3),
        "min_ms": round(ordered[0], 3),
    }


# -- ratios --------------------------------------------------------------------------


@dataclass(frozen=True)
class Ratio:
    name: str
    value: float
    target: float
    #: "<=" or ">=": how ``value`` must compare with ``target``.
    sense: str
    detail: str

    @property
    def passed(self) -> bool:
        return self.value <= self.target if self.sense == "<=" else self.value >= self.target

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "value": round(self.value, 4), "result": self.verdict}

    @property
    def verdict(self) -> str:
        return "PASS" if self.passed else "MISS"


def _ratios(
    single: dict[str, Summary],
    threaded: dict[str, Summary],
    hung: dict[str, Any],
    quorum_loss: dict[str, Any],
    commands: dict[str, dict[str, CommandCount]],
    left_behind: dict[str, dict[str, list[int]]],
    plan: Plan,
) -> list[Ratio]:
    ours5, ours1 = single["celery_redlock_5"], single["celery_redlock_1"]
    redis_py, floor, pottery = single["redis_py"], single["floor_1"], single["pottery_5"]
    healthy, hung_run = hung["_summaries"][0], hung["_summaries"][1]
    cmds = commands["celery_redlock_5"]
    limit_ms = (plan.node_timeout + 0.05) * 1000
    ours_runs = [
        single["celery_redlock_5"],
        single["celery_redlock_1"],
        threaded["celery_redlock_5"],
        threaded["celery_redlock_1"],
        healthy,
        hung_run,
    ]
    not_won = sum(run.failed for run in ours_runs)
    attempted = sum(run.operations for run in ours_runs)
    return [
        Ratio(
            "ours (5 nodes) p50 / redis-py Lock p50",
            ours5.p50_us / redis_py.p50_us,
            1.0,
            "<=",
            f"{ours5.p50_us:.1f} / {redis_py.p50_us:.1f} µs",
        ),
        Ratio(
            "ours (5 nodes) p99 / redis-py Lock p99",
            ours5.p99_us / redis_py.p99_us,
            1.5,
            "<=",
            f"{ours5.p99_us:.1f} / {redis_py.p99_us:.1f} µs",
        ),
        Ratio(
            "ours (1 node) p50 / bare-socket floor p50",
            ours1.p50_us / floor.p50_us,
            2.0,
            "<=",
            f"{ours1.p50_us:.1f} / {floor.p50_us:.1f} µs",
        ),
        Ratio(
            "ours ops/s / pottery ops/s, 1 thread (5 nodes each)",
            ours5.ops_per_s / pottery.ops_per_s,
            8.0,
            ">=",
            f"{ours5.ops_per_s:,.0f} / {pottery.ops_per_s:,.0f}",
        ),
        Ratio(
            f"ours ops/s / pottery ops/s, {plan.threads} threads (5 nodes each)",
            threaded["celery_redlock_5"].ops_per_s / threaded["pottery_5"].ops_per_s,
            4.0,
            ">=",
            f"{threaded['celery_redlock_5'].ops_per_s:,.0f} / "
            f"{threaded['pottery_5'].ops_per_s:,.0f}",
        ),
        Ratio(
            "ours p50, 1 of 5 nodes hung / healthy",
            hung_run.p50_us / healthy.p50_us,
            1.2,
            "<=",
            f"{hung_run.p50_us:.1f} / {healthy.p50_us:.1f} µs",
        ),
        Ratio(
            f"ours: time to QuorumUnavailable, 3 of 5 hung (max of {quorum_loss['tries']}), ms",
            quorum_loss["max_ms"],
            limit_ms,
            "<=",
            f"p50 {quorum_loss['p50_ms']:.1f} ms, max {quorum_loss['max_ms']:.1f} ms; "
            f"target node_timeout {plan.node_timeout * 1000:.0f} ms + 50 ms",
        ),
        Ratio(
            "ours: top-level commands per node per acquire",
            cmds["acquire"].top_level_max_node,
            1.0,
            "<=",
            _describe(cmds["acquire"].top_level) + " (busiest node)",
        ),
        Ratio(
            "ours: top-level commands per node per release",
            cmds["release"].top_level_max_node,
            1.0,
            "<=",
            _describe(cmds["release"].top_level) + " (busiest node)",
        ),
        Ratio(
            "extra check: ours, acquires of a free key not won (all runs above)",
            not_won,
            0,
            "<=",
            f"{not_won} of {attempted} operations, 1 and {plan.threads} threads, "
            "healthy and 1 hung",
        ),
        Ratio(
            "extra check: ours, keys left on nodes after every lease was released",
            sum(
                sum(left_behind[slug][phase])
                for slug in ("celery_redlock_5", "celery_redlock_1")
                for phase in ("single", "threads")
            ),
            0,
            "<=",
            "per node, 5 nodes: 1 thread "
            f"{left_behind['celery_redlock_5']['single']}, {plan.threads} threads "
            f"{left_behind['celery_redlock_5']['threads']}; 1 node: "
            f"{left_behind['celery_redlock_1']['single']} / "
            f"{left_behind['celery_redlock_1']['threads']}",
        ),
    ]


# -- report --------------------------------------------------------------------------


def _describe(counts: dict[str, float]) -> str:
    if not counts:
        return "none"
    return ", ".join(
        f"{name} {value:.2f}".rstrip("0").rstrip(".")
        for name, value in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    )


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.2f}"


def _failed(summary: dict[str, Any]) -> str:
    return str(sum(summary["failures"].values()))


def _fmt(value: float, digits: int = 1) -> str:
    return f"{value:,.{digits}f}"


def render_markdown(report: dict[str, Any], names: dict[str, str]) -> str:
    machine = report["machine"]
    libs = machine["libraries"]
    plan = report["plan"]
    single, threaded = report["single_thread"], report["threads"]
    lines = [
        "### Lock benchmark",
        "",
        f"`python -m bench locks`, {report['started_at']}: {machine['cpu']}, "
        f"{machine['cpus']} CPUs, {machine['platform']}, {machine['python']}, "
        f"redis-server {machine['redis_server']['version']} x {NODES} on loopback; "
        f"celery-redlock {libs['celery-redlock']}, redis-py {libs['redis']}, "
        f"pottery {libs['pottery']}, python-redis-lock {libs['python-redis-lock']}. "
        f"Non-blocking acquire + release of an uncontended key, ttl {plan['ttl']:g} s, "
        f"our node_timeout {plan['node_timeout'] * 1000:.0f} ms; latencies in µs. "
        f"Load average {machine['loadavg_at_start'][0]:g} at the start, "
        f"{report['loadavg_at_end'][0]:g} at the end (other work on the machine skews "
        "the 5-node rows most: 5 servers and the client share the CPUs).",
        "",
        f"| Lock | 1 thread p50 | p99 | ops/s | {plan['threads']} threads p50 | p99 | ops/s "
        "| failed (1 / 8 threads) |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    failure_notes = []
    for slug, name in names.items():
        one = single[slug]
        many = threaded.get(slug)
        row = [
            name,
            _fmt(one["p50_us"]),
            _fmt(one["p99_us"]),
            _fmt(one["ops_per_s"], 0),
        ]
        if many is None:
            row += ["-", "-", "-", f"{_failed(one)} / -"]
        else:
            row += [_fmt(many["p50_us"]), _fmt(many["p99_us"]), _fmt(many["ops_per_s"], 0)]
            row.append(f"{_failed(one)} / {_failed(many)}")
        lines.append("| " + " | ".join(row) + " |")
        for label, data in (("1 thread", one), (f"{plan['threads']} threads", many)):
            if data and data["failures"]:
                kinds = ", ".join(f"{kind} x{count}" for kind, count in data["failures"].items())
                failure_notes.append(f"{name}, {label}: {kinds}")
    if failure_notes:
        lines += [
            "",
            "Failed operations (acquire of a key nobody else touches, not won; "
            "counted in the latencies): " + "; ".join(failure_notes) + ".",
        ]
    lines += async_locks.render(report["asyncio"], plan["threads"])
    left = report["keys_left_after_release_per_node"]
    lines += [
        "",
        "Keys still on the nodes right after every lease of those runs was released "
        "(a SET that landed after its own release; it holds the key until its TTL), "
        "per node:",
        "",
        f"| Lock | after 1 thread | after {plan['threads']} threads |",
        "|---|---|---|",
    ]
    for slug, phases in left.items():
        lines.append(f"| {names[slug]} | {phases['single']} | {phases['threads']} |")
    hung = report["faults"]["one_of_five_hung"]
    loss = report["faults"]["three_of_five_hung"]
    ours_h, pot_h = hung["celery_redlock_5"], hung["pottery_5"]
    capped = " (stopped by its time budget)" if pot_h["stopped_by_budget"] else ""
    lines += [
        "",
        "Faults (node SIGSTOPped; healthy twin measured just before):",
        "",
        "| Scenario | Lock | p50 | p99 | max | ops/s | operations | failed |",
        "|---|---|--:|--:|--:|--:|--:|--:|",
    ]
    for label, lock, data in (
        ("5 nodes, healthy", "celery-redlock", ours_h["healthy"]),
        ("5 nodes, 1 hung", "celery-redlock", ours_h["hung"]),
        ("5 nodes, healthy", "pottery", pot_h["healthy"]),
        ("5 nodes, 1 hung", "pottery" + capped, pot_h["hung"]),
    ):
        lines.append(
            f"| {label} | {lock} | {_fmt(data['p50_us'])} | {_fmt(data['p99_us'])} | "
            f"{_fmt(data['max_us'])} | {_fmt(data['ops_per_s'], 0)} | {data['operations']} "
            f"| {_failed(data)} |"
        )
    lines += [
        "",
        f"3 of 5 nodes hung: our acquire raised QuorumUnavailable after "
        f"p50 {loss['p50_ms']:.1f} ms, max {loss['max_ms']:.1f} ms over {loss['tries']} tries "
        f"(node_timeout {loss['node_timeout_s'] * 1000:.0f} ms; outcomes {loss['outcomes']}).",
        "",
        "Commands per node per operation (warm connections; top-level = sent by the client, "
        "from MONITOR; in-script = run inside its Lua script, which Redis 7 also counts "
        "in commandstats):",
        "",
        "| Lock | acquire: top-level | acquire: in-script | release: top-level "
        "| release: in-script |",
        "|---|---|---|---|---|",
    ]
    for slug, counts in report["commands"].items():
        acq, rel = counts["acquire"], counts["release"]
        lines.append(
            f"| {names[slug]} | {_describe(acq['top_level_per_node'])} | "
            f"{_describe(acq['in_script_per_node'])} | {_describe(rel['top_level_per_node'])} "
            f"| {_describe(rel['in_script_per_node'])} |"
        )
    lines += [
        "",
        "Ratios (same run):",
        "",
        "| Ratio | Value | Target | Result | Detail |",
        "|---|--:|--:|---|---|",
    ]
    for ratio in report["ratios"]:
        lines.append(
            f"| {ratio['name']} | {_number(ratio['value'])} | {ratio['sense']} {ratio['target']:g} "
            f"| **{ratio['result']}** | {ratio['detail']} |"
        )
    return "\n".join(lines) + "\n"


# -- the run -------------------------------------------------------------------------


def run(plan: Plan, binary: str, log: Callable[[str], None]) -> tuple[dict[str, Any], str]:
    """Start the servers, measure everything, stop them; the report and its Markdown."""
    started = time.monotonic()
    report: dict[str, Any] = report_head("locks", binary, plan)
    keys = _Keys()
    with RedisNodes(NODES, binary=binary) as cluster:
        log(
            f"{NODES} x redis-server {report['machine']['redis_server']['version']} up: "
            f"ports {[server.port for server in cluster]}"
        )
        addresses = [(server.host, server.port) for server in cluster]
        host, port = addresses[0]
        ours5 = OurRedlock(cluster.urls, plan.ttl, plan.node_timeout)
        ours1 = OurRedlock(cluster.urls[:1], plan.ttl, plan.node_timeout)
        redis_py = RedisPyLock(host, port, plan.ttl)
        pottery = Pottery(addresses, plan.ttl)
        python_redis_lock = PythonRedisLock(host, port, plan.ttl)
        contenders: list[Contender] = [ours5, ours1, redis_py, pottery, python_redis_lock]
        value = secrets.token_urlsafe(20).encode() + b"|" + f"{socket.gethostname()}:1".encode()
        ttl_ms = int(plan.ttl * 1000)
        floor1 = FloorCycle(host, port, keys("floor", 1), value, ttl_ms)
        floor5 = FloorQuorum(addresses, keys("floor", 5), value, ttl_ms)
        names = {c.slug: c.name for c in contenders}
        names["floor_1"] = "floor: bare socket, 1 node"
        names["floor_5"] = FloorQuorum.name(5)
        try:
            log("single thread ...")
            entries: list[tuple[str, Op, int]] = [
                (
                    c.slug,
                    c.op(keys("single", c.slug)),
                    plan.pottery_iterations if isinstance(c, Pottery) else plan.iterations,
                )
                for c in contenders
            ]
            entries += [("floor_1", floor1, plan.iterations), ("floor_5", floor5, plan.iterations)]
            single, round_p50 = _single_thread(entries, plan, log)
            left_single = {c.slug: _left_behind(c, addresses, keys, "single") for c in contenders}
            log(f"{plan.threads} threads ...")
            threaded, left_threads = _threaded(contenders, addresses, keys, plan, log)
            left_behind = {
                c.slug: {"single": left_single[c.slug], "threads": left_threads[c.slug]}
                for c in contenders
            }
            log("commands per node ...")
            commands = {
                c.slug: _commands(c, addresses[: c.nodes], keys, plan.command_operations)
                for c in contenders
            }
            log("faults: one node of 5 hung ...")
            hung = _hung_one(cluster, ours5, pottery, keys, plan, log)
            log("faults: three nodes of 5 hung ...")
            quorum_loss = _hung_three(cluster, ours5, keys, plan)
            log("asyncio ...")
            asyncio_rows = async_locks.measure(cluster.urls, addresses, plan, keys, log)
        finally:
            floor1.close()
            floor5.close()
            for contender in contenders:
                contender.close()
    ratios = _ratios(single, threaded, hung, quorum_loss, commands, left_behind, plan)
    ratios += [
        Ratio(label, value, 8.0, ">=", detail)
        for label, value, detail in async_locks.ratios(asyncio_rows, plan.threads)
    ]
    del hung["_summaries"]
    report.update(
        {
            "contenders": names,
            "single_thread": {slug: s.as_dict() for slug, s in single.items()},
            "single_thread_p50_per_round_us": round_p50,
            "threads": {slug: s.as_dict() for slug, s in threaded.items()},
            "keys_left_after_release_per_node": left_behind,
            "faults": {"one_of_five_hung": hung, "three_of_five_hung": quorum_loss},
            "asyncio": asyncio_rows,
            "commands": {
                slug: {op: count.as_dict() for op, count in counts.items()}
                for slug, counts in commands.items()
            },
            "ratios": [ratio.as_dict() for ratio in ratios],
            "duration_s": round(time.monotonic() - started, 1),
            "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
        }
    )
    return report, render_markdown(report, names)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench locks", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument("--quick", action="store_true", help="few iterations; saves nothing")
    parser.add_argument(
        "--redis-server",
        default=None,
        help=f"redis-server binary (default: ${REDIS_SERVER_ENV}, else the newest on PATH)",
    )
    parser.add_argument(
        "--out", type=Path, default=RESULTS_DIR, help="where locks.json and locks.md go"
    )
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    binary = args.redis_server or pick_redis_server()

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    report, markdown = run(plan, binary, log)
    print(markdown)
    log(f"done in {report['duration_s']} s")
    if not args.quick:
        _write(args.out / "locks.json", json.dumps(report, indent=2, ensure_ascii=False) + "\n")
        _write(args.out / "locks.md", markdown)
        log(f"saved {args.out / 'locks.json'} and {args.out / 'locks.md'}")
    return 0
