"""Tests for tools/modelcheck/replace.py: queue once replacing the pending copy.

Kept apart from test_modelcheck.py (already past 500 lines). Each CI scenario is
explored when a test first asks for it: the safe ones exhaustively with no violation
and not vacuously (bodies run, copies replaced, copies sent anyway), each control
and the finding with a shortest counterexample whose trace shows the event behind it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from tools.modelcheck import in_processes  # noqa: E402
from tools.modelcheck.__main__ import main  # noqa: E402
from tools.modelcheck.replace import (  # noqa: E402
    LOST,
    REPLACED_RUNS,
    ReplaceModel,
    ReplaceScenario,
)
from tools.modelcheck.replace_check import (  # noqa: E402
    ReplaceResult,
    check_replace,
    replace_scenarios,
)

REPLACE_CI = {sc.name: sc for sc in replace_scenarios() if not sc.full_only}
REPLACE_SAFE = [name for name, sc in REPLACE_CI.items() if sc.expect == "safe"]


@pytest.fixture(scope="module")
def results() -> dict[str, ReplaceResult]:
    """Every CI scenario of replacing explored once, two at a time."""
    return dict(zip(REPLACE_CI, in_processes(check_replace, list(REPLACE_CI.values()), jobs=2)))


@pytest.mark.parametrize("name", REPLACE_SAFE)
def test_replacing_is_safe_in_its_whole_state_space(
    results: dict[str, ReplaceResult], name: str
) -> None:
    result = results[name]
    assert result.outcome == "safe", "\n".join(result.trace)
    assert result.states > 4_000 and result.final_states > 10
    # Not vacuous: in some final state a copy ran and another ended replaced, and a
    # call won a fate.
    assert result.bodies_run >= 2 and result.ended_replaced >= 1 and result.replaced > 0


def test_two_calls_follow_a_chain_and_one_sends_anyway(
    results: dict[str, ReplaceResult],
) -> None:
    result = results["replace-2-replacers"]
    assert result.chains > 0 and result.fallbacks > 0
    # R4 holds there: two pending copies only after a "send anyway".
    assert result.two_pending > 0 and result.two_pending_no_fallback == 0
    early = results["replace-1-replacer-early"]
    assert early.fallbacks > 0 and early.two_pending == 0


def test_a_split_fate_with_a_node_down_goes_round_instead_of_deciding(
    results: dict[str, ReplaceResult],
) -> None:
    assert results["replace-1-replacer-node-down"].spinning_finals > 0
    assert results["replace-2-replacers"].spinning_finals == 0


@pytest.mark.parametrize(
    ("name", "kind", "event"),
    [
        ("replace-naive", REPLACED_RUNS, "V reads P [V, V, V]: its own"),
        ("replace-raise-when-undecided", LOST, "RAISES (N1 not sent)"),
        ("replace-call-crash", LOST, "enqueuing call CRASHES"),
    ],
)
def test_replace_control_finds_a_counterexample(
    results: dict[str, ReplaceResult], name: str, kind: str, event: str
) -> None:
    result = results[name]
    assert result.outcome == "violation" and result.as_expected
    assert result.violation is not None and result.violation.startswith(kind)
    assert any(event in line for line in result.trace), "\n".join(result.trace)
    assert "VIOLATION" in result.trace[-1]


def test_a_call_that_crashes_after_its_fate_claim_landed_loses_the_copy_it_replaced(
    results: dict[str, ReplaceResult],
) -> None:
    """The finding: the claim wins on the nodes before its call learns it; the call
    dies before sending its copy, and the replaced copy ends 'replaced by' nothing
    that will ever run. Sending first (the repair) is safe with the same crash."""
    trace = results["replace-call-crash"].trace
    crash = next(i for i, line in enumerate(trace) if "CRASHES" in line)
    assert any("node3 F(N1) <- N2: holds N2" in line for line in trace[:crash])
    assert "stores 'replaced by N2'" in trace[crash + 1]
    assert trace[-1] == "!! VIOLATION: task lost: N1 (replaced by N2, never sent)"
    assert len(trace) - 1 == 16
    repaired = results["replace-send-first-call-crash"]
    assert repaired.outcome == "safe" and repaired.replaced > 0
    # The repair's cost, reported: the new copy is pending beside the old one until
    # the old one's fate is claimed.
    assert repaired.two_pending_no_fallback > 0


def test_a_sent_copy_is_pending_until_a_quorum_holds_its_fate() -> None:
    model = ReplaceModel(ReplaceScenario("probe", "", nodes=5))
    state = model.initial()
    assert model.pending(state) == 1  # V: sent, its fate unclaimed
    fates = tuple((1, -1, -1) for _ in range(3)) + tuple((2, -1, -1) for _ in range(2))
    assert model.pending(state._replace(fates=fates)) == 0  # a quorum gave V to N1


def test_the_command_line_runs_the_replace_scenarios(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "replace.json"
    code = main(["--only", "replace-naive", "--only", "replace-raise-when-undecided",
                 "--json", str(out)])  # fmt: skip
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "replace-naive: shortest counterexample" in printed
    rows = json.loads(out.read_text())
    assert [row["scenario"] for row in rows] == ["replace-naive", "replace-raise-when-undecided"]
    assert all(row["outcome"] == "violation" and row["trace"] for row in rows)
    assert main(["--list"]) == 0
    assert "replace-send-first-2-replacers" in capsys.readouterr().out
