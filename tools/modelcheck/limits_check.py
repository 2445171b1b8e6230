"""The checker, the scenario catalogue and the printer for ``limits.py`` (at most N
holders per key over M lock nodes).

Breadth-first over canonical states (nodes and clients renamed), so the first
violation met is a shortest one; its trace is rebuilt by replaying from the initial
state, taking at each step a successor with the next canonical key, which keeps
node and client names consistent along the trace. Counted besides, in the final
states (nothing left to do): how many leave a client out although fewer than N are
inside -- with no faults and holders that stay, that is a split (every node granted
something, no slot reached a majority).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, NamedTuple, Optional

from .limits import (
    ALL_FREE,
    COUNTER,
    FREE,
    FROM_START,
    IDLE,
    INSIDE,
    LOWEST,
    NAMED,
    OVER_LIMIT,
    SLOT_SHARED,
    Action,
    LimitModel,
    LimitScenario,
    State,
)


class LimitResult(NamedTuple):
    scenario: LimitScenario
    states: int
    transitions: int
    depth: int
    violation: Optional[str]
    trace: list[str]
    #: final states, and those with a client out while fewer than N are inside.
    finals: int
    split_finals: int
    #: the most clients inside at once in any explored state (not vacuous: = N).
    max_inside: int
    #: whether the search was cut short by ``max_states``.
    bounded: bool
    seconds: float

    @property
    def outcome(self) -> str:
        if self.violation is not None:
            return "violates"
        return "bounded" if self.bounded else "safe"

    @property
    def as_expected(self) -> bool:
        if self.scenario.expect == "safe":
            return self.outcome == "safe"
        return self.violation == self.scenario.expect_kind

    @property
    def trace_steps(self) -> int:
        return len(self.trace) - 1 if self.trace else 0


def check_limits(sc: LimitScenario) -> LimitResult:
    """Every interleaving, breadth-first: the first violation found is a shortest."""
    began = time.monotonic()
    model = LimitModel(sc)
    start = model.initial()
    first = model.canonical(start)
    parent: dict[object, Optional[object]] = {first: None}
    frontier = deque([(start, first, 0)])
    transitions = finals = split_finals = max_inside = depth = 0
    while frontier:
        state, key, level = frontier.popleft()
        depth = max(depth, level)
        inside = sum(1 for cl in state.clients if cl.phase == INSIDE)
        max_inside = max(max_inside, inside)
        found = model.violation(state)
        if found is not None:
            trace = _replay(model, _path(parent, key), found)
            seconds = time.monotonic() - began
            return LimitResult(sc, len(parent), transitions, level, found, trace,
                               finals, split_finals, max_inside, False, seconds)  # fmt: skip
        moves = model.successors(state)
        transitions += len(moves)
        if not moves:
            finals += 1
            out = any(cl.phase == IDLE for cl in state.clients)
            split_finals += out and inside < sc.limit
        for _, nxt in moves:
            nkey = model.canonical(nxt)
            if nkey not in parent:
                if len(parent) >= sc.max_states:
                    frontier.clear()
                    break
                parent[nkey] = key
                frontier.append((nxt, nkey, level + 1))
    bounded = len(parent) >= sc.max_states
    return LimitResult(sc, len(parent), transitions, depth, None, [], finals, split_finals,
                       max_inside, bounded, time.monotonic() - began)  # fmt: skip


def _path(parent: dict[object, Optional[object]], key: object) -> list[object]:
    keys = [key]
    at = parent[key]
    while at is not None:
        keys.append(at)
        at = parent[at]
    keys.reverse()
    return keys


def _replay(model: LimitModel, keys: list[object], found: str) -> list[str]:
    state = model.initial()
    lines = []
    for n, key in enumerate(keys[1:]):
        action, nxt = next((a, x) for a, x in model.successors(state) if model.canonical(x) == key)
        lines.append(f"{n + 1:2d}. {describe(model.sc, state, action, nxt)}")
        state = nxt
    inside = [_client(c) for c, cl in enumerate(state.clients) if cl.phase == INSIDE]
    lines.append(f"!! VIOLATION ({found}): {', '.join(inside)} inside, limit {model.sc.limit}")
    return lines


def _client(c: int) -> str:
    return "ABCDEFGH"[c]


def _node(k: int) -> str:
    return f"node{k + 1}"


def _holders(sc: LimitScenario, data: tuple[int, ...]) -> str:
    if sc.design == COUNTER:
        return "{" + ",".join(_client(t // 16) for t in data) + "}"
    return "[" + " ".join("-" if t == FREE else _client(t // 16) for t in data) + "]"


def _granted(sc: LimitScenario, mask: int) -> str:
    if sc.design == COUNTER:
        return "admits" if mask else "refuses (full)"
    slots = [str(i) for i in range(sc.limit) if mask >> i & 1]
    return f"sets slot {','.join(slots)} for" if slots else "has no free slot for"


def describe(sc: LimitScenario, before: State, action: Action, after: State) -> str:
    """One trace line: what happened, and who got in by it."""
    what, at, c, detail = action
    who = _client(c)
    if what == "start":
        text = f"{who} asks every node" + (f" for slot {detail}" if detail >= 0 else "")
    elif what == "give up":
        text = f"{who} gives its round up (deadline), stops counting its entries"
    elif what == "leave":
        text = f"{who} leaves (or crashes), stops counting its entries"
    elif what == "error":
        text = f"{_node(at)} (down) fails {who}'s request"
    elif what in ("acquire", "reply lost"):
        lost = ", the reply is lost" if what == "reply lost" else ""
        data = _holders(sc, after.cols[at].data)
        text = f"{_node(at)} {_granted(sc, detail)} {who} -> {data}{lost}"
    elif what == "expire":
        data = _holders(sc, after.cols[at].data)
        text = f"{who}'s entry on {_node(at)} is released or expires -> {data}"
    elif what == "crash":
        rest = "down until its entries expired" if sc.delayed_restart else "restarts empty AT ONCE"
        text = f"{_node(at)} CRASHES ({rest})"
    else:
        text = f"{_node(at)} rejoins, empty"
    for k, (old, new) in enumerate(zip(before.clients, after.clients)):
        if new.phase == INSIDE and old.phase != INSIDE:
            slot = f" on slot {new.slot}" if sc.design != COUNTER else ""
            text += f"  => {_client(k)} INSIDE{slot}"
    return text


#: No lost replies, no deadlines: delays and reordering only.
CALM: dict[str, Any] = {"lossy": False, "deadline": False}


def limit_scenarios() -> list[LimitScenario]:
    s = LimitScenario
    return [
        s("limit-counter-3-nodes", "negative control: a per-node count admitted by a majority"
          " (3 nodes, N=2, 3 clients; delays alone)", design=COUNTER, leave=False,
          expect="violates", expect_kind=OVER_LIMIT, **CALM),
        s("limit-counter-5-nodes", "negative control: the same with 5 nodes (q=3 <= 2*5/3)",
          design=COUNTER, nodes=5, leave=False, expect="violates", expect_kind=OVER_LIMIT,
          **CALM),
        s("limit-slots-restart-no-delay", "control: lowest-free slots, a node restarts empty"
          " at once (no delayed restart)", clients=2, crashes=1, expect="violates",
          expect_kind=SLOT_SHARED, delayed_restart=False),
        # A cooldown is a rate of one start per cooldown: N=1, "inside" read as
        # "started within the cooldown" (SAFETY.md, "Cooldowns").
        s("cooldown-from-3-nodes-faults", "a cooldown (one slot from the start: the"
          " library's), 3 nodes, 2 clients, lost replies, deadlines, a node crash (delayed"
          " restart)", design=FROM_START, limit=1, clients=2, crashes=1),
        s("cooldown-from-3-nodes", "a cooldown, 3 nodes, 3 clients that leave",
          design=FROM_START, limit=1, full_only=True, **CALM),
        s("cooldown-restart-no-delay", "control: a cooldown whose node restarts empty at"
          " once forgets the start inside it", design=FROM_START, limit=1, clients=2,
          crashes=1, expect="violates", expect_kind=OVER_LIMIT, delayed_restart=False),
        s("limit-lowest-3-nodes-n2", "lowest-free slots, 3 nodes, N=2, 3 clients that leave",
          **CALM),
        s("limit-lowest-3-nodes-n2-faults", "lowest-free slots, 3 nodes, N=2, 2 clients,"
          " lost replies, deadlines, a node crash (delayed restart)", clients=2, crashes=1),
        s("limit-lowest-3-nodes-n2-one-down", "lowest-free slots, 3 nodes (1 down), N=2,"
          " 3 clients that leave", down=1, **CALM),
        s("limit-named-3-nodes-n2", "a named slot per round, 3 nodes, N=2, 3 clients",
          design=NAMED, **CALM),
        s("limit-from-3-nodes-n2", "first free from a starting slot (the library's), 3"
          " nodes, N=2, 3 clients that leave", design=FROM_START, full_only=True, **CALM),
        s("limit-from-3-nodes-n2-faults", "first free from a starting slot, 3 nodes, N=2,"
          " 2 clients, lost replies, deadlines, a node crash (delayed restart)",
          design=FROM_START, clients=2, crashes=1),
        s("limit-all-free-3-nodes-n2", "all free slots per round, 3 nodes, N=2, 3 clients",
          design=ALL_FREE, full_only=True, **CALM),
        s("limit-lowest-5-nodes-n2-one-down", "lowest-free slots, 5 nodes (1 down), N=2,"
          " 3 clients that stay", nodes=5, down=1, leave=False, full_only=True, **CALM),
        s("limit-lowest-3-nodes-n3", "lowest-free slots, 3 nodes, N=3, 4 clients that stay",
          limit=3, clients=4, leave=False, full_only=True, **CALM),
    ] + [
        s(f"limit-split-{design}-{nodes}-nodes-n{n}", f"splits: {design}, {nodes} nodes, N={n},"
          f" {n} clients, no faults, holders stay", design=design, nodes=nodes, limit=n,
          clients=n, leave=False, full_only=n > 2 and design == ALL_FREE, **CALM)
        for nodes, n in ((3, 2), (3, 3))
        for design in (NAMED, ALL_FREE, LOWEST)
    ]  # fmt: skip


def format_limits(results: list[LimitResult]) -> str:
    lines = ["limit scenarios (tools/modelcheck/limits.py): at most N inside per key"]
    for r in results:
        sc = r.scenario
        expect = sc.expect if sc.expect == "safe" else f"violation: {sc.expect_kind}"
        got = r.outcome if r.violation is None else f"violates: {r.violation}"
        split = f"splits {r.split_finals}/{r.finals}" if r.violation is None else ""
        lines.append(
            f"  {sc.name:34s} {sc.design:11s} M={sc.nodes} N={sc.limit} cl={sc.clients} "
            f"expect {expect:30s} {got:30s} ok {'yes' if r.as_expected else 'NO ':3s} "
            f"states {r.states:8d} depth {r.depth:3d} {split:16s} {r.seconds:6.1f}s"
        )
    for r in results:
        if r.trace:
            sc = r.scenario
            lines.append(
                f"== {sc.name}: shortest counterexample, {r.trace_steps} steps "
                f"({sc.design}, {sc.nodes} nodes, quorum {sc.quorum}, N={sc.limit})"
            )
            lines.extend("   " + line for line in r.trace)
    return "\n".join(lines)


__all__ = ["LOWEST", "LimitResult", "check_limits", "format_limits", "limit_scenarios"]
