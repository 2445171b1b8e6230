"""Overhead per operation, for ``python -m bench limits``: one thread, uncontended.

Every entry is one timed operation: our mutex ``acquire`` + ``release``, our
``acquire(key, limit=N)`` + ``release``, our ``admit(key, rate)`` (an empty window:
a fresh key per call), on 1, 3 and 5 nodes; the floor of the same nodes (bare
sockets, hand-packed RESP, a quorum of replies: ``SET NX PX`` + ``DEL`` beside
acquire + release, one ``SET PX`` round beside admit); on one Redis, the INCR
counter and the fixed-window INCR limiter (bench/limiters.py). Rounds are
interleaved (every entry in turn, ``plan.rounds`` times) so drift on the machine
hits all alike.

An admit's script looks for the lowest free slot of the window, so its cost grows
with the starts already in it: on the most nodes, rows with some of a rate's 1,000
places taken (each timed admit's place freed again, untimed, so every call sees the
same window) and with all taken (refused).
"""

from __future__ import annotations

import contextlib
import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

import redis

from celery_redlock import QuorumUnavailable, Redlock
from celery_redlock.lock.stored import RATE, permit_slot
from celery_redlock.testing import RedisNodes

from .limiters import FixedWindowRate, FloorRound, IncrCounter
from .resp import FloorQuorum
from .stats import Op, OpFailed, Timing, summarize

if TYPE_CHECKING:
    from .limits import Plan

__all__ = ["SLOW_SHARE", "WINDOW", "overhead"]

#: The rate whose window is filled for the admit rows that find places taken.
WINDOW = (1000, 3600.0)
#: The share of the plan's iterations those rows take (each scans up to 1,000 slots).
SLOW_SHARE = 0.1


def _not_won(what: str) -> OpFailed:
    return OpFailed("not won", what)


def _limit_op(redlock: Redlock, key: str, limit: int) -> Op:
    """acquire + release of one of ``key``'s ``limit`` permits (1: the mutex)."""

    def op() -> None:
        try:
            lease = redlock.acquire(key, blocking=False, limit=limit)
            if lease is None:
                raise _not_won(key)
            lease.release()
        except QuorumUnavailable as error:
            raise OpFailed("QuorumUnavailable", str(error)) from None

    return op


def _admit_op(redlock: Redlock, keys: Callable[[], str], rate: Any, expect: bool = True) -> Op:
    """One admit on ``keys()``; not admitted (or admitted, when ``expect`` is False)
    counts as failed."""

    def op() -> None:
        try:
            admitted = redlock.admit(keys(), rate) == 0.0
        except QuorumUnavailable as error:
            raise OpFailed("QuorumUnavailable", str(error)) from None
        if admitted != expect:
            raise OpFailed("not admitted" if expect else "admitted")

    return op


def _counter_op(counter: IncrCounter) -> Op:
    def op() -> None:
        if not counter.try_acquire():
            raise _not_won("INCR counter")
        counter.release()

    return op


def _window_op(limiter: FixedWindowRate) -> Op:
    def op() -> None:
        if limiter.admit() != 0.0:
            raise OpFailed("not admitted")

    return op


@dataclass
class _Fill:
    """A window with its first ``taken`` places held on every node."""

    taken: int
    #: Admits it took; those that were told to try again (the start counted all the
    #: same: a round slower than RATE_SLACK) made it take more than ``taken``.
    admits: int = 0
    admitted: int = 0
    #: Frees again the place the measured admit took (whichever slot it was).
    reset: Optional[Callable[[], None]] = None

    def as_dict(self) -> dict[str, int]:
        return {"taken": self.taken, "admits": self.admits, "admitted": self.admitted}


@dataclass
class _Entry:
    slug: str
    name: str
    nodes: int
    #: "acquire+release" or "admit": which floor it is held against.
    kind: str
    op: Op
    #: Untimed, after each timed op (puts a window back as it was).
    reset: Optional[Callable[[], object]] = None
    #: How its window was filled beforehand.
    fill: Optional[_Fill] = None
    #: Of the plan's iterations (a slow row takes fewer).
    share: float = 1.0


def _timed(entry: _Entry, iterations: int, warmup: int) -> Timing:
    for _ in range(warmup):
        with contextlib.suppress(OpFailed):
            entry.op()
        if entry.reset is not None:
            entry.reset()
    clock = time.perf_counter_ns
    latencies = [0] * iterations
    timing = Timing(latencies, 0)
    for i in range(iterations):
        t0 = clock()
        try:
            entry.op()
        except OpFailed as failure:
            timing.failures[failure.kind] += 1
        latencies[i] = clock() - t0
        timing.wall_ns += latencies[i]
        if entry.reset is not None:
            entry.reset()
    return timing


def _same(key: str) -> Callable[[], str]:
    return lambda: key


def _fill(
    redlock: Redlock, clients: list[redis.Redis], key: str, rate: tuple[int, float], taken: int
) -> _Fill:
    """Admit on ``key`` until ``taken`` of its slots are held on every node (a round
    scans from a random slot, so which ones is the lock's choice)."""
    fill = _Fill(taken)
    slots = [permit_slot(key, RATE, i) for i in range(rate[0])]

    def held() -> list[set[str]]:
        return [{s for s in slots if client.exists(s)} for client in clients]

    while fill.admits < taken or min(len(h) for h in held()) < taken:
        if fill.admits > 2 * taken:
            raise RuntimeError(f"{key}: {taken} places not taken in {fill.admits} admits")
        fill.admits += 1
        fill.admitted += redlock.admit(key, rate) == 0.0
    kept = held()

    def reset() -> None:  # give back what the measured admit took, keep the fill
        for client, keep in zip(clients, kept):
            extra = [s for s in slots if s not in keep]
            if extra:
                client.delete(*extra)

    if taken < rate[0]:
        reset()
        fill.reset = reset
    return fill


def overhead(
    cluster: RedisNodes, keys: Callable[..., str], plan: Plan, log: Callable[[str], None]
) -> list[dict[str, Any]]:
    """Every entry's summary, with its floor's and our mutex's (same nodes) p50 beside."""
    addresses = [(server.host, server.port) for server in cluster]
    value = secrets.token_urlsafe(20).encode() + b"|bench"
    ttl_ms = int(plan.ttl * 1000)
    clients = [server.client() for server in cluster]
    one = clients[0]
    counter = 0

    def fresh() -> str:
        nonlocal counter
        counter += 1
        return keys("admit", counter)

    entries: list[_Entry] = []
    closers: list[Callable[[], None]] = []
    rate = (plan.rate_count, plan.rate_period_s)
    for n in (1, 3, len(cluster)):
        redlock = Redlock(cluster.urls[:n], ttl=plan.ttl, node_timeout=plan.node_timeout)
        floor2 = FloorQuorum(addresses[:n], keys("floor2", n), value, ttl_ms)
        floor1 = FloorRound(addresses[:n], keys("floor1", n), value, ttl_ms)
        closers += [redlock.close, floor2.close, floor1.close]
        entries += [
            _Entry(f"floor2_{n}", "floor: SET NX PX + DEL", n, "acquire+release", floor2),
            _Entry(f"floor1_{n}", "floor: one SET PX round", n, "admit", floor1),
            _Entry(f"mutex_{n}", "ours: mutex acquire + release", n, "acquire+release",
                   _limit_op(redlock, keys("mutex", n), 1)),
            _Entry(f"limit_{n}", f"ours: acquire(limit={plan.limit}) + release", n,
                   "acquire+release", _limit_op(redlock, keys("limit", n), plan.limit)),
            _Entry(f"admit_{n}", f"ours: admit, {plan.rate_count}/{plan.rate_period_s:g}s, "
                   "empty window", n, "admit", _admit_op(redlock, fresh, rate)),
        ]  # fmt: skip
        if n == 1:
            entries += [
                _Entry("incr_counter", f"{IncrCounter.name}, N={plan.limit}", 1,
                       "acquire+release",
                       _counter_op(IncrCounter(one, keys("incr"), plan.limit, plan.ttl))),
                _Entry("fixed_window", f"{FixedWindowRate.name}, 10000/s", 1, "admit",
                       _window_op(FixedWindowRate(one, keys("window"), 10_000, 1.0))),
            ]  # fmt: skip
        if n == len(cluster):
            big = WINDOW
            for taken in plan.occupancies:
                key = keys("occupied", taken)
                fill = _fill(redlock, clients, key, big, taken)
                full = taken == big[0]
                name = "window full (refused)" if full else f"{taken} of 1000 taken"
                entries.append(
                    _Entry(f"admit_{n}_taken_{taken}", f"ours: admit, 1000/h, {name}", n,
                           "admit", _admit_op(redlock, _same(key), big, expect=not full),
                           reset=fill.reset, fill=fill, share=SLOW_SHARE)
                )  # fmt: skip
    timings = {entry.slug: Timing([], 0) for entry in entries}
    try:
        for number in range(plan.rounds):
            for entry in entries:
                warmup = plan.warmup if number == 0 else plan.warmup // 10
                iterations = max(1, int(plan.iterations * entry.share) // plan.rounds)
                timings[entry.slug].extend(_timed(entry, iterations, int(warmup * entry.share)))
            log(f"  overhead: round {number + 1}/{plan.rounds} done")
    finally:
        for close in closers:
            close()
    summaries = {slug: summarize(timing) for slug, timing in timings.items()}
    rows = []
    for entry in entries:
        s = summaries[entry.slug]
        floor = summaries[f"floor{2 if entry.kind == 'acquire+release' else 1}_{entry.nodes}"]
        mutex = summaries[f"mutex_{entry.nodes}"]
        rows.append(
            {
                "slug": entry.slug,
                "name": entry.name,
                "nodes": entry.nodes,
                "kind": entry.kind,
                **s.as_dict(),
                "over_floor_p50": round(s.p50_us / floor.p50_us, 2),
                "over_floor_p99": round(s.p99_us / floor.p99_us, 2),
                "over_mutex_p50": round(s.p50_us / mutex.p50_us, 2),
                "over_mutex_p99": round(s.p99_us / mutex.p99_us, 2),
                "fill": entry.fill and entry.fill.as_dict(),
            }
        )
    return rows
