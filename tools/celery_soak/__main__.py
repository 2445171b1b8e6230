"""``python -m tools.celery_soak --minutes M --seed S``: see the package docstring."""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from .run import Settings, soak

RESULTS = Path(__file__).resolve().parents[1] / "soak-results"


def _pair(text: str) -> tuple[float, float]:
    low, _, high = text.partition("-")
    return float(low), float(high or low)


def brief(summary: dict[str, Any]) -> str:
    """The counts on a few lines (the JSON has the details)."""
    result = summary["result"]
    lines = [
        f"jobs {result['jobs']}: {result['outcomes']}",
        f"per mode: {result['per_mode']}",
        f"faults: {summary['faults']}",
        f"redeliveries {result['redeliveries']} (extra executions {result['extra_executions']}),"
        f" overlaps {result['overlaps']} (paused holder {result['overlaps_paused_holder']}),"
        f" fenced writes refused {result['fenced_writes_refused']}",
    ]
    for lost in result["lost_details"]:
        where = " (in transport)" if lost["task_id"] in result["lost_in_transport"] else ""
        lines.append(f"LOST{where} {lost['task_id']} mode={lost['mode']} state={lost['state']}")
        lines.extend(f"    {line}" for line in lost["log"])
    for overlap in result["overlap_details"]:
        lines.append(f"OVERLAP {json.dumps(overlap)}")
    lines.append(f"violations: {summary['violations'] or 'none'}")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.celery_soak",
        description="Real celery workers, real lock nodes, faults; account for every job.",
    )
    parser.add_argument("--minutes", type=float, default=3.0, help="send phase (default 3)")
    parser.add_argument("--seed", type=int, default=None, help="seed (default: random)")
    parser.add_argument("--keys", type=int, default=12, help="lock keys (default 12)")
    parser.add_argument("--rate", type=_pair, default=(5.0, 10.0), help="jobs/s, LOW-HIGH")
    parser.add_argument(
        "--fault-every", type=_pair, default=(5.0, 15.0), help="seconds between faults, LOW-HIGH"
    )
    parser.add_argument("--drain", type=float, default=120.0, help="drain deadline, s")
    parser.add_argument("--log-dir", type=Path, default=None, help="worker logs (default: temp)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the JSON goes")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    settings = Settings(
        minutes=args.minutes,
        seed=seed,
        keys=args.keys,
        rates=args.rate,
        fault_every=args.fault_every,
        drain_s=args.drain,
        log_dir=args.log_dir,
    )
    print(f"celery soak: {args.minutes:g} min, seed {seed}", file=sys.stderr, flush=True)
    summary = soak(settings, lambda line: print(line, file=sys.stderr, flush=True))
    text = json.dumps(summary, indent=2, default=str)
    print(text)
    print(brief(summary), file=sys.stderr)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = summary["started_utc"].replace(":", "").replace("-", "").replace("+0000", "Z")
    path = args.out / f"celery-soak-{stamp}-seed{seed}.json"
    path.write_text(text + "\n")
    print(f"saved {path}", file=sys.stderr)
    return 1 if summary["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
