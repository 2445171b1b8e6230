"""Task-overhead benchmark: what a lock costs a trivial Celery task, in tasks/s.

Run from the repository root::

    python -m bench tasks                 # full run (~3 min), saves the results
    python -m bench tasks --quick         # smoke run, nothing saved
    python -m bench tasks --profile never # skip the cProfile pass even on a MISS

One run starts a redis-server broker (also the result backend, unused: results are
off), 5 redis-server lock nodes and an observer redis-server on free loopback ports
(``celery_redlock.testing``), measures everything on them, tears them down, prints a
Markdown report and writes ``bench/results/tasks.json`` and ``bench/results/tasks.md``.

Variants (``bench/taskapp.py``), the same trivial body each time:

- ``plain``: ``@app.task``;
- ``redlock``: ``RedlockTask`` on the 5 nodes, default settings (auto_extend on, retry);
- ``single``: a one-node ``SET NX PX`` / compare-and-delete lock taken in
  ``before_start`` with redis-py, celery-once / celery-singleton style
  (a re-implementation of their approach, not their package).

Pools: ``--pool solo``, ``--pool prefork -c 2``, ``--pool threads -c 4`` and ``--pool
gevent -c 50``; a fresh ``celery worker`` subprocess per measurement, on a fresh queue.
RedlockTask's target over plain holds for solo and prefork; the threads and gevent rows
are information (one process: its CPU per task includes the message handling).

Method, per measurement: publish a warm-up batch and then the N timed tasks (distinct
arguments: no two tasks share a lock key) to the queue, *then* start the worker, so it
never waits on the publisher. The warm-up batch goes first and pays for imports and
first connections. Each body pushes its CLOCK_MONOTONIC time, pid and process CPU time
to the observer; throughput = (N - 1) / (last timed body - first timed body), i.e.
N - 1 complete task cycles (message in, lock, body, unlock, ack). CPU per task is
the pool processes' own CPU time over the same span (prefork: the children's; the
parent's message handling is not in it). Each configuration runs ``repeats`` times,
interleaved (every variant in turn, both pools, then again) so drift on the machine
hits all alike; tables show the median and the spread (min..max).

Worker flags: ``--loglevel WARNING`` (the two INFO lines per task would cost every
variant alike), ``--without-gossip --without-mingle --without-heartbeat``; results
disabled (``task_ignore_result``).

If RedlockTask misses its target (or with ``--profile always``), a profile pass follows
on the same servers, solo workers only: the lock variants once more with their hooks
timed inside the worker (wall and CPU of ``before_start`` / ``after_return``, no
profiler), then every variant under cProfile; the report shows where RedlockTask's
time per task goes, by celery_redlock file and function.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import pstats
import secrets
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import redis
from celery import Celery

from celery_redlock.testing import REDIS_SERVER_ENV, CeleryProcess, RedisNodes, RedisServer

from . import taskapp
from .commands import count_keys
from .locks import Ratio, _dist_version, _write, machine_info, pick_redis_server

__all__ = ["FULL", "QUICK", "Measurement", "Plan", "main", "run"]

RESULTS_DIR = Path(__file__).resolve().parent / "results"
CHECKOUT = Path(__file__).resolve().parent.parent

NODES = 5
#: (pool, concurrency) set-ups, in the order they run.
POOLS: tuple[tuple[str, int], ...] = (("solo", 1), ("prefork", 2), ("threads", 4), ("gevent", 50))
#: Pools whose RedlockTask / plain ratio has a target; the others' rows are information.
TARGET_POOLS = ("solo", "prefork")
#: Variant slug -> what the tables call it.
VARIANTS = {
    "plain": "plain @app.task",
    "redlock": "RedlockTask (5 nodes)",
    "single": "single-node SET NX lock (celery-once style)",
}
#: The profile pass's hook-timed variants (``taskapp.TIMED_TASKS``).
TIMED_VARIANTS = {
    "redlock": VARIANTS["redlock"],
    "redlock_no_extend": "RedlockTask, redlock_auto_extend=False",
    "single": VARIANTS["single"],
}
#: Seconds a worker gets for its warm shutdown before its group is SIGKILLed.
WORKER_STOP_TIMEOUT = 20.0
#: RedlockTask tasks/s over plain tasks/s, per pool.
TARGET_VS_PLAIN = 0.85
#: Where a profile's rows are attributed (files of the package under study).
PROFILED_FILES = ("task.py", "keys.py", "config.py", "redlock.py", "nodes.py", "watchdog.py")


@dataclass(frozen=True)
class Plan:
    """How much one run does."""

    #: Timed tasks per measurement.
    tasks: int = 3000
    #: Warm-up tasks published ahead of them (imports, first connections).
    warmup: int = 100
    #: Measurements per (variant, pool). Other work on a small machine can move one run
    #: by 30 %: the median of 3 shrugs off one disturbed run (``--repeats`` for more).
    repeats: int = 3
    #: Seconds a measurement may take before the run is abandoned.
    timeout_s: float = 120.0
    #: Timed tasks under cProfile (solo) when RedlockTask misses.
    profile_tasks: int = 2000
    #: Rows of each profile kept in the report.
    profile_top: int = 25


FULL = Plan()
QUICK = Plan(tasks=300, warmup=20, repeats=1, profile_tasks=300)


@dataclass(frozen=True)
class Measurement:
    """One worker's run of ``tasks`` timed tasks, as the observer saw it."""

    variant: str
    pool: str
    concurrency: int
    repeat: int
    tasks: int
    tasks_per_s: float
    #: First timed body to the last, seconds.
    window_s: float
    #: Pool processes' CPU time (user + system) per task, µs, over the window.
    cpu_us_per_task: float
    #: Processes that ran timed bodies (prefork: the children).
    processes: int
    #: Worker spawn to the last timed body, seconds (start-up and warm-up included).
    spawn_to_done_s: float
    #: CPU the 5 lock nodes (together) and the broker spent per task, µs (INFO cpu, from
    #: the worker's spawn to its last timed body, divided over warm-up + timed tasks).
    nodes_cpu_us_per_task: float
    broker_cpu_us_per_task: float
    #: Lock keys still on the lock nodes after the worker stopped (must be 0).
    lock_keys_left: int
    #: Instrumented runs only: hook -> wall and CPU µs per call (see taskapp).
    hooks: Optional[dict[str, dict[str, float]]] = None

    def as_dict(self) -> dict[str, Any]:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}


# -- servers and workers ---------------------------------------------------------------


@dataclass
class Servers:
    broker: RedisServer
    nodes: RedisNodes
    observer_server: RedisServer
    observer: redis.Redis

    def worker_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            BENCH_BROKER_URL=self.broker.url,
            BENCH_LOCK_NODES=",".join(self.nodes.urls),
            BENCH_OBSERVER_URL=self.observer_server.url,
        )
        for name in ("BENCH_PROFILE", "BENCH_INSTRUMENT_TASKS"):
            env.pop(name, None)
        return env


def _start_worker(
    env: dict[str, str], pool: str, concurrency: int, queue: str, log_path: Path
) -> CeleryProcess:
    """One ``celery -A bench.taskapp worker`` subprocess in its own process group."""
    return CeleryProcess.worker(
        "bench.taskapp",
        name=queue,
        pool=pool,
        concurrency=concurrency,
        queues=[queue],
        loglevel="WARNING",
        log_path=log_path,
        cwd=CHECKOUT,
        env=env,
        pythonpath=[CHECKOUT],
    )


def _client(broker_url: str) -> Celery:
    client = Celery("bench_tasks_client", broker=broker_url, set_as_current=False)
    client.conf.broker_connection_retry_on_startup = True
    return client


def _publish(client: Celery, task_name: str, queue: str, tag: str, count: int) -> None:
    with client.producer_or_acquire() as producer:
        for index in range(count):
            client.send_task(
                task_name, (tag, index), queue=queue, ignore_result=True, producer=producer
            )


def _await_count(
    observer: redis.Redis, key: str, count: int, worker: CeleryProcess, timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    while int(observer.llen(key)) < count:
        if not worker.alive:
            raise RuntimeError(f"worker exited before {key} reached {count}:\n{worker.tail()}")
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{key}: {observer.llen(key)} of {count} after {timeout_s:.0f} s:\n{worker.tail()}"
            )
        time.sleep(0.02)


def _server_cpu(servers: Sequence[RedisServer]) -> float:
    """Seconds of CPU (user + system, every thread) the servers have used so far."""
    total = 0.0
    for server in servers:
        cpu = server.info("cpu")
        total += float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])
    return total


def _parse(entries: list[Any]) -> list[tuple[int, int, int]]:
    """Observer entries (bytes) -> (monotonic ns, pid, process CPU ns), by time."""
    stamps = []
    for entry in entries:
        when, pid, cpu = bytes(entry).split()
        stamps.append((int(when), int(pid), int(cpu)))
    return sorted(stamps)


def _cpu_ns(stamps: list[tuple[int, int, int]]) -> tuple[int, int]:
    """Pool CPU spent between each process's first and last timed body, and the number
    of task cycles that covers (per process: its bodies - 1)."""
    per_pid: dict[int, list[int]] = {}
    for _, pid, cpu in stamps:
        per_pid.setdefault(pid, []).append(cpu)
    spent = sum(max(cpus) - min(cpus) for cpus in per_pid.values())
    cycles = sum(len(cpus) - 1 for cpus in per_pid.values())
    return spent, cycles


def measure(
    servers: Servers,
    client: Celery,
    variant: str,
    pool: str,
    concurrency: int,
    repeat: int,
    plan: Plan,
    workdir: Path,
    *,
    timed_hooks: bool = False,
    profile_path: Optional[Path] = None,
) -> Measurement:
    """One worker, fresh queue: warm-up + ``plan.tasks`` timed tasks, then stop it.

    ``timed_hooks``: run the variant's ``bench.*.timed`` twin, which times its lock
    hooks; ``profile_path``: run cProfile in the worker and dump the stats there.
    """
    tag = f"{secrets.token_hex(3)}-{variant}-{pool}-{repeat}"
    warm_tag = f"{taskapp.WARMUP_TAG}-{tag}"
    queue = f"bench-{tag}"
    task_name = (taskapp.TIMED_TASKS if timed_hooks else taskapp.TASKS)[variant]
    _publish(client, task_name, queue, warm_tag, plan.warmup)
    _publish(client, task_name, queue, tag, plan.tasks)
    env = servers.worker_env()
    if timed_hooks or profile_path is not None:
        env["BENCH_INSTRUMENT_TASKS"] = str(plan.tasks)
    if profile_path is not None:
        env["BENCH_PROFILE"] = str(profile_path)
    nodes_cpu, broker_cpu = _server_cpu(servers.nodes), _server_cpu([servers.broker])
    spawned = time.monotonic_ns()
    worker = _start_worker(env, pool, concurrency, queue, workdir / f"{queue}.log")
    try:
        _await_count(
            servers.observer, taskapp.observer_key(tag), plan.tasks, worker, plan.timeout_s
        )
        nodes_cpu = _server_cpu(servers.nodes) - nodes_cpu
        broker_cpu = _server_cpu([servers.broker]) - broker_cpu
    finally:
        worker.stop(WORKER_STOP_TIMEOUT)
    key = taskapp.observer_key(tag)
    stamps = _parse(servers.observer.lrange(key, 0, -1))
    warm = int(servers.observer.llen(taskapp.observer_key(warm_tag)))
    hook_reports = servers.observer.lrange(taskapp.hooks_key(tag), 0, -1)
    servers.observer.delete(key, taskapp.observer_key(warm_tag), taskapp.hooks_key(tag))
    if len(stamps) != plan.tasks or warm != plan.warmup:
        raise RuntimeError(
            f"{tag}: {len(stamps)} timed and {warm} warm-up bodies, expected "
            f"{plan.tasks} and {plan.warmup}:\n{worker.tail()}"
        )
    window_ns = stamps[-1][0] - stamps[0][0]
    cpu_ns, cycles = _cpu_ns(stamps)
    addresses = [(node.host, node.port) for node in servers.nodes]
    left = sum(count_keys(addresses, "redlock:bench.*", skip=("\x00",)))
    left += sum(count_keys(addresses[:1], f"{taskapp.LOCK_PREFIX}:*"))
    servers.nodes.flushall()  # tombstones, and any key left: the next run counts its own
    return Measurement(
        variant=variant,
        pool=pool,
        concurrency=concurrency,
        repeat=repeat,
        tasks=plan.tasks,
        tasks_per_s=(len(stamps) - 1) / (window_ns / 1e9),
        window_s=window_ns / 1e9,
        cpu_us_per_task=cpu_ns / max(1, cycles) / 1000,
        processes=len({pid for _, pid, _ in stamps}),
        spawn_to_done_s=(stamps[-1][0] - spawned) / 1e9,
        nodes_cpu_us_per_task=nodes_cpu / (plan.tasks + plan.warmup) * 1e6,
        broker_cpu_us_per_task=broker_cpu / (plan.tasks + plan.warmup) * 1e6,
        lock_keys_left=left,
        hooks=_hook_times(hook_reports) if timed_hooks else None,
    )


def _hook_times(reports: list[Any]) -> dict[str, dict[str, float]]:
    """Hook totals reported by the worker's processes -> µs per call, wall and CPU."""
    totals: dict[str, list[int]] = {}
    for report in reports:
        for hook, (wall, cpu, calls) in json.loads(report)["hooks"].items():
            summed = totals.setdefault(hook, [0, 0, 0])
            summed[0] += wall
            summed[1] += cpu
            summed[2] += calls
    return {
        hook: {
            "wall_us": round(wall / calls / 1000, 1),
            "cpu_us": round(cpu / calls / 1000, 1),
            "calls": calls,
        }
        for hook, (wall, cpu, calls) in totals.items()
        if calls
    }


# -- summaries, ratios, profiles --------------------------------------------------------


def _summary(runs: list[Measurement]) -> dict[str, Any]:
    rates = [m.tasks_per_s for m in runs]
    cpus = [m.cpu_us_per_task for m in runs]
    median = statistics.median(rates)
    return {
        "tasks_per_s_median": round(median, 1),
        "tasks_per_s_min": round(min(rates), 1),
        "tasks_per_s_max": round(max(rates), 1),
        "spread_pct": round((max(rates) - min(rates)) / median * 100, 1),
        "tasks_per_s_runs": [round(rate, 1) for rate in rates],
        "us_per_task_median": round(1e6 / median, 1),
        "cpu_us_per_task_median": round(statistics.median(cpus), 1),
        "nodes_cpu_us_per_task_median": round(
            statistics.median(m.nodes_cpu_us_per_task for m in runs), 1
        ),
        "broker_cpu_us_per_task_median": round(
            statistics.median(m.broker_cpu_us_per_task for m in runs), 1
        ),
        "lock_keys_left": sum(m.lock_keys_left for m in runs),
    }


def _ratios(
    summaries: dict[str, dict[str, dict[str, Any]]], runs: list[Measurement]
) -> list[Ratio]:
    ratios = []
    for pool, concurrency in POOLS:
        label = pool if pool == "solo" else f"{pool} -c {concurrency}"
        by = summaries[pool]
        vs_plain = TARGET_VS_PLAIN if pool in TARGET_POOLS else 0.0
        for other, target, sense in (("plain", vs_plain, ">="), ("single", 0.0, ">=")):
            ours, theirs = by["redlock"]["tasks_per_s_median"], by[other]["tasks_per_s_median"]
            per_repeat = sorted(
                a.tasks_per_s / b.tasks_per_s
                for a in runs
                for b in runs
                if a.pool == b.pool == pool
                and a.repeat == b.repeat
                and (a.variant, b.variant) == ("redlock", other)
            )
            best = by["redlock"]["tasks_per_s_max"] / by[other]["tasks_per_s_max"]
            added = 1e6 / ours - 1e6 / theirs
            cpu = ""
            if pool == "solo":  # prefork: the parent's share is not measured
                cpu_ratio = (
                    by[other]["cpu_us_per_task_median"] / by["redlock"]["cpu_us_per_task_median"]
                )
                cpu = f"; worker CPU per task, inverted, {cpu_ratio:.2f}"
            ratios.append(
                Ratio(
                    f"RedlockTask / {VARIANTS[other]} tasks/s, {label}",
                    ours / theirs,
                    target,
                    sense,
                    f"{ours:,.0f} / {theirs:,.0f} tasks/s (medians), {added:+.0f} µs/task; "
                    "per repeat "
                    + ", ".join(f"{r:.2f}" for r in per_repeat)
                    + f"; best runs {best:.2f}{cpu}",
                )
            )
    return ratios


def _ratio_dict(ratio: Ratio) -> dict[str, Any]:
    """A ratio for the JSON; one without a target is information, not a verdict."""
    if ratio.target:
        return ratio.as_dict()
    return {**ratio.as_dict(), "target": None, "sense": None, "result": "-"}


def _where(filename: str) -> Optional[str]:
    """``.../celery_redlock/task.py`` -> ``task.py``; None outside celery_redlock."""
    parts = Path(filename).parts
    if len(parts) >= 2 and parts[-2] == "celery_redlock":
        return parts[-1]
    return None


def _profile_report(path: Path, tasks: int, top: int) -> dict[str, Any]:
    """Per-task µs (cProfile-inflated: read the ranking) by celery_redlock function."""
    stats = pstats.Stats(str(path))
    table: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    total_tt = sum(entry[2] for entry in table.values())
    per_file: dict[str, float] = {}
    rows = []
    for (filename, line, name), (_, calls, tottime, cumtime, _) in table.items():
        where = _where(filename)
        if where is not None:
            per_file[where] = per_file.get(where, 0.0) + tottime
        rows.append(
            {
                "function": f"{where or _short(filename)}:{line}({name})",
                "calls_per_task": round(calls / tasks, 2),
                "own_us_per_task": round(tottime / tasks * 1e6, 2),
                "cumulative_us_per_task": round(cumtime / tasks * 1e6, 2),
                "in_celery_redlock": where is not None,
            }
        )
    by_own = sorted(rows, key=lambda r: -r["own_us_per_task"])[:top]
    ours = [r for r in rows if r["in_celery_redlock"]]
    by_cumulative = sorted(ours, key=lambda r: -r["cumulative_us_per_task"])[:top]
    return {
        "tasks": tasks,
        "profiled_us_per_task": round(total_tt / tasks * 1e6, 1),
        "own_us_per_task_by_file": {
            name: round(value / tasks * 1e6, 2)
            for name, value in sorted(per_file.items(), key=lambda kv: -kv[1])
        },
        "top_own_time": by_own,
        "celery_redlock_by_cumulative": by_cumulative,
    }


def _short(filename: str) -> str:
    """A profiled file as the table shows it: from site-packages on, else its name."""
    marker = "site-packages" + os.sep
    if marker in filename:
        return filename.split(marker, 1)[1]
    return filename if filename.startswith("<") else Path(filename).name


def _median_hooks(runs: list[Measurement]) -> dict[str, Any]:
    """Hook timings of repeated runs: the median of each number, and every run's."""
    medians: dict[str, dict[str, float]] = {}
    for hook in ("before_start", "after_return"):
        per_run = [m.hooks[hook] for m in runs if m.hooks and hook in m.hooks]
        if per_run:
            medians[hook] = {
                metric: round(statistics.median(times[metric] for times in per_run), 1)
                for metric in ("wall_us", "cpu_us")
            }
    return {
        "tasks_per_s": round(statistics.median(m.tasks_per_s for m in runs), 1),
        "hooks": medians,
        "runs": [{"tasks_per_s": round(m.tasks_per_s, 1), "hooks": m.hooks} for m in runs],
    }


def _profile_pass(
    servers: Servers, client: Celery, plan: Plan, workdir: Path, log: Callable[[str], None]
) -> dict[str, Any]:
    """Solo workers: the lock hooks timed (no profiler), then cProfile of every variant."""
    instrumented = replace(plan, tasks=plan.profile_tasks)
    timed: dict[str, list[Measurement]] = {variant: [] for variant in taskapp.TIMED_TASKS}
    log("lock hooks timed in solo workers ...")
    for repeat in range(plan.repeats):
        for variant, runs in timed.items():
            m = measure(
                servers, client, variant, "solo", 1, repeat, instrumented, workdir, timed_hooks=True
            )
            runs.append(m)
            log(f"  {variant}: {m.hooks}")
    hooks = {variant: _median_hooks(runs) for variant, runs in timed.items()}
    log("cProfile of solo workers ...")
    profiles: dict[str, Any] = {}
    for variant in VARIANTS:
        path = workdir / f"profile-{variant}.pstats"
        measure(servers, client, variant, "solo", 1, -1, instrumented, workdir, profile_path=path)
        if not path.exists():
            raise RuntimeError(f"the {variant} worker wrote no profile at {path}")
        profiles[variant] = _profile_report(path, plan.profile_tasks - 1, plan.profile_top)
        log(f"  {variant}: {profiles[variant]['profiled_us_per_task']:.0f} µs/task under cProfile")
    return {"hooks": hooks, "cprofile": profiles}


# -- report --------------------------------------------------------------------------------


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.2f}"


def _profile_markdown(report: dict[str, Any], profile: dict[str, Any]) -> list[str]:
    plan, solo = report["plan"], report["summaries"]["solo"]
    gap_wall = solo["redlock"]["us_per_task_median"] - solo["plain"]["us_per_task_median"]
    gap_cpu = solo["redlock"]["cpu_us_per_task_median"] - solo["plain"]["cpu_us_per_task_median"]
    lines = [
        "",
        f"Where the time goes: solo workers, {plan['profile_tasks']} timed tasks each, "
        "after the measurements above (same servers).",
        "",
        f"Lock hooks timed inside the worker, no profiler; medians of {plan['repeats']} "
        "interleaved runs (CPU = the whole worker process, so a renewal thread woken by "
        "a hook counts too):",
        "",
        "| Task | before_start wall µs | CPU µs | after_return wall µs | CPU µs "
        "| hooks wall µs/task | hooks CPU µs/task | runs' tasks/s |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    hooks_wall: dict[str, float] = {}
    hooks_cpu: dict[str, float] = {}
    for variant, timed in profile["hooks"].items():
        hooks = timed["hooks"]
        before = hooks.get("before_start", {"wall_us": 0.0, "cpu_us": 0.0})
        after = hooks.get("after_return", {"wall_us": 0.0, "cpu_us": 0.0})
        hooks_wall[variant] = before["wall_us"] + after["wall_us"]
        hooks_cpu[variant] = before["cpu_us"] + after["cpu_us"]
        lines.append(
            f"| {TIMED_VARIANTS[variant]} | {before['wall_us']:.1f} | {before['cpu_us']:.1f} | "
            f"{after['wall_us']:.1f} | {after['cpu_us']:.1f} | {hooks_wall[variant]:.1f} | "
            f"{hooks_cpu[variant]:.1f} | {timed['tasks_per_s']:,.0f} |"
        )
    if "redlock" in hooks_wall:
        lines += [
            "",
            f"In the timed solo runs above RedlockTask took {gap_wall:.0f} µs more per task "
            f"than the plain task (wall) and {gap_cpu:.0f} µs more worker CPU; its hooks "
            f"take {hooks_wall['redlock']:.0f} µs wall and {hooks_cpu['redlock']:.0f} µs CPU "
            "per task here. What the hooks do not explain is indirect: the 5 lock nodes, "
            "the broker and the worker share the CPUs, and a woken thread costs the worker "
            "time between tasks.",
        ]
    if "redlock" in hooks_wall and "redlock_no_extend" in hooks_wall:
        lines += [
            "",
            "The renewal thread (redlock_auto_extend, watch + unwatch + waking the thread) "
            f"costs {hooks_wall['redlock'] - hooks_wall['redlock_no_extend']:.0f} µs wall and "
            f"{hooks_cpu['redlock'] - hooks_cpu['redlock_no_extend']:.0f} µs CPU per task "
            "in the hooks (with it minus without).",
        ]
    cprofile = profile["cprofile"]
    lines += [
        "",
        "cProfile (wall clock, the worker's main thread; it inflates pure-Python code "
        "several times over: read the ranking and the differences, not the absolute µs):",
        "",
        "| Task | profiled µs/task | own µs/task in celery_redlock, by file |",
        "|---|--:|---|",
    ]
    for variant, stats in cprofile.items():
        files = ", ".join(
            f"{name} {value:.1f}" for name, value in stats["own_us_per_task_by_file"].items()
        )
        lines.append(
            f"| {VARIANTS[variant]} | {stats['profiled_us_per_task']:,.1f} | {files or '-'} |"
        )
    ours = cprofile.get("redlock")
    if ours:
        lines += [
            "",
            "RedlockTask under cProfile, celery_redlock functions by cumulative µs per task:",
            "",
            "| Function | calls/task | own µs | cumulative µs |",
            "|---|--:|--:|--:|",
        ]
        for row in ours["celery_redlock_by_cumulative"][:15]:
            lines.append(
                f"| `{row['function']}` | {row['calls_per_task']:g} | "
                f"{row['own_us_per_task']:.1f} | {row['cumulative_us_per_task']:.1f} |"
            )
    return lines


def render_markdown(report: dict[str, Any]) -> str:
    machine, plan = report["machine"], report["plan"]
    libs = machine["libraries"]
    lines = [
        "### Task-overhead benchmark",
        "",
        f"`python -m bench tasks`, {report['started_at']}: {machine['cpu']}, "
        f"{machine['cpus']} CPUs, {machine['platform']}, {machine['python']}, "
        f"redis-server {machine['redis_server']['version']} (broker, {NODES} lock nodes, "
        f"observer) on loopback; celery {libs['celery']}, kombu {libs['kombu']}, "
        f"celery-redlock {libs['celery-redlock']}, redis-py {libs['redis']}. "
        f"A trivial task (distinct arguments per task: no contention), {plan['tasks']} "
        f"timed tasks after {plan['warmup']} warm-up ones, all published before the "
        "worker starts; a fresh `celery worker` per measurement, `--loglevel WARNING`, "
        f"results off; {plan['repeats']} interleaved repeats, median (min..max). "
        "Throughput = (N - 1) / (first to last timed body, CLOCK_MONOTONIC, as the bodies "
        "reported it to an observer Redis). Load average "
        f"{machine['loadavg_at_start'][0]:g} at the start, "
        f"{report['loadavg_at_end'][0]:g} at the end.",
        "",
        "| Pool | Task | tasks/s (median) | min..max | spread | µs/task | "
        "pool CPU µs/task | lock nodes CPU µs/task | broker CPU µs/task | lock keys left |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for pool, by in report["summaries"].items():
        for variant, name in VARIANTS.items():
            s = by[variant]
            lines.append(
                f"| {pool} | {name} | {s['tasks_per_s_median']:,.0f} | "
                f"{s['tasks_per_s_min']:,.0f}..{s['tasks_per_s_max']:,.0f} | "
                f"{s['spread_pct']:.0f}% | {s['us_per_task_median']:,.0f} | "
                f"{s['cpu_us_per_task_median']:,.0f} | {s['nodes_cpu_us_per_task_median']:,.0f} | "
                f"{s['broker_cpu_us_per_task_median']:,.0f} | {s['lock_keys_left']} |"
            )
    lines += [
        "",
        "Pool CPU: user + system time of the processes that ran the bodies, over the "
        "timed span (prefork: the 2 children; the parent's message handling is not in it). "
        "Lock nodes / broker CPU: what the 5 lock redis-servers together / the broker "
        "used per task (INFO cpu), warm-up included; here they share the machine's "
        f"{machine['cpus']} CPUs with the worker, as they would not in production.",
        "",
        "Ratios (same run; RedlockTask / single-node lock has no target, it is the price "
        "of the quorum). Detail: the time RedlockTask adds per task, the ratio per repeat "
        "(runs of one repeat ran back to back), of the best runs (least disturbed by other "
        "work) and, solo only, of worker CPU per task (theirs / ours: the ratio if the "
        "worker's CPU were the only bottleneck, whatever else loads the machine):",
        "",
        "| Ratio | Value | Target | Result | Detail |",
        "|---|--:|--:|---|---|",
    ]
    for ratio in report["ratios"]:
        has_target = ratio["target"] is not None
        target = f"{ratio['sense']} {ratio['target']:g}" if has_target else "-"
        result = f"**{ratio['result']}**" if has_target else "-"
        lines.append(
            f"| {ratio['name']} | {_number(ratio['value'])} | {target} | {result} "
            f"| {ratio['detail']} |"
        )
    profile = report.get("profile")
    if profile:
        lines += _profile_markdown(report, profile)
    return "\n".join(lines) + "\n"


# -- the run -------------------------------------------------------------------------------


def run(
    plan: Plan, binary: str, profile: str, log: Callable[[str], None]
) -> tuple[dict[str, Any], str]:
    """Start the servers, measure every (variant, pool) ``repeats`` times, stop them."""
    started = time.monotonic()
    machine = machine_info(binary)
    machine["libraries"].update(
        celery=_dist_version("celery"),
        kombu=_dist_version("kombu"),
        billiard=_dist_version("billiard"),
    )
    for name in ("pottery", "python-redis-lock", "hiredis"):
        machine["libraries"].pop(name, None)
    report: dict[str, Any] = {
        "bench": "tasks",
        "started_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine,
        "plan": asdict(plan),
    }
    runs: list[Measurement] = []
    profile_data: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-tasks-")))
        broker = stack.enter_context(RedisServer(binary=binary))
        observer_server = stack.enter_context(RedisServer(binary=binary))
        nodes = stack.enter_context(RedisNodes(NODES, binary=binary))
        servers = Servers(broker, nodes, observer_server, observer_server.client())
        client = _client(broker.url)
        stack.callback(client.close)
        log(
            f"redis-server {machine['redis_server']['version']} up: broker {broker.port}, "
            f"observer {observer_server.port}, lock nodes {[n.port for n in nodes]}"
        )
        total = plan.repeats * len(POOLS) * len(VARIANTS)
        for repeat in range(plan.repeats):
            for pool, concurrency in POOLS:
                for variant in VARIANTS:
                    m = measure(servers, client, variant, pool, concurrency, repeat, plan, workdir)
                    runs.append(m)
                    log(
                        f"  [{len(runs)}/{total}] {pool:7} {variant:7} {m.tasks_per_s:8,.0f} "
                        f"tasks/s, CPU {m.cpu_us_per_task:6.0f} µs/task, "
                        f"{m.spawn_to_done_s:.1f} s"
                    )
        summaries = {
            pool: {
                variant: _summary([m for m in runs if m.pool == pool and m.variant == variant])
                for variant in VARIANTS
            }
            for pool, _ in POOLS
        }
        ratios = _ratios(summaries, runs)
        missed = any(r.target and not r.passed for r in ratios)
        if profile == "always" or (profile == "auto" and missed):
            profile_data = _profile_pass(servers, client, plan, workdir, log)
    report.update(
        {
            "variants": VARIANTS,
            "pools": [f"{pool} -c {concurrency}" for pool, concurrency in POOLS],
            "runs": [m.as_dict() for m in runs],
            "summaries": summaries,
            "ratios": [_ratio_dict(ratio) for ratio in ratios],
            "profile": profile_data,
            "duration_s": round(time.monotonic() - started, 1),
            "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
        }
    )
    return report, render_markdown(report)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench tasks", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument("--quick", action="store_true", help="few tasks, 1 repeat; saves nothing")
    parser.add_argument(
        "--profile",
        choices=("auto", "always", "never"),
        default="auto",
        help="cProfile pass of solo workers: only when RedlockTask misses (default), "
        "always, or never",
    )
    parser.add_argument(
        "--repeats", type=int, default=None, help="measurements per configuration (default 3)"
    )
    parser.add_argument(
        "--redis-server",
        default=None,
        help=f"redis-server binary (default: ${REDIS_SERVER_ENV}, else the newest on PATH)",
    )
    parser.add_argument(
        "--out", type=Path, default=RESULTS_DIR, help="where tasks.json and tasks.md go"
    )
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    if args.repeats is not None:
        plan = replace(plan, repeats=max(1, args.repeats))
    binary = args.redis_server or pick_redis_server()

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    report, markdown = run(plan, binary, args.profile, log)
    print(markdown)
    log(f"done in {report['duration_s']} s")
    if not args.quick:
        _write(args.out / "tasks.json", json.dumps(report, indent=2, ensure_ascii=False) + "\n")
        _write(args.out / "tasks.md", markdown)
        log(f"saved {args.out / 'tasks.json'} and {args.out / 'tasks.md'}")
    return 0
