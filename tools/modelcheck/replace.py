"""Queue once in replace mode (``redlock_on_queued="replace"``; SAFETY.md, "Replacing
the pending copy") as a finite transition system; ``replace_check.py`` explores it
and holds the scenarios.

A lock key has a *place* ``P``: a mutex key on N nodes whose value names the queued
copy. Every copy ``X`` has a *fate* ``F(X)``: a claim per node, SET NX, never changed
once set, with the hand-off claim's verdict (``handoff.claim_winner``). Copy 0 (``V``)
is queued: sent, ``P`` names it on every node. Each other copy is a call that enqueues
it in replace mode, with ``patience`` attempts:

a. acquire ``P`` for ``N``; won: send ``N``, done. Contended: ``P`` names ``V``.
c. claim ``F(V)`` with ``N``. WON: ``V`` never runs its body; compare-and-set ``P``
   from ``V`` to ``N``, send ``N``, store ``V``'s result "replaced by N". LOST to
   ``V`` (``V`` started): go to a. LOST to ``X``: ``V`` was replaced by ``X``, claim
   ``F(X)`` next. UNDECIDED: claim again. Each of these spends an attempt; with none
   left ``N`` is sent anyway (no place, no replacement).

``send_first`` (the repair, ``SEND_FIRST``): a contended call sends ``N`` before it
claims anything, so no claim names a copy that is not sent yet. A copy ``X`` that
starts claims ``F(X)`` with ``X``: WON, its body runs and it hands ``P`` back (deletes
``P`` where it names ``X``); LOST to ``Y``: it swaps ``P`` from ``X`` to ``Y`` (as
``Y``'s call does; the protocol leaves ``P`` to ``Y``'s call, which may have crashed),
stores "replaced by Y" and ends; UNDECIDED: it is published again, same id (a split
with a node down and every node that is up answered goes round until the node is
back: ``SPINNING``).
``NAIVE`` (a control): no fates; the replacer swaps ``P`` and marks ``V``, and a
starting copy reads ``P`` and, when a quorum names it, then runs its body.

What may happen, in any order: the broker delivers any message at any time; a claim
request lands at any time or never and its reply may be lost; a party decides on the
replies it has at any moment (``early`` such decisions in a run), after which replies
to its requests still on their way are lost; up to ``down`` nodes go down for good; an
enqueuing call crashes at any step (``crashes``; its claim requests still land). A
``P`` round is one step over the nodes that are up (``P`` only says whom to claim:
what never runs is decided by fates alone). Left out: node restarts (a node that
restarts empty loses fates: the delayed restart keeps them, as for the lock), and
``P``'s TTL.

Invariants: a copy marked replaced never starts its body, and (sending first) the copy
it names was sent when it was marked (R1); no copy both runs and is marked replaced
(R2); in every final state each sent copy ran, goes round, or is
marked replaced by a copy that was sent (or is itself marked replaced, onwards: R3).
Counted, not asserted (R4): states with two pending copies (sent, not ended, no
quorum of their fate naming another copy), and how many follow a "send anyway".
Standard library only; imports nothing of ``celery_redlock``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional

from .handoff import _at, _remove, _sorted, claim_winner

REPLACED_RUNS = "a replaced copy runs"
RAN_AND_REPLACED = "ran and marked replaced"
LOST = "task lost"
#: R1 where the order allows checking it at once: marked replaced by a copy not sent.
UNSENT_MARK = "replaced by a copy not sent"

CLAIM_THEN_SEND, SEND_FIRST, NAIVE = "claim-then-send", "send-first", "naive"
#: A node's empty value (no place, no claim) and "no marker".
NIL = -1
# Enqueuer steps.
ACQ, CLAIM, SWAP, SEND, MARK = range(5)
# Worker steps (a copy starting): CLAIM as above; naive: READ, then RUN.
READ, RUN = 5, 6
NOBODY = 0
# Copy outcomes.
PENDING, RAN, REPLACED, SPINNING = range(4)


@dataclass(frozen=True)
class ReplaceScenario:
    name: str
    description: str
    #: copies enqueued in replace mode while copy 0 is queued.
    replacers: int = 2
    nodes: int = 3
    design: str = CLAIM_THEN_SEND
    #: attempts of one enqueuing call (each claim or place round after the first).
    patience: int = 2
    #: enqueuing calls that crash, in the whole run.
    crashes: int = 0
    #: early decisions in the whole run (replies late or lost).
    early: int = 1
    #: nodes that may go down for good (at most nodes - quorum).
    down: int = 0
    #: with its attempts spent on an undecided claim the call sends ``N`` anyway;
    #: else it raises (a control).
    send_anyway: bool = True
    expect: str = "safe"
    expect_kind: str = ""
    max_states: int = 3_000_000
    full_only: bool = False

    @property
    def quorum(self) -> int:
        return self.nodes // 2 + 1


class Enq(NamedTuple):
    """An enqueuing call for ``copy``; ``target``: the copy whose fate it claims."""

    copy: int
    step: int
    target: int
    left: int
    replies: tuple[int, ...] = ()


class Run(NamedTuple):
    """A worker starting ``copy``."""

    copy: int
    step: int
    replies: tuple[int, ...] = ()


class Req(NamedTuple):
    node: int
    #: the copy whose fate is claimed, and the value written.
    fate: int
    value: int
    #: the claimant awaiting the reply: an enqueuing call (its copy, >= 1), a worker
    #: (-1 - copy), or NOBODY.
    waiter: int


class State(NamedTuple):
    msgs: tuple[int, ...]
    enqs: tuple[Enq, ...]
    runs: tuple[Run, ...]
    #: per node: ``P``'s value, and each copy's fate.
    place: tuple[int, ...]
    fates: tuple[tuple[int, ...], ...]
    inflight: tuple[Req, ...]
    down: tuple[bool, ...]
    sent: tuple[bool, ...]
    outcome: tuple[int, ...]
    #: per copy: the copy its stored result says it was replaced by, or NIL.
    marker: tuple[int, ...]
    #: a call sent its copy anyway (attempts spent, no replacement).
    fallback: bool
    crashes_left: int
    early_left: int


Step = tuple[str, State, Optional[str]]
#: the replies decided on, whether early, and the state after.
Decision = tuple[tuple[int, ...], bool, State]


def name(copy: int) -> str:
    return "V" if copy == 0 else f"N{copy}"


def _names(values: tuple[int, ...]) -> str:
    return "[" + ", ".join("nil" if v == NIL else name(v) for v in values) + "]"


class ReplaceModel:
    def __init__(self, scenario: ReplaceScenario) -> None:
        self.sc = scenario
        self.copies = scenario.replacers + 1
        #: transitions (> 0: reachable): a replacer won a fate, a call sent anyway,
        #: a call followed a chain, a start lost its fate.
        self.replaced = self.fallbacks = self.chains = self.lost_starts = 0

    def initial(self) -> State:
        sc, n = self.sc, self.copies
        enqs = tuple(Enq(c, ACQ, NIL, sc.patience) for c in range(1, n))
        return State(
            (0,), enqs, (), tuple(0 for _ in range(sc.nodes)),
            tuple(tuple(NIL for _ in range(n)) for _ in range(sc.nodes)), (),
            tuple(False for _ in range(sc.nodes)), (True, *(False for _ in range(1, n))),
            tuple(PENDING for _ in range(n)), tuple(NIL for _ in range(n)), False,
            sc.crashes, sc.early,
        )  # fmt: skip

    def canonical(self, s: State) -> object:
        """``s`` with the nodes sorted: nothing outside a node's values and the
        requests on their way to it names a node."""
        bundles = sorted(
            (s.down[i], s.place[i], s.fates[i], _sorted(r[1:] for r in s.inflight if r.node == i))
            for i in range(self.sc.nodes)
        )
        return (s.msgs, s.enqs, s.runs, tuple(bundles), s.sent, s.outcome, s.marker,
                s.fallback, s.crashes_left, s.early_left)  # fmt: skip

    def successors(self, s: State) -> list[Step]:
        out: list[Step] = []
        for m in sorted(set(s.msgs)):
            out.append(self._deliver(s, m))
        for r in sorted(set(s.inflight)):
            out.append(self._land(s, r))
        for e in s.enqs:
            out.extend(self._enq_step(s, e))
            if s.crashes_left > 0:
                nxt = self._forget(s._replace(enqs=_remove(s.enqs, e)), e.copy)
                nxt = nxt._replace(crashes_left=s.crashes_left - 1)
                out.append((f"{name(e.copy)}'s enqueuing call CRASHES", nxt, None))
        for w in s.runs:
            out.extend(self._run_step(s, w))
        if sum(s.down) < self.sc.down:
            for i in range(self.sc.nodes):
                if not s.down[i]:
                    inflight = tuple(r for r in s.inflight if r.node != i)
                    nxt = s._replace(down=_at(s.down, i, True), inflight=inflight)
                    out.append((f"node{i + 1} goes DOWN (for good)", nxt, None))
        return out

    # -- claims -------------------------------------------------------------------

    def _claim(self, s: State, fate: int, value: int, waiter: int) -> State:
        reqs = (Req(i, fate, value, waiter) for i in range(self.sc.nodes) if not s.down[i])
        return s._replace(inflight=_sorted((*s.inflight, *reqs)))

    def _forget(self, s: State, waiter: int) -> State:
        """``waiter``'s replies are no longer awaited (it decided or crashed); requests
        nobody awaits that can change nothing (their node holds that fate) are dropped."""
        kept = set()
        for r in s.inflight:
            r = r._replace(waiter=NOBODY) if r.waiter == waiter else r
            if r.waiter != NOBODY or s.fates[r.node][r.fate] == NIL:
                kept.add(r)
        return s._replace(inflight=_sorted(kept))

    def _land(self, s: State, r: Req) -> Step:
        held = s.fates[r.node][r.fate]
        value = r.value if held == NIL else held
        fates = _at(s.fates, r.node, _at(s.fates[r.node], r.fate, value))
        base = s._replace(fates=fates, inflight=_remove(s.inflight, r))
        what = f"node{r.node + 1} F({name(r.fate)}) <- {name(r.value)}: holds {name(value)}"
        base = self._forget(base, NOBODY)
        if r.waiter == NOBODY:
            return (f"{what} (reply not awaited)", base, None)
        if r.waiter >= 0:
            e = next(e for e in base.enqs if e.copy == r.waiter)
            e2 = e._replace(replies=_sorted((*e.replies, value)))
            return (what, base._replace(enqs=_sorted((*_remove(base.enqs, e), e2))), None)
        w = next(w for w in base.runs if w.copy == -1 - r.waiter)
        w2 = w._replace(replies=_sorted((*w.replies, value)))
        return (what, base._replace(runs=_sorted((*_remove(base.runs, w), w2))), None)

    def _decisions(self, s: State, replies: tuple[int, ...], waiter: int) -> list[Decision]:
        """``(replies, early, state)`` for each decision open: on every reply once every
        request landed, and (the budget allowing) early on any part of them."""
        waiting = any(r.waiter == waiter for r in s.inflight)
        rest = self._forget(s, waiter)
        out: list[Decision] = [] if waiting else [(replies, False, rest)]
        if s.early_left > 0:
            spent = rest._replace(early_left=s.early_left - 1)
            subsets = {
                tuple(sorted(replies[i] for i in range(len(replies)) if mask >> i & 1))
                for mask in range(1 << len(replies))
            }
            out += [(sub, True, spent) for sub in sorted(subsets) if waiting or sub != replies]
        return out

    def _split(self, s: State, replies: tuple[int, ...], early: bool) -> bool:
        """Undecided for good: every node that is up answered, a node is down."""
        return not early and any(s.down) and len(replies) == self.sc.nodes - sum(s.down)

    # -- enqueuing calls ------------------------------------------------------------

    def _enq_step(self, s: State, e: Enq) -> list[Step]:
        rest = s._replace(enqs=_remove(s.enqs, e))
        who = f"{name(e.copy)}'s call"
        if e.step == ACQ:
            return self._acquire(rest, e, who)
        if e.step == CLAIM:
            if any(r.waiter == e.copy for r in s.inflight) and s.early_left == 0:
                return []
            out = []
            for replies, early, base in self._decisions(rest, e.replies, e.copy):
                out.append(self._claimed(base, e, replies, early, who))
            return out
        if e.step == SWAP:
            swapped = self._swap(rest, e.target, e.copy)
            then = MARK if self.sc.design == SEND_FIRST else SEND
            what = f"{who} swaps P from {name(e.target)} to {name(e.copy)}"
            what += f" -> {_names(swapped.place)}"
            return [(what, _with(swapped, e._replace(step=then)), None)]
        if e.step == SEND:
            nxt = self._send(rest, e.copy)
            if e.target == NIL:
                return [(f"{who} sends {name(e.copy)}: done", nxt, None)]
            return [(f"{who} sends {name(e.copy)}", _with(nxt, e._replace(step=MARK)), None)]
        return [self._mark(rest, e.target, e.copy, f"{who} stores {name(e.target)}'s result")]

    def _send(self, s: State, copy: int) -> State:
        return s._replace(msgs=_sorted((*s.msgs, copy)), sent=_at(s.sent, copy, True))

    def _mark(self, s: State, copy: int, by: int, what: str) -> Step:
        bad = None
        if s.outcome[copy] == RAN:
            bad = f"{RAN_AND_REPLACED}: {name(copy)} ran and is marked replaced by {name(by)}"
        elif self.sc.design == SEND_FIRST and not s.sent[by]:
            # Sending first, a fate is only ever claimed for a copy already sent.
            bad = f"{UNSENT_MARK}: {name(copy)} marked replaced by {name(by)}, not sent"
        nxt = s._replace(marker=_at(s.marker, copy, by))
        return (f"{what} 'replaced by {name(by)}'", nxt, bad)

    def _acquire(self, rest: State, e: Enq, who: str) -> list[Step]:
        sc = self.sc
        up = [i for i in range(sc.nodes) if not rest.down[i]]
        place = tuple(e.copy if v == NIL and not rest.down[i] else v
                      for i, v in enumerate(rest.place))  # fmt: skip
        if sum(place[i] == e.copy for i in up) >= sc.quorum:
            what = f"{who} acquires P -> {_names(place)}"
            nxt = rest._replace(place=place)
            if nxt.sent[e.copy]:
                return [(f"{what} ({name(e.copy)} sent before): done", nxt, None)]
            return [(what, _with(nxt, e._replace(step=SEND, target=NIL)), None)]
        released = tuple(NIL if v == e.copy and not rest.down[i] else v
                         for i, v in enumerate(place))  # fmt: skip
        base = rest._replace(place=released)
        out: list[Step] = []
        for v in sorted({place[i] for i in up} - {e.copy, NIL}):
            what = f"{who} contended: P names {name(v)} ({_names(rest.place)})"
            if sc.design == NAIVE:
                nxt = _with(base, e._replace(step=SWAP, target=v))
                out.append((f"{what}, replaces it", nxt, None))
                continue
            if sc.design == SEND_FIRST and not base.sent[e.copy]:
                base, what = self._send(base, e.copy), f"{what}, sends {name(e.copy)}"
            claimed = self._claim(base, v, e.copy, e.copy)
            out.append((f"{what}, claims F({name(v)})", _with(claimed, e._replace(step=CLAIM,
                        target=v, replies=())), None))  # fmt: skip
        return out

    def _claimed(self, s: State, e: Enq, replies: tuple[int, ...], early: bool, who: str) -> Step:
        v, winner = e.target, claim_winner(replies, self.sc.nodes)
        late = ", deadline passed" if early else ""
        claim = f"F({name(v)}) {_names(replies)}{late}"
        e = e._replace(replies=())
        if winner == e.copy:
            self.replaced += 1
            return (f"{who} WINS {claim}", _with(s, e._replace(step=SWAP)), None)
        if e.left == 0:
            return self._spent(s, e, f"{who} {claim}: " + ("undecided" if winner is None
                               else f"lost to {name(winner)}"))  # fmt: skip
        e = e._replace(left=e.left - 1)
        if winner == v:
            nxt = _with(s, e._replace(step=ACQ, target=NIL))
            return (f"{who} loses {claim} ({name(v)} started): back to P", nxt, None)
        if winner is not None:
            self.chains += 1
            nxt = _with(self._claim(s, winner, e.copy, e.copy), e._replace(target=winner))
            return (f"{who} loses {claim}: claims F({name(winner)})", nxt, None)
        nxt = _with(self._claim(s, v, e.copy, e.copy), e)
        return (f"{who} {claim} undecided: claims again", nxt, None)

    def _spent(self, s: State, e: Enq, what: str) -> Step:
        if s.sent[e.copy]:
            return (f"{what}, attempts spent ({name(e.copy)} sent before)", s, None)
        if not self.sc.send_anyway:
            return (f"{what}, attempts spent: RAISES ({name(e.copy)} not sent)", s, None)
        self.fallbacks += 1
        nxt = self._send(s, e.copy)._replace(fallback=True)
        return (f"{what}, attempts spent: sends {name(e.copy)} ANYWAY", nxt, None)

    # -- copies starting ----------------------------------------------------------

    def _deliver(self, s: State, copy: int) -> Step:
        rest = s._replace(msgs=_remove(s.msgs, copy))
        what = f"worker starts {name(copy)}"
        if self.sc.design == NAIVE:
            return (f"{what}: reads P", _run(rest, Run(copy, READ)), None)
        claimed = self._claim(rest, copy, copy, -1 - copy)
        return (f"{what}: claims F({name(copy)})", _run(claimed, Run(copy, CLAIM)), None)

    def _run_step(self, s: State, w: Run) -> list[Step]:
        rest = s._replace(runs=_remove(s.runs, w))
        who = f"{name(w.copy)}"
        if w.step == READ:
            named = sum(v == w.copy for v, d in zip(s.place, s.down) if not d)
            if named >= self.sc.quorum:
                return [(f"{who} reads P {_names(s.place)}: its own", _run(rest, w._replace(
                    step=RUN)), None)]  # fmt: skip
            nxt = rest._replace(outcome=_at(rest.outcome, w.copy, REPLACED))
            return [(f"{who} reads P {_names(s.place)}: not its own, ends", nxt, None)]
        if w.step == RUN:
            return [self._body(rest, w.copy, f"{who}:")]
        waiter = -1 - w.copy
        if any(r.waiter == waiter for r in s.inflight) and s.early_left == 0:
            return []
        out = []
        for replies, early, base in self._decisions(rest, w.replies, waiter):
            out.append(self._started(base, w.copy, replies, early))
        return out

    def _body(self, s: State, copy: int, what: str) -> Step:
        bad = None
        if s.marker[copy] != NIL:
            bad = f"{REPLACED_RUNS}: {name(copy)} marked replaced by {name(s.marker[copy])}"
        nxt = self._swap(s._replace(outcome=_at(s.outcome, copy, RAN)), copy, NIL)
        return (f"{what} its body STARTS, hands P back", nxt, bad)

    def _swap(self, s: State, old: int, new: int) -> State:
        """``P`` from ``old`` to ``new`` (NIL: deleted) on each node that is up."""
        return s._replace(place=tuple(new if v == old and not d else v
                                      for v, d in zip(s.place, s.down)))  # fmt: skip

    def _started(self, s: State, copy: int, replies: tuple[int, ...], early: bool) -> Step:
        winner = claim_winner(replies, self.sc.nodes)
        late = ", deadline passed" if early else ""
        claim = f"{name(copy)} F({name(copy)}) {_names(replies)}{late}"
        if winner == copy:
            return self._body(s, copy, f"{claim}: WINS,")
        if winner is not None:
            self.lost_starts += 1
            ended = self._swap(s._replace(outcome=_at(s.outcome, copy, REPLACED)), copy, winner)
            return self._mark(ended, copy, winner, f"{claim}: lost, swaps P to it, stores")
        if self._split(s, replies, early):
            nxt = s._replace(outcome=_at(s.outcome, copy, SPINNING))
            return (f"{claim}: split, goes round until the down node is back", nxt, None)
        return (f"{claim}: undecided, published again", self._send(s, copy), None)

    def lost(self, s: State) -> Optional[str]:
        """R3 in a final state: the sent copies that did not end as they should."""
        missing = []
        for c in range(self.copies):
            if not s.sent[c] or s.outcome[c] in (RAN, SPINNING):
                continue
            by, seen = s.marker[c], {c}
            while by != NIL and not s.sent[by] and by not in seen:
                seen.add(by)
                by = s.marker[by]
            if by == NIL or not s.sent[by]:
                by = s.marker[c]
                why = f"replaced by {name(by)}, never sent" if by != NIL else "never ran"
                missing.append(f"{name(c)} ({why})")
        return f"{LOST}: {', '.join(missing)}" if missing else None

    def pending(self, s: State) -> int:
        """R4: sent copies not started and not replaced (no quorum holds their fate)."""
        count = 0
        for c in range(self.copies):
            if s.sent[c] and s.outcome[c] == PENDING and s.marker[c] == NIL:
                held = [node[c] for node in s.fates if node[c] != NIL]
                count += all(held.count(x) < self.sc.quorum for x in held)
        return count


def _with(s: State, e: Enq) -> State:
    return s._replace(enqs=_sorted((*s.enqs, e)))


def _run(s: State, w: Run) -> State:
    return s._replace(runs=_sorted((*s.runs, w)))
