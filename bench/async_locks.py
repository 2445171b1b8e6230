"""The asyncio rows of ``python -m bench locks``: ``AsyncRedlock`` against pottery's
``AIORedlock`` and aioredlock, on the same 5 nodes in the same run.

Each contender does a non-blocking acquire + release of an uncontended key, timed
one by one (``time.perf_counter_ns``) on one event loop: first one task (latency),
then ``tasks`` tasks at once, each on its own key (throughput, not contention).
Contenders alternate in interleaved rounds so drift on the machine hits all alike.
A free key not won is counted as failed, as in the synchronous rows.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections import Counter
from typing import Any, Awaitable, Callable, Protocol

import aioredlock
import pottery
import redis.asyncio

from celery_redlock import QuorumUnavailable
from celery_redlock.asyncio import AsyncRedlock

from .stats import Summary, Timing, summarize

__all__ = ["measure", "render"]

AsyncOp = Callable[[], Awaitable[bool]]  # True: won and released


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

        async def op() -> bool:
            try:
                lease = await lock.acquire(key, blocking=False)
                return lease is not None and await lease.release()
            except QuorumUnavailable:  # a loaded machine missed node_timeout
                return False

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

        async def op() -> bool:
            if not await lock.acquire(blocking=False):
                return False
            await lock.release()
            return True

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

        async def op() -> bool:
            try:
                lock = await manager.lock(key, lock_timeout=self._ttl)
            except aioredlock.LockError:
                return False
            await manager.unlock(lock)
            return True

        return op

    async def close(self) -> None:
        await self._manager.destroy()


async def _loop(op: AsyncOp, iterations: int, warmup: int) -> Timing:
    for _ in range(warmup):
        await op()
    gc.collect()
    latencies: list[int] = []
    failures: Counter[str] = Counter()
    started = time.perf_counter_ns()
    for _ in range(iterations):
        began = time.perf_counter_ns()
        if not await op():
            failures["not won"] += 1
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
    contenders: list[AsyncContender], plan: Any, key: Callable[..., str], log: Callable[[str], None]
) -> dict[str, Any]:
    fast = {Ours.slug}
    single = {c.slug: Timing([], 0) for c in contenders}
    ops = {c.slug: c.op(key("async", c.slug)) for c in contenders}
    for number in range(plan.rounds):
        for c in contenders:
            count = plan.iterations if c.slug in fast else plan.pottery_iterations
            warmup = plan.warmup if number == 0 else plan.warmup // 10
            single[c.slug].extend(await _loop(ops[c.slug], max(1, count // plan.rounds), warmup))
        log(f"  asyncio, one task: round {number + 1}/{plan.rounds} done")
    many: dict[str, Summary] = {}
    for c in contenders:
        count = plan.thread_iterations if c.slug in fast else plan.pottery_thread_iterations
        task_ops = [c.op(key("async-tasks", c.slug, i)) for i in range(plan.threads)]
        many[c.slug] = summarize(await _tasks(task_ops, count))
        log(f"  asyncio, {plan.threads} tasks: {c.name} done")
    return {
        "names": {c.slug: c.name for c in contenders},
        "single": {slug: summarize(t).as_dict() for slug, t in single.items()},
        "tasks": {slug: s.as_dict() for slug, s in many.items()},
    }


def measure(
    urls: list[str],
    addresses: list[tuple[str, int]],
    plan: Any,
    key: Callable[..., str],
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Every asyncio contender on the nodes; per contender, one-task and N-task summaries."""

    async def run() -> dict[str, Any]:
        contenders: list[AsyncContender] = [
            Ours(urls, plan.ttl, plan.node_timeout),
            PotteryAIO(addresses, plan.ttl),
            AioRedlock(addresses, plan.ttl),
        ]
        try:
            return await _measure(contenders, plan, key, log)
        finally:
            for contender in contenders:
                await contender.close()

    return asyncio.run(run())


def ratios(result: dict[str, Any], threads: int) -> list[tuple[str, float, str]]:
    """(label, ours / theirs ops/s, detail) at 5 nodes, one task and ``threads`` tasks."""
    rows = []
    for phase, label in (("single", "1 task"), ("tasks", f"{threads} tasks")):
        data = result[phase]
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
    """The asyncio table (Markdown lines)."""
    lines = [
        "",
        f"asyncio, same nodes, same run (one event loop; {threads} tasks each on its own key):",
        "",
        f"| Lock | 1 task p50 | p99 | ops/s | {threads} tasks p50 | p99 | ops/s "
        "| failed (1 / N tasks) |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for slug, name in result["names"].items():
        one, many = result["single"][slug], result["tasks"][slug]
        failed = f"{sum(one['failures'].values())} / {sum(many['failures'].values())}"
        row = [name]
        for data in (one, many):
            row += [f"{data['p50_us']:,.1f}", f"{data['p99_us']:,.1f}", f"{data['ops_per_s']:,.0f}"]
        lines.append("| " + " | ".join([*row, failed]) + " |")
    return lines
