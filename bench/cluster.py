"""Scale-out: ``python -m bench cluster [--quick] [--seconds S] [--processes N]``.

Lock operations per second when the one Redlock node is a Redis Cluster
(``redis+cluster://``: one vote, its keys spread over the shards) instead of a plain
master. Targets, all up at once on loopback (``celery_redlock.testing``): one plain
master (``RedisNodes(1)``) and clusters of 1, 3 and 6 shards (``ShardedCluster``).

N client *processes*, spawned once, each hold one ``Redlock([url], ttl=10,
node_timeout=0.5)`` per target. Per slice of a target they warm up, then all start at
one ``CLOCK_MONOTONIC`` stamp and run non-blocking acquire + release of distinct
random keys until the slice ends; slices are interleaved over the targets, so drift
on the machine hits all alike. Per target: ops/s, p50/p99 (``stats.summarize``), the
ratio to the plain master, the servers' and the clients' CPU per operation (``/proc``)
and how busy the machine's CPUs were (``/proc/stat``): at 100 % more shards cannot
add throughput. A full run writes ``bench/results/cluster.{json,md}``; ``--quick``
saves nothing unless ``--out`` is given.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import multiprocessing
import os
import secrets
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Callable, Optional

from celery_redlock import Redlock, RedlockError
from celery_redlock.testing import REDIS_SERVER_ENV, RedisNodes, RedisServer, ShardedCluster

from .machine import RESULTS_DIR, _write, pick_redis_server, report_head
from .stats import Timing, summarize

__all__ = ["FULL", "QUICK", "Plan", "main", "run"]

#: How far ahead the common start stamp is set (every process past its ``recv``).
START_AHEAD_NS = 20_000_000


@dataclass(frozen=True)
class Plan:
    """How much one run does."""

    processes: int = 4
    #: Measured seconds per target, split over ``rounds`` interleaved slices.
    seconds: float = 5.0
    rounds: int = 4
    #: Untimed operations before each slice, seconds.
    warmup_s: float = 0.3
    shards: tuple[int, ...] = (1, 3, 6)
    ttl: float = 10.0
    node_timeout: float = 0.5


FULL = Plan()
QUICK = Plan(processes=2, seconds=1.0, rounds=1, warmup_s=0.2)


@dataclass(frozen=True)
class Target:
    name: str
    url: str
    servers: list[RedisServer]
    shards: Optional[int]


# -- the client processes -------------------------------------------------------------


def _acquire_release(redlock: Redlock, key: str, failed: Counter[str]) -> None:
    try:
        lease = redlock.acquire(key, blocking=False)
        if lease is None:
            failed["not won"] += 1
        else:
            lease.release()
    except RedlockError as error:
        failed[type(error).__name__] += 1


def _client(index: int, urls: list[str], ttl: float, node_timeout: float, conn: Connection) -> None:
    """One client process: on ``(target, warmup_s, seconds)`` warm up, say "ready",
    wait for the start stamp, run until it plus ``seconds``, send the samples."""
    redlocks = [Redlock([url], ttl=ttl, node_timeout=node_timeout) for url in urls]
    prefix = f"bench:cluster:{secrets.token_hex(4)}:{index}:"
    numbers = itertools.count()
    clock = time.monotonic_ns
    try:
        while (order := conn.recv()) is not None:
            target, warmup_s, seconds = order
            redlock, failed = redlocks[target], Counter[str]()
            warm_until = clock() + int(warmup_s * 1e9)
            while clock() < warm_until:
                _acquire_release(redlock, f"{prefix}{next(numbers)}", failed)
            failed.clear()
            conn.send("ready")
            start = conn.recv()
            time.sleep(max(0.0, (start - clock()) / 1e9))
            end, latencies, cpu = start + int(seconds * 1e9), [], time.process_time()
            while (t0 := clock()) < end:
                _acquire_release(redlock, f"{prefix}{next(numbers)}", failed)
                latencies.append(clock() - t0)
            conn.send((latencies, clock(), time.process_time() - cpu, dict(failed)))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        raise
    finally:
        for redlock in redlocks:
            redlock.close()


class _Clients:
    """The spawned client processes and a pipe to each."""

    def __init__(self, plan: Plan, urls: list[str]) -> None:
        context = multiprocessing.get_context("spawn")
        self.pipes: list[Connection] = []
        self.processes = []
        for index in range(plan.processes):
            ours, theirs = context.Pipe()
            args = (index, urls, plan.ttl, plan.node_timeout, theirs)
            process = context.Process(target=_client, args=args, daemon=True)
            process.start()
            self.pipes.append(ours)
            self.processes.append(process)

    def _recv_all(self) -> list[Any]:
        replies = [pipe.recv() for pipe in self.pipes]
        for reply in replies:
            if isinstance(reply, tuple) and reply[:1] == ("error",):
                raise RuntimeError(f"a client process failed:\n{reply[1]}")
        return replies

    def slice(self, target: int, warmup_s: float, seconds: float) -> tuple[Timing, float]:
        """One slice on ``target``: the pooled samples and the clients' CPU seconds."""
        for pipe in self.pipes:
            pipe.send((target, warmup_s, seconds))
        self._recv_all()  # every one warmed up
        start = time.monotonic_ns() + START_AHEAD_NS
        for pipe in self.pipes:
            pipe.send(start)
        replies = self._recv_all()
        timing = Timing([], max(r[1] for r in replies) - start, len(replies))
        for latencies, _, _, failed in replies:
            timing.latencies_ns.extend(latencies)
            timing.failures.update(failed)
        return timing, sum(r[2] for r in replies)

    def close(self) -> None:
        for pipe in self.pipes:
            with contextlib.suppress(OSError):
                pipe.send(None)
        for process in self.processes:
            process.join(10)
            if process.is_alive():
                process.kill()


# -- CPU from /proc -------------------------------------------------------------------


def _machine_cpu() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return sum(fields) - fields[3] - fields[4], sum(fields)  # idle, iowait


def _servers_cpu_s(servers: list[RedisServer]) -> float:
    """User + system CPU seconds the servers have spent."""
    ticks = 0
    for server in servers:
        with contextlib.suppress(OSError, TypeError):
            rest = Path(f"/proc/{server.pid}/stat").read_text().rpartition(")")[2].split()
            ticks += int(rest[11]) + int(rest[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


# -- the run ------------------------------------------------------------------------------


def _measure(
    clients: _Clients, targets: list[Target], plan: Plan, log: Callable[[str], None]
) -> list[dict[str, Any]]:
    timings = [Timing([], 0, plan.processes) for _ in targets]
    cpu = [{"servers": 0.0, "clients": 0.0, "busy": 0, "total": 0} for _ in targets]
    loads: list[list[float]] = [[] for _ in targets]
    for round_ in range(plan.rounds):
        order = list(range(len(targets)))
        order = order[round_ % len(order) :] + order[: round_ % len(order)]
        for index in order:
            servers, (busy, total) = _servers_cpu_s(targets[index].servers), _machine_cpu()
            timing, clients_cpu = clients.slice(index, plan.warmup_s, plan.seconds / plan.rounds)
            busy2, total2 = _machine_cpu()
            timings[index].extend(timing)
            cpu[index]["servers"] += _servers_cpu_s(targets[index].servers) - servers
            cpu[index]["clients"] += clients_cpu
            cpu[index]["busy"] += busy2 - busy
            cpu[index]["total"] += total2 - total
            loads[index].append(round(os.getloadavg()[0], 2))
            log(f"  {targets[index].name}: {len(timing.latencies_ns)} ops in slice {round_ + 1}")
    rows = []
    for target, timing, used, load in zip(targets, timings, cpu, loads):
        summary = summarize(timing)
        rows.append({
            "target": target.name, "shards": target.shards, "servers": len(target.servers),
            **summary.as_dict(),
            "server_cpu_us_per_op": round(used["servers"] * 1e6 / summary.operations, 1),
            "client_cpu_us_per_op": round(used["clients"] * 1e6 / summary.operations, 1),
            "machine_cpu_busy": round(used["busy"] / max(1, used["total"]), 3),
            "loadavg": load,
        })  # fmt: skip
    plain = rows[0]["ops_per_s"]
    for row in rows:
        row["over_plain"] = round(row["ops_per_s"] / plain, 3)
    return rows


def _scale_out(rows: list[dict[str, Any]]) -> dict[str, float]:
    by_shards = {row["shards"]: row["ops_per_s"] for row in rows if row["shards"]}
    if 1 not in by_shards:
        return {}
    return {f"{n}_over_1": round(v / by_shards[1], 3) for n, v in by_shards.items() if n != 1}


def run(plan: Plan, binary: str, log: Callable[[str], None]) -> tuple[dict[str, Any], str]:
    started = time.monotonic()
    report: dict[str, Any] = report_head("cluster", binary, plan)
    with contextlib.ExitStack() as stack:
        plain = stack.enter_context(RedisNodes(1, binary=binary))
        targets = [Target("plain master", plain.urls[0], list(plain), None)]
        for shards in plan.shards:
            cluster = stack.enter_context(ShardedCluster(shards, binary=binary))
            name = f"cluster, {shards} shard{'s' if shards > 1 else ''}"
            targets.append(Target(name, cluster.lock_url, list(cluster), shards))
        log(f"targets up: {', '.join(t.name for t in targets)}; {plan.processes} client processes")
        clients = _Clients(plan, [target.url for target in targets])
        stack.callback(clients.close)
        report["targets"] = _measure(clients, targets, plan, log)
    report["scale_out"] = _scale_out(report["targets"])
    report["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    report["duration_s"] = round(time.monotonic() - started, 1)
    return report, render_markdown(report)


def render_markdown(report: dict[str, Any]) -> str:
    machine, plan = report["machine"], report["plan"]
    lines = [
        f"`python -m bench cluster`, {report['started_at']}: {machine['cpu']}, "
        f"{machine['cpus']} CPUs, {machine['python']}, redis-server "
        f"{machine['redis_server']['version']} on loopback; celery-redlock "
        f"{machine['libraries']['celery-redlock']}. {plan['processes']} client processes, each "
        f"with its own `Redlock([url], ttl={plan['ttl']:g}, node_timeout={plan['node_timeout']:g})`"
        f" per target; non-blocking acquire + release of distinct random keys; "
        f"{plan['warmup_s']:g} s warm-up, then {plan['seconds']:g} s measured per target in "
        f"{plan['rounds']} interleaved slice(s). Load average "
        f"{machine['loadavg_at_start'][0]} at the start, {report['loadavg_at_end'][0]} at the "
        f"end; took {report['duration_s']} s.",
        "",
        "| target | redis-servers | ops/s | p50 µs | p99 µs | ops/s ÷ plain | server CPU µs/op "
        "| client CPU µs/op | machine CPU busy | failed |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for row in report["targets"]:
        lines.append(
            f"| {row['target']} | {row['servers']} | {row['ops_per_s']:,.0f} | "
            f"{row['p50_us']:,.1f} | {row['p99_us']:,.1f} | {row['over_plain']:.2f} | "
            f"{row['server_cpu_us_per_op']:,.1f} | {row['client_cpu_us_per_op']:,.1f} | "
            f"{row['machine_cpu_busy']:.0%} | {sum(row['failures'].values())} |"
        )
    if report["scale_out"]:
        shown = ", ".join(
            f"{key.split('_')[0]} shards / 1: {value:.2f}"
            for key, value in report["scale_out"].items()
        )
        lines += ["", f"Scale-out (ops/s): {shown}."]
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench cluster", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument("--quick", action="store_true", help="short run; saves nothing")
    parser.add_argument("--seconds", type=float, help="measured seconds per target")
    parser.add_argument("--processes", type=int, help="client processes")
    parser.add_argument("--shards", help="cluster sizes, comma-separated (default 1,3,6)")
    parser.add_argument(
        "--redis-server",
        default=None,
        help=f"redis-server binary (default: ${REDIS_SERVER_ENV}, else the newest on PATH)",
    )
    parser.add_argument("--out", type=Path, help="where cluster.json and .md go")
    args = parser.parse_args(argv)
    shards = tuple(int(n) for n in args.shards.split(",")) if args.shards else None
    given = {"seconds": args.seconds, "processes": args.processes, "shards": shards}
    plan = replace(QUICK if args.quick else FULL, **{k: v for k, v in given.items() if v})
    out = args.out if args.out is not None or args.quick else RESULTS_DIR

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    report, markdown = run(plan, args.redis_server or pick_redis_server(), log)
    print(markdown)
    log(f"done in {report['duration_s']} s")
    if out is not None:
        _write(out / "cluster.json", json.dumps(report, indent=2, ensure_ascii=False) + "\n")
        _write(out / "cluster.md", markdown)
        log(f"saved {out / 'cluster.json'} and {out / 'cluster.md'}")
    return 0
