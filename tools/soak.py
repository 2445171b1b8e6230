"""A longer randomized run of the fault-injection rows, with one command.

    python -m tools.soak --minutes 2 --seed 7
    python -m tools.soak --trial 4:123456        # replay one trial (row:seed)

Picks rows 1 (contention), 2 (minority crash, delayed restart), 4 (quorum loss),
5 (late replies) and 8 (renewal cut off) at random, each trial with its own seed
drawn from ``--seed`` and fresh redis-servers, for ``--minutes``; the same scenarios
(tools/faultlab) and the same independent oracle as tests/lock/test_faults.py, with random
sizes. Prints a
JSON summary (trials per row, acquisitions, overlaps, stale writes, every failing
trial with the command that replays it) and saves it under tools/soak-results/.
Exits 1 if any trial found a violation or failed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import random
import subprocess
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable, Optional

from celery_redlock.testing import find_redis_server
from tools.faultlab.crashes import contention, minority_crash, quorum_loss
from tools.faultlab.lab import Lab, RowResult
from tools.faultlab.network import extension_failure, late_replies, late_replies_paused_client

RESULTS = Path(__file__).resolve().parent / "soak-results"

#: Counters summed per row and overall (the oracle's, see tools.faultlab.oracle.Report.summary).
#: ``late_writes`` is informational, not among VIOLATIONS: writes out of fence order
#: that may have landed after their own writer's deadline -- the writer's lateness,
#: which fencing exists to refuse, not the lock's fault.
COUNTERS = (
    "acquisitions",
    "attempts",
    "writes",
    "late_writes",
    "overlaps",
    "stale_writes",
    "fence_regressions",
    "born_dead",
    "overclaims",
)
VIOLATIONS = ("overlaps", "stale_writes", "fence_regressions", "born_dead", "overclaims")


def _row1(lab: Lab, seed: int) -> RowResult:
    rng = random.Random(seed)
    return contention(lab, seed, seconds=rng.uniform(3.0, 8.0), processes=rng.randint(4, 6), keys=3)


def _row2(lab: Lab, seed: int) -> RowResult:
    return minority_crash(lab, seed, phase=random.Random(seed).uniform(1.0, 2.0))


def _row4(lab: Lab, seed: int) -> RowResult:
    return quorum_loss(lab, seed, phase=random.Random(seed).uniform(0.5, 1.5))


def _row5(lab: Lab, seed: int) -> RowResult:
    # Mostly the proxy sweep; now and then the client itself is stopped mid-round.
    if random.Random(seed).random() < 0.3:
        return late_replies_paused_client(lab, seed, trials=2)
    return late_replies(lab, seed, trials=6)


def _row8(lab: Lab, seed: int) -> RowResult:
    return extension_failure(lab, seed, trials=random.Random(seed).randint(1, 2))


ROWS: dict[str, Callable[[Lab, int], RowResult]] = {
    "1": _row1,
    "2": _row2,
    "4": _row4,
    "5": _row5,
    "8": _row8,
}


def _redis_version() -> str:
    binary = find_redis_server()
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    return f"{binary}: {out.stdout.strip()}"


def run_trial(row: str, seed: int) -> dict[str, Any]:
    """One trial on fresh servers: the row's summary line as a dict, or its error."""
    started = time.monotonic()
    try:
        with Lab.standalone() as lab:
            result = ROWS[row](lab, seed)
    except Exception:
        return {
            "row": row,
            "seed": seed,
            "error": traceback.format_exc(limit=8),
            "seconds": round(time.monotonic() - started, 2),
        }
    entry: dict[str, Any] = json.loads(result.line())
    entry["row"] = row
    entry["name"] = result.row
    entry["seconds"] = round(time.monotonic() - started, 2)
    if result.problems:
        entry["describe"] = result.report.describe()
    return entry


def soak(
    minutes: float, seed: int, rows: Sequence[str], log: Callable[[str], None]
) -> dict[str, Any]:
    rng = random.Random(seed)
    started_wall = datetime.datetime.now(datetime.timezone.utc)
    started = time.monotonic()
    end = started + minutes * 60
    per_row: dict[str, dict[str, Any]] = {
        row: {"trials": 0, "failed": 0, "errors": 0, **dict.fromkeys(COUNTERS, 0)} for row in rows
    }
    failures: list[dict[str, Any]] = []
    interrupted = False
    try:
        while time.monotonic() < end:
            row = rng.choice(list(rows))
            trial_seed = rng.randrange(2**31)
            entry = run_trial(row, trial_seed)
            stats = per_row[row]
            stats["trials"] += 1
            for name in COUNTERS:
                stats[name] += int(entry.get(name, 0))
            failed = bool(entry.get("error") or entry.get("problems"))
            if entry.get("error"):
                stats["errors"] += 1
            if failed:
                stats["failed"] += 1
                entry["replay"] = f"python -m tools.soak --trial {row}:{trial_seed}"
                failures.append(entry)
            log(
                f"[{time.monotonic() - started:7.1f}s] row {row} seed {trial_seed}: "
                + ("FAILED " if failed else "ok ")
                + ", ".join(f"{n}={entry.get(n, 0)}" for n in ("acquisitions", *VIOLATIONS))
                + f" ({entry.get('seconds')}s)"
            )
    except KeyboardInterrupt:
        interrupted = True
    totals = {name: sum(s[name] for s in per_row.values()) for name in COUNTERS}
    totals["trials"] = sum(s["trials"] for s in per_row.values())
    totals["failed"] = sum(s["failed"] for s in per_row.values())
    return {
        "tool": "python -m tools.soak",
        "seed": seed,
        "minutes": minutes,
        "rows_enabled": list(rows),
        "started_utc": started_wall.isoformat(timespec="seconds"),
        "elapsed_s": round(time.monotonic() - started, 1),
        "interrupted": interrupted,
        "redis_server": _redis_version(),
        "python": platform.python_version(),
        "machine": f"{platform.system()} {platform.machine()}",
        "rows": per_row,
        "totals": totals,
        "violations": sum(totals[name] for name in VIOLATIONS),
        "failures": failures,
        "rerun": f"python -m tools.soak --minutes {minutes:g} --seed {seed}",
    }


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.soak",
        description="A longer randomized run of tests/lock/test_faults.py's rows.",
    )
    parser.add_argument("--minutes", type=float, default=2.0, help="how long to run (default 2)")
    parser.add_argument("--seed", type=int, default=None, help="master seed (default: random)")
    parser.add_argument(
        "--rows",
        default=",".join(ROWS),
        help=f"rows to mix, comma-separated (default {','.join(ROWS)})",
    )
    parser.add_argument("--trial", default=None, help="replay one trial: ROW:SEED")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the JSON goes")
    args = parser.parse_args(argv)

    if args.trial:
        row, _, seed_text = args.trial.partition(":")
        entry = run_trial(row, int(seed_text))
        print(json.dumps(entry, indent=2))
        return 1 if entry.get("error") or entry.get("problems") else 0

    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in rows if r not in ROWS]
    if unknown or not rows:
        parser.error(f"unknown rows {unknown}; choose from {list(ROWS)}")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    print(f"soak: {args.minutes:g} min, seed {seed}, rows {rows}", file=sys.stderr, flush=True)
    summary = soak(args.minutes, seed, rows, lambda line: print(line, file=sys.stderr, flush=True))
    text = json.dumps(summary, indent=2)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = summary["started_utc"].replace(":", "").replace("-", "").replace("+0000", "Z")
    path = args.out / f"soak-{stamp}-seed{seed}.json"
    path.write_text(text + "\n")
    print(f"saved {path}", file=sys.stderr)
    failed = summary["violations"] or summary["totals"]["failed"] or summary["interrupted"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
