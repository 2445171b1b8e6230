"""Limits and rates: ``python -m bench limits [--quick] [--no-tasks]``.

One run starts 5 redis-server lock nodes and an observer redis-server on free
loopback ports (``celery_redlock.testing``) and measures, side by side on them:

1. **Overhead per operation** (``limits_overhead``): our ``acquire(key, limit=3)`` +
   ``release()`` and ``admit(key, rate)`` beside our mutex and the bare-socket floor,
   on 1, 3 and 5 nodes, and on one Redis a single-Redis INCR counter (heimdall-style)
   and a fixed-window INCR rate limiter (``limiters``: the approaches re-implemented,
   not those packages); admits that find a window partly or wholly taken.
2. **Precision under contention** (``limits_contention`` runs the contenders through
   ``limits_precision``): threads on one key with a limit, threads starting under a
   rate, two bursts astride a period boundary, as an observer Redis sees them.
3. **Tasks** (``limits_tasks``; ``--no-tasks`` skips it): a backlog of same-key
   ``redlock_rate`` copies drained by real ``celery worker`` processes.

``limits_report`` renders the Markdown; a full run writes ``bench/results/limits.json``
and ``bench/results/limits.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from celery_redlock.testing import REDIS_SERVER_ENV, RedisNodes, RedisServer

from . import limits_contention, limits_overhead, limits_report, limits_tasks

__all__ = ["FULL", "QUICK", "Plan", "main", "run"]

RESULTS_DIR = Path(__file__).resolve().parent / "results"
NODES = 5


@dataclass(frozen=True)
class Plan:
    """How much one run does."""

    #: Timed operations per overhead entry (split over ``rounds``), after ``warmup``.
    iterations: int = 4000
    rounds: int = 4
    warmup: int = 200
    #: Places of a rate's 1,000 taken for the admit rows on 5 nodes (1,000: refused).
    occupancies: tuple[int, ...] = (100, 999, 1000)
    #: The limit's N, and the precision runs' threads and holding time.
    limit: int = 3
    threads: int = 16
    hold_s: float = 0.002
    limit_duration_s: float = 5.0
    #: The rate of the precision runs: R starts per period.
    rate_count: int = 50
    rate_period_s: float = 1.0
    rate_duration_s: float = 6.0
    #: The two bursts' distance, astride a period boundary.
    burst_gap_s: float = 0.15
    #: The task section: same-key copies, the task's rate, workers x concurrency.
    task_backlog: int = 200
    task_rate: str = limits_tasks.TASK_RATE
    task_workers: int = 2
    task_concurrency: int = 4
    ttl: float = 10.0
    node_timeout: float = 0.05


FULL = Plan()
QUICK = Plan(
    iterations=300,
    rounds=2,
    warmup=30,
    occupancies=(100, 1000),
    limit_duration_s=1.0,
    rate_duration_s=2.5,
    task_backlog=40,
    task_workers=1,
)


class _Keys:
    """Keys no earlier run has touched."""

    def __init__(self) -> None:
        self.run = secrets.token_hex(4)

    def __call__(self, *parts: object) -> str:
        return ":".join(["limits", self.run, *map(str, parts)])


# -- the run ------------------------------------------------------------------------------


def run(
    plan: Plan, binary: str, tasks: bool, log: Callable[[str], None]
) -> tuple[dict[str, Any], str]:
    from .machine import report_head

    started = time.monotonic()
    report: dict[str, Any] = report_head("limits", binary, plan)
    keys = _Keys()
    with RedisNodes(NODES, binary=binary) as cluster, RedisServer(binary=binary) as watcher:
        log(f"{NODES} lock nodes and an observer up: {[s.port for s in cluster]}, {watcher.port}")
        log("overhead ...")
        report["overhead"] = limits_overhead.overhead(cluster, keys, plan, log)
        report["loadavg_after_overhead"] = round(os.getloadavg()[0], 2)
        log("precision ...")
        report["precision"] = limits_contention.precision(
            cluster, watcher.client(), keys, plan, log
        )
        report["loadavg_after_precision"] = round(os.getloadavg()[0], 2)
        if tasks:
            log("tasks ...")
            with tempfile.TemporaryDirectory(prefix="bench-limits-") as workdir:
                report["tasks"] = limits_tasks.drain(
                    binary, cluster, plan.task_backlog, plan.task_rate, plan.task_workers,
                    plan.task_concurrency, Path(workdir), log,
                )  # fmt: skip
    report["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    report["duration_s"] = round(time.monotonic() - started, 1)
    return report, limits_report.render_markdown(report)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench limits", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument("--quick", action="store_true", help="small run; saves nothing")
    parser.add_argument("--no-tasks", action="store_true", help="skip the Celery workers")
    parser.add_argument(
        "--redis-server",
        default=None,
        help=f"redis-server binary (default: ${REDIS_SERVER_ENV}, else the newest on PATH)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    from .locks import _write, pick_redis_server  # the bench extra's imports, as above

    plan = QUICK if args.quick else FULL
    binary = args.redis_server or pick_redis_server()

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    report, markdown = run(plan, binary, not args.no_tasks, log)
    print(markdown)
    log(f"done in {report['duration_s']} s")
    if not args.quick:
        _write(args.out / "limits.json", json.dumps(report, indent=2, ensure_ascii=False) + "\n")
        _write(args.out / "limits.md", markdown)
        log(f"saved {args.out / 'limits.json'} and {args.out / 'limits.md'}")
    return 0
