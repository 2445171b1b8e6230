"""Who is measured for precision under contention, for ``python -m bench limits``:
ours on 3 and 5 nodes and the INCR limiters on one (bench/limiters.py), each through
the measurements of limits_precision.py, on the same lock nodes and observer.

Beside each row: the round trips node 0 served per hold or per start (``INFO
commandstats``: EVALSHA for ours, one per round; GET, EXEC and DECR for the INCR
counter; EXEC for the fixed window), which says how many tries a hold or a start took.
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING, Any, Callable, Optional

import redis

from celery_redlock import Redlock
from celery_redlock.lock.stored import LIMIT, permit_slot
from celery_redlock.testing import RedisNodes

from . import limits_precision
from .limiters import FixedWindowRate, IncrCounter, Observer

if TYPE_CHECKING:
    from .limits import Plan

__all__ = ["POLL_MS", "precision"]

#: A polling caller's pause between tries, ms (uniform): the INCR counter's, and ours
#: in the polling row.
POLL_MS = (0.5, 1.5)
#: Node counts ours runs on (the polling row: the last).
OUR_NODES = (3, 5)


def _ours_enter(redlock: Redlock, key: str, limit: int, polling: bool) -> limits_precision.Enter:
    def enter(deadline: float) -> Optional[Callable[[], object]]:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if not polling:
                lease = redlock.acquire(key, limit=limit, timeout=left)
                return None if lease is None else lease.release
            lease = redlock.acquire(key, limit=limit, blocking=False)
            if lease is not None:
                return lease.release
            time.sleep(random.uniform(*POLL_MS) / 1000)

    return enter


def _counter_enter(counter: IncrCounter) -> limits_precision.Enter:
    def enter(deadline: float) -> Optional[Callable[[], object]]:
        while time.monotonic() < deadline:
            if counter.try_acquire():
                return counter.release
            time.sleep(random.uniform(*POLL_MS) / 1000)
        return None

    return enter


def _ours_start(redlock: Redlock, key: str, rate: tuple[int, float]) -> limits_precision.Start:
    def start(deadline: float) -> bool:
        left = deadline - time.monotonic()
        return left > 0 and redlock.admit(key, rate, timeout=left) == 0.0

    return start


def _ours_once(redlock: Redlock, key: str, rate: tuple[int, float]) -> Callable[[], bool]:
    return lambda: redlock.admit(key, rate) == 0.0


def _window_start(limiter: FixedWindowRate) -> limits_precision.Start:
    def start(deadline: float) -> bool:
        wait = limiter.admit()
        if wait == 0.0:
            return True
        time.sleep(max(0.0, min(wait, deadline - time.monotonic())))
        return False

    return start


#: Commands that are one round trip to node 0, by limiter family (``INFO commandstats``).
ROUND_TRIPS = {"ours": ("evalsha", "eval"), "incr": ("get", "exec", "decr"), "fixed": ("exec",)}


def _round_trips(client: redis.Redis, family: str) -> int:
    stats = client.info("commandstats")
    return sum(
        int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ROUND_TRIPS[family]
    )


def _counted(
    client: redis.Redis, family: str, measure: Callable[[], dict[str, Any]], per: str
) -> dict[str, Any]:
    """``measure()``'s row, with the round trips node 0 served per ``row[per]``."""
    before = _round_trips(client, family)
    row = measure()
    trips = _round_trips(client, family) - before
    row["round_trips_node0_per_" + per] = round(trips / row[per], 1) if row[per] else None
    return row


def _held_permits(clients: list[redis.Redis], key: str, limit: int) -> Callable[[], list[int]]:
    """Per node, how many of ``key``'s permits hold a value."""
    slots = [permit_slot(key, LIMIT, i) for i in range(limit)]
    return lambda: [int(client.exists(*slots)) for client in clients]


def _limit_rows(
    locks: dict[int, Redlock], clients: list[redis.Redis], observer: Observer,
    keys: Callable[..., str], plan: Plan, log: Callable[[str], None],
) -> list[dict[str, Any]]:  # fmt: skip
    """A row per contender; ``left``: what is still counted, per node, once every
    thread let go (permits held on the nodes, the INCR counter's value)."""
    one, most = clients[0], OUR_NODES[-1]
    contenders: list[tuple[str, int, str, str, bool]] = [
        (f"ours ({n} nodes), blocking acquire", n, "ours", keys("inside", n), False)
        for n in OUR_NODES
    ]
    contenders.append((f"ours ({most} nodes), polling", most, "ours", keys("inside", "poll"), True))
    rows = []
    for name, nodes, family, key, polling in contenders:
        enter = _ours_enter(locks[nodes], key, plan.limit, polling)
        rows.append(_limit_row(name, nodes, family, enter, _held_permits(clients[:nodes], key,
                    plan.limit), one, observer, plan, log))  # fmt: skip
    counter = IncrCounter(one, keys("inside", "incr"), plan.limit, plan.ttl)
    rows.append(
        _limit_row(IncrCounter.name + ", polling", 1, "incr", _counter_enter(counter),
                   lambda: [int(one.get(keys("inside", "incr")) or 0)], one, observer, plan, log)
    )  # fmt: skip
    return rows


def _limit_row(
    name: str, nodes: int, family: str, enter: limits_precision.Enter,
    left: Callable[[], list[int]], one: redis.Redis, observer: Observer, plan: Plan,
    log: Callable[[str], None],
) -> dict[str, Any]:  # fmt: skip
    def measure() -> dict[str, Any]:
        return limits_precision.limit_run(
            enter, observer, plan.threads, plan.limit, plan.hold_s, plan.limit_duration_s
        )

    row = _counted(one, family, measure, "entries")
    time.sleep(0.1)  # late replies land
    row = {"limiter": name, "nodes": nodes, "family": family, **row, "left": left()}
    log(f"  limit: {name}: max inside {row['max_inside']}, busy {row['busy_share']}, "
        f"left {row['left']}")  # fmt: skip
    return row


def _rate_rows(
    locks: dict[int, Redlock], one: redis.Redis, observer: Observer,
    keys: Callable[..., str], plan: Plan, log: Callable[[str], None],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:  # fmt: skip
    rate = (plan.rate_count, plan.rate_period_s)
    starters: list[tuple[str, int, str, limits_precision.Start, Callable[[], bool]]] = [
        (f"ours ({n} nodes), admit(timeout=...)", n, "ours",
         _ours_start(locks[n], keys("rate", n), rate),
         _ours_once(locks[n], keys("burst", n), rate))
        for n in OUR_NODES
    ]  # fmt: skip
    saturated = FixedWindowRate(one, keys("rate", "window"), *rate)
    bursts = FixedWindowRate(one, keys("burst", "window"), *rate)
    starters.append(
        (FixedWindowRate.name + ", sleeping until the next window", 1, "fixed",
         _window_start(saturated), lambda: bursts.admit() == 0.0)
    )  # fmt: skip
    rate_rows, burst_rows = [], []
    for name, nodes, family, start, try_once in starters:

        def measure(start: limits_precision.Start = start) -> dict[str, Any]:
            return limits_precision.rate_run(
                start, observer, plan.threads, plan.rate_count, plan.rate_period_s,
                plan.rate_duration_s,
            )  # fmt: skip

        row = _counted(one, family, measure, "starts")
        rate_rows.append({"limiter": name, "nodes": nodes, "family": family, **row})
        log(f"  rate: {name}: max in window {row['max_in_window']}, "
            f"achieved {row['achieved_fraction']}")  # fmt: skip
        row = limits_precision.burst_run(
            try_once, observer, plan.threads, plan.rate_count, plan.rate_period_s,
            plan.burst_gap_s,
        )  # fmt: skip
        burst_rows.append({"limiter": name.split(",")[0], "nodes": nodes, **row})
        log(f"  bursts: {name}: {row['admitted_first']} + {row['admitted_second']}")
    return rate_rows, burst_rows


def _warm(redlock: Redlock, key: str, threads: int) -> None:
    """Each thread takes and gives back a lock of its own a few times (untimed): every
    row starts with as many open connections to the nodes as it has threads."""

    def work(index: int) -> None:
        for _ in range(5):
            lease = redlock.acquire(f"{key}:{index}", timeout=5.0)
            if lease is not None:
                lease.release()

    limits_precision.in_threads(threads, work)


def precision(
    cluster: RedisNodes, observer_client: redis.Redis, keys: Callable[..., str], plan: Plan,
    log: Callable[[str], None],
) -> dict[str, list[dict[str, Any]]]:  # fmt: skip
    """The limit's and the rate's rows (limits_precision.py says how they are read)."""
    observer = Observer(observer_client, keys("observer"))
    clients = [server.client() for server in cluster]
    one = clients[0]
    locks = {n: Redlock(cluster.urls[:n], ttl=plan.ttl, node_timeout=plan.node_timeout)
             for n in OUR_NODES}  # fmt: skip
    try:
        for lock in locks.values():
            _warm(lock, keys("warm"), plan.threads)
        limit_rows = _limit_rows(locks, clients, observer, keys, plan, log)
        rate_rows, burst_rows = _rate_rows(locks, one, observer, keys, plan, log)
    finally:
        observer.clear()
        for lock in locks.values():
            lock.close()
    return {"limit": limit_rows, "rate": rate_rows, "bursts": burst_rows}
