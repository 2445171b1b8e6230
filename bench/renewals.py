"""Renewals at scale: ``python -m bench renewals [--quick]``.

Two questions, on 5 local redis-server masters:

1. **Renewal CPU vs leases held.** N leases (10, 100, 1,000, 10,000) at ttl 3 s, kept
   alive by a watchdog (renewed every 1 s: N renewals a second). After one interval
   to settle, the process's CPU time (``time.process_time``: every thread, the
   watchdog's and the finisher's) over a window, as a share of one core and per
   renewal; renewals counted from the leases' extensions, rounds from the nodes'
   ``INFO commandstats`` (EVALSHA calls per node per second).
2. **Leases lost with nodes far away.** 1,000 leases at ttl 3 s, each node behind a
   ``FaultProxy`` adding ``--delay-ms`` each way. After three ttls, every key is read
   on every node (past the proxies): a lease whose value is on fewer than a majority
   of nodes is lost, whatever the lease says.

Both are also run with one round per lease (the watchdog before batching: a
``Watchdog`` that takes one due lease at a time) for the 1,000-lease rows.
Goals (issue 13): 0 leases lost at 10 ms; < 5% of a core for 1,000 renewals/s.
"""

from __future__ import annotations

import argparse
import datetime
import heapq
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import redis

from celery_redlock import Lease, QuorumUnavailable, Redlock
from celery_redlock.lock.watchdog import Watchdog
from celery_redlock.testing import FaultProxy, RedisNodes

from .locks import RESULTS_DIR, _write, machine_info, pick_redis_server

__all__ = ["SerialWatchdog", "main"]

TTL = 3.0
INTERVAL = TTL / 3
#: Tries per lease: a set-up acquire on a loaded machine can miss node_timeout (the
#: watchdog already renews the first leases meanwhile).
ACQUIRE_TRIES = 5


class SerialWatchdog(Watchdog):
    """The watchdog as it was before batching: one due lease, one round."""

    def _take_due(self, now: float) -> list[tuple[Lease, float]]:
        while self._queue:  # called when the earliest entry is due
            _, _, lease = heapq.heappop(self._queue)
            entry = self._watched.get(id(lease))
            if entry is not None and entry[0] is lease:
                return [(lease, entry[1])]
        return []


def _acquire(redlock: Redlock, count: int, prefix: str, dog: Watchdog) -> list[Lease]:
    """``count`` leases, each watched as soon as it is won (10,000 acquires take
    longer than a ttl)."""
    leases = []
    for i in range(count):
        lease = None
        for attempt in range(ACQUIRE_TRIES):
            try:
                lease = redlock.acquire(f"{prefix}:{i}", ttl=TTL, blocking=False)
                break
            except QuorumUnavailable:  # a loaded machine missed node_timeout
                if attempt == ACQUIRE_TRIES - 1:
                    raise
        if lease is None:
            raise RuntimeError(f"{prefix}:{i} not acquired on fresh nodes")
        dog.watch(lease, INTERVAL)
        leases.append(lease)
    return leases


def _evalsha_calls(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def _held_on_majority(clients: list[redis.Redis], leases: list[Lease]) -> int:
    """How many leases hold their value on a majority of nodes (read on the nodes)."""
    counts = [0] * len(leases)
    for client in clients:
        pipe = client.pipeline(transaction=False)
        for lease in leases:
            pipe.get(lease.key)
        for i, (lease, value) in enumerate(zip(leases, pipe.execute())):
            counts[i] += value == lease.value.encode()
    return sum(1 for c in counts if c >= len(clients) // 2 + 1)


def _stop(dog: Watchdog, leases: list[Lease]) -> None:
    for lease in leases:
        dog.unwatch(lease)
    for lease in leases:
        lease.release()


def cpu_row(cluster: RedisNodes, count: int, window: float, serial: bool) -> dict[str, Any]:
    """Renewal CPU with ``count`` leases held on ``cluster``."""
    redlock = Redlock(cluster.urls, ttl=TTL)
    dog = SerialWatchdog() if serial else Watchdog()
    leases = _acquire(redlock, count, f"cpu{count}{'s' if serial else ''}:{time.time_ns()}", dog)
    time.sleep(INTERVAL * 1.5)  # the first renewals are behind us
    probe = cluster[0].client()
    rounds_before = _evalsha_calls(probe)
    extended_before = sum(lease.extensions for lease in leases)
    cpu_before, wall_before = time.process_time(), time.monotonic()
    time.sleep(window)
    cpu = time.process_time() - cpu_before
    wall = time.monotonic() - wall_before
    renewals = sum(lease.extensions for lease in leases) - extended_before
    rounds = _evalsha_calls(probe) - rounds_before
    lost = sum(1 for lease in leases if lease.lost_reason is not None)
    _stop(dog, leases)
    redlock.close()
    return {
        "leases": count,
        "mode": "one round per lease" if serial else "batched",
        "window_s": round(wall, 2),
        "renewals_per_s": round(renewals / wall, 1),
        "cpu_share_of_a_core": round(cpu / wall, 4),
        "cpu_us_per_renewal": round(cpu / renewals * 1e6, 1) if renewals else None,
        "evalsha_per_node_per_s": round(rounds / wall, 1),
        "lost": lost,
    }


def far_row(cluster: RedisNodes, count: int, delay: float, serial: bool) -> dict[str, Any]:
    """Leases lost with every node ``delay`` seconds away each way."""
    proxies = [FaultProxy(server) for server in cluster]
    try:
        redlock = Redlock([proxy.url for proxy in proxies], ttl=TTL)
        dog = SerialWatchdog() if serial else Watchdog()
        leases = _acquire(redlock, count, f"far{'s' if serial else ''}:{time.time_ns()}", dog)
        for proxy in proxies:
            proxy.delay(delay)
        clients = [server.client() for server in cluster]
        time.sleep(max(0.0, leases[-1].acquired_at + 3 * TTL - time.monotonic()))
        held = _held_on_majority(clients, leases)
        reported = sum(1 for lease in leases if lease.lost_reason is not None)
        for lease in leases:
            dog.unwatch(lease)
        for proxy in proxies:
            proxy.delay(0)
        for lease in leases:
            lease.release()
        redlock.close()
    finally:
        for proxy in proxies:
            proxy.close()
    return {
        "leases": count,
        "mode": "one round per lease" if serial else "batched",
        "delay_ms_each_way": delay * 1000,
        "after_s": 3 * TTL,
        "lost_on_the_nodes": count - held,
        "lost_reported": reported,
    }


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        f"`python -m bench renewals`, {report['date']}: {m['cpu']}, {m['cpus']} CPUs, "
        f"{m['python']}, redis-server {m['redis_server']['version']} x 5 on loopback. "
        f"Leases at ttl {TTL:g} s renewed every {INTERVAL:g} s by one watchdog; CPU is the "
        f"whole process's (`time.process_time`) over {report['window_s']:g} s. Load average "
        f"{m['loadavg_at_start'][0]} at the start, {report['loadavg_at_end']} at the end.",
        "",
        "| leases held | mode | renewals/s | CPU, % of a core | CPU µs / renewal "
        "| EVALSHA / node / s | lost |",
        "|--:|---|--:|--:|--:|--:|--:|",
    ]
    for row in report["cpu"]:
        per = "-" if row["cpu_us_per_renewal"] is None else f"{row['cpu_us_per_renewal']:,.1f}"
        lines.append(
            f"| {row['leases']:,} | {row['mode']} | {row['renewals_per_s']:,.0f} "
            f"| {row['cpu_share_of_a_core'] * 100:.1f} | {per} "
            f"| {row['evalsha_per_node_per_s']:,.1f} | {row['lost']} |"
        )
    lines += [
        "",
        "Nodes far away (each behind a FaultProxy delaying every chunk both ways); "
        "lost = value on fewer than a majority of nodes, read on the nodes after three ttls:",
        "",
        "| leases | mode | delay each way | lost (on the nodes) | lost (reported) |",
        "|--:|---|--:|--:|--:|",
    ]
    for row in report["far"]:
        lines.append(
            f"| {row['leases']:,} | {row['mode']} | {row['delay_ms_each_way']:g} ms "
            f"| {row['lost_on_the_nodes']} | {row['lost_reported']} |"
        )
    return "\n".join(lines) + "\n"


def run(
    sizes: list[int], window: float, delay: float, binary: str, log: Callable[[str], None]
) -> dict[str, Any]:
    report: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine_info(binary),
        "ttl_s": TTL,
        "window_s": window,
        "cpu": [],
        "far": [],
    }
    started = time.monotonic()
    with RedisNodes(5, binary=binary) as cluster:
        for count in sizes:
            for serial in (False, True) if count == 1000 else (False,):
                log(f"cpu: {count} leases, {'serial' if serial else 'batched'}")
                report["cpu"].append(cpu_row(cluster, count, window, serial))
                log(f"  {report['cpu'][-1]}")
        for serial in (False, True):
            log(f"far: 1000 leases, {delay * 1000:g} ms, {'serial' if serial else 'batched'}")
            report["far"].append(far_row(cluster, 1000, delay, serial))
            log(f"  {report['far'][-1]}")
    report["loadavg_at_end"] = round(os.getloadavg()[0], 2)
    report["duration_s"] = round(time.monotonic() - started, 1)
    return report


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench renewals", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small run, results not saved")
    parser.add_argument("--window", type=float, default=5.0, help="CPU window, seconds")
    parser.add_argument("--delay-ms", type=float, default=10.0, help="far nodes, each way")
    parser.add_argument("--redis-server", default=None)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    binary = args.redis_server or pick_redis_server()
    sizes = [10, 100, 1000] if args.quick else [10, 100, 1000, 10000]
    window = 2.0 if args.quick else args.window

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    report = run(sizes, window, args.delay_ms / 1000, binary, log)
    text = markdown(report)
    print(text)
    if not args.quick:
        _write(args.out / "renewals.json", json.dumps(report, indent=2, ensure_ascii=False) + "\n")
        _write(args.out / "renewals.md", text)
        log(f"saved {args.out / 'renewals.json'} and {args.out / 'renewals.md'}")
    return 0
