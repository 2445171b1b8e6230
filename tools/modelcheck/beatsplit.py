"""Two beats claiming one tick with a lock node down, as a finite transition system,
with its own breadth-first checker.

The question: with a minority of the lock nodes down, can a tick be lost -- sent
by no beat -- although a quorum of nodes is alive? It depends on how a lost
round's replies are read. The old reading called a round an outage when any node
failed and the refusals alone did not rule out a quorum; one node down and the
beats splitting the other four 2-2 (or a round that stopped at its third "no")
then read as "lock nodes unavailable", and each beat gave the tick up. The
reading celery_redlock uses now (lock/acquire_replies.py, restated here, not
imported): unavailable only when more than N - quorum nodes *failed*; a node the
round stopped waiting for did not fail. Anything else not won is contention or a
split, and the beat asks who holds the tick (a quorum naming one holder: another
beat sent it) and otherwise tries again, within its claim timeout.

What may happen, in any order: each beat starts its round, its acquire reaches each
live node at any time (per connection in order: a lost round's release follows its
acquire), a dead node's error comes at any time, and a round stops as soon as it
is decided (a quorum of grants, or N - quorum + 1 noes), the rest NOT_AWAITED. A
lost round is undone on every live node; the beat then reads every node (after
its release has landed) and sends nothing if a quorum names a holder.

One assumption, stated: a *retry* starts only when no round is in flight and every
release has landed, and no round starts during a retry. That is what the random
pause between tries buys in practice (milliseconds, against a round of about one);
without it an adversarial scheduler could split every try until the claim timeout,
which beat reports as a missed tick ("split between beats"), not an outage.

Invariants: the tick is never sent twice; in every final state it was sent once.
Counted besides: the final states in which a beat gave the tick up as
"unavailable" although a quorum of nodes was alive (none, with the new reading).
Standard library only; imports nothing of ``celery_redlock``.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import NamedTuple, Optional

SENT_TWICE = "tick sent twice"
LOST = "tick lost"

#: A beat's reply slots: awaiting, granted, failed; a refusal is the holder's id.
AWAITING, YES, ERROR = -1, -2, -3
#: Phases of a beat.
START, ROUND, HOLDER, DONE = range(4)
#: Outcomes of a finished beat.
SENT, FOUND_TAKEN, MISSED_UNAVAILABLE, MISSED_SPLIT = "sent", "taken", "unavailable", "split"
#: Node values besides "held by beat b".
FREE = -1


@dataclass(frozen=True)
class BeatSplitScenario:
    """Nodes, how many are down, how many tries a beat has, which reading of replies."""

    name: str
    description: str
    nodes: int = 5
    down: int = 1
    #: rounds a beat may try for the tick (its claim timeout, counted in tries).
    tries: int = 2
    #: "new" (a failure counts only when failures alone rule out a quorum) or
    #: "old" (any failure, with refusals that do not rule out a quorum: outage).
    verdict: str = "new"
    expect: str = "safe"
    expect_kind: str = ""
    full_only: bool = False

    @property
    def quorum(self) -> int:
        return self.nodes // 2 + 1


class Beat(NamedTuple):
    phase: int
    tries: int
    #: per node: AWAITING, YES, ERROR, or the refusing holder's beat id.
    replies: tuple[int, ...]
    outcome: str


#: Per node: the ops still to reach it, in order: ("A", try) or ("R", 0).
PerNode = tuple[tuple[tuple[str, int], ...], ...]


class State(NamedTuple):
    nodes: tuple[int, ...]
    #: per beat, per node: its connection's ops not yet processed.
    queues: tuple[PerNode, ...]
    beats: tuple[Beat, ...]


def verdict(sc: BeatSplitScenario, results: tuple[int, ...]) -> str:
    """granted, contended, split or unavailable, as ``sc.verdict`` reads them;
    AWAITING entries are NOT_AWAITED once the round is decided."""
    q, n = sc.quorum, sc.nodes
    yes = results.count(YES)
    failed = results.count(ERROR)
    refusals = [r for r in results if r >= 0]
    if yes >= q:
        return "granted"
    if sc.verdict == "old":
        if failed and len(refusals) <= n - q:
            return "unavailable"
        return "contended"
    if failed > n - q:
        return "unavailable"
    top = Counter(refusals).most_common(1)
    return "contended" if top and top[0][1] >= q else "split"


class BeatSplitModel:
    def __init__(self, sc: BeatSplitScenario) -> None:
        self.sc = sc
        self.live = tuple(range(sc.down, sc.nodes))

    def initial(self) -> State:
        empty = tuple(() for _ in range(self.sc.nodes))
        beat = Beat(START, 0, (AWAITING,) * self.sc.nodes, "")
        return State((FREE,) * self.sc.nodes, (empty, empty), (beat, beat))

    def _quiet(self, s: State) -> bool:
        return all(not q for per_beat in s.queues for q in per_beat) and all(
            b.phase != ROUND for b in s.beats
        )

    def successors(self, s: State) -> list[tuple[str, State]]:
        out: list[tuple[str, State]] = []
        for b, beat in enumerate(s.beats):
            if beat.phase == START and self._may_start(s, b):
                out.append((f"beat{b} sends try {beat.tries + 1}", self._start(s, b)))
            if beat.phase == ROUND:
                for i in range(self.sc.down):
                    if beat.replies[i] == AWAITING:
                        out.append(
                            (f"node{i} (down) fails beat{b}'s try", self._reply(s, b, i, ERROR))
                        )
            if beat.phase == HOLDER and not any(s.queues[b]):
                out.append((f"beat{b} reads who holds the tick", self._read_holder(s, b)))
            for i in self.live:
                if s.queues[b][i]:
                    out.append(self._node_step(s, b, i))
        return out

    def _may_start(self, s: State, b: int) -> bool:
        other = s.beats[1 - b]
        if s.beats[b].tries == 0:  # a first try: only not during the other's retry
            return not (other.phase == ROUND and other.tries > 1)
        return self._quiet(s)

    def _start(self, s: State, b: int) -> State:
        beat = s.beats[b]
        tries = beat.tries + 1
        queues = list(s.queues[b])
        for i in self.live:
            queues[i] = queues[i] + (("A", tries),)
        new = Beat(ROUND, tries, (AWAITING,) * self.sc.nodes, "")
        return self._set(s, b, new, queues=tuple(queues))

    def _node_step(self, s: State, b: int, i: int) -> tuple[str, State]:
        (op, tries), rest = s.queues[b][i][0], s.queues[b][i][1:]
        queues = list(s.queues[b])
        queues[i] = rest
        nodes = list(s.nodes)
        s = s._replace(queues=self._queues(s, b, tuple(queues)))
        if op == "R":
            if nodes[i] == b:
                nodes[i] = FREE
            return f"node{i} releases beat{b}'s share", s._replace(nodes=tuple(nodes))
        reply = YES if nodes[i] in (FREE, b) else nodes[i]
        if reply == YES:
            nodes[i] = b
        s = s._replace(nodes=tuple(nodes))
        beat = s.beats[b]
        what = f"node{i} {'grants beat' if reply == YES else 'refuses beat'}{b} try {tries}"
        if beat.phase == ROUND and beat.tries == tries and beat.replies[i] == AWAITING:
            return what, self._reply(s, b, i, reply)
        return what + " (not awaited)", s

    def _reply(self, s: State, b: int, i: int, reply: int) -> State:
        beat = s.beats[b]
        replies = (*beat.replies[:i], reply, *beat.replies[i + 1 :])
        yes = replies.count(YES)
        no = sum(1 for r in replies if r != YES and r != AWAITING)
        q, n = self.sc.quorum, self.sc.nodes
        if yes < q and no < n - q + 1 and AWAITING in replies:
            return self._set(s, b, beat._replace(replies=replies))
        judged = verdict(self.sc, replies)
        if judged == "granted":
            return self._set(s, b, Beat(DONE, beat.tries, replies, SENT))
        queues = list(s.queues[b])
        for node in self.live:
            queues[node] = queues[node] + (("R", 0),)
        phase, outcome = (DONE, MISSED_UNAVAILABLE) if judged == "unavailable" else (HOLDER, "")
        return self._set(s, b, Beat(phase, beat.tries, replies, outcome), queues=tuple(queues))

    def _read_holder(self, s: State, b: int) -> State:
        beat = s.beats[b]
        held = Counter(s.nodes[i] for i in self.live if s.nodes[i] != FREE).most_common(1)
        if held and held[0][1] >= self.sc.quorum:
            return self._set(s, b, beat._replace(phase=DONE, outcome=FOUND_TAKEN))
        if beat.tries < self.sc.tries:
            return self._set(s, b, beat._replace(phase=START))
        return self._set(s, b, beat._replace(phase=DONE, outcome=MISSED_SPLIT))

    @staticmethod
    def _queues(s: State, b: int, mine: PerNode) -> tuple[PerNode, ...]:
        return tuple(mine if k == b else q for k, q in enumerate(s.queues))

    def _set(self, s: State, b: int, beat: Beat, queues: Optional[PerNode] = None) -> State:
        beats = tuple(beat if k == b else x for k, x in enumerate(s.beats))
        if queues is not None:
            s = s._replace(queues=self._queues(s, b, queues))
        return s._replace(beats=beats)

    def violation(self, s: State, final: bool) -> Optional[str]:
        """The invariants: never sent twice; sent once in every final state. (A beat
        that read an outage while a quorum was alive shows in the final states'
        outcomes, ``BeatSplitResult.finals``.)"""
        outcomes = [beat.outcome for beat in s.beats]
        if outcomes.count(SENT) > 1:
            return SENT_TWICE
        if final and SENT not in outcomes:
            return LOST
        return None


class BeatSplitResult(NamedTuple):
    scenario: BeatSplitScenario
    states: int
    violation: Optional[str]
    trace: list[str]
    #: final states by the beats' outcomes, e.g. {("sent", "taken"): 12}.
    finals: dict[tuple[str, ...], int]
    seconds: float

    @property
    def outcome(self) -> str:
        return "safe" if self.violation is None else "violates"

    @property
    def as_expected(self) -> bool:
        if self.scenario.expect == "safe":
            return self.violation is None
        return self.violation == self.scenario.expect_kind


def check_beat_split(sc: BeatSplitScenario) -> BeatSplitResult:
    """Breadth-first over every interleaving: the first violation found is a shortest."""
    began = time.monotonic()
    model = BeatSplitModel(sc)
    start = model.initial()
    parent: dict[State, Optional[tuple[State, str]]] = {start: None}
    frontier = deque([start])
    finals: Counter[tuple[str, ...]] = Counter()
    while frontier:
        state = frontier.popleft()
        moves = model.successors(state)
        found = model.violation(state, final=not moves)
        if found is not None:
            return BeatSplitResult(
                sc,
                len(parent),
                found,
                _trace(parent, state),
                dict(finals),
                time.monotonic() - began,
            )
        if not moves:
            finals[tuple(beat.outcome for beat in state.beats)] += 1
        for what, nxt in moves:
            if nxt not in parent:
                parent[nxt] = (state, what)
                frontier.append(nxt)
    return BeatSplitResult(sc, len(parent), None, [], dict(finals), time.monotonic() - began)


def _trace(parent: dict[State, Optional[tuple[State, str]]], state: State) -> list[str]:
    steps: list[str] = []
    at: Optional[tuple[State, str]] = parent[state]
    while at is not None:
        steps.append(at[1])
        at = parent[at[0]]
    steps.reverse()
    outcomes = ", ".join(
        f"beat{b}: {beat.outcome or 'not done'}" for b, beat in enumerate(state.beats)
    )
    return [f"{n + 1:2d}. {step}" for n, step in enumerate(steps)] + [f"    -> {outcomes}"]


def beat_split_scenarios() -> list[BeatSplitScenario]:
    return [
        BeatSplitScenario(
            "beat-split-one-node-down",
            "2 beats, 5 nodes, 1 down: a split of the other 4 is retried, never an outage",
        ),
        BeatSplitScenario(
            "beat-split-two-nodes-down",
            "2 beats, 5 nodes, 2 down: the 3 alive are a quorum; splits are retried",
            down=2,
        ),
        BeatSplitScenario(
            "beat-split-one-node-down-old-verdict",
            "negative control: the old reading calls the split an outage; a tick is lost",
            verdict="old",
            expect="violates",
            expect_kind=LOST,
        ),
    ]


def format_beat_split(results: list[BeatSplitResult]) -> str:
    lines = ["beat split scenarios (tools/modelcheck/beatsplit.py):"]
    for r in results:
        sc = r.scenario
        expect = sc.expect if sc.expect == "safe" else f"violation: {sc.expect_kind}"
        got = r.outcome if r.violation is None else f"violates: {r.violation}"
        ok = "yes" if r.as_expected else "NO"
        lines.append(
            f"  {sc.name:40s} N={sc.nodes} down={sc.down} expect {expect:24s} "
            f"{got:28s} ok {ok:3s} states {r.states:7d} {r.seconds:5.1f}s"
        )
    for r in results:
        if r.trace:
            lines.append(f"== {r.scenario.name}: shortest counterexample, {len(r.trace) - 1} steps")
            lines.extend("   " + line for line in r.trace)
    return "\n".join(lines)
