"""The checker, the scenario catalogue and the printer for ``replace.py`` (queue once
replacing the pending copy).

Breadth-first over canonical states (nodes renamed; ``search.py``), so the first
violation met is a shortest one. Besides the verdict, each result counts what makes
it not vacuous (bodies run, copies replaced, chains followed, copies sent anyway)
and R4, which is reported, not asserted: states with two pending copies at once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional

from .replace import (
    LOST,
    NAIVE,
    RAN,
    REPLACED,
    REPLACED_RUNS,
    SEND_FIRST,
    SPINNING,
    ReplaceModel,
    ReplaceScenario,
    State,
    Step,
)
from .search import search


@dataclass
class ReplaceResult:
    scenario: ReplaceScenario
    outcome: str = "safe"
    states: int = 0
    final_states: int = 0
    #: the most bodies run, and copies ended replaced, in one final state.
    bodies_run: int = 0
    ended_replaced: int = 0
    #: final states where a copy goes round (a split fate while a node is down).
    spinning_finals: int = 0
    #: transitions: a call won a fate, followed a chain, sent its copy anyway.
    replaced: int = 0
    chains: int = 0
    fallbacks: int = 0
    #: R4: states with two pending copies; those after a "send anyway" not counted.
    two_pending: int = 0
    two_pending_no_fallback: int = 0
    seconds: float = 0.0
    violation: Optional[str] = None
    trace: list[str] = field(default_factory=list)

    @property
    def as_expected(self) -> bool:
        sc = self.scenario
        if sc.expect == "safe":
            return self.outcome == "safe"
        return self.violation is not None and self.violation.startswith(sc.expect_kind)

    def to_json(self) -> dict[str, Any]:
        row = {k: v for k, v in vars(self).items() if k != "scenario"}
        return {"scenario": self.scenario.name, "expect": self.scenario.expect, **row}


def check_replace(scenario: ReplaceScenario) -> ReplaceResult:
    """Breadth-first over every reachable state: the first violation is a shortest one."""
    model = ReplaceModel(scenario)
    started = time.perf_counter()
    result = ReplaceResult(scenario)

    def visit(s: State, steps: list[Step]) -> None:
        if model.pending(s) > 1:
            result.two_pending += 1
            result.two_pending_no_fallback += not s.fallback
        if not steps:
            result.final_states += 1
            result.bodies_run = max(result.bodies_run, s.outcome.count(RAN))
            result.ended_replaced = max(result.ended_replaced, s.outcome.count(REPLACED))
            result.spinning_finals += SPINNING in s.outcome

    found = search(model, scenario.max_states, visit)
    if found.violation is not None:
        result.outcome, result.violation = "violation", found.violation
        result.trace = found.trace
    elif found.bounded:
        result.outcome = "bounded"
    result.states = found.states
    result.replaced, result.chains = model.replaced, model.chains
    result.fallbacks = model.fallbacks
    result.seconds = time.perf_counter() - started
    return result


def replace_scenarios() -> list[ReplaceScenario]:
    s = ReplaceScenario
    control: dict[str, Any] = {"expect": "violation"}
    return [
        s("replace-2-replacers", "a pending copy, two calls replacing it, 3 nodes, replies"
          " in any order", early=0),
        s("replace-1-replacer-early", "a pending copy, one call, two early decisions (replies"
          " late or lost: undecided claims, late requests, sent anyway)", replacers=1, early=2),
        s("replace-1-replacer-node-down", "the same, one of the 3 nodes going down for good at"
          " any moment", replacers=1, early=2, down=1),
        s("replace-call-crash", "finding: two calls, one crashing at any step (its fate claim"
          " lands, its copy is never sent)", early=0, crashes=1, expect_kind=LOST, **control),
        s("replace-send-first-call-crash", "the repair (a contended call sends its copy before"
          " it claims), one call crashing at any step, two early decisions",
          design=SEND_FIRST, replacers=1, crashes=1, early=2),
        s("replace-send-first-node-down", "the repair, one call crashing, one early decision,"
          " one node down for good", design=SEND_FIRST, replacers=1, crashes=1, down=1),
        s("replace-naive", "control: no fates (the replacer swaps P and marks; a starting copy"
          " reads P, then runs)", design=NAIVE, early=0, expect_kind=REPLACED_RUNS, **control),
        s("replace-raise-when-undecided", "control: a call whose claim is undecided with its"
          " attempts spent raises instead of sending its copy", patience=0,
          send_anyway=False, replacers=1, expect_kind=LOST, **control),
        s("replace-2-replacers-node-down", "two calls, one node down for good at any moment",
          early=0, down=1, full_only=True),
        s("replace-2-replacers-early", "two calls, one early decision", full_only=True),
        s("replace-send-first-2-replacers", "the repair, two calls, one crashing at any step",
          design=SEND_FIRST, crashes=1, early=0, full_only=True),
    ]  # fmt: skip


def format_replace(results: list[ReplaceResult]) -> str:
    rows = [("scenario", "expect", "result", "ok", "states", "final", "ran", "replaced",
             "chains", "anyway", "spinning", "2-pending", "seconds")]  # fmt: skip
    for r in results:
        sc = r.scenario
        expect = "safe" if sc.expect == "safe" else f"violation: {sc.expect_kind}"
        got = r.outcome if r.violation is None else f"violation: {r.violation.split(':')[0]}"
        pending = f"{r.two_pending} ({r.two_pending_no_fallback})"
        rows.append((sc.name, expect, got, "yes" if r.as_expected else "NO", str(r.states),
                     str(r.final_states), str(r.bodies_run), str(r.replaced), str(r.chains),
                     str(r.fallbacks), str(r.spinning_finals), pending,
                     f"{r.seconds:.1f}"))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("2-pending: states with two pending copies (not after a send anyway)")
    for r in results:
        if r.trace:
            lines += ["", f"== {r.scenario.name}: shortest counterexample", *r.trace]
    return "\n".join(lines)
