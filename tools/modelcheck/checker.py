"""Breadth-first explorer for ``model.Model`` and the printer of its traces.

The search is plain BFS over canonical states (see ``Model.canonical``): every
state at depth d is expanded before any at depth d + 1, so the first invariant
violation met is one with the fewest steps, i.e. a shortest counterexample. Each
scenario carries a depth bound and a state-count bound, so a run always ends; the
result says whether the state space was exhausted or a bound cut it short.

Only canonical keys are stored (one dict, key -> parent key). A trace is rebuilt
by replaying: from the initial concrete state, take at each step a successor
whose canonical key is the next one on the path. That gives concrete node names
that stay consistent along the trace, which symmetry reduction alone would not.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Optional, TypeVar

from .model import (
    ACQUIRE,
    EXTEND,
    EXTENDING,
    FENCE,
    FENCE_ORDER,
    FENCING_NAIVE,
    GIVE_UP,
    HOLDING,
    IDLE,
    NO_KEY,
    ROUND1,
    ROUND2,
    SAFE,
    VIOLATES,
    Action,
    Model,
    Scenario,
    State,
    Violation,
    client_name,
    node_name,
    token_name,
)

#: ``Result.outcome`` values (besides model.SAFE and model.VIOLATES).
BOUNDED = "bounded"

Key = tuple[object, ...]

S = TypeVar("S")
R = TypeVar("R")


@dataclass
class Result:
    """What one scenario's exploration found."""

    scenario: Scenario
    #: "violation" if an invariant broke, else "safe" (state space exhausted)
    #: or "bounded" (a depth/state bound stopped the search first: no proof).
    outcome: str
    states: int = 0
    transitions: int = 0
    #: depth (steps from the initial state) of the deepest level explored.
    max_depth: int = 0
    seconds: float = 0.0
    #: explored states in which some client holds a lease, and the highest fence
    #: granted in any of them: evidence that the invariants were exercised.
    holding_states: int = 0
    top_fence: int = 0
    violation: Optional[Violation] = None
    #: steps (model transitions) in the counterexample, and its printed lines.
    trace_steps: int = 0
    trace: list[str] = field(default_factory=list)

    @property
    def as_expected(self) -> bool:
        sc = self.scenario
        if sc.expect == SAFE:
            return self.outcome == SAFE or (self.outcome == BOUNDED and not sc.exhaustive)
        return (
            self.outcome == VIOLATES
            and self.violation is not None
            and self.violation.kind == sc.expect_kind
            and any(sc.expect_event in line for line in self.trace)
        )

    def to_json(self) -> dict[str, object]:
        sc = self.scenario
        return {
            "scenario": sc.name,
            "description": sc.description,
            "nodes": sc.nodes,
            "clients": sc.clients,
            "ttl": sc.ttl,
            "expect": sc.expect if sc.expect == SAFE else f"violation: {sc.expect_kind}",
            "outcome": self.outcome,
            "as_expected": self.as_expected,
            "violation": None if self.violation is None else self.violation.kind,
            "states": self.states,
            "transitions": self.transitions,
            "max_depth": self.max_depth,
            "holding_states": self.holding_states,
            "seconds": round(self.seconds, 3),
            "trace_steps": self.trace_steps,
            "trace": self.trace,
        }


def check(scenario: Scenario) -> Result:
    """Explore ``scenario`` breadth-first; stop at the first violation or bound."""
    model = Model(scenario)
    started = time.perf_counter()
    init = model.initial()
    root = model.canonical(init)
    parent: dict[Key, Optional[Key]] = {root: None}
    frontier: list[tuple[State, Key]] = [(init, root)]
    result = Result(scenario, SAFE, top_fence=init.max_fence)
    canonical = model.canonical
    successors = model.successors
    depth = 0
    transitions = 0
    holding = 0
    top_fence = init.max_fence
    while frontier and result.outcome == SAFE:
        if depth >= scenario.max_depth:
            result.outcome = BOUNDED
            break
        next_frontier: list[tuple[State, Key]] = []
        for state, key in frontier:
            for _action, nxt, violation in successors(state):
                transitions += 1
                if violation is not None:
                    path = _path(parent, key)
                    result.outcome = VIOLATES
                    result.violation = violation
                    result.trace_steps = len(path)  # the states before it, root included
                    result.trace = render_trace(model, path, violation)
                    break
                nkey = canonical(nxt)
                if nkey in parent:
                    continue
                parent[nkey] = key
                next_frontier.append((nxt, nkey))
                if any(c.phase == HOLDING for c in nxt.clients):
                    holding += 1
                    top_fence = max(top_fence, nxt.max_fence)
                if len(parent) >= scenario.max_states:
                    result.outcome = BOUNDED
                    break
            if result.outcome != SAFE:
                break
        if result.outcome != SAFE:
            depth += 1  # the violating (or last added) state is one level deeper
            break
        frontier = next_frontier
        if frontier:
            depth += 1
    result.states = len(parent)
    result.transitions = transitions
    result.max_depth = depth
    result.holding_states = holding
    result.top_fence = top_fence
    result.seconds = time.perf_counter() - started
    return result


def check_all(selected: Sequence[Scenario], jobs: int = 1) -> list[Result]:
    """``check`` every scenario, in up to ``jobs`` processes; results in order."""
    return in_processes(check, selected, jobs)


def in_processes(explore: Callable[[S], R], selected: Sequence[S], jobs: int) -> list[R]:
    """``explore`` (a module-level function: it is pickled) over every scenario of any
    model, in up to ``jobs`` processes; results in order. Explorations are CPU-bound
    and independent: two cores explore two scenarios at once."""
    if jobs <= 1 or len(selected) <= 1:
        return [explore(sc) for sc in selected]
    # Spawned, not forked: the caller (pytest, say) may have threads running.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        return list(pool.map(explore, selected))


def _path(parent: dict[Key, Optional[Key]], key: Key) -> list[Key]:
    """Keys from the root to ``key`` inclusive."""
    path: list[Key] = []
    cur: Optional[Key] = key
    while cur is not None:
        path.append(cur)
        cur = parent[cur]
    path.reverse()
    return path


# --------------------------------------------------------------------------- #
# Trace replay and printing
# --------------------------------------------------------------------------- #


def render_trace(model: Model, path: list[Key], violation: Violation) -> list[str]:
    """Replay ``path`` concretely and describe each step, ending with the violation."""
    state = model.initial()
    now = 0
    # Real start time of each client's open round, for printing the exact elapsed
    # time (the state only keeps it saturated).
    started: dict[int, int] = {}
    lines: list[str] = []
    for want in path[1:]:
        for action, nxt, _ in model.successors(state):
            if model.canonical(nxt) == want:
                if action.kind == "tick":
                    now += 1
                elif action.kind in ("start", "extend"):
                    started[action.actor] = now
                lines.extend(describe(model, state, action, nxt, now, started))
                state = nxt
                break
        else:  # pragma: no cover - would mean canonical() and successors() disagree
            raise AssertionError("trace replay lost its way")
    for action, nxt, found in model.successors(state):
        if found is not None and found.kind == violation.kind:
            lines.extend(describe(model, state, action, nxt, now, started))
            message = found.message
            if found.kind == FENCE_ORDER and model.scenario.clock_fence:
                message = message.split(" granted fence")[0] + (
                    f" granted fence {_show(model, found.fence, now)}, not above the highest "
                    f"fence granted before ({_show(model, found.previous, now)})"
                )
            lines.append(f"t={now} !! VIOLATION ({found.kind}): {message}")
            return lines
    raise AssertionError("trace replay did not reach the violation")  # pragma: no cover


def describe(
    model: Model,
    before: State,
    action: Action,
    after: State,
    now: int,
    started: Optional[dict[int, int]] = None,
) -> list[str]:
    """Human-readable lines for one step (``now`` is the time after the step;
    ``started`` maps clients to the real start time of their open round)."""
    sc = model.scenario
    at = f"t={now}"
    kind = action.kind
    i = action.actor
    if kind == "tick":
        lines = []
        for n, (old, new) in enumerate(zip(before.nodes, after.nodes)):
            if old.key != NO_KEY and new.key == NO_KEY:
                lines.append(f"{at} {node_name(n)} key {token_name(*old.key)} expires")
        for c, (old_c, new_c) in enumerate(zip(before.clients, after.clients)):
            if old_c.phase in (HOLDING, EXTENDING) and new_c.phase == IDLE:
                lines.append(
                    f"{at} client {client_name(c)} lease {token_name(c, old_c.attempt)} "
                    "lapses (validity over on its clock)"
                )
        return lines
    if kind == "expire":
        old = before.nodes[i]
        return [
            f"{at} {node_name(i)} key {token_name(*old.key)} expires {old.key_ttl} tick(s) "
            "early (node clock fast, within the drift bound)"
        ]
    if kind == "deliver":
        return [_describe_delivery(model, before, after, action, now)]
    if kind == "start":
        cl = after.clients[i]
        targets = ",".join(node_name(n) for n, node in enumerate(before.nodes) if node.up)
        return [
            f"{at} client {client_name(i)} starts {token_name(i, cl.attempt)}: t0={now}, "
            f"acquire round1 sent to {targets or 'no node'}"
        ]
    if kind == "close":
        elapsed = None if started is None else now - started[i]
        return [_describe_close(model, before, after, action, now, elapsed)]
    if kind == "release":
        return [
            f"{at} client {client_name(i)} releases {token_name(i, before.clients[i].attempt)} "
            "(lease ends; compare-and-delete sent to all nodes)"
        ]
    if kind == "extend":
        return [
            f"{at} client {client_name(i)} extends {token_name(i, before.clients[i].attempt)}: "
            "compare-and-pexpire sent to all nodes"
        ]
    if kind in ("crash", "restart"):
        lost = [
            "lock key " + ("kept" if sc.persist_keys else "lost"),
            "counter " + ("kept" if sc.persist_counters else "lost"),
        ]
        if kind == "restart":
            return [f"{at} {node_name(i)} CRASHES and restarts at once ({', '.join(lost)})"]
        return [f"{at} {node_name(i)} CRASHES ({', '.join(lost)}), stays down"]
    if kind == "rejoin":
        return [f"{at} {node_name(i)} restarts and rejoins after {sc.restart_delay}+ ticks down"]
    raise AssertionError(f"unknown action {kind}")  # pragma: no cover


def _show(model: Model, value: int, now: int) -> str:
    """A counter or fence as an absolute number."""
    if not model.scenario.clock_fence:
        return str(value)
    # With a clock component counters are stored relative to now, and saturate
    # at a floor meaning "empty, or too old to matter".
    return "empty/old" if value <= model.counter_floor else str(value + now)


def _describe_delivery(model: Model, before: State, after: State, action: Action, now: int) -> str:
    req = action.request
    assert req is not None
    old = before.nodes[action.actor]
    new = after.nodes[action.actor]
    who = f"t={now} client {client_name(req.client)}"
    node = node_name(action.actor)
    mine = old.key == (req.client, req.attempt)
    held = "absent" if old.key == NO_KEY else f"held by {token_name(*old.key)}"
    cl_before = before.clients[req.client]
    counted = after.clients[req.client].results != cl_before.results
    late = "" if counted else " (reply ignored: that round is over)"
    if req.kind == ACQUIRE:
        if old.key != NO_KEY:
            return f"{who} acquire round1 -> {node} NO (key {held})"
        if model.scenario.fencing == FENCING_NAIVE:
            return (
                f"{who} acquire -> {node} OK (SET NX + INCR: counter "
                f"{_show(model, new.counter, now)}){late}"
            )
        return f"{who} acquire round1 -> {node} OK (counter {_show(model, new.counter, now)}){late}"
    if req.kind == FENCE:
        fence = _show(model, req.fence, now)
        if not mine:
            return f"{who} fence round2 T={fence} -> {node} NO (key {held})"
        return (
            f"{who} fence round2 T={fence} -> {node} OK (counter "
            f"{_show(model, old.counter, now)} -> {_show(model, new.counter, now)}){late}"
        )
    if req.kind == EXTEND:
        if not mine:
            return f"{who} extend -> {node} NO (key {held})"
        return f"{who} extend -> {node} OK (key ttl reset to {model.ttl}){late}"
    if mine:
        return f"{who} release -> {node} deletes {token_name(req.client, req.attempt)}"
    return f"{who} release -> {node} no-op (key {held})"


def _describe_close(
    model: Model, before: State, after: State, action: Action, now: int, elapsed: Optional[int]
) -> str:
    sc = model.scenario
    c = action.actor
    old = before.clients[c]
    new = after.clients[c]
    name = f"t={now} client {client_name(c)}"
    token = token_name(c, old.attempt)
    word = "yes" if old.phase == ROUND1 else "OK"
    have = f"{len(old.results)} of {sc.nodes} nodes said {word}, quorum {model.quorum}"
    if old.phase == EXTENDING:
        if action.choice == GIVE_UP:
            return (
                f"{name} extend of {token} gives up ({have}; deadline); "
                f"lease still valid until t={now + new.remaining}"
            )
        return f"{name} extend of {token} counts ({have}): valid until t={now + new.remaining}"
    stage = "round2" if old.phase == ROUND2 else "round1"
    if action.choice == GIVE_UP:
        return f"{name} {stage} of {token} gives up ({have}; deadline): releases on all nodes"
    if elapsed is None:  # without the replay's clock, the saturated count
        elapsed = old.since
    used = elapsed if sc.subtract_elapsed else 0
    validity = f"validity {sc.ttl}-{used}-{sc.drift_margin}={sc.ttl - used - sc.drift_margin}"
    if not sc.subtract_elapsed:
        validity += f" with {elapsed} tick(s) elapsed NOT subtracted"
    if old.phase == ROUND1 and sc.fencing != "off":
        counted = f"max counter {_show(model, action.choice, now)}"
        if action.choice < max(old.results):
            counted += " (the higher replies are late)"
        have += f", {counted}"
    if new.phase == ROUND2:
        return (
            f"{name} round1 of {token} wins ({have}; {validity}) -> round2: "
            f"fence T={_show(model, new.best, now)} sent to all nodes"
        )
    fence = ""
    if sc.fencing != "off":
        value = old.best if old.phase == ROUND2 else action.choice
        fence = f" with fence {_show(model, value, now)}"
    return (
        f"{name} GRANTED {token}{fence} after {stage} ({have}; {validity}): "
        f"holds the lease until t={now + new.remaining}"
    )
