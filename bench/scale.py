"""Scale tables: ``python -m bench scale [--quick]``.

One command, every section on servers it starts itself, results in
``bench/results/scale.json``, ``scale.md`` (the tables, included by
docs/benchmarks/scale.md) and ``scale.png`` (one figure, matplotlib). ``--quick`` is
a smoke run (under 2 minutes) that saves nothing unless ``--out`` is given.

1. **Latency vs nodes** (1, 3, 5, 7, 9): non-blocking acquire + release of an
   uncontended key, p50/p95 µs: our Redlock on the first N of 9 masters beside the
   bare-socket floor of the same N (``SET NX PX`` + ``DEL``, quorum of replies; one
   node: a blocking socket) and pottery's Redlock on the same N, interleaved rounds
   in the same run.
2. **ops/s vs threads** (1, 8, 32), each thread its own key: ours and pottery on 5
   nodes, redis-py's ``Lock`` on 1 (our ``Redlock`` object shared by the threads),
   and the floor on 5 (each thread its own bare sockets): how far the machine and the
   interpreter let threads scale with no client code, and each one's ops/s over its
   own 1-thread figure.
3. **Renewal CPU vs leases held** (10 to 10,000, ttl 3 s, renewed every 1 s by one
   watchdog; ``bench/renewals.py``): renewals/s, CPU % of a core, leases lost.
4. **Hot key vs duplicates queued** (10, 30, 100): real prefork workers, hand-off on
   and off (``bench/scale_tasks.py``): busy share, broker messages, each ran once.
5. **Hand-off latency**: holder release in one process to a blocked ``acquire`` in
   another, 5 nodes (``bench/scale_handoff.py``).

Every section notes the load average when it ran: on a shared 2-CPU machine the
servers, the client and other work compete for the same cores.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from celery_redlock.testing import REDIS_SERVER_ENV, RedisNodes

from . import renewals, scale_handoff, scale_report, scale_tasks
from .contenders import Contender, OurRedlock, Pottery, RedisPyLock
from .locks import (
    RESULTS_DIR,
    _Keys,
    _single_thread,
    _write,
    pick_redis_server,
)
from .locks import Plan as LocksPlan
from .machine import report_head
from .profile import cpu_per_op
from .resp import FloorCycle, FloorQuorum
from .stats import Op, run_threads, summarize

__all__ = ["FULL", "QUICK", "Plan", "main", "run"]

Log = Callable[[str], None]


@dataclass(frozen=True)
class Plan:
    """How much one run does."""

    node_counts: tuple[int, ...] = (1, 3, 5, 7, 9)
    #: Timed operations per (contender, node count), split over ``rounds``.
    iterations: int = 4000
    pottery_iterations: int = 600
    rounds: int = 4
    warmup: int = 200
    #: Operations timed by getrusage (CPU per operation, ours and the floor, 1 and 5 nodes).
    cpu_operations: int = 3000
    thread_counts: tuple[int, ...] = (1, 8, 32)
    #: Timed operations per thread count, split over the threads (pottery: fewer, it
    #: starts a thread pool per operation).
    thread_operations: int = 4000
    pottery_thread_operations: int = 400
    lease_counts: tuple[int, ...] = (10, 100, 1000, 10000)
    renewal_window_s: float = 4.0
    duplicates: tuple[int, ...] = (10, 30, 100)
    hot_body_s: float = 0.1
    hot_workers: int = 2
    hot_concurrency: int = 4
    handoff_samples: int = 40
    ttl: float = 10.0
    node_timeout: float = 0.05


FULL = Plan()
QUICK = Plan(
    node_counts=(1, 3, 5),
    iterations=400,
    pottery_iterations=60,
    rounds=2,
    warmup=30,
    cpu_operations=300,
    thread_counts=(1, 8),
    thread_operations=200,
    pottery_thread_operations=20,
    lease_counts=(10, 100),
    renewal_window_s=1.5,
    duplicates=(10,),
    hot_body_s=0.05,
    hot_workers=1,
    hot_concurrency=2,
    handoff_samples=8,
)


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def pin(cluster: RedisNodes) -> dict[str, Any]:
    """Servers on the last CPU, this process on the others (``sched_setaffinity``,
    as ``taskset`` does), so the client and the servers stop taking each other's
    core; other work on the machine is not moved. What was done, for the report."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return {"pinned": False, "why": f"{len(cpus)} usable CPU"}
    servers, client = {cpus[-1]}, set(cpus[:-1])
    for server in cluster:
        if server.pid is not None:
            os.sched_setaffinity(server.pid, servers)
    os.sched_setaffinity(0, client)
    return {"pinned": True, "servers_cpus": sorted(servers), "client_cpus": sorted(client)}


def latency_vs_nodes(cluster: RedisNodes, plan: Plan, keys: _Keys, log: Log) -> dict[str, Any]:
    """Ours, the floor and pottery on the first N nodes, for each N, interleaved."""
    value = secrets.token_urlsafe(20).encode() + f"|{socket.gethostname()}:1".encode()
    ttl_ms = int(plan.ttl * 1000)
    entries: list[tuple[str, Op, int]] = []
    closers: list[Callable[[], None]] = []
    for n in plan.node_counts:
        urls = cluster.urls[:n]
        addresses = [(server.host, server.port) for server in cluster[:n]]
        ours = OurRedlock(urls, plan.ttl, plan.node_timeout)
        pottery = Pottery(addresses, plan.ttl)
        floor: Any = (
            FloorCycle(*addresses[0], keys("floor", n), value, ttl_ms)
            if n == 1
            else FloorQuorum(addresses, keys("floor", n), value, ttl_ms)
        )
        closers += [ours.close, pottery.close, floor.close]
        entries += [
            (f"ours_{n}", ours.op(keys("ours", n)), plan.iterations),
            (f"floor_{n}", floor, plan.iterations),
            (f"pottery_{n}", pottery.op(keys("pottery", n)), plan.pottery_iterations),
        ]
    load = _load()
    rounds_plan = LocksPlan(rounds=plan.rounds, warmup=plan.warmup)
    ops = {slug: op for slug, op, _ in entries}
    cpu: dict[str, dict[str, float]] = {}
    try:
        summaries, _ = _single_thread(entries, rounds_plan, log)
        # Where the time goes: CPU per operation (getrusage), ours beside the floor.
        for n in (1, 5):
            if n in plan.node_counts:
                for who in ("ours", "floor"):
                    cpu[f"{who}_{n}"] = {
                        k: round(v, 2)
                        for k, v in cpu_per_op(ops[f"{who}_{n}"], plan.cpu_operations).items()
                    }
    finally:
        for close in closers:
            close()
    rows = []
    for n in plan.node_counts:
        mine, bare, theirs = (summaries[f"{who}_{n}"] for who in ("ours", "floor", "pottery"))
        rows.append(
            {
                "nodes": n,
                "ours": mine.as_dict(),
                "floor": bare.as_dict(),
                "pottery": theirs.as_dict(),
                "ours_over_floor_p50": round(mine.p50_us / bare.p50_us, 2),
                "pottery_over_ours_p50": round(theirs.p50_us / mine.p50_us, 2),
            }
        )
    return {"loadavg": [load, _load()], "rows": rows, "cpu_per_op": cpu}


def ops_vs_threads(cluster: RedisNodes, plan: Plan, keys: _Keys, log: Log) -> dict[str, Any]:
    """ops/s with 1, 8, 32 threads, each thread on its own key; the floor beside them
    (each thread its own bare sockets to the 5 nodes): what the machine, the kernel
    and the interpreter allow threads with no client code at all."""
    addresses = [(server.host, server.port) for server in cluster[:5]]
    contenders: list[Contender] = [
        OurRedlock(cluster.urls[:5], plan.ttl, plan.node_timeout),
        Pottery(addresses, plan.ttl),
        RedisPyLock(*addresses[0], plan.ttl),
    ]
    value = secrets.token_urlsafe(20).encode() + f"|{socket.gethostname()}:1".encode()
    ttl_ms = int(plan.ttl * 1000)
    floors: list[FloorQuorum] = []
    load = _load()
    rows = []
    try:
        for threads in plan.thread_counts:
            row: dict[str, Any] = {"threads": threads, "loadavg": _load()}
            for contender in contenders:
                total = (
                    plan.pottery_thread_operations
                    if isinstance(contender, Pottery)
                    else plan.thread_operations
                )

                def make_op(index: int, c: Contender = contender, t: int = threads) -> Op:
                    return c.op(keys("threads", c.slug, t, index))

                timing = run_threads(make_op, threads, max(10, total // threads), warmup=10)
                row[contender.slug] = summarize(timing).as_dict()

            def floor_op(index: int, t: int = threads) -> Op:
                floor = FloorQuorum(addresses, keys("threads", "floor", t, index), value, ttl_ms)
                floors.append(floor)
                return floor

            timing = run_threads(floor_op, threads, max(10, plan.thread_operations // threads), 10)
            row["floor_5"] = summarize(timing).as_dict()
            rows.append(row)
            log(f"  {threads} threads done (load {_load()})")
    finally:
        for contender in contenders:
            contender.close()
        for floor in floors:
            floor.close()
    names = {c.slug: c.name for c in contenders}
    names["floor_5"] = FloorQuorum.name(len(addresses))
    return {"loadavg": [load, _load()], "names": names, "rows": rows}


def renewal_rows(cluster: RedisNodes, plan: Plan, log: Log) -> list[dict[str, Any]]:
    """``bench/renewals.py``'s CPU row (batched watchdog) for each lease count."""
    rows = []
    for count in plan.lease_counts:
        row = renewals.cpu_row(cluster, count, plan.renewal_window_s, serial=False)
        row["loadavg"] = _load()
        rows.append(row)
        log(f"  {count} leases: {row}")
    return rows


def run(plan: Plan, binary: str, log: Log, pinned: bool = False) -> dict[str, Any]:
    """Every section, each on fresh servers; the report (JSON-ready). ``pinned``: the
    latency and threads sections run with servers and client on separate CPUs."""
    started = time.monotonic()
    report: dict[str, Any] = report_head("scale", binary, plan)
    keys = _Keys()
    affinity = os.sched_getaffinity(0)
    with RedisNodes(max(plan.node_counts), binary=binary) as cluster:
        report["pinning"] = pin(cluster) if pinned else {"pinned": False}
        log(f"latency vs nodes {plan.node_counts} ({report['pinning']}) ...")
        report["latency_vs_nodes"] = latency_vs_nodes(cluster, plan, keys, log)
        log(f"ops/s vs threads {plan.thread_counts} ...")
        report["ops_vs_threads"] = ops_vs_threads(cluster, plan, keys, log)
    os.sched_setaffinity(0, affinity)  # the rest runs unpinned
    with RedisNodes(5, binary=binary) as cluster:
        log(f"hand-off latency, {plan.handoff_samples} samples ...")
        report["handoff_latency"] = []
        for lock_name in scale_handoff.LOCKS:
            handoff = scale_handoff.measure(
                cluster.urls, plan.handoff_samples, keys("handoff", lock_name), lock_name
            )
            report["handoff_latency"].append({**handoff, "loadavg": _load()})
            log(f"  {report['handoff_latency'][-1]}")
        log(f"renewal CPU vs leases held {plan.lease_counts} ...")
        report["renewals"] = renewal_rows(cluster, plan, log)
        log(f"hot key vs duplicates {plan.duplicates} ...")
        cluster.flushall()
        with tempfile.TemporaryDirectory(prefix="bench-scale-") as workdir:
            report["hot_key"] = scale_tasks.hot_key_rows(
                binary,
                cluster,
                plan.duplicates,
                plan.hot_body_s,
                plan.hot_workers,
                plan.hot_concurrency,
                Path(workdir),
                log,
            )
    report["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    report["duration_s"] = round(time.monotonic() - started, 1)
    return report


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench scale", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument("--quick", action="store_true", help="smoke run; saves nothing")
    parser.add_argument(
        "--redis-server",
        default=None,
        help=f"redis-server binary (default: ${REDIS_SERVER_ENV}, else the newest on PATH)",
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="latency and threads sections: redis-servers on the last CPU, the client "
        "on the others (like taskset)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where scale.json, scale.md and scale.png go (default bench/results; "
        "--quick saves only when this is given)",
    )
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    binary = args.redis_server or pick_redis_server()

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    report = run(plan, binary, log, pinned=args.pin)
    markdown = scale_report.render_markdown(report)
    print(markdown)
    log(f"done in {report['duration_s']} s")
    out = args.out if args.out is not None or args.quick else RESULTS_DIR
    if out is not None:
        _write(out / "scale.json", json.dumps(report, indent=2, ensure_ascii=False) + "\n")
        _write(out / "scale.md", markdown)
        scale_report.plot(report, out / "scale.png")
        log(f"saved {out / 'scale.json'}, scale.md and scale.png")
    return 0
