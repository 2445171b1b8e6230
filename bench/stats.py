"""Timed loops and their summaries: latency percentiles (µs) and throughput (ops/s).

Every operation is timed on its own with ``time.perf_counter_ns``. The garbage
collector stays on (the libraries run with it on in production) but is emptied
before each measurement, so no measurement inherits another's garbage.

An operation that fails at its job (a free lock not won) raises :class:`OpFailed`: it
is counted by kind and the run goes on, its latency included. Any other exception
stops the run.
"""

from __future__ import annotations

import contextlib
import gc
import math
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional

__all__ = [
    "Op",
    "OpFailed",
    "Summary",
    "Timing",
    "percentile",
    "run_loop",
    "run_threads",
    "summarize",
]

#: One timed operation (for a lock: acquire then release). Raises OpFailed if it fails.
Op = Callable[[], None]


class OpFailed(Exception):
    """The operation ran but did not do its job; ``kind`` is what the tables count."""

    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind


@dataclass
class Timing:
    """Raw samples: one latency per operation (ns), the wall time they took (ns) and
    the failed operations by kind."""

    latencies_ns: list[int]
    wall_ns: int
    threads: int = 1
    failures: Counter[str] = field(default_factory=Counter)

    def extend(self, other: Timing) -> None:
        self.latencies_ns.extend(other.latencies_ns)
        self.wall_ns += other.wall_ns
        self.failures.update(other.failures)


@dataclass(frozen=True)
class Summary:
    """What a table shows about a timing."""

    operations: int
    threads: int
    p50_us: float
    p90_us: float
    p95_us: float
    p99_us: float
    max_us: float
    mean_us: float
    ops_per_s: float
    wall_s: float
    #: Failed operations by kind (counted in ``operations`` and the latencies).
    failures: dict[str, int] = field(default_factory=dict)

    @property
    def failed(self) -> int:
        return sum(self.failures.values())

    def as_dict(self) -> dict[str, Any]:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}


def percentile(sorted_values: list[int], fraction: float) -> int:
    """Nearest-rank percentile of an ascending list (``fraction`` in (0, 1])."""
    if not sorted_values:
        raise ValueError("no samples")
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def summarize(timing: Timing) -> Summary:
    values = sorted(timing.latencies_ns)
    count = len(values)
    return Summary(
        operations=count,
        threads=timing.threads,
        p50_us=percentile(values, 0.50) / 1000,
        p90_us=percentile(values, 0.90) / 1000,
        p95_us=percentile(values, 0.95) / 1000,
        p99_us=percentile(values, 0.99) / 1000,
        max_us=values[-1] / 1000,
        mean_us=sum(values) / count / 1000,
        ops_per_s=count / (timing.wall_ns / 1e9),
        wall_s=timing.wall_ns / 1e9,
        failures=dict(timing.failures),
    )


def _warm_up(op: Op, calls: int) -> None:
    """Untimed calls; one that fails at its job (a loaded machine) is not counted."""
    for _ in range(calls):
        with contextlib.suppress(OpFailed):
            op()


def run_loop(op: Op, iterations: int, warmup: int = 0) -> Timing:
    """``op`` ``iterations`` times in this thread, after ``warmup`` untimed calls."""
    _warm_up(op, warmup)
    gc.collect()
    clock = time.perf_counter_ns
    latencies = [0] * iterations
    failures: Counter[str] = Counter()
    started = clock()
    for i in range(iterations):
        t0 = clock()
        try:
            op()
        except OpFailed as failure:
            failures[failure.kind] += 1
        latencies[i] = clock() - t0
    return Timing(latencies, clock() - started, failures=failures)


def run_threads(
    make_op: Callable[[int], Op], threads: int, iterations: int, warmup: int = 0
) -> Timing:
    """``threads`` threads, each running its own ``make_op(index)`` ``iterations`` times.

    The ops are made and warmed up before a barrier; the wall time runs from the first
    thread's start to the last one's end, latencies are pooled across threads.
    """
    barrier = threading.Barrier(threads + 1)
    results: list[Optional[tuple[list[int], int, int, Counter[str]]]] = [None] * threads
    failures: list[BaseException] = []

    def worker(index: int) -> None:
        clock = time.perf_counter_ns
        latencies = [0] * iterations
        failed: Counter[str] = Counter()
        try:
            op = make_op(index)
            _warm_up(op, warmup)
        except BaseException as error:
            failures.append(error)
            barrier.abort()
            return
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            return
        started = clock()
        try:
            for i in range(iterations):
                t0 = clock()
                try:
                    op()
                except OpFailed as failure:
                    failed[failure.kind] += 1
                latencies[i] = clock() - t0
        except BaseException as error:
            failures.append(error)
            return
        results[index] = (latencies, started, clock(), failed)

    workers = [
        threading.Thread(target=worker, args=(i,), name=f"bench-{i}", daemon=True)
        for i in range(threads)
    ]
    for thread in workers:
        thread.start()
    gc.collect()
    with contextlib.suppress(threading.BrokenBarrierError):
        barrier.wait()
    for thread in workers:
        thread.join()
    if failures:
        raise failures[0]
    done = [r for r in results if r is not None]
    latencies = [value for r in done for value in r[0]]
    wall = max(r[2] for r in done) - min(r[1] for r in done)
    failed: Counter[str] = Counter()
    for r in done:
        failed.update(r[3])
    return Timing(latencies, wall, threads, failed)
