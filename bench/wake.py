"""Hand-off latency: a holder in one process releases, a blocked waiter in another
takes the lock. ``python -m bench wake [--trials N] [--quick]``.

Each contender gets two long-lived processes (spawned, so nothing is shared): the
*holder* takes the key; the *waiter* then starts a blocking acquire (timeout 5 s);
after a settle time (the waiter is in its wait by then) the holder notes
``time.monotonic_ns()`` (one clock for every process on the machine) and releases;
the waiter notes the clock as its acquire returns. Latency = acquired - released,
so it covers the release round, the wake-up (or the poll) and the winning attempt.
Trials of all contenders are interleaved, so drift on the machine hits all alike.

Contenders, all in one run on the same 5 redis-server masters (the 1-node libraries
use the first): celery-redlock (5 nodes, woken by the release), celery-redlock
polling as before the wake-up (an injected sleep turns hearing off: random 0.5..1.5 x
``retry_delay`` 0.2 s), ``AsyncRedlock`` (5 nodes, woken, on an event loop kept
for the child's life), python-redis-lock (1 node, BLPOP on a signal list), redis-py
``Lock`` (1 node, polls every 0.1 s, its default) and pottery ``Redlock`` (5 nodes,
blocking acquire polls). Writes bench/results/wake.json and wake.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Callable, Optional

from celery_redlock.testing import RedisNodes

from .locks import RESULTS_DIR, _write, machine_info, pick_redis_server

TTL = 10.0
WAIT = 5.0
SETTLE = 0.03
#: slug -> what the table calls it.
CONTENDERS = {
    "celery_redlock_5": "celery-redlock, woken (5 nodes)",
    "celery_redlock_5_polling": "celery-redlock, polling as before (5 nodes)",
    "async_redlock_5": "celery-redlock AsyncRedlock, woken (5 nodes)",
    "python_redis_lock": "python-redis-lock, BLPOP (1 node)",
    "redis_py": "redis-py Lock, polls 0.1 s (1 node)",
    "pottery_5": "pottery Redlock (5 nodes)",
}


def _lock_factory(slug: str, urls: list[str]) -> Callable[[str, bool], Any]:
    """In a child: (key, blocking) -> the lock's release function if won, else None."""
    import pottery
    import redis
    import redis_lock

    from celery_redlock import Redlock

    if slug.startswith("celery_redlock"):
        options: dict[str, Any] = {"ttl": TTL, "node_timeout": 0.05}
        if slug.endswith("polling"):
            options["sleep"] = lambda seconds: time.sleep(seconds)  # injected: polls
        redlock = Redlock(urls, **options)

        def ours(key: str, blocking: bool) -> Any:
            lease = redlock.acquire(key, blocking=blocking, timeout=WAIT if blocking else None)
            return None if lease is None else lease.release

        return ours
    if slug == "async_redlock_5":
        return _async_factory(urls)
    clients = [redis.Redis.from_url(url) for url in urls]
    if slug == "python_redis_lock":

        def prl(key: str, blocking: bool) -> Any:
            lock = redis_lock.Lock(clients[0], key, expire=int(TTL))
            won = lock.acquire(blocking=blocking, timeout=WAIT if blocking else None)
            return lock.release if won else None

        return prl
    if slug == "redis_py":

        def rpy(key: str, blocking: bool) -> Any:
            lock = clients[0].lock(key, timeout=TTL)
            won = lock.acquire(blocking=blocking, blocking_timeout=WAIT)
            return lock.release if won else None

        return rpy
    masters = frozenset(clients)

    def pot(key: str, blocking: bool) -> Any:
        lock = pottery.Redlock(key=key, masters=masters, auto_release_time=TTL)
        won = lock.acquire(blocking=blocking, timeout=WAIT if blocking else -1)
        return lock.release if won else None

    return pot


def _async_factory(urls: list[str]) -> Callable[[str, bool], Any]:
    """AsyncRedlock on one event loop kept for the child's life."""
    import asyncio

    from celery_redlock.asyncio import AsyncRedlock

    loop = asyncio.new_event_loop()
    redlock = AsyncRedlock(urls, ttl=TTL, node_timeout=0.05)

    def ours(key: str, blocking: bool) -> Any:
        timeout = WAIT if blocking else None
        lease = loop.run_until_complete(redlock.acquire(key, blocking=blocking, timeout=timeout))
        return None if lease is None else lambda: loop.run_until_complete(lease.release())

    return ours


def _child(slug: str, urls: list[str], pipe: Connection) -> None:
    """Holder or waiter: ("hold", key) / ("release",) / ("wait", key) / ("stop",)."""
    take = _lock_factory(slug, urls)
    release: Optional[Callable[[], Any]] = None
    while True:
        message = pipe.recv()
        if message[0] == "hold":
            release = take(message[1], False)
            pipe.send(release is not None)
        elif message[0] == "release" and release is not None:
            released = time.monotonic_ns()
            release()
            pipe.send(released)
        elif message[0] == "wait":
            pipe.send("waiting")
            release = take(message[1], True)
            acquired = time.monotonic_ns()
            if release is not None:
                release()
            pipe.send(acquired if release is not None else None)
        else:
            return


def _trial(holder: Connection, waiter: Connection, key: str) -> Optional[float]:
    """One hand-off; its latency in ms, or None when the waiter was not served."""
    holder.send(("hold", key))
    if not holder.recv():
        return None
    waiter.send(("wait", key))
    assert waiter.recv() == "waiting"
    time.sleep(SETTLE)
    holder.send(("release",))
    released = holder.recv()
    acquired = waiter.recv()
    return None if acquired is None else (acquired - released) / 1e6


def _summary(latencies: list[float], failed: int) -> dict[str, Any]:
    ordered = sorted(latencies)

    def pick(fraction: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(fraction * len(ordered)))], 3)

    return {
        "trials": len(ordered),
        "not_served": failed,
        "p50_ms": pick(0.5),
        "p95_ms": pick(0.95),
        "mean_ms": round(statistics.fmean(ordered), 3),
        "max_ms": round(ordered[-1], 3),
    }


def run(trials: int, binary: str, log: Callable[[str], None]) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    report: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine_info(binary),
        "uptime_at_start": _uptime(),
        "ttl_s": TTL,
        "settle_s": SETTLE,
        "trials": trials,
    }
    latencies: dict[str, list[float]] = {slug: [] for slug in CONTENDERS}
    failed = dict.fromkeys(CONTENDERS, 0)
    with RedisNodes(5, binary=binary) as cluster:
        pairs: dict[str, tuple[Connection, Connection, list[Any]]] = {}
        for slug in CONTENDERS:
            ends, procs = [], []
            for _ in range(2):
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=_child, args=(slug, cluster.urls, child), daemon=True)
                proc.start()
                ends.append(parent)
                procs.append(proc)
            pairs[slug] = (ends[0], ends[1], procs)
        for i in range(trials):
            for slug, (holder, waiter, _) in pairs.items():
                latency = _trial(holder, waiter, f"bench:wake:{slug}")
                if latency is None:
                    failed[slug] += 1
                else:
                    latencies[slug].append(latency)
            if (i + 1) % 25 == 0:
                log(f"{i + 1}/{trials} trials")
        for holder, waiter, procs in pairs.values():
            holder.send(("stop",))
            waiter.send(("stop",))
            for proc in procs:
                proc.join(5)
    report["results"] = {
        slug: {"name": CONTENDERS[slug], **_summary(latencies[slug], failed[slug])}
        for slug in CONTENDERS
    }
    report["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    report["uptime_at_end"] = _uptime()
    return report


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return f"load average {os.getloadavg()}"


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    ours = report["results"]["celery_redlock_5"]
    lines = [
        f"`python -m bench wake`, {report['date']}: {m['cpu']}, {m['cpus']} CPUs, "
        f"{m['python']}, redis-server {m['redis_server']['version']} x 5 on loopback. "
        f"Holder and waiter in different processes; {report['trials']} hand-offs per "
        f"contender, interleaved; latency from the holder's release call to the "
        f"waiter's acquire returning, ms.",
        "",
        f"Load: `{report['uptime_at_start']}` at the start, `{report['uptime_at_end']}` "
        "at the end.",
        "",
        "| contender | p50 ms | p95 ms | mean ms | max ms | p50 vs ours | not served |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["results"].values():
        ratio = row["p50_ms"] / ours["p50_ms"] if ours["p50_ms"] else float("nan")
        lines.append(
            f"| {row['name']} | {row['p50_ms']:.2f} | {row['p95_ms']:.2f} | "
            f"{row['mean_ms']:.2f} | {row['max_ms']:.2f} | {ratio:.2f}x | {row['not_served']} |"
        )
    verdict = "PASS" if ours["p50_ms"] <= 2.0 else "MISS"
    lines += ["", f"Goal: our p50 <= 2 ms at 5 nodes: {ours['p50_ms']:.2f} ms, {verdict}."]
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench wake", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="20 trials, results not saved")
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--redis-server", default=None)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    binary = args.redis_server or pick_redis_server()

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    report = run(20 if args.quick else args.trials, binary, log)
    text = markdown(report)
    print(text)
    if not args.quick:
        _write(args.out / "wake.json", json.dumps(report, indent=2, ensure_ascii=False) + "\n")
        _write(args.out / "wake.md", text)
        log(f"saved {args.out / 'wake.json'} and {args.out / 'wake.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
