"""The Celery app that the ``celery worker`` subprocesses of ``python -m bench tasks`` run.

Three tasks with the same trivial body, one per way of running it:

- ``bench.plain``: a plain ``@app.task``;
- ``bench.redlock``: ``RedlockTask`` with the default settings (5 lock nodes,
  ``redlock_auto_extend`` on, ``redlock_on_contended="retry"``, key = task name + a
  hash of the arguments);
- ``bench.single``: :class:`SingleNodeLockTask`, a single-node ``SET key token NX PX``
  lock released by a compare-and-delete, in the style of celery-once and
  celery-singleton. It is a *re-implementation of their approach* (a key from the task
  name and its arguments, one Redis, redis-py), not their package: both take their
  lock at enqueue time, we take it in ``before_start`` as RedlockTask does, so that
  the two run-time locks are compared like for like.

Each task gets distinct arguments ``(tag, index)``, so no two tasks share a lock key:
what is measured is the lock's overhead, never contention.

Two more families serve other benchmarks: ``bench.hot.*`` (one hot key, for
``python -m bench scale``) and ``bench.rate`` (a backlog under ``redlock_rate``, for
``python -m bench limits``); workers count the task messages they publish for them.

Configured from the environment, so one module serves every measurement:

- ``BENCH_BROKER_URL``: broker and result backend (results are off: ``ignore_result``);
- ``BENCH_LOCK_NODES``: the 5 lock nodes, comma-separated Redis URLs (the single-node
  lock uses the first);
- ``BENCH_OBSERVER_URL``: the Redis the task bodies report to (never seen by a lock);
- ``BENCH_INSTRUMENT_TASKS`` (optional, the profile pass only): N; the worker then
  instruments the timed tasks 1 to N (N - 1 whole task cycles): with
  ``BENCH_PROFILE`` set to a path, cProfile runs in the body's thread (solo pool: the
  one that runs everything) and its stats are dumped there; the ``bench.*.timed``
  tasks time their lock hooks (wall and process CPU) and report the totals to the
  observer (``bench-hooks:{tag}``).

What a body reports: ``RPUSH bench:{tag} "<monotonic ns> <pid> <process CPU ns>"`` on
the observer, over a bare socket with ``CLIENT REPLY OFF``: one ``send()`` per task
and no wait for a reply, so the witness costs every variant the same few µs.
``time.monotonic_ns()`` is CLOCK_MONOTONIC, one clock for every process on the
machine, so timestamps from prefork children compare directly.
"""

from __future__ import annotations

import cProfile
import hashlib
import json
import os
import secrets
import time
from typing import Any, Optional
from urllib.parse import urlsplit

import redis
from celery import Celery, Task
from celery.signals import after_task_publish, worker_process_shutdown, worker_shutdown

from celery_redlock import RedlockTask, signals

from .resp import RespConnection, pack

__all__ = [
    "HOT_TASKS",
    "LOCK_PREFIX",
    "RATE_TASK",
    "TASKS",
    "TIMED_TASKS",
    "SingleNodeLockTask",
    "app",
    "hooks_key",
    "hot_keys",
    "observer_key",
    "rate_keys",
]

BROKER_URL = os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/0")
LOCK_NODES = [
    url.strip() for url in os.environ.get("BENCH_LOCK_NODES", BROKER_URL).split(",") if url.strip()
]
OBSERVER_URL = os.environ.get("BENCH_OBSERVER_URL", BROKER_URL)
PROFILE_PATH = os.environ.get("BENCH_PROFILE")
INSTRUMENT_TASKS = int(os.environ.get("BENCH_INSTRUMENT_TASKS", "0"))

#: Key prefix of the single-node lock (celery-once writes ``qo_<task>_<args>``).
LOCK_PREFIX = "single"
#: Lease of the single-node lock, seconds (RedlockTask's default redlock_ttl is 30 s too).
SINGLE_TTL_MS = 30_000
#: Tags of warm-up batches start with this: the instrumentation ignores them.
WARMUP_TAG = "warm"

app = Celery("bench_taskapp", broker=BROKER_URL, backend=BROKER_URL, set_as_current=False)
app.conf.update(
    broker_connection_retry_on_startup=True,
    task_create_missing_queues=True,
    # No result writes: a backend SET per task would cost every variant the same and
    # only dilute the difference the bench is after.
    task_ignore_result=True,
    redlock_nodes=LOCK_NODES,
)


def observer_key(tag: str) -> str:
    """The observer list the bodies of batch ``tag`` push to."""
    return f"bench:{tag}"


def hooks_key(tag: str) -> str:
    """The observer list a worker reports its hook timings of batch ``tag`` to."""
    return f"bench-hooks:{tag}"


# -- the witness ----------------------------------------------------------------------

_observer: Optional[tuple[int, RespConnection]] = None


def _observer_conn() -> RespConnection:
    """This process's observer connection (a forked child opens its own)."""
    global _observer
    if _observer is None or _observer[0] != os.getpid():
        parts = urlsplit(OBSERVER_URL)
        conn = RespConnection(parts.hostname or "127.0.0.1", parts.port or 6379)
        # No replies from here on: the body sends and goes on, nothing piles up to read.
        conn.send(pack("CLIENT", "REPLY", "OFF"))
        _observer = (os.getpid(), conn)
    return _observer[1]


# -- instrumentation (the profile pass only; the timed runs carry none of it) ------------

_profiler: Optional[cProfile.Profile] = None
_instrumented = 0
#: Hook name -> [wall ns, process CPU ns, calls], timed tasks only (see _TimedHooks).
_hook_totals: dict[str, list[int]] = {}


def _instrument_step(tag: str) -> None:
    """Start cProfile at the first timed body; at the INSTRUMENT_TASKS-th, stop it and
    report the hook totals (so both cover INSTRUMENT_TASKS - 1 whole task cycles)."""
    global _profiler, _instrumented
    if tag.startswith(WARMUP_TAG):
        return
    _instrumented += 1
    if _instrumented == 1 and PROFILE_PATH is not None:
        _profiler = cProfile.Profile()
        _profiler.enable()
    if _instrumented == INSTRUMENT_TASKS:
        _dump_profile()
        if _hook_totals:
            report = json.dumps({"pid": os.getpid(), "hooks": _hook_totals}).encode()
            _observer_conn().send(pack(b"RPUSH", hooks_key(tag), report))


def _dump_profile(**_: Any) -> None:
    global _profiler
    if _profiler is None or PROFILE_PATH is None:
        return
    _profiler.disable()
    _profiler.dump_stats(PROFILE_PATH)
    _profiler = None


def body(tag: str, index: int) -> None:
    """The trivial task: report one timestamp to the observer and return."""
    if INSTRUMENT_TASKS:
        _instrument_step(tag)
    stamp = b"%d %d %d" % (time.monotonic_ns(), os.getpid(), time.process_time_ns())
    _observer_conn().send(pack(b"RPUSH", observer_key(tag), stamp))


worker_shutdown.connect(_dump_profile, weak=False)
worker_process_shutdown.connect(_dump_profile, weak=False)


# -- the single-node lock (celery-once / celery-singleton style) -------------------------

# KEYS[1] the lock key; ARGV[1] our token. Deletes the key only if it holds our token.
_COMPARE_AND_DELETE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""

_lock_client: Optional[tuple[int, redis.Redis, Any]] = None


def _single_node() -> tuple[redis.Redis, Any]:
    """This process's redis-py client for the lock node, and the release script."""
    global _lock_client
    if _lock_client is None or _lock_client[0] != os.getpid():
        client = redis.Redis.from_url(LOCK_NODES[0])
        _lock_client = (os.getpid(), client, client.register_script(_COMPARE_AND_DELETE))
    return _lock_client[1], _lock_client[2]


class SingleNodeContended(Exception):
    """The single-node lock was held by someone else (never happens in this bench)."""


class SingleNodeLockTask(Task):  # type: ignore[misc]
    """A task that holds a one-node Redis lock while it runs.

    Key: prefix, task name and an MD5 of the JSON of the arguments, as
    celery-singleton builds it; value: a random token; ``SET key token NX PX`` in
    ``before_start``, compare-and-delete (EVALSHA) in ``after_return``.
    """

    def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
        client, _ = _single_node()
        encoded = json.dumps([list(args or ()), kwargs or {}], sort_keys=True).encode()
        digest = hashlib.md5(encoded, usedforsecurity=False).hexdigest()
        key = f"{LOCK_PREFIX}:{self.name}:{digest}"
        token = secrets.token_hex(16)
        if not client.set(key, token, nx=True, px=SINGLE_TTL_MS):
            raise SingleNodeContended(key)
        self.request.single_lock = (key, token)

    def after_return(
        self, status: str, retval: Any, task_id: str, args: Any, kwargs: Any, einfo: Any
    ) -> None:
        held: Optional[tuple[str, str]] = getattr(self.request, "single_lock", None)
        if held is None:
            return
        self.request.single_lock = None
        _, release = _single_node()
        release(keys=[held[0]], args=[held[1]])


# -- hook timers (the profile pass only) ---------------------------------------------


class _TimedHooks(Task):  # type: ignore[misc]
    """Times the lock hooks of the class after it in the MRO: wall and process CPU
    (every thread of the process, so a renewal thread woken by the hook counts too)."""

    def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
        if not args or str(args[0]).startswith(WARMUP_TAG):
            super().before_start(task_id, args, kwargs)
            return
        wall, cpu = time.perf_counter_ns(), time.process_time_ns()
        try:
            super().before_start(task_id, args, kwargs)
        finally:
            _add_hook_time("before_start", wall, cpu)

    def after_return(
        self, status: str, retval: Any, task_id: str, args: Any, kwargs: Any, einfo: Any
    ) -> None:
        if not args or str(args[0]).startswith(WARMUP_TAG):
            super().after_return(status, retval, task_id, args, kwargs, einfo)
            return
        wall, cpu = time.perf_counter_ns(), time.process_time_ns()
        try:
            super().after_return(status, retval, task_id, args, kwargs, einfo)
        finally:
            _add_hook_time("after_return", wall, cpu)


def _add_hook_time(hook: str, wall_started: int, cpu_started: int) -> None:
    totals = _hook_totals.setdefault(hook, [0, 0, 0])
    totals[0] += time.perf_counter_ns() - wall_started
    totals[1] += time.process_time_ns() - cpu_started
    totals[2] += 1


class TimedRedlockTask(_TimedHooks, RedlockTask):
    """RedlockTask with its hooks timed."""


class TimedSingleNodeLockTask(_TimedHooks, SingleNodeLockTask):
    """SingleNodeLockTask with its hooks timed."""


# -- the tasks -----------------------------------------------------------------------

# Not decorator syntax: Celery's app.task is untyped.
plain = app.task(name="bench.plain", shared=False)(body)
locked = app.task(name="bench.redlock", shared=False, base=RedlockTask)(body)
single = app.task(name="bench.single", shared=False, base=SingleNodeLockTask)(body)

locked_timed = app.task(name="bench.redlock.timed", shared=False, base=TimedRedlockTask)(body)
#: The same without the renewal thread: the difference is what the watchdog costs.
locked_no_extend_timed = app.task(
    name="bench.redlock_no_extend.timed",
    shared=False,
    base=TimedRedlockTask,
    redlock_auto_extend=False,
)(body)
single_timed = app.task(name="bench.single.timed", shared=False, base=TimedSingleNodeLockTask)(body)

#: Variant slug -> task name.
TASKS = {"plain": "bench.plain", "redlock": "bench.redlock", "single": "bench.single"}
#: The same variants with their lock hooks timed (profile pass only).
TIMED_TASKS = {
    "redlock": "bench.redlock.timed",
    "redlock_no_extend": "bench.redlock_no_extend.timed",
    "single": "bench.single.timed",
}


# -- the hot key (python -m bench scale) ------------------------------------------------

#: Countdown cap and retry budget of the hot-key tasks: the defaults (60 s, 20 retries)
#: would let 100 queued duplicates run out of retries; the tests' hand-off app uses these.
HOT_BACKOFF_MAX = 4.0
HOT_MAX_RETRIES = 10_000


def hot_keys(tag: str) -> tuple[str, str, str]:
    """Observer keys of hot-key batch ``tag``: runs per task id (hash), body spans
    (list of ``"<task id> <start ns> <end ns>"``), task messages workers published."""
    return f"hot-runs:{tag}", f"hot-spans:{tag}", f"hot-published:{tag}"


def hot_body(task: Task, tag: str, seconds: float) -> None:
    """Every duplicate of batch ``tag`` locks the same key; the body sleeps ``seconds``
    and reports its span (CLOCK_MONOTONIC, one clock for every process here)."""
    start = time.monotonic_ns()
    time.sleep(seconds)
    end = time.monotonic_ns()
    runs, spans, _ = hot_keys(tag)
    task_id = str(task.request.id)
    _observer_conn().send(
        pack(b"HINCRBY", runs, task_id, 1)
        + pack(b"RPUSH", spans, f"{task_id} {start} {end}".encode())
    )


def _hot_task(name: str, **options: Any) -> Any:
    return app.task(
        name=name,
        shared=False,
        bind=True,
        base=RedlockTask,
        redlock_key="hot:{tag}",
        redlock_retry_backoff_max=HOT_BACKOFF_MAX,
        redlock_max_retries=HOT_MAX_RETRIES,
        **options,
    )(hot_body)


#: redlock_handoff on (the default: not set) / off -> task name.
HOT_TASKS = {True: "bench.hot.handoff", False: "bench.hot.retry"}
hot_handoff = _hot_task(HOT_TASKS[True])
hot_retry = _hot_task(HOT_TASKS[False], redlock_handoff=False)


def _count_hot_published(sender: Any = None, body: Any = None, **_: Any) -> None:
    """A hot-key message a worker published (lock retry, hand-off wake, fallback)."""
    if not str(sender or "").startswith("bench.hot."):
        return
    kwargs = body[1] if isinstance(body, (list, tuple)) and len(body) > 1 else {}
    tag = (kwargs or {}).get("tag")
    if tag:
        _observer_conn().send(pack(b"INCR", hot_keys(tag)[2]))


after_task_publish.connect(_count_hot_published, weak=False)


# -- a backlog under a rate (python -m bench limits) -------------------------------------

#: The rate-limited task: every copy of one ``tag`` shares the key ``rate:{tag}``, no
#: limit on how many run at once, ``BENCH_TASK_RATE`` starts per period (default 20/s).
RATE_TASK = "bench.rate"


def rate_keys(tag: str) -> tuple[str, str, str]:
    """Observer keys of rate batch ``tag``: body starts (list of ``"<task id> <start
    ns>"``), task messages workers published, copies sent back over the rate."""
    return f"rate-starts:{tag}", f"rate-published:{tag}", f"rate-waits:{tag}"


def rate_body(task: Task, tag: str, index: int) -> None:
    """Reports its start (CLOCK_MONOTONIC, one clock for every process here)."""
    entry = f"{task.request.id} {time.monotonic_ns()}".encode()
    _observer_conn().send(pack(b"RPUSH", rate_keys(tag)[0], entry))


rate_task = app.task(
    name=RATE_TASK,
    shared=False,
    bind=True,
    base=RedlockTask,
    redlock_key="rate:{tag}",
    redlock_limit="unlimited",
    redlock_rate=os.environ.get("BENCH_TASK_RATE", "20/s"),
)(rate_body)


def _count_rate_published(sender: Any = None, body: Any = None, **_: Any) -> None:
    """A rate-task message a worker published (a copy sent back over the rate)."""
    if sender != RATE_TASK:
        return
    kwargs = body[1] if isinstance(body, (list, tuple)) and len(body) > 1 else {}
    tag = (kwargs or {}).get("tag")
    if tag:
        _observer_conn().send(pack(b"INCR", rate_keys(tag)[1]))


def _count_rate_waits(sender: Any = None, key: str = "", action: str = "", **_: Any) -> None:
    """A copy over the rate (``lock_contended`` with action "wait")."""
    if action == "wait" and getattr(sender, "name", None) == RATE_TASK:
        _observer_conn().send(pack(b"INCR", rate_keys(key.rpartition(":")[2])[2]))


after_task_publish.connect(_count_rate_published, weak=False)
signals.lock_contended.connect(_count_rate_waits, weak=False)
