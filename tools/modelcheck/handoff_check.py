"""The checker, the scenario catalogue and the printer for ``handoff.py`` (the
hand-off to waiting duplicates).

Breadth-first over canonical states (nodes renamed, copy ids renumbered;
``search.py``), so the first violation met is a shortest one. Invariants: a task's
body never starts twice, two bodies are never inside at once, no task both runs and
gives up, no copy gives up on a split claim (a quorum answered, no copy id on a
quorum: with at most N - quorum nodes down that is never an outage), and in every
final state (nothing left to do) every task has run or has given up explicitly (a
FAILURE or a skip the caller sees).
A body that crashed and whose message the broker delivers again (``redeliver``) has
not run: the task must still run or give up, and that redelivery, or a copy it
publishes, may start the body again (at least once, as any ``acks_late`` task).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

from .handoff import (
    CLAIM_FIRST,
    LOST,
    RAN,
    RUN_TWICE,
    SPINNING,
    SPLIT,
    SPLIT_GIVE_UP,
    TWO_OUTCOMES,
    HandoffModel,
    HandoffScenario,
    State,
    Step,
)
from .search import search


@dataclass
class HandoffResult:
    scenario: HandoffScenario
    outcome: str
    states: int = 0
    final_states: int = 0
    bodies_run: int = 0
    #: final states where a task goes round (a split claim while a node is down).
    spinning_finals: int = 0
    #: split claims decided on somewhere in the explored space (transitions).
    splits: int = 0
    #: claim reads that kept a contended copy's ids, and bodies started again after
    #: their crash (transitions).
    kept: int = 0
    reruns: int = 0
    seconds: float = 0.0
    violation: Optional[str] = None
    trace: list[str] = field(default_factory=list)

    @property
    def as_expected(self) -> bool:
        sc = self.scenario
        if sc.expect == "safe":
            return self.outcome == "safe"
        return self.violation is not None and self.violation.startswith(sc.expect_kind)


def check_handoff(scenario: HandoffScenario) -> HandoffResult:
    """Breadth-first over every reachable state: the first violation is a shortest one."""
    model = HandoffModel(scenario)
    started = time.perf_counter()
    result = HandoffResult(scenario, "safe")

    def visit(s: State, steps: list[Step]) -> None:
        if not steps:
            result.final_states += 1
            result.bodies_run = max(result.bodies_run, s.outcome.count(RAN))
            result.spinning_finals += SPINNING in s.outcome

    found = search(model, scenario.max_states, visit)
    if found.violation is not None:
        result.outcome, result.violation = "violation", found.violation
        result.trace = found.trace
    elif found.bounded:
        result.outcome = "bounded"
    result.states = found.states
    result.splits = model.splits
    result.kept, result.reruns = model.kept, model.reruns
    result.seconds = time.perf_counter() - started
    return result


def handoff_scenarios() -> list[HandoffScenario]:
    control = {"expect": "violation"}
    return [
        HandoffScenario(
            "handoff-2-tasks",
            "two copies of one key, one lock retry each, 3 claim nodes, holder crash, lost "
            "and duplicate wakes",
            early=0,
        ),
        HandoffScenario(
            "handoff-2-tasks-node-down",
            "the same with one of the 3 nodes going down for good at any moment",
            down=1,
            early=0,
        ),
        HandoffScenario(
            "handoff-2-tasks-early",
            "two copies, one node down, one early decision (a reply late or lost)",
            down=1,
            dup_wakes=0,
            full_only=True,
        ),
        HandoffScenario(
            "handoff-split-probe",
            "finding: the shortest way to a split claim with one node down (the re-published "
            "copy then goes round until the node is back)",
            down=1,
            probe_split=True,
            expect_kind=SPLIT,
            **control,  # type: ignore[arg-type]
        ),
        HandoffScenario(
            "handoff-exhausted-split-gives-up",
            "control: a holder whose claim is undecided with its retries spent gives up",
            exhausted_undecided="give-up",
            early=1,
            expect_kind=TWO_OUTCOMES,
            **control,  # type: ignore[arg-type]
        ),
        HandoffScenario(
            "handoff-claim-first-node-down",
            "control: the earlier design (claim before the lock), one node down",
            design=CLAIM_FIRST,
            down=1,
            ignore=(TWO_OUTCOMES,),
            expect_kind=SPLIT_GIVE_UP,
            **control,  # type: ignore[arg-type]
        ),
        HandoffScenario(
            "handoff-claim-first-gives-up-after-run",
            "control: the earlier design, all nodes up: an undecided copy gives up after "
            "the other copy of its waiter id ran",
            design=CLAIM_FIRST,
            expect_kind=TWO_OUTCOMES,
            **control,  # type: ignore[arg-type]
        ),
        HandoffScenario(
            "handoff-no-claim",
            "control: every copy that wins the lock runs (no waiter-id claim)",
            claim=False,
            ignore=(TWO_OUTCOMES,),
            expect_kind=RUN_TWICE,
            **control,  # type: ignore[arg-type]
        ),
        HandoffScenario(
            "handoff-claim-any-node",
            "control: a copy takes its claim as won when any node holds its id",
            claim_rule="any",
            ignore=(TWO_OUTCOMES,),
            expect_kind=RUN_TWICE,
            **control,  # type: ignore[arg-type]
        ),
        HandoffScenario(
            "handoff-no-fallback",
            "control: a waiter relies on its wake alone (no fallback copy)",
            fallback=False,
            expect_kind=LOST,
            **control,  # type: ignore[arg-type]
        ),
        HandoffScenario(
            "handoff-rewake-as-wake",
            "control: a wake re-published after an undecided claim still acts as a wake "
            "(without the claim-tried mark, which would keep its ids whatever it acts as)",
            republish_as="wake",
            claim_tried=False,
            dup_wakes=0,
            expect_kind=LOST,
            **control,  # type: ignore[arg-type]
        ),
        HandoffScenario(
            "handoff-wake-registers-nothing",
            "a contended wake ends without registering again (the fallback still runs)",
            wake_registers=False,
            down=1,
            early=0,
        ),
        HandoffScenario(
            "handoff-crash-redelivery",
            "two copies, one lock retry each; the worker running a claim's winner is killed "
            "in the body and the broker delivers that message again (acks_late); lost and "
            "duplicate wakes",
            redeliver=True,
            crash_claimants_only=True,
            early=0,
        ),
        HandoffScenario(
            "handoff-crash-redelivery-node-down",
            "the same, one of the 3 nodes going down for good at any moment, no duplicate wakes",
            redeliver=True,
            crash_claimants_only=True,
            down=1,
            dup_wakes=0,
            early=0,
        ),
        HandoffScenario(
            "handoff-crash-redelivery-retry",
            "the same, all nodes up, two lock retries each (a redelivered copy that keeps "
            "its ids has a retry left to spend)",
            redeliver=True,
            crash_claimants_only=True,
            budget=2,
            dup_wakes=0,
            early=0,
            full_only=True,
        ),
        HandoffScenario(
            "handoff-crash-redelivery-any-holder",
            "a crash and its redelivery hitting any holder (an original's redelivery "
            "contends afresh), no duplicate wakes",
            redeliver=True,
            dup_wakes=0,
            early=0,
            full_only=True,
        ),
        HandoffScenario(
            "handoff-crash-redelivery-early",
            "a crash and its redelivery, one node down, one early decision (a claim or read "
            "reply late or lost)",
            redeliver=True,
            crash_claimants_only=True,
            down=1,
            dup_wakes=0,
            full_only=True,
        ),
        HandoffScenario(
            "handoff-crash-redelivery-no-claim-read",
            "control: a crash and its redelivery under the rule before the claim read (a "
            "contended wake goes back in the queue, a fallback takes a fresh copy id)",
            redeliver=True,
            crash_claimants_only=True,
            claim_read=False,
            dup_wakes=0,
            early=0,
            expect_kind=LOST,
            **control,  # type: ignore[arg-type]
        ),
        HandoffScenario(
            "handoff-crash-redelivery-drop-on-any-node",
            "control: a crash and its redelivery, a contended copy dropped when any node's "
            "claim names another copy (not a claim settled for good)",
            redeliver=True,
            crash_claimants_only=True,
            down=1,
            dup_wakes=0,
            drop_on_read="any",
            expect_kind=LOST,
            **control,  # type: ignore[arg-type]
        ),
        HandoffScenario(
            "handoff-late-claim",
            "from a claim whose round ended before its requests landed (three lock retries, "
            "one spent; its requests still on their way): the copy keeps its ids for good; "
            "holder crash, lost and duplicate wakes",
            budget=3,
            opening="late-claim",
        ),
        HandoffScenario(
            "handoff-late-claim-no-mark",
            "control: the same, no crash or duplicate wake, the copy reading the claim as "
            "any copy does (nil everywhere: not its own, a fresh copy id; then its late "
            "requests land)",
            budget=3,
            opening="late-claim",
            claim_tried=False,
            dup_wakes=0,
            crashes=0,
            expect_kind=LOST,
            **control,  # type: ignore[arg-type]
        ),
        HandoffScenario(
            "handoff-late-claim-node-down",
            "the late claim with one of the 3 nodes going down for good at any moment",
            budget=3,
            opening="late-claim",
            down=1,
            full_only=True,
        ),
        HandoffScenario(
            "handoff-late-claim-redelivery",
            "the late claim with the claim's winner killed in its body and delivered again",
            budget=3,
            opening="late-claim",
            redeliver=True,
            crash_claimants_only=True,
            full_only=True,
        ),
        HandoffScenario(
            "handoff-late-claim-early",
            "the late claim with two more early decisions (replies late or lost)",
            budget=3,
            opening="late-claim",
            dup_wakes=0,
            early=2,
            full_only=True,
        ),
        HandoffScenario(
            "handoff-claim-retry",
            "two copies, two lock retries each, holder crash, lost and duplicate wakes",
            budget=2,
            early=0,
            full_only=True,
        ),
        HandoffScenario(
            "handoff-claim-retry-node-down",
            "two copies, two lock retries each, holder crash, lost wakes, one node down",
            budget=2,
            down=1,
            early=0,
            dup_wakes=0,
            full_only=True,
        ),
    ]


def format_handoff(results: list[HandoffResult]) -> str:
    rows = [("scenario", "expect", "result", "ok", "states", "final", "spinning", "splits",
             "kept", "reruns", "seconds")]  # fmt: skip
    for r in results:
        sc = r.scenario
        expect = "safe" if sc.expect == "safe" else f"violation: {sc.expect_kind}"
        got = r.outcome if r.violation is None else f"violation: {r.violation.split(':')[0]}"
        rows.append((sc.name, expect, got, "yes" if r.as_expected else "NO", str(r.states),
                     str(r.final_states), str(r.spinning_finals), str(r.splits),
                     str(r.kept), str(r.reruns), f"{r.seconds:.1f}"))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for r in results:
        if r.trace:
            lines += ["", f"== {r.scenario.name}: shortest counterexample", *r.trace]
    return "\n".join(lines)
