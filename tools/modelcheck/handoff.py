"""The hand-off to waiting duplicates (SAFETY.md, "Hand-off to waiting duplicates")
as a finite transition system, with its own breadth-first checker.

The lock itself is one atomic mutex here (its quorum algorithm is model.py's
subject); what this model adds is what hand-off brings: copies of a task that
meet the held lock register as waiters, publish a fallback copy and end; a
releasing holder pops a waiter and publishes a wake copy; a wake and a fallback
carrying the same waiter id settle which one goes on by a claim written with
SET NX on N nodes, counted with a quorum.

What may happen, in any order:

* the broker delivers any message at any time (countdowns and queues are just
  delay), and loses any wake message;
* a claim request reaches its node at any time or never, and its reply may be
  lost; a copy decides on the replies it has at any moment (its deadline);
* a registration is lost; a waiter entry expires at any time; a waker pops an
  entry on some nodes only, so the same waiter can be woken again (``dup_wakes``);
* the holder crashes in its body (its lock frees at its TTL, the ``expire`` step).

Invariants: a task's body never starts twice; two bodies are never inside at
once; and in every final state (nothing left to do) every task has run or has
given up explicitly (its lock-retry budget spent: a FAILURE or a skip the caller
sees), i.e. no task is lost. Standard library only; imports nothing of
``celery_redlock``.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Optional

RUN_TWICE = "body run twice"
OVERLAP = "two bodies at once"
LOST = "task lost"

# Message kinds; copy ids: the original 0, the fallback 1, the k-th wake 2 + k.
ORIGINAL, FALLBACK, WAKE = 0, 1, 2
KIND_NAMES = ("original", "fallback", "wake")
# Process steps.
CLAIM, ACQUIRE, REGISTER, CHECK, BODY, WAKING = range(6)
# Lock states besides "held by task t".
FREE, DEAD = -1, -2
# Task outcomes.
PENDING, RAN, GAVE_UP = 0, 1, 2


@dataclass(frozen=True)
class HandoffScenario:
    """One configuration: tasks, nodes, faults, protocol variant, expectation."""

    name: str
    description: str
    tasks: int = 2
    nodes: int = 3
    #: lock retries per task (contentions and undecided claims).
    budget: int = 2
    #: holder crashes allowed in the whole run.
    crashes: int = 1
    #: extra wakes of one waiter (an entry popped on a minority of nodes only).
    dup_wakes: int = 1
    #: protocol variant switches (a negative control turns one off).
    claim: bool = True
    fallback: bool = True
    #: "quorum" (the protocol) or "any" (won when any node says ours: a bug).
    claim_rule: str = "quorum"
    expect: str = "safe"
    expect_kind: str = ""
    max_states: int = 2_000_000
    #: only run by ``python -m tools.modelcheck --full`` (minutes of CPU).
    full_only: bool = False

    @property
    def quorum(self) -> int:
        return self.nodes // 2 + 1


class Msg(NamedTuple):
    task: int
    kind: int
    wid: int
    copy: int


class Proc(NamedTuple):
    """A copy being run by a worker."""

    task: int
    kind: int
    wid: int
    copy: int
    step: int
    #: which delivery of its message this is (the task's retries when delivered):
    #: replies to an earlier delivery's requests go to that one's connections only.
    delivery: int
    #: the claim values its nodes answered (a multiset: which node said what does
    #: not matter, and each request is answered once).
    replies: tuple[int, ...]


class ClaimReq(NamedTuple):
    node: int
    task: int
    wid: int
    copy: int
    delivery: int


class State(NamedTuple):
    msgs: tuple[Msg, ...]
    procs: tuple[Proc, ...]
    lock: int
    #: waiter entries (task, wid).
    queue: tuple[tuple[int, int], ...]
    #: per node: sorted (task, wid, copy) claims; never deleted.
    claims: tuple[tuple[tuple[int, int, int], ...], ...]
    inflight: tuple[ClaimReq, ...]
    outcome: tuple[int, ...]
    retries: tuple[int, ...]
    #: wakes published so far per (task, wid).
    woken: tuple[tuple[int, int, int], ...]
    crashes_left: int


def _sorted(items: object) -> tuple:  # type: ignore[type-arg]
    return tuple(sorted(items))  # type: ignore[call-overload]


def _at(items: tuple, i: int, value: object) -> tuple:  # type: ignore[type-arg]
    return (*items[:i], value, *items[i + 1 :])


def _remove(items: tuple, item: object) -> tuple:  # type: ignore[type-arg]
    i = items.index(item)
    return items[:i] + items[i + 1 :]


def _name(task: int) -> str:
    return "T" + str(task + 1)


class HandoffModel:
    def __init__(self, scenario: HandoffScenario) -> None:
        self.sc = scenario

    def initial(self) -> State:
        sc = self.sc
        return State(
            _sorted(Msg(t, ORIGINAL, 0, 0) for t in range(sc.tasks)),
            (), FREE, (), tuple(() for _ in range(sc.nodes)), (),
            tuple(PENDING for _ in range(sc.tasks)), tuple(0 for _ in range(sc.tasks)),
            (), sc.crashes,
        )  # fmt: skip

    def canonical(self, s: State) -> tuple[object, ...]:
        """``s`` with the nodes sorted: nodes are interchangeable (nothing outside a
        node's claims and the requests on their way to it names a node)."""
        bundles = sorted(
            (s.claims[i], tuple(r[1:] for r in s.inflight if r.node == i))
            for i in range(self.sc.nodes)
        )
        return (s.msgs, s.procs, s.lock, s.queue, tuple(bundles), s.outcome, s.retries,
                s.woken, s.crashes_left)  # fmt: skip

    def successors(self, s: State) -> list[tuple[str, State, Optional[str]]]:
        out: list[tuple[str, State, Optional[str]]] = []
        for m in sorted(set(s.msgs)):
            out.append(self._deliver(s, m))
            if m.kind == WAKE:
                out.append((f"broker loses {_msg(m)}", s._replace(msgs=_remove(s.msgs, m)), None))
        for r in sorted(set(s.inflight)):
            out.extend(self._node_claim(s, r))
        for p in sorted(set(s.procs)):
            out.extend(self._proc_step(s, p))
        if s.lock == DEAD:
            out.append(("the crashed holder's lock expires (TTL)", s._replace(lock=FREE), None))
        for e in s.queue:
            out.append(
                (f"waiter {_wid(*e)} entry expires", s._replace(queue=_remove(s.queue, e)), None)
            )
        return out

    # -- steps ------------------------------------------------------------------

    def _deliver(self, s: State, m: Msg) -> tuple[str, State, Optional[str]]:
        claiming = m.wid > 0 and self.sc.claim
        delivery = s.retries[m.task]
        proc = Proc(m.task, m.kind, m.wid, m.copy, CLAIM if claiming else ACQUIRE, delivery, ())
        inflight = s.inflight
        if claiming:
            reqs = [ClaimReq(i, m.task, m.wid, m.copy, delivery) for i in range(self.sc.nodes)]
            inflight = _sorted((*inflight, *reqs))
        nxt = s._replace(
            msgs=_remove(s.msgs, m), procs=_sorted((*s.procs, proc)), inflight=inflight
        )
        verb = "claims" if claiming else "starts"
        return (f"worker runs {_msg(m)}: {verb}", nxt, None)

    def _node_claim(self, s: State, r: ClaimReq) -> list[tuple[str, State, Optional[str]]]:
        held = [c for (t, w, c) in s.claims[r.node] if (t, w) == (r.task, r.wid)]
        value = held[0] if held else r.copy
        claims = s.claims
        if not held:
            claims = _at(claims, r.node, _sorted((*claims[r.node], (r.task, r.wid, r.copy))))
        base = s._replace(claims=claims, inflight=_remove(s.inflight, r))
        what = f"node{r.node + 1} claim {_wid(r.task, r.wid)} by copy {r.copy}: holds {value}"
        # A lost or late reply is the same as a decision taken without it (_decide
        # considers every subset of the replies received), so it is always delivered.
        for p in set(base.procs):
            if p.step == CLAIM and (p.task, p.wid, p.copy, p.delivery) == r[1:]:
                q = p._replace(replies=_sorted((*p.replies, value)))
                return [(what, base._replace(procs=_sorted((*_remove(base.procs, p), q))), None)]
        return [(what, base, None)]

    def _proc_step(self, s: State, p: Proc) -> list[tuple[str, State, Optional[str]]]:
        rest = s._replace(procs=_remove(s.procs, p))
        who = f"{_name(p.task)} {KIND_NAMES[p.kind]}"
        if p.step == CLAIM:
            return self._decide_any(s, rest, p, who)
        if p.step == ACQUIRE:
            return [self._acquire(s, rest, p, who)]
        if p.step == REGISTER:
            # Registering and publishing the fallback are one step: no other step can
            # see the fallback message before it exists, so nothing is lost by it.
            nxt = _with(rest, p._replace(step=CHECK))
            published = "publishes NO fallback"
            if self.sc.fallback:
                m = Msg(p.task, FALLBACK, p.wid, 1)
                nxt = nxt._replace(msgs=_sorted((*nxt.msgs, m)))
                published = f"publishes {_msg(m)} (countdown)"
            entry = (p.task, p.wid)
            registered = nxt._replace(queue=_sorted((*nxt.queue, entry)))
            return [
                (f"{who} registers waiter {_wid(*entry)}, {published}", registered, None),
                (f"{who} registration of {_wid(*entry)} lost, {published}", nxt, None),
            ]
        if p.step == CHECK:
            if s.lock == FREE:
                return [
                    (f"{who} sees the lock free: wakes", _with(rest, p._replace(step=WAKING)), None)
                ]
            return [(f"{who} sees the lock held: ends (waits)", rest, None)]
        if p.step == BODY:
            out: list[tuple[str, State, Optional[str]]] = [
                (
                    f"{who} body ends, releases",
                    _with(rest, p._replace(step=WAKING))._replace(lock=FREE),
                    None,
                )
            ]
            if s.crashes_left > 0:
                crashed = rest._replace(lock=DEAD, crashes_left=s.crashes_left - 1)
                out.append(
                    (f"{who} worker CRASHES in the body (lock kept until TTL)", crashed, None)
                )
            return out
        return self._wake(rest, who)

    def _decide_any(
        self, s: State, rest: State, p: Proc, who: str
    ) -> list[tuple[str, State, Optional[str]]]:
        """The decision on any subset of the replies received (the rest lost or late)."""
        subsets = {
            tuple(sorted(p.replies[i] for i in range(len(p.replies)) if mask >> i & 1))
            for mask in range(1 << len(p.replies))
        }
        out: dict[State, tuple[str, State, Optional[str]]] = {}
        for replies in sorted(subsets):
            what, nxt, bad = self._decide(s, rest, p._replace(replies=replies), who)
            out.setdefault(nxt, (what, nxt, bad))
        return list(out.values())

    def _decide(self, s: State, rest: State, p: Proc, who: str) -> tuple[str, State, Optional[str]]:
        sc = self.sc
        answered = list(p.replies)
        counts = {v: answered.count(v) for v in set(answered)}
        if sc.claim_rule == "any":
            winner: Optional[int] = p.copy if p.copy in counts else None
            if winner is None:
                winner = next((v for v, n in counts.items() if n >= sc.quorum), None)
        else:
            winner = next((v for v, n in counts.items() if n >= sc.quorum), None)
            if winner is None and len(answered) == sc.nodes:
                winner = min(counts, key=lambda v: (-counts[v], v))
        seen = f"replies {list(p.replies)}"
        if winner == p.copy:
            return (
                f"{who} WINS claim {_wid(p.task, p.wid)} ({seen})",
                _with(rest, p._replace(step=ACQUIRE)),
                None,
            )
        if winner is not None:
            return (
                f"{who} loses claim to copy {winner} ({seen}): ends, stores nothing",
                rest,
                None,
            )
        if s.retries[p.task] >= sc.budget:
            return (
                f"{who} claim undecided ({seen}), budget spent: gives up",
                _gave_up(rest, p.task),
                None,
            )
        # Re-published with a countdown like a fallback (the broker keeps it as it keeps
        # any message: only the waker's publish can be missing), same ids.
        again = Msg(p.task, FALLBACK, p.wid, p.copy)
        nxt = rest._replace(
            msgs=_sorted((*rest.msgs, again)),
            retries=_at(rest.retries, p.task, rest.retries[p.task] + 1),
        )
        return (f"{who} claim undecided ({seen}): re-published, same ids", nxt, None)

    def _acquire(
        self, s: State, rest: State, p: Proc, who: str
    ) -> tuple[str, State, Optional[str]]:
        if s.lock == FREE:
            violation = None
            if s.outcome[p.task] == RAN:
                violation = f"{RUN_TWICE}: {_name(p.task)}'s body starts a second time"
            elif any(q.step == BODY for q in rest.procs):
                violation = f"{OVERLAP}: {_name(p.task)} starts while another body runs"
            nxt = _with(rest, p._replace(step=BODY))._replace(
                lock=p.task, outcome=_at(s.outcome, p.task, RAN)
            )
            return (f"{who} acquires the lock, body STARTS", nxt, violation)
        if s.retries[p.task] >= self.sc.budget:
            return (f"{who} contended, budget spent: gives up", _gave_up(rest, p.task), None)
        n = s.retries[p.task] + 1
        nxt = _with(
            rest._replace(retries=_at(s.retries, p.task, n)), p._replace(wid=n, step=REGISTER)
        )
        return (f"{who} contended: waits as {_wid(p.task, n)}", nxt, None)

    def _wake(self, rest: State, who: str) -> list[tuple[str, State, Optional[str]]]:
        if not rest.queue:
            return [(f"{who} finds no waiter", rest, None)]
        out: list[tuple[str, State, Optional[str]]] = []
        for entry in rest.queue:
            task, wid = entry
            done = next((n for (t, w, n) in rest.woken if (t, w) == entry), 0)
            woken = _sorted((*(x for x in rest.woken if x[:2] != entry), (task, wid, done + 1)))
            m = Msg(task, WAKE, wid, 2 + done)
            popped = rest._replace(queue=_remove(rest.queue, entry), woken=woken,
                                   msgs=_sorted((*rest.msgs, m)))  # fmt: skip
            out.append((f"{who} pops {_wid(*entry)}, publishes {_msg(m)}", popped, None))
            if done < self.sc.dup_wakes:
                kept = popped._replace(queue=rest.queue)
                out.append(
                    (f"{who} pops {_wid(*entry)} on a minority, publishes {_msg(m)}", kept, None)
                )
        return out

    def lost(self, s: State) -> Optional[str]:
        """In a final state: the tasks that neither ran nor gave up."""
        missing = [_name(t) for t, o in enumerate(s.outcome) if o == PENDING]
        return f"{LOST}: {', '.join(missing)} never ran and never gave up" if missing else None


def _with(s: State, p: Proc) -> State:
    return s._replace(procs=_sorted((*s.procs, p)))


def _gave_up(s: State, task: int) -> State:
    if s.outcome[task] == RAN:  # the other copy of the pair ran it: that stands
        return s
    return s._replace(outcome=_at(s.outcome, task, GAVE_UP))


def _wid(task: int, wid: int) -> str:
    return f"w{task + 1}.{wid}"


def _msg(m: Msg) -> str:
    ids = f" {_wid(m.task, m.wid)} copy {m.copy}" if m.wid else ""
    return f"{_name(m.task)} {KIND_NAMES[m.kind]}{ids}"


@dataclass
class HandoffResult:
    scenario: HandoffScenario
    outcome: str
    states: int = 0
    final_states: int = 0
    bodies_run: int = 0
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
    init = model.initial()
    canonical = model.canonical
    parent: dict[object, Optional[tuple[State, str]]] = {canonical(init): None}
    queue = deque([init])
    result = HandoffResult(scenario, "safe")
    while queue:
        s = queue.popleft()
        steps = model.successors(s)
        violation = None if steps else model.lost(s)
        if not steps:
            result.final_states += 1
            result.bodies_run = max(result.bodies_run, s.outcome.count(RAN))
        end: Optional[State] = s if violation else None
        for what, nxt, bad in steps:
            key = canonical(nxt)
            if key not in parent:
                parent[key] = (s, what)
                queue.append(nxt)
            if bad is not None:
                violation, end = bad, nxt
                break
        if violation is not None and end is not None:
            result.outcome, result.violation = "violation", violation
            result.trace = [*_trace(parent, canonical, end), f"!! VIOLATION: {violation}"]
            break
        if len(parent) >= scenario.max_states:
            result.outcome = "bounded"
            break
    result.states = len(parent)
    result.seconds = time.perf_counter() - started
    return result


def _trace(
    parent: dict[object, Optional[tuple[State, str]]],
    canonical: Callable[[State], object],
    end: State,
) -> list[str]:
    lines: list[str] = []
    node = parent.get(canonical(end))
    while node is not None:
        prev, what = node
        lines.append(what)
        node = parent[canonical(prev)]
    return [f"{i + 1:2d}. {line}" for i, line in enumerate(reversed(lines))]


def handoff_scenarios() -> list[HandoffScenario]:
    control = {"expect": "violation"}
    return [
        HandoffScenario(
            "handoff-2-tasks",
            "two copies of one key, 3 claim nodes, holder crash, lost and duplicate wakes",
            budget=1,
        ),
        HandoffScenario(
            "handoff-claim-retry",
            "two copies, two lock retries each: undecided claims re-published, lost wakes",
            budget=2,
            crashes=0,
            dup_wakes=0,
            full_only=True,
        ),
        HandoffScenario(
            "handoff-3-tasks",
            "three copies of one key, one retry each, holder crash, lost wakes",
            tasks=3,
            budget=1,
            dup_wakes=0,
            full_only=True,
        ),
        HandoffScenario(
            "handoff-no-claim",
            "control: wake and fallback copies both go on (no waiter-id claim)",
            claim=False,
            expect_kind=RUN_TWICE,
            **control,  # type: ignore[arg-type]
        ),
        HandoffScenario(
            "handoff-claim-any-node",
            "control: a copy takes its claim as won when any node holds its id",
            claim_rule="any",
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
    ]


def format_handoff(results: list[HandoffResult]) -> str:
    rows = [("scenario", "expect", "result", "ok", "states", "final", "seconds")]
    for r in results:
        sc = r.scenario
        expect = "safe" if sc.expect == "safe" else f"violation: {sc.expect_kind}"
        got = r.outcome if r.violation is None else f"violation: {r.violation.split(':')[0]}"
        rows.append((sc.name, expect, got, "yes" if r.as_expected else "NO", str(r.states),
                     str(r.final_states), f"{r.seconds:.1f}"))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for r in results:
        if r.trace:
            lines += ["", f"== {r.scenario.name}: shortest counterexample", *r.trace]
    return "\n".join(lines)
