"""One soak: start the stack, send and inject faults for a while, heal, drain, account.

:func:`soak` returns the JSON summary (a dict); the command (``__main__``) prints and
saves it, and the slow test (tests/workers/test_celery_soak.py) checks it.
"""

from __future__ import annotations

import datetime
import platform
import random
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from celery_redlock.testing import find_redis_server

from . import report
from .faults import Faults
from .jobs import Sender, drain, read_observer
from .launch import WORKERS, Stack
from .soakapp import MAX_TTL, TTLS, VISIBILITY_TIMEOUT


@dataclass(frozen=True)
class Settings:
    minutes: float
    seed: int
    keys: int = 12
    rates: tuple[float, float] = (5.0, 10.0)  # jobs per second
    fault_every: tuple[float, float] = (5.0, 15.0)  # seconds between faults
    drain_s: float = 120.0
    log_dir: Optional[Path] = None  # default: a fresh temp dir, kept for reading

    def rerun(self) -> str:
        return f"python -m tools.celery_soak --minutes {self.minutes:g} --seed {self.seed}"


def _redis_version() -> str:
    binary = find_redis_server()
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    return f"{binary}: {out.stdout.strip()}"


def soak(settings: Settings, log: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    rng = random.Random(settings.seed)
    log_dir = settings.log_dir or Path(tempfile.mkdtemp(prefix="celery-soak-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    tags = [f"k{i}" for i in range(settings.keys)]
    started_wall = datetime.datetime.now(datetime.timezone.utc)
    began = time.monotonic()
    with Stack(log_dir) as stack:
        log(f"stack up in {time.monotonic() - began:.1f}s; worker logs in {log_dir}")
        sender = Sender(stack.client, random.Random(rng.randrange(2**31)), tags, settings.rates)
        faults = Faults(
            stack,
            random.Random(rng.randrange(2**31)),
            MAX_TTL,
            settings.fault_every,
            lambda line: log(f"[{time.monotonic() - began:6.1f}s] {line}"),
        )
        send_began = time.monotonic()
        sender.start()
        try:
            faults.run(settings.minutes * 60)
        finally:
            sender.stop()
            log(f"send phase over: {len(sender.jobs)} jobs; healing")
            faults.heal()
            restarted = stack.ensure_up()
            if restarted:
                log(f"workers found dead after healing, restarted: {restarted}")
        sent_s = time.monotonic() - send_began
        drained_s = drain(stack.client, sender.jobs, settings.drain_s, log)
        log(f"drained in {drained_s:.1f}s")
        seen = read_observer(stack.observer, tags)
        result = report.account(sender.jobs, seen, faults.faults, tags, stack.log_paths())
        crash_lines = report.crashes(stack.log_paths())
    summary: dict[str, Any] = {
        "tool": "python -m tools.celery_soak",
        "seed": settings.seed,
        "minutes": settings.minutes,
        "started_utc": started_wall.isoformat(timespec="seconds"),
        "elapsed_s": round(time.monotonic() - began, 1),
        "send_s": round(sent_s, 1),
        "drain_s": round(drained_s, 1),
        "drain_deadline_s": settings.drain_s,
        "send_rate_per_s": round(sender.rate, 2),
        "keys": settings.keys,
        "ttls": TTLS,
        "visibility_timeout_s": VISIBILITY_TIMEOUT,
        "workers": {w.name: f"{w.pool} -c {w.concurrency}" for w in WORKERS},
        "worker_logs": stack.log_paths(),
        "redis_server": _redis_version(),
        "python": platform.python_version(),
        "faults": faults.counts(),
        "fault_log": [fault.as_dict() for fault in faults.faults],
        "fault_errors": faults.errors,
        "workers_dead_after_healing": restarted,
        "send_errors": sender.errors,
        "result": result,
        "crash_lines": crash_lines[:200],
        "crash_line_count": len(crash_lines),
        "rerun": settings.rerun(),
    }
    summary["violations"] = report.violations(summary)
    return summary
