"""The asyncio rows of ``python -m bench locks``: ``AsyncRedlock`` against pottery's
``AIORedlock`` and aioredlock, on the same 5 nodes in the same run.

Each contender does a non-blocking acquire + release of an uncontended key, timed
one by one (``time.perf_counter_ns``) on one event loop: first one task (latency),
then ``tasks`` tasks at once, each on its own key (throughput, not contention).
Contenders alternate in interleaved rounds so drift on the machine hits all alike.
A free key not won is counted as failed, as in the synchronous rows.

The asyncio floor (``Floor``) is the least an event loop can do for the same
operation: ``SET k v NX PX`` written to 5 raw ``asyncio.Protocol`` connections,
one future resolved by the third reply, then ``DEL k`` the same way -- no client
library, no parsing beyond counting reply lines. It bounds what any asyncio lock
can reach on this machine; the ratios to it say how far each lock is from it.

``python -m bench async`` runs these rows alone (1, 8 and 32 tasks) and saves
``bench/results/async_locks.{json,md}``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import gc
import json
import os
import sys
import time
from collections import Counter, deque
from pathlib import Path
from typing import Any, Awaitable, Callable, Optional, Protocol

import aioredlock
import pottery
import redis.asyncio

from celery_redlock import QuorumUnavailable
from celery_redlock.asyncio import AsyncRedlock

from .resp import pack
from .stats import Timing, summarize

__all__ = ["Floor", "main", "measure", "render"]

#: One acquire + release: None when won and released, else what went wrong.
AsyncOp = Callable[[], Awaitable[Optional[str]]]


class AsyncContender(Protocol):
    slug: str
    name: str

    def op(self, key: str) -> AsyncOp: ...
    async def close(self) -> None: ...


class Ours:
    slug = "async_celery_redlock_5"
    name = "celery-redlock AsyncRedlock (5 nodes)"

    def __init__(self, urls: list[str], ttl: float, node_timeout: float) -> None:
        self._lock = AsyncRedlock(urls, ttl=ttl, node_timeout=node_timeout)

    def op(self, key: str) -> AsyncOp:
        lock = self._lock

        async def op() -> Optional[str]:
            try:
                lease = await lock.acquire(key, blocking=False)
                if lease is None:
                    return "not won"
                return None if await lease.release() else "released False"
            except QuorumUnavailable as exc:  # a loaded machine missed node_timeout
                kinds = sorted({type(error).__name__ for error in exc.errors.values()})
                return f"QuorumUnavailable ({', '.join(kinds)})"

        return op

    async def close(self) -> None:
        self._lock.close()


class PotteryAIO:
    slug = "async_pottery_5"
    name = "pottery AIORedlock (5 nodes)"

    def __init__(self, addresses: list[tuple[str, int]], ttl: float) -> None:
        self._clients = [redis.asyncio.Redis(host=h, port=p) for h, p in addresses]
        self._ttl = ttl

    def op(self, key: str) -> AsyncOp:
        lock = pottery.AIORedlock(key=key, masters=self._clients, auto_release_time=self._ttl)

        async def op() -> Optional[str]:
            if not await lock.acquire(blocking=False):
                return "not won"
            await lock.release()
            return None

        return op

    async def close(self) -> None:
        for client in self._clients:
            await client.aclose()


class AioRedlock:
    slug = "async_aioredlock_5"
    name = "aioredlock (5 nodes)"

    def __init__(self, addresses: list[tuple[str, int]], ttl: float) -> None:
        # retry_count=1: one attempt, as non-blocking; its defaults otherwise.
        self._manager = aioredlock.Aioredlock(
            [{"host": h, "port": p} for h, p in addresses], retry_count=1
        )
        self._ttl = ttl

    def op(self, key: str) -> AsyncOp:
        manager = self._manager

        async def op() -> Optional[str]:
            try:
                lock = await manager.lock(key, lock_timeout=self._ttl)
            except aioredlock.LockError:
                return "not won"
            await manager.unlock(lock)
            return None

        return op

    async def close(self) -> None:
        await self._manager.destroy()


class _FloorRound:
    """One floor round: a future, resolved by the ``need``-th reply."""

    __slots__ = ("future", "heard", "need")

    def __init__(self, future: asyncio.Future[None], need: int) -> None:
        self.future = future
        self.heard = 0
        self.need = need

    def hit(self) -> None:
        self.heard += 1
        if self.heard == self.need:
            self.future.set_result(None)


class _FloorConnection(asyncio.Protocol):
    """A raw connection; every reply the floor asks for is one line (+OK, $-1, :1)."""

    def __init__(self) -> None:
        self.transport: Optional[asyncio.Transport] = None
        self.waiting: deque[_FloorRound] = deque()
        self.outbuf: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        waiting = self.waiting
        for _ in range(data.count(b"\r\n")):
            waiting.popleft().hit()


class Floor:
    """The asyncio floor on 5 nodes (see the module docstring). Alone, a round is
    written at once; with other rounds in flight, what every task sends in one loop
    turn goes out in one write per node (the cheapest for many tasks)."""

    slug = "async_floor_5"
    name = "floor: raw asyncio.Protocol x 5, quorum of 3"

    def __init__(self, addresses: list[tuple[str, int]], ttl: float) -> None:
        self._addresses = addresses
        self._ttl_ms = int(ttl * 1000)
        self._conns: list[_FloorConnection] = []
        self._in_flight = 0
        self._flush_due = False

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        for host, port in self._addresses:
            _, conn = await loop.create_connection(_FloorConnection, host, port)
            self._conns.append(conn)

    def _flush(self) -> None:
        self._flush_due = False
        for conn in self._conns:
            if conn.outbuf and conn.transport is not None:
                conn.transport.write(b"".join(conn.outbuf))
                conn.outbuf.clear()

    async def _round(self, payload: bytes, need: int) -> None:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        waiter = _FloorRound(future, need)
        alone = not self._in_flight
        if not alone and not self._flush_due:
            loop.call_soon(self._flush)
            self._flush_due = True
        for conn in self._conns:
            conn.waiting.append(waiter)
            if alone and conn.transport is not None:
                conn.transport.write(payload)
            else:
                conn.outbuf.append(payload)
        self._in_flight += 1
        try:
            await future
        finally:
            self._in_flight -= 1

    def op(self, key: str) -> AsyncOp:
        need = len(self._addresses) // 2 + 1
        set_payload = pack(b"SET", key, b"x" * 27 + b"|host:1", b"NX", b"PX", self._ttl_ms)
        del_payload = pack(b"DEL", key)

        async def op() -> Optional[str]:
            await self._round(set_payload, need)
            await self._round(del_payload, need)
            return None

        return op

    async def close(self) -> None:
        for conn in self._conns:
            if conn.transport is not None:
                conn.transport.close()


async def _loop(op: AsyncOp, iterations: int, warmup: int) -> Timing:
    for _ in range(warmup):
        await op()
    gc.collect()
    latencies: list[int] = []
    failures: Counter[str] = Counter()
    started = time.perf_counter_ns()
    for _ in range(iterations):
        began = time.perf_counter_ns()
        failed = await op()
        if failed is not None:
            failures[failed] += 1
        latencies.append(time.perf_counter_ns() - began)
    return Timing(latencies, time.perf_counter_ns() - started, 1, failures)


async def _tasks(ops: list[AsyncOp], iterations: int) -> Timing:
    gc.collect()
    started = time.perf_counter_ns()
    timings = await asyncio.gather(*(_loop(op, iterations, 0) for op in ops))
    total = Timing([], time.perf_counter_ns() - started, len(ops))
    for timing in timings:
        total.latencies_ns.extend(timing.latencies_ns)
        total.failures.update(timing.failures)
    return total


async def _measure(
    contenders: list[AsyncContender],
    plan: Any,
    key: Callable[..., str],
    log: Callable[[str], None],
    task_counts: list[int],
) -> dict[str, Any]:
    fast = {Ours.slug, Floor.slug}
    single = {c.slug: Timing([], 0) for c in contenders}
    ops = {c.slug: c.op(key("async", c.slug)) for c in contenders}
    for number in range(plan.rounds):
        for c in contenders:
            count = plan.iterations if c.slug in fast else plan.pottery_iterations
            warmup = plan.warmup if number == 0 else plan.warmup // 10
            single[c.slug].extend(await _loop(ops[c.slug], max(1, count // plan.rounds), warmup))
        log(f"  asyncio, one task: round {number + 1}/{plan.rounds} done")
    many: dict[str, dict[str, Any]] = {}
    for tasks in task_counts:
        ops_of = {
            c.slug: [c.op(key("async-tasks", c.slug, tasks, i)) for i in range(tasks)]
            for c in contenders
        }
        timings = {c.slug: Timing([], 0, tasks) for c in contenders}
        for number in range(plan.rounds):  # interleaved too
            for c in contenders:
                count = plan.thread_iterations if c.slug in fast else plan.pottery_thread_iterations
                # the same number of operations in all, whatever the number of tasks
                per_task = max(1, count * plan.threads // tasks // plan.rounds)
                timings[c.slug].extend(await _tasks(ops_of[c.slug], per_task))
            log(f"  asyncio, {tasks} tasks: round {number + 1}/{plan.rounds} done")
        many[str(tasks)] = {slug: summarize(t).as_dict() for slug, t in timings.items()}
    return {
        "names": {c.slug: c.name for c in contenders},
        "single": {slug: summarize(t).as_dict() for slug, t in single.items()},
        "tasks": many[str(task_counts[0])],
        "tasks_by_count": many,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }


def measure(
    urls: list[str],
    addresses: list[tuple[str, int]],
    plan: Any,
    key: Callable[..., str],
    log: Callable[[str], None],
    task_counts: Optional[list[int]] = None,
) -> dict[str, Any]:
    """Every asyncio contender and the floor on the nodes: one-task and N-task
    summaries per contender (N: ``task_counts``, default ``plan.threads``)."""

    async def run() -> dict[str, Any]:
        floor = Floor(addresses, plan.ttl)
        await floor.start()
        contenders: list[AsyncContender] = [
            Ours(urls, plan.ttl, plan.node_timeout),
            PotteryAIO(addresses, plan.ttl),
            AioRedlock(addresses, plan.ttl),
            floor,
        ]
        try:
            return await _measure(contenders, plan, key, log, task_counts or [plan.threads])
        finally:
            for contender in contenders:
                await contender.close()

    return asyncio.run(run())


def _phases(result: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    by_count = result.get("tasks_by_count") or {}
    return [("1 task", result["single"])] + [
        (f"{count} tasks", data) for count, data in by_count.items()
    ]


def ratios(result: dict[str, Any], threads: int) -> list[tuple[str, float, str]]:
    """(label, ours / theirs ops/s, detail) at 5 nodes, for each number of tasks."""
    rows = []
    for label, data in _phases(result):
        ours = data[Ours.slug]["ops_per_s"]
        for slug in (PotteryAIO.slug, AioRedlock.slug):
            theirs = data[slug]["ops_per_s"]
            rows.append(
                (
                    f"ours AsyncRedlock ops/s / {result['names'][slug]} ops/s, {label}",
                    ours / theirs if theirs else float("inf"),
                    f"{ours:,.0f} / {theirs:,.0f}",
                )
            )
    return rows


def render(result: dict[str, Any], threads: int) -> list[str]:
    """The asyncio table (Markdown lines): per number of tasks, each lock's latency,
    ops/s, and ops/s against the floor's and against ours."""
    lines = [
        "",
        "asyncio, same nodes, same run (one event loop; N tasks each on its own key; "
        f"load average {' '.join(str(x) for x in result.get('loadavg', []))} at the end):",
        "",
        "| Lock | tasks | p50 µs | p99 µs | ops/s | / floor | ours / it | failed |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for label, data in _phases(result):
        floor = data.get(Floor.slug, {}).get("ops_per_s")
        ours = data[Ours.slug]["ops_per_s"]
        for slug, name in result["names"].items():
            row = data[slug]
            ops = row["ops_per_s"]
            lines.append(
                f"| {name} | {label.split()[0]} | {row['p50_us']:,.1f} | {row['p99_us']:,.1f} "
                f"| {ops:,.0f} | {ops / floor if floor else float('nan'):.2f} "
                f"| {ours / ops:.2f} | {sum(row['failures'].values())} |"
            )
    notes = [
        f"{name}, {label}: " + ", ".join(f"{kind} x{n}" for kind, n in failures.items())
        for label, data in _phases(result)
        for slug, name in result["names"].items()
        if (failures := data[slug]["failures"])
    ]
    if notes:
        lines += ["", "Failed operations (counted in the latencies): " + "; ".join(notes) + "."]
    return lines


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m bench async``: the asyncio rows alone, on 5 fresh servers."""
    from celery_redlock.testing import RedisNodes

    from .locks import FULL, QUICK, RESULTS_DIR, pick_redis_server

    parser = argparse.ArgumentParser(prog="python -m bench async", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="few iterations; saves nothing")
    parser.add_argument("--tasks", default="8,32", help="task counts (default 8,32)")
    parser.add_argument("--redis-server", default=None)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    counts = [int(n) for n in args.tasks.split(",")]
    run_id = os.urandom(4).hex()

    def key(*parts: object) -> str:
        return "bench:" + run_id + ":" + ":".join(str(p) for p in parts)

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    report: dict[str, Any] = {
        "bench": "async_locks",
        "started_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
    }
    started = time.monotonic()
    with RedisNodes(5, binary=args.redis_server or pick_redis_server()) as cluster:
        addresses = [(server.host, server.port) for server in cluster]
        result = measure(cluster.urls, addresses, plan, key, log, counts)
    report.update(result)
    report["duration_s"] = round(time.monotonic() - started, 1)
    report["ratios"] = [
        {"name": name, "value": round(value, 2), "detail": detail}
        for name, value, detail in ratios(result, plan.threads)
    ]
    lines = [
        f"`python -m bench async`, {report['started_at']}, {report['cpus']} CPUs, "
        f"CPython {report['python']}, 5 redis-servers on loopback; load average "
        f"{report['loadavg_at_start']} at the start, {result['loadavg']} at the end.",
        *render(result, plan.threads),
        "",
        "| Ratio (same run) | Value | Detail |",
        "|---|--:|---|",
        *(f"| {r['name']} | {r['value']:.2f} | {r['detail']} |" for r in report["ratios"]),
    ]
    markdown = "\n".join(lines) + "\n"
    print(markdown)
    if not args.quick:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "async_locks.json").write_text(json.dumps(report, indent=2) + "\n")
        (args.out / "async_locks.md").write_text(markdown)
        log(f"saved {args.out / 'async_locks.json'} and {args.out / 'async_locks.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
