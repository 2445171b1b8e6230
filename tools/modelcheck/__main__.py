"""Command line: run the scenario catalogue and print what the model checker found.

    python -m tools.modelcheck                  # the CI scenarios (~1.5 min of CPU)
    python -m tools.modelcheck --full           # also N=5, three clients, ttl=2 fenced
    python -m tools.modelcheck --only baseline --only naive-fences
    python -m tools.modelcheck --json results.json --jobs 2

Prints one table row per scenario (states explored, transitions, depth, result,
seconds), then the shortest counterexample trace of every scenario that has one.
Exits 1 if any scenario's result is not the expected one (a safe scenario with a
violation, or a negative control without its counterexample).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Optional

from .beatsplit import beat_split_scenarios, check_beat_split, format_beat_split
from .checker import Result, check_all
from .handoff_check import check_handoff, format_handoff, handoff_scenarios
from .limits_check import check_limits, format_limits, limit_scenarios
from .model import scenarios
from .replace_check import check_replace, format_replace, replace_scenarios


def format_table(results: Sequence[Result]) -> str:
    header = ("scenario", "N", "cl", "expect", "result", "ok", "states", "transitions",
              "depth", "trace", "seconds")  # fmt: skip
    rows = [header]
    for r in results:
        sc = r.scenario
        outcome = r.outcome if r.violation is None else f"{r.outcome}: {r.violation.kind}"
        rows.append(
            (
                sc.name,
                str(sc.nodes),
                str(sc.clients),
                sc.expect if sc.expect == "safe" else f"violation: {sc.expect_kind}",
                outcome,
                "yes" if r.as_expected else "NO",
                str(r.states),
                str(r.transitions),
                str(r.max_depth),
                f"{r.trace_steps} steps" if r.trace else "-",
                f"{r.seconds:.1f}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    numeric = {1, 2, 6, 7, 8, 10}
    lines = []
    for n, row in enumerate(rows):
        cells = [
            cell.rjust(widths[i]) if i in numeric else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_traces(results: Sequence[Result]) -> str:
    blocks = []
    for r in results:
        if not r.trace:
            continue
        sc = r.scenario
        blocks.append(
            f"== {sc.name}: shortest counterexample, {r.trace_steps} steps "
            f"(N={sc.nodes}, quorum {sc.quorum}, ttl={sc.ttl}, drift margin "
            f"{sc.drift_margin}, node drift {sc.clock_drift})\n   {sc.description}\n"
            + "\n".join("   " + line for line in r.trace)
        )
    return "\n\n".join(blocks)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.modelcheck",
        description="Explicit-state model checking of Redlock with fencing.",
    )
    parser.add_argument("--full", action="store_true", help="also run the large scenarios")
    parser.add_argument("--only", action="append", metavar="NAME", help="run only NAME")
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON to FILE")
    parser.add_argument("--jobs", type=int, default=1, help="processes to use (default 1)")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    args = parser.parse_args(argv)

    catalogue = scenarios()
    handoff = handoff_scenarios()
    splits = beat_split_scenarios()
    limits = limit_scenarios()
    replacing = replace_scenarios()
    if args.list:
        listed = [(sc.name, sc.full_only, sc.description) for sc in catalogue]
        listed += [(h.name, h.full_only, h.description) for h in handoff]
        listed += [(b.name, b.full_only, b.description) for b in splits]
        listed += [(sc.name, sc.full_only, sc.description) for sc in limits]
        listed += [(sc.name, sc.full_only, sc.description) for sc in replacing]
        for name, full_only, description in listed:
            print(f"{name:48s} {'full' if full_only else 'ci  '}  {description}")
        return 0
    if args.only:
        known = {sc.name for sc in catalogue} | {h.name for h in handoff}
        known |= {b.name for b in splits} | {sc.name for sc in limits}
        known |= {sc.name for sc in replacing}
        unknown = sorted(set(args.only) - known)
        if unknown:
            parser.error(f"unknown scenario(s): {', '.join(unknown)}")
        selected = [sc for sc in catalogue if sc.name in args.only]
        handoff = [h for h in handoff if h.name in args.only]
        splits = [b for b in splits if b.name in args.only]
        limits = [sc for sc in limits if sc.name in args.only]
        replacing = [sc for sc in replacing if sc.name in args.only]
    else:
        selected = [sc for sc in catalogue if args.full or not sc.full_only]
        handoff = [h for h in handoff if args.full or not h.full_only]
        splits = [b for b in splits if args.full or not b.full_only]
        limits = [sc for sc in limits if args.full or not sc.full_only]
        replacing = [sc for sc in replacing if args.full or not sc.full_only]

    results = check_all(selected, args.jobs) if selected else []
    if results:
        print(format_table(results))
    traces = format_traces(results)
    if traces:
        print()
        print(traces)
    handoff_results = [check_handoff(h) for h in handoff]
    if handoff_results:
        print()
        print(format_handoff(handoff_results))
    split_results = [check_beat_split(b) for b in splits]
    if split_results:
        print()
        print(format_beat_split(split_results))
    limit_results = [check_limits(sc) for sc in limits]
    if limit_results:
        print()
        print(format_limits(limit_results))
    replace_results = [check_replace(sc) for sc in replacing]
    if replace_results:
        print()
        print(format_replace(replace_results))
    if args.json:
        rows = [r.to_json() for r in results] + [r.to_json() for r in replace_results]
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(rows, out, indent=2)
            out.write("\n")
    expected = [r.as_expected for r in results] + [h.as_expected for h in handoff_results]
    expected += [b.as_expected for b in split_results]
    expected += [r.as_expected for r in limit_results]
    expected += [r.as_expected for r in replace_results]
    return 0 if all(expected) else 1


if __name__ == "__main__":
    sys.exit(main())
