"""The independent witness: what the tasks did, counted on a Redis that is not a lock node.

The lock's own word ("I hold it") proves nothing about the lock. So every task body
reports to a separate Redis (``OBSERVER_URL``), and the demo judges safety from there:

- :func:`holding`, around every body: INCR ``occ:{lock key}`` on entry, keep the
  highest value ever seen in ``max:{lock key}`` (atomically, one Lua script), DECR
  on exit. For any key, ``max`` above 1 means two bodies ran at once.
- Celery and celery-redlock signals, in the worker: ``task_prerun`` (every task id
  received, and which beat tick it came from), ``task_postrun`` (its outcome),
  ``lock_contended`` (skips, retries, fails), ``lock_acquired`` (how long the acquire
  took), ``lock_extended`` and ``lock_lost``.
- The long job reports each fenced write, accepted or refused.

:func:`read` gathers it all into a :class:`Snapshot` for the demo's progress lines and
summary. Every key starts with ``demo:``. When ``OBSERVER_URL`` is empty nothing is
recorded.

Imports redis-py, Celery's signals and celery_redlock.signals; never the lock itself.
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Optional

import redis
from celery.signals import task_postrun, task_prerun

from celery_redlock import signals
from celery_redlock.beat import ENTRY_HEADER, TICK_HEADER

from .settings import Settings

__all__ = [
    "Snapshot",
    "client_for",
    "connect_signals",
    "fence_write",
    "forget_dead",
    "holding",
    "read",
]

PREFIX = "demo:"
#: Tasks of this project: the signals below ignore everyone else's.
TASK_PREFIX = "example_project."

# KEYS: occ, max, keys set, holders hash. ARGV: lock key, holder. Returns the occupancy.
_ENTER = """
local now = redis.call('INCR', KEYS[1])
if now > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], now) end
redis.call('SADD', KEYS[3], ARGV[1])
redis.call('HSET', KEYS[4], ARGV[1], ARGV[2])
return now
"""
# KEYS: occ, holders hash. ARGV: lock key, holder. Forgets the holder only if it is ours.
_LEAVE = """
redis.call('DECR', KEYS[1])
if redis.call('HGET', KEYS[2], ARGV[1]) == ARGV[2] then redis.call('HDEL', KEYS[2], ARGV[1]) end
return 1
"""

_client: Optional[tuple[int, Optional[redis.Redis]]] = None


def client_for(url: str) -> redis.Redis:
    """A client for the observer at ``url`` (strings, not bytes)."""
    return redis.Redis.from_url(url, decode_responses=True, socket_timeout=5.0)


def _observer() -> Optional[redis.Redis]:
    """This process's observer client, or None when there is no observer."""
    global _client
    if _client is None or _client[0] != os.getpid():  # a forked child makes its own
        url = Settings.from_env().observer_url
        _client = (os.getpid(), client_for(url) if url else None)
    return _client[1]


def _short(task_name: str) -> str:
    return task_name.removeprefix(TASK_PREFIX)


# -- what the tasks report ------------------------------------------------------------


@contextlib.contextmanager
def holding(lock_key: str, worker: str, task_id: str) -> Iterator[int]:
    """Around a task body: count it in ``occ:{lock_key}`` while it runs; yields the
    occupancy seen on entry (1 unless another body is inside for the same key)."""
    client = _observer()
    if client is None:
        yield 1
        return
    holder = f"{worker} {os.getpid()} {task_id}"
    occ, top = f"{PREFIX}occ:{lock_key}", f"{PREFIX}max:{lock_key}"
    occupancy = int(
        client.eval(_ENTER, 4, occ, top, f"{PREFIX}keys", f"{PREFIX}holders", lock_key, holder)
    )
    try:
        yield occupancy
    finally:
        client.eval(_LEAVE, 2, occ, f"{PREFIX}holders", lock_key, holder)


def ran(task_name: str) -> None:
    """A body of ``task_name`` started."""
    client = _observer()
    if client is not None:
        client.hincrby(f"{PREFIX}ran", _short(task_name), 1)


def fence_write(job: str, fence: int, accepted: bool) -> None:
    """The long job tried a fenced write."""
    client = _observer()
    if client is None:
        return
    outcome = "accepted" if accepted else "refused"
    client.hincrby(f"{PREFIX}fence:{outcome}", job, 1)
    client.rpush(f"{PREFIX}fence:log", f"{job} {fence} {outcome} {os.getpid()}")


def fence_taken(job: str, fence: int) -> None:
    """A holder of the long job's lock started with ``fence`` (in holding order)."""
    client = _observer()
    if client is not None:
        client.rpush(f"{PREFIX}fences:{job}", str(fence))


def forget_dead(client: redis.Redis, worker: str) -> dict[str, str]:
    """A worker known to be dead (its container killed and exited) had bodies inside:
    they left when it died, though they never said so. Counts them out of the
    occupancy of their keys as their own exit would have. Returns lock key -> task id
    of each.

    Call it only once the worker is gone: a body still running would then be counted
    out while inside, and a second body beside it would go unseen.
    """
    left = {}
    for lock_key, holder in _hash(client, f"{PREFIX}holders").items():
        name, _, task_id = holder.split()
        if name == worker:
            client.eval(_LEAVE, 2, f"{PREFIX}occ:{lock_key}", f"{PREFIX}holders", lock_key, holder)
            left[lock_key] = task_id
    return left


# -- signal receivers (worker side) ------------------------------------------------------


def _ours(sender: Any) -> bool:
    return str(getattr(sender, "name", "") or "").startswith(TASK_PREFIX)


def _on_prerun(sender: Any = None, task_id: Optional[str] = None, **_: Any) -> None:
    client = _observer()
    if client is None or not _ours(sender):
        return
    request = sender.request
    tick = getattr(request, TICK_HEADER, None)
    entry = getattr(request, ENTRY_HEADER, None)
    if task_id:
        client.hset(f"{PREFIX}seen", task_id, _short(sender.name))
    if tick is not None and entry is not None and task_id:
        # Every delivery of a beat message, whatever happens next (run, skip, retry).
        client.sadd(f"{PREFIX}beat:ticks", f"{entry} {tick}")
        client.sadd(f"{PREFIX}beat:tick:{entry}:{tick}", task_id)


def _on_postrun(
    sender: Any = None, task_id: Optional[str] = None, state: Optional[str] = None, **_: Any
) -> None:
    client = _observer()
    # A lock retry re-publishes the same task id *before* this delivery ends, so the
    # next delivery may finish first: RETRY is never recorded as an outcome.
    if client is not None and _ours(sender) and task_id and state != "RETRY":
        client.hset(f"{PREFIX}final", task_id, f"{_short(sender.name)} {state}")


def _on_contended(sender: Any = None, action: Optional[str] = None, **_: Any) -> None:
    client = _observer()
    if client is not None and _ours(sender):
        client.hincrby(f"{PREFIX}contended", f"{_short(sender.name)} {action}", 1)


def _on_acquired(sender: Any = None, elapsed: float = 0.0, **_: Any) -> None:
    client = _observer()
    if client is not None and _ours(sender):
        client.rpush(f"{PREFIX}latency", repr(float(elapsed)))


def _on_extended(sender: Any = None, **_: Any) -> None:
    client = _observer()
    if client is not None and _ours(sender):
        client.incr(f"{PREFIX}extended")


def _on_lost(sender: Any = None, key: str = "", **_: Any) -> None:
    client = _observer()
    if client is not None and _ours(sender):
        client.hincrby(f"{PREFIX}lost", key, 1)


def connect_signals() -> None:
    """Connect the receivers above (idempotent: Celery keys receivers by identity)."""
    task_prerun.connect(_on_prerun, weak=False)
    task_postrun.connect(_on_postrun, weak=False)
    signals.lock_contended.connect(_on_contended, weak=False)
    signals.lock_acquired.connect(_on_acquired, weak=False)
    signals.lock_extended.connect(_on_extended, weak=False)
    signals.lock_lost.connect(_on_lost, weak=False)


# -- reading it back (the demo) ------------------------------------------------------------


@dataclass
class Snapshot:
    """Everything the observer has seen so far."""

    #: lock key -> highest number of bodies seen inside at once.
    max_holders: dict[str, int] = field(default_factory=dict)
    #: lock key -> "worker pid task_id" of a body inside right now.
    holders: dict[str, str] = field(default_factory=dict)
    #: short task name -> bodies started.
    ran: Counter[str] = field(default_factory=Counter)
    #: (short task name, action) -> contentions: action "skip", "retry" or "fail".
    contended: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: task id -> short task name, for every task id a worker received.
    seen: dict[str, str] = field(default_factory=dict)
    #: task id -> (short task name, outcome: SUCCESS (also a skipped copy), FAILURE...).
    final: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: Seconds each successful acquire took (``lock_acquired``'s ``elapsed``).
    latencies: list[float] = field(default_factory=list)
    extended: int = 0
    #: lock key -> leases lost.
    lost: Counter[str] = field(default_factory=Counter)
    #: job -> fenced writes accepted / refused.
    fence_accepted: Counter[str] = field(default_factory=Counter)
    fence_refused: Counter[str] = field(default_factory=Counter)
    #: (job, fence, "accepted" | "refused", pid) in write order.
    fence_log: list[tuple[str, int, str, int]] = field(default_factory=list)
    #: job -> the fence of each holder, in holding order.
    fences: dict[str, list[int]] = field(default_factory=dict)
    #: (entry, tick) -> distinct task ids a worker received for that beat tick.
    beat_deliveries: dict[tuple[str, int], int] = field(default_factory=dict)

    @property
    def skipped(self) -> int:
        return sum(n for (_, action), n in self.contended.items() if action == "skip")

    @property
    def retried(self) -> int:
        return sum(n for (_, action), n in self.contended.items() if action == "retry")

    def unfinished(self, sent: set[str]) -> set[str]:
        """Task ids sent or received that have no outcome yet (still waiting)."""
        return (sent | set(self.seen)) - set(self.final)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _hash(client: redis.Redis, name: str) -> dict[str, str]:
    return {_text(k): _text(v) for k, v in client.hgetall(name).items()}


def _list(client: redis.Redis, name: str) -> list[str]:
    return [_text(item) for item in client.lrange(name, 0, -1)]


def _counter(mapping: dict[str, str]) -> Counter[str]:
    return Counter({name: int(value) for name, value in mapping.items()})


def read(client: redis.Redis, beat: bool = True) -> Snapshot:
    """Read the observer (``beat=False``: skip the per-tick sets, for progress lines)."""
    snap = Snapshot()
    keys = sorted(_text(key) for key in client.smembers(f"{PREFIX}keys"))
    if keys:
        tops = client.mget([f"{PREFIX}max:{key}" for key in keys])
        snap.max_holders = {key: int(top or 0) for key, top in zip(keys, tops)}
    snap.holders = _hash(client, f"{PREFIX}holders")
    snap.ran = _counter(_hash(client, f"{PREFIX}ran"))
    for name_action, count in _hash(client, f"{PREFIX}contended").items():
        name, _, action = name_action.partition(" ")
        snap.contended[(name, action)] = int(count)
    snap.seen = _hash(client, f"{PREFIX}seen")
    for task_id, value in _hash(client, f"{PREFIX}final").items():
        name, _, state = value.partition(" ")
        snap.final[task_id] = (name, state)
    snap.latencies = [float(x) for x in _list(client, f"{PREFIX}latency")]
    snap.extended = int(client.get(f"{PREFIX}extended") or 0)
    snap.lost = _counter(_hash(client, f"{PREFIX}lost"))
    snap.fence_accepted = _counter(_hash(client, f"{PREFIX}fence:accepted"))
    snap.fence_refused = _counter(_hash(client, f"{PREFIX}fence:refused"))
    for line in _list(client, f"{PREFIX}fence:log"):
        job, fence, outcome, pid = line.split()
        snap.fence_log.append((job, int(fence), outcome, int(pid)))
    for job_key in map(_text, client.scan_iter(f"{PREFIX}fences:*")):
        job = job_key.removeprefix(f"{PREFIX}fences:")
        snap.fences[job] = [int(x) for x in _list(client, job_key)]
    if beat:
        for member in map(_text, client.smembers(f"{PREFIX}beat:ticks")):
            entry, _, tick = member.rpartition(" ")
            delivered = client.scard(f"{PREFIX}beat:tick:{entry}:{tick}")
            snap.beat_deliveries[(entry, int(tick))] = int(delivered)
    return snap
