"""Precision under contention, for ``python -m bench limits``: how many are inside a
limit, and how many start within a rate's window, as an observer Redis sees it.

- **Limit.** T threads on one key with a limit of N: each goes in, tells the observer
  (``Observer.enter``, which logs the occupancy on the observer's clock), holds a
  moment, tells it it left, goes out, and again, for a fixed time. From the log: the
  most inside at once, entries that made it more than N, and the busy share (the
  time-weighted mean occupancy over N: 1.0 would be every permit used all the time).
- **Rate, saturated.** T threads call the limiter in a loop for a fixed time, each
  waiting as the limiter says; every start is logged on the observer's clock. From
  the log: the most starts in any window of one period (sliding: every start opens
  one), the shortest span of R + 1 consecutive starts (under a period: a window held
  more than R), and the achieved rate, the period over the *effective* period (the
  time R starts took in the steady state: from the first start to the (kR + 1)-th,
  over k).
- **Rate, two bursts.** R tries late in one whole period of the caller's clock and R
  more early in the next, each try once (no waiting): a fixed window admits both.

The observer's log is written after the limiter answered: an observed stay is inside
the real one, so a limiter that keeps its word never shows more than N.
"""

from __future__ import annotations

import bisect
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional

from .limiters import Observer

__all__ = [
    "Enter",
    "burst_run",
    "in_threads",
    "limit_run",
    "occupancy_stats",
    "rate_run",
    "window_stats",
]

#: Goes in before the deadline (monotonic seconds): the way out, or None (time's up).
Enter = Callable[[float], Optional[Callable[[], object]]]
#: Tries to start before the deadline: True when a start was admitted.
Start = Callable[[float], bool]


def in_threads(threads: int, body: Callable[[int], None]) -> None:
    """``body(index)`` in ``threads`` threads started together; the first error raises."""
    barrier = threading.Barrier(threads)
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            barrier.wait()
            body(index)
        except BaseException as error:
            errors.append(error)

    workers = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if errors:
        raise errors[0]


# -- the limit --------------------------------------------------------------------------


def occupancy_stats(
    log: list[tuple[int, int]], begin_us: int, end_us: int, limit: int
) -> dict[str, Any]:
    """Most inside, entries over ``limit`` and the time-weighted mean occupancy over
    ``[begin_us, end_us]`` from ``(µs, occupancy after the change)`` in change order."""
    area = 0
    level, since = 0, begin_us
    for at, inside in log:
        at = min(max(at, begin_us), end_us)
        area += level * (at - since)
        level, since = inside, at
    area += level * (end_us - since)
    span = end_us - begin_us
    mean = area / span if span > 0 else 0.0
    entries = [inside for (_, inside), (_, before) in zip(log, [(0, 0), *log]) if inside > before]
    return {
        "max_inside": max((inside for _, inside in log), default=0),
        "entries": len(entries),
        "entries_over_limit": sum(1 for inside in entries if inside > limit),
        "mean_occupancy": round(mean, 3),
        "busy_share": round(mean / limit, 4),
    }


def limit_run(
    enter: Enter, observer: Observer, threads: int, limit: int, hold_s: float, duration_s: float
) -> dict[str, Any]:
    """``threads`` threads go in and out of ``enter``'s limit for ``duration_s``."""
    observer.clear()
    failures: list[str] = []
    deadline = time.monotonic() + duration_s
    begin = observer.now_us()

    def work(_: int) -> None:
        while time.monotonic() < deadline:
            try:
                leave = enter(deadline)
            except Exception as error:  # an outage on a loaded machine: counted
                failures.append(type(error).__name__)
                continue
            if leave is None:
                return
            observer.enter()
            time.sleep(hold_s)
            observer.leave()
            try:
                leave()
            except Exception as error:  # the permit frees at its TTL: counted
                failures.append(type(error).__name__)

    in_threads(threads, work)
    end = observer.now_us()
    row = occupancy_stats(observer.occupancy_log(), begin, end, limit)
    row.update(
        threads=threads,
        limit=limit,
        hold_ms=hold_s * 1000,
        duration_s=round((end - begin) / 1e6, 2),
        holds_per_s=round(row["entries"] / ((end - begin) / 1e6), 1),
        ideal_holds_per_s=round(limit / hold_s, 1),
        failed=len(failures),
    )
    return row


# -- the rate ---------------------------------------------------------------------------


def window_stats(starts_us: list[int], count: int, period_s: float) -> dict[str, Any]:
    """Most starts in any window of ``period_s`` (one opened by every start), the
    shortest span of ``count`` + 1 consecutive starts, and the effective period."""
    starts = sorted(starts_us)
    period_us = int(period_s * 1e6)
    most = max(
        (bisect.bisect_left(starts, first + period_us) - i for i, first in enumerate(starts)),
        default=0,
    )
    spans = [starts[i + count] - starts[i] for i in range(len(starts) - count)]
    periods = (len(starts) - 1) // count if starts else 0
    effective = (starts[periods * count] - starts[0]) / periods / 1e6 if periods else None
    return {
        "starts": len(starts),
        "max_in_window": most,
        "shortest_span_of_r_plus_1_ms": round(min(spans) / 1000, 1) if spans else None,
        "effective_period_s": round(effective, 4) if effective else None,
        "achieved_fraction": round(period_s / effective, 4) if effective else None,
    }


def rate_run(
    start: Start, observer: Observer, threads: int, count: int, period_s: float,
    duration_s: float,
) -> dict[str, Any]:  # fmt: skip
    """``threads`` threads start under the rate for ``duration_s``, as fast as it lets
    them."""
    observer.clear()
    failures: list[str] = []
    deadline = time.monotonic() + duration_s
    begin = observer.now_us()

    def work(_: int) -> None:
        while time.monotonic() < deadline:
            try:
                admitted = start(deadline)
            except Exception as error:
                failures.append(type(error).__name__)
                continue
            if admitted:
                observer.started()

    in_threads(threads, work)
    end = observer.now_us()
    starts = observer.starts()
    row = window_stats(starts, count, period_s)
    row.update(
        threads=threads,
        rate=f"{count}/{period_s:g}s",
        duration_s=round((end - begin) / 1e6, 2),
        starts_per_s_over_the_run=round(len(starts) / ((end - begin) / 1e6), 1),
        failed=len(failures),
    )
    return row


def burst_run(
    try_once: Callable[[], bool], observer: Observer, threads: int, count: int,
    period_s: float, gap_s: float,
) -> dict[str, Any]:  # fmt: skip
    """Two bursts of ``count`` single tries, ``gap_s`` apart, astride a boundary
    between two whole periods of the caller's clock (``time.time``)."""
    observer.clear()
    admitted = [0, 0]
    failures: list[str] = []
    lock = threading.Lock()
    now = time.time()
    boundary = (now // period_s + 1) * period_s
    if boundary - now < gap_s:
        boundary += period_s

    def one(burst: int) -> None:
        try:
            won = try_once()
        except Exception as error:
            failures.append(type(error).__name__)
            return
        if won:
            observer.started()
            with lock:
                admitted[burst] += 1

    with ThreadPoolExecutor(threads) as pool:
        for burst, at in enumerate((boundary - gap_s / 2, boundary + gap_s / 2)):
            time.sleep(max(0.0, at - time.time()))
            for future in [pool.submit(one, burst) for _ in range(count)]:
                future.result()
    row = window_stats(observer.starts(), count, period_s)
    row.update(
        tries_per_burst=count,
        gap_ms=gap_s * 1000,
        admitted_first=admitted[0],
        admitted_second=admitted[1],
        failed=len(failures),
    )
    return row
