"""Tests for tools.modelcheck, the explicit-state model checker of our Redlock.

The CI scenarios of the catalogue are explored once per session (two processes)
and each test reads its scenario's result:

* every safe scenario is explored exhaustively with no violation, and the
  exploration was not vacuous (enough states, leases actually granted, fences
  actually compared);
* every negative control, and the finding about two-round fencing without
  persisted counters, yields a shortest counterexample whose trace shows the
  fault that causes it.

Smaller tests check the machinery the verdicts rest on: the canonical form used
for symmetry reduction, the search bounds, and the command line.
"""

from __future__ import annotations

import itertools
import json
import random
import sys
from pathlib import Path
from typing import cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

# tools/ is not an installed package: make the repository root importable
# whichever way pytest was started (pytest, python -m pytest, from any cwd).
_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from tools.modelcheck import (  # noqa: E402
    BOUNDED,
    FENCE_ORDER,
    MUTUAL_EXCLUSION,
    SAFE,
    VIOLATES,
    Model,
    Result,
    Scenario,
    check,
    check_all,
    in_processes,
    scenarios,
)
from tools.modelcheck.__main__ import main  # noqa: E402
from tools.modelcheck.model import (  # noqa: E402
    FENCING_TWO_ROUND,
    NO_KEY,
    Client,
    Node,
    Request,
    State,
)

CI_SCENARIOS = [sc for sc in scenarios() if not sc.full_only]
SAFE_NAMES = [sc.name for sc in CI_SCENARIOS if sc.expect == SAFE]
CONTROL_NAMES = [sc.name for sc in CI_SCENARIOS if sc.expect == VIOLATES]

#: Lower bounds on the states each safe scenario must explore: about a third of
#: what the model explores today, so that the reductions may improve but a
#: model that silently stopped doing something (no restarts, no second client)
#: fails here.
MIN_STATES = {
    "baseline": 1_000,
    "reacquire": 25_000,
    "clock-drift": 1_500,
    "extend": 30_000,
    "delayed-restart": 4_000,
    "persistence": 4_000,
    "fenced-persistence": 20_000,
    "fenced-extend": 15_000,
    "fenced-delayed-restart-persisted-counter": 30_000,
    "fenced-delayed-restart-clock-fence": 70_000,
}

#: Length (in model steps) of the shortest counterexample of each control. BFS
#: guarantees minimality; pinning the numbers catches a model change that makes
#: a known attack longer (or impossible) without anyone noticing.
SHORTEST = {
    "restart-no-persistence": 9,
    "restart-delay-too-short": 11,
    "validity-ignores-elapsed": 10,
    "drift-margin-too-small": 11,
    "naive-fences": 12,
    "fenced-delayed-restart": 18,
}


@pytest.fixture(scope="session")
def ci_results() -> dict[str, Result]:
    """Every CI scenario explored once, two at a time."""
    return {r.scenario.name: r for r in check_all(CI_SCENARIOS, jobs=2)}


def test_every_ci_scenario_has_expectations() -> None:
    assert set(MIN_STATES) == set(SAFE_NAMES)
    assert set(SHORTEST) == set(CONTROL_NAMES)


# -- safe scenarios ------------------------------------------------------------ #


@pytest.mark.parametrize("name", SAFE_NAMES)
def test_safe_scenario_has_no_violation_in_its_whole_state_space(
    ci_results: dict[str, Result], name: str
) -> None:
    result = ci_results[name]
    assert result.violation is None, "\n".join(result.trace)
    assert result.outcome == SAFE  # exhausted, not cut short by a bound
    assert result.states >= MIN_STATES[name]
    # Leases were granted, and while one was held the search went on, so the
    # mutual exclusion check had something to compare against.
    assert result.holding_states > 100


# (Not the clock-fence variant: its fences are clock readings, not 1, 2, ...)
@pytest.mark.parametrize(
    "name",
    [
        sc.name
        for sc in CI_SCENARIOS
        if sc.expect == SAFE and sc.fencing == FENCING_TWO_ROUND and not sc.clock_fence
    ],
)
def test_fenced_safe_scenario_compares_successive_fences(
    ci_results: dict[str, Result], name: str
) -> None:
    # A second fenced grant (fence 2 or more) was explored: fence order was tested.
    assert ci_results[name].top_fence >= 2


# -- negative controls and the finding --------------------------------------- #


@pytest.mark.parametrize("name", CONTROL_NAMES)
def test_control_finds_a_shortest_counterexample(ci_results: dict[str, Result], name: str) -> None:
    result = ci_results[name]
    sc = result.scenario
    assert result.outcome == VIOLATES
    assert result.violation is not None
    assert result.violation.kind == sc.expect_kind
    assert any(sc.expect_event in line for line in result.trace), "\n".join(result.trace)
    assert result.trace_steps == SHORTEST[name]
    assert result.trace[-1].startswith("t=") and "VIOLATION" in result.trace[-1]
    assert all(line.startswith("t=") for line in result.trace)
    assert result.as_expected


def test_restart_without_persistence_breaks_mutual_exclusion_via_the_restart(
    ci_results: dict[str, Result],
) -> None:
    trace = ci_results["restart-no-persistence"].trace
    crash = next(i for i, line in enumerate(trace) if "CRASHES and restarts" in line)
    # A is granted before the restart and B after it: the restarted node voted twice.
    assert any("client A GRANTED" in line for line in trace[:crash])
    assert any("client B GRANTED" in line for line in trace[crash:])
    assert MUTUAL_EXCLUSION in trace[-1]


def test_naive_fences_go_backwards_through_per_node_counters(
    ci_results: dict[str, Result],
) -> None:
    trace = ci_results["naive-fences"].trace
    assert sum("GRANTED" in line for line in trace) == 2
    assert all("round2" not in line for line in trace)
    assert FENCE_ORDER in trace[-1]


def test_validity_that_ignores_elapsed_time_outlives_the_keys(
    ci_results: dict[str, Result],
) -> None:
    trace = ci_results["validity-ignores-elapsed"].trace
    # The slow round: a key already expired when the client counts its quorum.
    assert any("expires" in line for line in trace)
    assert "NOT subtracted" in next(line for line in trace if "client A GRANTED" in line)


def test_two_round_fences_need_counters_that_survive_a_restart(
    ci_results: dict[str, Result],
) -> None:
    """The finding: delayed restart protects the lock keys but not the counters."""
    trace = ci_results["fenced-delayed-restart"].trace
    text = "\n".join(trace)
    assert "counter lost" in text and "rejoins" in text
    grants = [line for line in trace if "GRANTED" in line]
    assert len(grants) == 2 and "fence 1" in grants[0] and "fence 1" in grants[1]
    # The same scenario with the counter persisted, or with a clock in the
    # fence, is safe (checked exhaustively above).
    assert ci_results["fenced-delayed-restart-persisted-counter"].outcome == SAFE
    assert ci_results["fenced-delayed-restart-clock-fence"].outcome == SAFE


# -- the machinery ------------------------------------------------------------- #


def _random_state(model: Model, seed: int, steps: int) -> State:
    rng = random.Random(seed)
    state = model.initial()
    for _ in range(steps):
        options = [nxt for _, nxt, violation in model.successors(state) if violation is None]
        if not options:
            break
        state = rng.choice(options)
    return state


_SYMMETRIC = Scenario(
    "symmetry",
    "two identical clients, fencing, crashes",
    fencing=FENCING_TWO_ROUND,
    crashes=1,
    restart_delay=1,
    persist_counters=True,
    ttl=2,
    drift_margin=0,
    clock_drift=0,
)


def _rename_clients(state: State) -> State:
    """Swap clients 0 and 1 everywhere (keys, requests, client slots)."""

    def swap(c: int) -> int:
        return 1 - c if c in (0, 1) else c

    nodes = tuple(
        Node(
            n.up,
            n.down_for,
            n.key if n.key == NO_KEY else (swap(n.key[0]), n.key[1]),
            n.key_ttl,
            n.counter,
            tuple(sorted(Request(r.kind, swap(r.client), *r[2:]) for r in n.inbox)),
        )
        for n in state.nodes
    )
    clients: tuple[Client, ...] = (state.clients[1], state.clients[0], *state.clients[2:])
    return State(nodes, clients, state.crashes_left, state.max_fence)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32), steps=st.integers(0, 30), rotate=st.integers(1, 2))
def test_canonical_form_ignores_node_and_client_names(seed: int, steps: int, rotate: int) -> None:
    model = Model(_SYMMETRIC)
    state = _random_state(model, seed, steps)
    renamed_nodes = state._replace(nodes=state.nodes[rotate:] + state.nodes[:rotate])
    assert model.canonical(renamed_nodes) == model.canonical(state)
    assert model.canonical(_rename_clients(state)) == model.canonical(state)


def test_clients_with_different_budgets_are_not_merged() -> None:
    model = Model(Scenario("asymmetric", "", attempts=(2, 1)))
    state = _random_state(model, 7, 6)
    swapped = _rename_clients(state)
    if swapped.clients != state.clients:
        assert model.canonical(swapped) != model.canonical(state)


def test_quorum_is_a_strict_majority() -> None:
    assert [Scenario("q", "", nodes=n).quorum for n in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]


def test_search_bounds_stop_the_exploration() -> None:
    by_states = check(Scenario("tiny", "", max_states=50))
    assert by_states.outcome == BOUNDED and by_states.states == 50
    by_depth = check(Scenario("shallow", "", max_depth=3))
    assert by_depth.outcome == BOUNDED and by_depth.max_depth == 3
    assert not by_depth.as_expected  # a bounded search proves nothing


def test_cli_prints_the_table_and_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "results.json"
    code = main(["--only", "restart-no-persistence", "--only", "baseline", "--json", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "scenario" in printed and "states" in printed
    assert "restart-no-persistence" in printed and "!! VIOLATION" in printed
    rows = json.loads(out.read_text())
    assert [row["scenario"] for row in rows] == ["baseline", "restart-no-persistence"]
    assert rows[0]["outcome"] == SAFE and rows[1]["outcome"] == VIOLATES
    assert rows[1]["trace"] and rows[1]["states"] > 0


# -- hand-off to waiting duplicates (tools/modelcheck/handoff.py) ------------------- #

from celery_redlock.lock.waiters import (  # noqa: E402
    claimed_by_another,
    may_be_claimed_by,
    read_claim,
)
from celery_redlock.wire.node_set import NodeSet  # noqa: E402
from tools.modelcheck.handoff import (  # noqa: E402
    LOST,
    NIL,
    RUN_TWICE,
    SPLIT,
    SPLIT_GIVE_UP,
    TWO_OUTCOMES,
    HandoffModel,
    HandoffScenario,
)
from tools.modelcheck.handoff_check import (  # noqa: E402
    HandoffResult,
    check_handoff,
    handoff_scenarios,
)

HANDOFF_CI = [h for h in handoff_scenarios() if not h.full_only]


@pytest.fixture(scope="session")
def handoff_results() -> dict[str, HandoffResult]:
    results = in_processes(check_handoff, HANDOFF_CI, jobs=2)
    return {r.scenario.name: r for r in results}


@pytest.mark.parametrize(
    "name",
    [
        "handoff-2-tasks",
        "handoff-2-tasks-node-down",
        "handoff-wake-registers-nothing",
        "handoff-crash-redelivery",
        "handoff-crash-redelivery-node-down",
        "handoff-late-claim",
    ],
)
def test_handoff_protocol_is_safe_in_its_whole_state_space(
    handoff_results: dict[str, HandoffResult], name: str
) -> None:
    result = handoff_results[name]
    assert result.outcome == SAFE, "\n".join(result.trace)
    assert result.states > 5_000
    # Final states were reached, in some of them both tasks ran: not vacuous.
    assert result.final_states > 10 and result.bodies_run == 2


def test_with_a_node_down_a_split_claim_goes_round_instead_of_giving_up(
    handoff_results: dict[str, HandoffResult],
) -> None:
    down = handoff_results["handoff-2-tasks-node-down"]
    assert down.splits > 0 and down.spinning_finals > 0  # the documented corner
    assert handoff_results["handoff-2-tasks"].spinning_finals == 0
    probe = handoff_results["handoff-split-probe"].trace
    # The split: the exhausted fallback claims without the lock while the wake claims
    # under it.
    assert any("claims w2.1 to give up" in line for line in probe), "\n".join(probe)
    assert any("acquires the lock, claims w2.1" in line for line in probe)


@pytest.mark.parametrize(
    ("name", "kind", "event"),
    [
        ("handoff-claim-first-node-down", SPLIT_GIVE_UP, "goes DOWN"),
        ("handoff-claim-first-gives-up-after-run", TWO_OUTCOMES, "GIVES UP"),
        ("handoff-exhausted-split-gives-up", TWO_OUTCOMES, "retries spent: GIVES UP"),
        ("handoff-no-claim", RUN_TWICE, "publishes T2 wake"),
        ("handoff-claim-any-node", RUN_TWICE, "WINS claim"),
        ("handoff-no-fallback", LOST, "NO fallback"),
        ("handoff-rewake-as-wake", LOST, "wake (re-published) reads claim"),
        ("handoff-crash-redelivery-no-claim-read", LOST, "CRASHES in the body"),
        ("handoff-late-claim-no-mark", LOST, "reads claim w1.1"),
        ("handoff-split-probe", SPLIT, "SPLIT"),
    ],
)
def test_handoff_control_finds_a_counterexample(
    handoff_results: dict[str, HandoffResult], name: str, kind: str, event: str
) -> None:
    result = handoff_results[name]
    assert result.outcome == VIOLATES and result.as_expected
    assert result.violation is not None and result.violation.startswith(kind)
    assert any(event in line for line in result.trace), "\n".join(result.trace)
    assert "VIOLATION" in result.trace[-1]


@pytest.mark.parametrize("name", ["handoff-crash-redelivery", "handoff-crash-redelivery-node-down"])
def test_a_redelivered_claim_winner_keeps_its_ids_and_its_task_runs_or_gives_up(
    handoff_results: dict[str, HandoffResult], name: str
) -> None:
    result = handoff_results[name]
    assert result.outcome == SAFE, "\n".join(result.trace)
    # Not vacuous: claim reads kept a copy's ids, and a crashed body started again.
    assert result.kept > 0 and result.reruns > 0


def test_without_the_claim_read_a_redelivered_wake_goes_back_in_the_queue_and_is_lost(
    handoff_results: dict[str, HandoffResult],
) -> None:
    result = handoff_results["handoff-crash-redelivery-no-claim-read"]
    text = "\n".join(result.trace)
    crash = next(i for i, line in enumerate(result.trace) if "CRASHES in the body" in line)
    # The wake that won the claim crashes; its redelivery, the one copy that can still
    # win that claim, ends as a contended wake does, and nothing else can run the task.
    assert "T2 wake WINS claim w2.1" in result.trace[crash - 1]
    assert "wake (redelivered) w2.1 copy 2" in result.trace[crash]
    assert "T2 wake (redelivered) contended:" in text and "ends (no fallback" in text
    assert result.as_expected  # LOST (the name is beatsplit's below this point)
    assert result.violation is not None and "T2 never ran and never gave up" in result.violation


def test_a_copy_whose_claim_round_ended_early_keeps_its_ids_for_good(
    handoff_results: dict[str, HandoffResult],
) -> None:
    marked = handoff_results["handoff-late-claim"]
    assert marked.outcome == SAFE and marked.kept > 0, "\n".join(marked.trace)
    # Without the mark: the read sees no claim, the copy takes a fresh copy id, its
    # late requests then land and name the old one -- no copy can win any more: the
    # next copy loses the claim to copy 1, or reads it settled on copy 1 and ends.
    trace = handoff_results["handoff-late-claim-no-mark"].trace
    read = next(i for i, line in enumerate(trace) if "reads claim w1.1" in line)
    assert "not its own" in trace[read]
    assert any("claim w1.1 by copy 1: holds 1" in line for line in trace[read:])
    assert any(
        ("loses claim w1.1" in line and "to copy 1" in line)
        or ("reads claim w1.1 ([1, 1, 1])" in line and "another copy's for good" in line)
        for line in trace[read + 1 :]
    ), "\n".join(trace)


class _Replies:
    """A node set whose every round answers ``results`` (for the claim read)."""

    def __init__(self, results: list[object]) -> None:
        self.results = results

    def round(self, *args: object, **kwargs: object) -> list[object]:
        return self.results


@pytest.mark.parametrize("nodes", [3, 5])
def test_the_models_claim_read_is_the_packages(nodes: int) -> None:
    """Every read of N nodes (a copy id, nil, or no answer from each; ids 0..2, one of
    them the reader's): the model keeps the ids, and drops the copy, exactly when the
    package does."""
    model = HandoffModel(HandoffScenario("read", "", nodes=nodes))
    quorum = nodes // 2 + 1
    seen = drops = 0
    for answers in itertools.product([None, NIL, 0, 1, 2], repeat=nodes):
        results: list[object] = [
            ConnectionError("down") if a is None else [None if a == NIL else str(a), 1000]
            for a in answers
        ]
        replies = tuple(sorted(a for a in answers if a is not None))
        for copy in (0, 1, 2):
            package = may_be_claimed_by(
                cast(NodeSet, _Replies(results)), quorum, "k", "w", str(copy), 1.0
            )
            assert model.may_be_claimed_by(replies, copy) == package, (answers, copy)
            seen += package
            values = read_claim(cast(NodeSet, _Replies(results)), "k", "w", 1.0)
            dropped = claimed_by_another(values, str(copy), quorum) is not None
            assert model.claimed_by_another(replies, copy) == dropped, (answers, copy)
            assert not (dropped and package), (answers, copy)  # never both
            drops += dropped
    assert 0 < seen < 3 * 5**nodes  # both verdicts met
    assert 0 < drops < 3 * 5**nodes


def test_a_claim_the_silent_nodes_could_give_to_the_reader_by_plurality_may_be_its_own() -> None:
    """Five nodes, two silent, the others naming copies 1, 1 and 2: copy 0 named by the
    two silent ones would tie copy 1 on two nodes and win the tie (the smallest id)."""
    results: list[object] = [ConnectionError("down")] * 2 + [[b"1", 1], [b"1", 1], [b"2", 1]]
    nodes = cast(NodeSet, _Replies(results))
    assert may_be_claimed_by(nodes, 3, "k", "w", "0", 1.0)
    assert not may_be_claimed_by(nodes, 3, "k", "w", "3", 1.0)  # ties copy 1, and loses the tie


# -- two beats, a lock node down (tools/modelcheck/beatsplit.py) ---------------------- #

from tools.modelcheck.beatsplit import (  # noqa: E402
    LOST,
    MISSED_UNAVAILABLE,
    BeatSplitResult,
    beat_split_scenarios,
    check_beat_split,
)


@pytest.fixture(scope="module")
def beat_split_results() -> dict[str, BeatSplitResult]:
    selected = [b for b in beat_split_scenarios() if not b.full_only]
    return dict(zip([b.name for b in selected], in_processes(check_beat_split, selected, jobs=2)))


@pytest.mark.parametrize("name", ["beat-split-one-node-down", "beat-split-two-nodes-down"])
def test_with_a_minority_of_nodes_down_no_interleaving_loses_or_doubles_a_tick(
    beat_split_results: dict[str, BeatSplitResult], name: str
) -> None:
    result = beat_split_results[name]
    assert result.violation is None, "\n".join(result.trace)
    assert result.states > 10_000  # not vacuous: the rounds interleave
    # Every final state: one beat sent the tick, the other found it taken; no beat
    # read the split as an outage.
    assert set(result.finals) == {("sent", "taken"), ("taken", "sent")}
    assert not any(MISSED_UNAVAILABLE in final for final in result.finals)


def test_the_old_verdict_loses_a_tick_when_one_node_is_down_and_the_beats_split(
    beat_split_results: dict[str, BeatSplitResult],
) -> None:
    result = beat_split_results["beat-split-one-node-down-old-verdict"]
    assert result.violation == LOST and result.as_expected
    text = "\n".join(result.trace)
    assert "node0 (down) fails beat0's try" in text and "node0 (down) fails beat1's try" in text
    assert "(not awaited)" in text  # a round stopped at its third no
    assert result.trace[-1].strip() == "-> beat0: unavailable, beat1: unavailable"


def test_the_command_line_runs_the_beat_split_scenarios(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["--only", "beat-split-one-node-down", "--only", "beat-split-one-node-down-old-verdict"]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "beat-split-one-node-down-old-verdict: shortest counterexample" in printed


# -- at most N inside per key (tools/modelcheck/limits.py) ------------------------------ #

from tools.modelcheck.limits import OVER_LIMIT, SLOT_SHARED  # noqa: E402
from tools.modelcheck.limits_check import LimitResult, check_limits, limit_scenarios  # noqa: E402

LIMIT_CI = {sc.name: sc for sc in limit_scenarios() if not sc.full_only}
LIMIT_SAFE = [name for name, sc in LIMIT_CI.items() if sc.expect == "safe" and sc.leave]


@pytest.fixture(scope="module")
def limit_results() -> dict[str, LimitResult]:
    """Every CI scenario of the limits explored once, two at a time."""
    return dict(zip(LIMIT_CI, in_processes(check_limits, list(LIMIT_CI.values()), jobs=2)))


@pytest.mark.parametrize("name", LIMIT_SAFE)
def test_permit_slots_never_admit_more_than_n_in_their_whole_state_space(
    limit_results: dict[str, LimitResult], name: str
) -> None:
    result = limit_results[name]
    assert result.outcome == "safe", "\n".join(result.trace)
    # Not vacuous: N holders were inside at once somewhere in the explored space.
    assert result.max_inside == result.scenario.limit
    assert result.states > 1_000


def test_a_per_node_counter_admitted_by_a_majority_lets_three_in_with_n_two(
    limit_results: dict[str, LimitResult],
) -> None:
    result = limit_results["limit-counter-3-nodes"]
    assert result.violation == OVER_LIMIT and result.as_expected
    # The shortest: three rounds, each admitted on a different pair of the 3 nodes.
    assert result.trace_steps == 9
    assert result.trace[-1] == "!! VIOLATION (more than N inside): A, B, C inside, limit 2"
    assert sum("INSIDE" in line for line in result.trace) == 3


def test_a_per_node_counter_is_unsafe_on_five_nodes_too_below_its_quorum_bound(
    limit_results: dict[str, LimitResult],
) -> None:
    # q = 3 <= N * nodes / (N + 1) = 10/3: three majorities of 5 fit in 2 per node.
    result = limit_results["limit-counter-5-nodes"]
    assert result.violation == OVER_LIMIT and result.as_expected
    assert result.trace_steps == 12


def test_slots_need_the_delayed_restart_like_the_mutex(
    limit_results: dict[str, LimitResult],
) -> None:
    result = limit_results["limit-slots-restart-no-delay"]
    assert result.violation == SLOT_SHARED and result.as_expected
    assert any("restarts empty AT ONCE" in line for line in result.trace)


def test_lowest_free_slot_per_node_can_split_a_round_while_a_permit_is_free(
    limit_results: dict[str, LimitResult],
) -> None:
    # N = 3 holders for 3 permits, no faults, holders stay: the nodes' orders can hand
    # one client three different slots; it must retry although a permit is free.
    result = limit_results["limit-split-lowest-free-3-nodes-n3"]
    assert result.outcome == "safe" and result.split_finals > 0
    # With N = 2 on 3 nodes it cannot: two of three nodes agree on one of two slots.
    assert limit_results["limit-split-lowest-free-3-nodes-n2"].split_finals == 0


def test_the_command_line_runs_the_limit_scenarios(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--only", "limit-counter-3-nodes", "--only", "limit-split-lowest-free-3-nodes-n2"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "limit-counter-3-nodes: shortest counterexample, 9 steps" in printed


def test_a_cooldown_whose_node_restarts_empty_at_once_admits_a_second_start(
    limit_results: dict[str, LimitResult],
) -> None:
    """The cooldown's control: one slot (N=1), a node restarted empty without the
    delayed restart forgets the start, and a second one is admitted inside it."""
    result = limit_results["cooldown-restart-no-delay"]
    assert result.violation == OVER_LIMIT and result.as_expected
    assert result.trace[-1] == "!! VIOLATION (more than N inside): A, B inside, limit 1"
    assert result.trace_steps == 7
