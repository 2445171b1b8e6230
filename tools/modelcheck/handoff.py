"""The hand-off to waiting duplicates (SAFETY.md, "Hand-off to waiting duplicates")
as a finite transition system; ``handoff_check.py`` explores it and holds the
scenarios.

The lock itself is one atomic mutex here (its quorum algorithm is model.py's
subject); what this model adds is what hand-off brings: copies of a task that
meet the held lock register as waiters, publish a fallback copy and end; a
releasing holder pops a waiter and publishes a wake copy; copies carrying the same
waiter id settle which one goes on by a claim written with SET NX on N nodes,
counted with a quorum (every node answered and no quorum: the id on the most nodes,
ties to the smallest).

Two designs. ``UNDER_LOCK`` (the protocol): a copy carrying a waiter id first takes
the lock, then claims. A contended one first reads the claim (``claim_read``): when
the claim is, or may be, its own copy id's it keeps its ids -- it counts a retry and
is re-published as a fallback with the same waiter and copy ids, registering nothing.
Otherwise a contended wake re-registers and ends; a contended fallback counts a
retry, registers the same id again and publishes the next fallback (a fresh copy
id). Once its retries are spent a copy claims without the lock and gives up only if
it won. ``CLAIM_FIRST`` (the earlier design, kept as a control): every copy carrying
a waiter id claims before it takes the lock, and each contention takes a fresh id.

What may happen, in any order:

* the broker delivers any message at any time (countdowns and queues are just
  delay), and loses any wake message;
* a claim request reaches its node at any time or never, and its reply may be
  lost; a copy decides on the replies it has at any moment (its deadline); a copy
  that decided stops listening (replies to its requests still on their way are lost);
* up to ``down`` nodes go down for good at any time (they never answer again);
* a registration is lost; a waiter entry expires at any time; a waker pops an
  entry on some nodes only, so the same waiter can be woken again (``dup_wakes``);
* the holder crashes in its body (its lock frees at its TTL, the ``expire`` step);
  with ``redeliver`` (``acks_late`` and ``reject_on_worker_lost``) the broker then
  delivers that same message again: same kind, waiter id, copy id and retries, so it,
  and only it, can still win the claim its crashed run won.

A claim read is one step: the values every node that is up holds at that moment (nil
where none), taken at any moment after the contention, so it may miss any claim
request still on its way; an early decision drops any of its replies. (Atomic, not a
request per node landing on its own: those interleavings cost 3 times the states,
and a read's use is to find its own copy's claim, which was set before that copy's
body started, hence before the read.)

A crashed body is not a run: its message may run the body again (at least once, as
any ``acks_late`` task; the body must be idempotent for that). Its task must still
run or give up (else it is lost), and starting the body again or giving up is no
violation; a body that ended is a run, and any start after it is ``RUN_TWICE``.

Copy ids are renumbered in the canonical form (kept in order, per task), so a copy
re-published any number of times does not make the state space infinite.
Standard library only; imports nothing of ``celery_redlock``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional

RUN_TWICE = "body run twice"
OVERLAP = "two bodies at once"
LOST = "task lost"
#: gave up on a claim that a quorum answered with no copy id on a quorum (a split,
#: not an outage: at most N - quorum nodes are ever down here).
SPLIT_GIVE_UP = "gave up on a split claim"
#: a task both ran and gave up (its stored outcome overwritten).
TWO_OUTCOMES = "ran and gave up"
#: not a fault: the probe (``probe_split``) for the shortest way to a split claim.
SPLIT = "claim split"

UNDER_LOCK, CLAIM_FIRST = "claim-under-lock", "claim-first"
# Message kinds.
# A wake re-published by itself (undecided claim) is REWAKE: the broker keeps it (only
# a waker's publish can be missing) and, in the "wake" variant, it still acts as a wake.
# A wake delivered again after its run crashed is REDELIVERED_WAKE: a wake the broker
# keeps (it was published; only a waker's publish can be missing).
ORIGINAL, FALLBACK, WAKE, REWAKE, REDELIVERED_WAKE = 0, 1, 2, 3, 4
KIND_NAMES = ("original", "fallback", "wake", "wake (re-published)", "wake (redelivered)")
WAKES = (WAKE, REWAKE, REDELIVERED_WAKE)
# Process steps: ACQUIRE first; CLAIM under the lock; LAST_CLAIM without the lock
# before giving up; FIRST_CLAIM before the lock (claim-first); READ, the claim read
# of a contended copy carrying a waiter id.
ACQUIRE, CLAIM, LAST_CLAIM, FIRST_CLAIM, REGISTER, CHECK, BODY, WAKING, READ = range(9)
CLAIMING = (CLAIM, LAST_CLAIM, FIRST_CLAIM)
#: a claim read's reply from a node that holds no claim for the waiter id.
NIL = -1
# Lock states besides "held by task t".
FREE, DEAD = -1, -2
# Task outcomes; SPINNING: a copy saw a split claim with a node down and goes round
# (re-published, spending nothing) until the node answers again -- not explored further.
# CRASHED: its body started and died, and its message is delivered again (``redeliver``):
# not a run, not an end.
PENDING, RAN, GAVE_UP, SPINNING, CRASHED = 0, 1, 2, 3, 4


@dataclass(frozen=True)
class HandoffScenario:
    """One configuration: tasks, nodes, faults, protocol variant, expectation."""

    name: str
    description: str
    tasks: int = 2
    nodes: int = 3
    #: lock retries per task (carried in each copy's message).
    budget: int = 1
    #: holder crashes allowed in the whole run.
    crashes: int = 1
    #: the broker delivers a crashed body's message again (``acks_late`` with
    #: ``reject_on_worker_lost``); else the crash ends that copy (early ack).
    redeliver: bool = False
    #: only a copy carrying a waiter id (it won that id's claim) crashes in its body;
    #: else any holder does, an original too (whose redelivery contends afresh as a
    #: third copy of the key: 32 times the states).
    crash_claimants_only: bool = False
    #: extra wakes of one waiter (an entry popped on a minority of nodes only).
    dup_wakes: int = 1
    #: nodes that may go down for good (at most nodes - quorum).
    down: int = 0
    #: early decisions in the whole run: a copy's deadline passes before every node
    #: that is up answered (replies late or lost); otherwise a copy decides once
    #: every request it sent has landed.
    early: int = 1
    design: str = UNDER_LOCK
    #: protocol variant switches (a negative control turns one off).
    claim: bool = True
    fallback: bool = True
    #: "quorum" (the protocol) or "any" (won when any node says ours: a bug).
    claim_rule: str = "quorum"
    #: a contended wake registers its waiter id again (else it just ends).
    wake_registers: bool = True
    #: a contended copy carrying a waiter id reads the claim first and keeps its ids
    #: when the claim is, or may be, its own (else: the rule before redelivery was
    #: looked at, a control).
    claim_read: bool = True
    #: which read drops the copy (it ends storing nothing): "final" (the protocol:
    #: another copy's claim on a quorum, or the plurality of a claim every node
    #: holds), "never" (the rule before: it goes on as any contended copy), "any"
    #: (any node naming another copy: a bug, a control).
    drop_on_read: str = "final"
    #: a copy re-published after its own claim round was undecided is marked (the
    #: claim-tried header) and keeps its ids for good, reading nothing: its requests
    #: may land after any read (else: it reads like any copy, a control).
    claim_tried: bool = True
    #: the state to start from (``OPENINGS``), else every task's original in the queue.
    opening: str = ""
    #: what a holder does with an undecided claim once its retries are spent:
    #: "give-up" (as any spent budget) or "republish" (spends nothing, goes again).
    exhausted_undecided: str = "republish"
    #: what a copy re-published after an undecided claim acts as when contended:
    #: "fallback" (counts a retry, publishes the next fallback) or "wake" (as it was).
    republish_as: str = "fallback"
    #: invariants not checked here (a control aimed at another one).
    ignore: tuple[str, ...] = ()
    #: report the first split claim as a violation (to print the shortest way there).
    probe_split: bool = False
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
    #: lock retries spent, carried in the message.
    tries: int
    #: the claim-tried header: its ids tried a claim whose round was undecided.
    tried: bool = False


class Proc(NamedTuple):
    """A copy being run by a worker."""

    task: int
    kind: int
    wid: int
    copy: int
    tries: int
    step: int
    #: the claim values its nodes answered (a multiset: which node said what does
    #: not matter, and each request is answered once).
    replies: tuple[int, ...]
    tried: bool = False


class ClaimReq(NamedTuple):
    node: int
    task: int
    wid: int
    copy: int
    #: False once its sender decided: it still lands, its reply is not counted.
    live: bool


class State(NamedTuple):
    msgs: tuple[Msg, ...]
    procs: tuple[Proc, ...]
    lock: int
    #: waiter entries (task, wid, tries of the registered message); one per wid.
    queue: tuple[tuple[int, int, int], ...]
    #: per node: sorted (task, wid, copy) claims; never deleted.
    claims: tuple[tuple[tuple[int, int, int], ...], ...]
    inflight: tuple[ClaimReq, ...]
    down: tuple[bool, ...]
    outcome: tuple[int, ...]
    #: per task: the next fresh waiter id and copy id.
    ids: tuple[tuple[int, int], ...]
    dups_left: int
    crashes_left: int
    early_left: int


Step = tuple[str, State, Optional[str]]


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
        self.new = scenario.design == UNDER_LOCK
        #: split claims decided on (transitions, not states): > 0 means reachable.
        self.splits = 0
        #: claim reads that kept the copy's ids, and bodies started again after a crash
        #: (transitions): > 0 means the redelivery rule was exercised.
        self.kept = 0
        self.reruns = 0

    def initial(self) -> State:
        sc = self.sc
        if sc.opening:
            return OPENINGS[sc.opening](sc)
        return State(
            _sorted(Msg(t, ORIGINAL, 0, 0, 0) for t in range(sc.tasks)), (), FREE, (),
            tuple(() for _ in range(sc.nodes)), (), tuple(False for _ in range(sc.nodes)),
            tuple(PENDING for _ in range(sc.tasks)), tuple((1, 1) for _ in range(sc.tasks)),
            sc.dup_wakes, sc.crashes, sc.early,
        )  # fmt: skip

    def canonical(self, s: State) -> tuple[object, ...]:
        """``s`` with the nodes sorted (nothing outside a node's claims and the
        requests on their way to it names a node) and each task's copy ids renumbered
        0, 1, ... in order (only their order and equality matter)."""
        used: list[set[int]] = [set() for _ in range(self.sc.tasks)]
        for m in s.msgs:
            used[m.task].add(m.copy)
        for p in s.procs:
            used[p.task].update((p.copy, *p.replies))
        for node in s.claims:
            for t, _, c in node:
                used[t].add(c)
        for r in s.inflight:
            used[r.task].add(r.copy)
        ren = [{c: i for i, c in enumerate(sorted(u))} for u in used]
        msgs = _sorted(m._replace(copy=ren[m.task][m.copy]) for m in s.msgs)
        procs = _sorted(
            p._replace(copy=ren[p.task][p.copy], replies=tuple(ren[p.task][v] for v in p.replies))
            for p in s.procs
        )
        bundles = sorted(
            (
                s.down[i],
                tuple((t, w, ren[t][c]) for t, w, c in s.claims[i]),
                _sorted(
                    (r.task, r.wid, ren[r.task][r.copy], r.live) for r in s.inflight if r.node == i
                ),
            )
            for i in range(self.sc.nodes)
        )
        ids = tuple((w, len(u)) for (w, _), u in zip(s.ids, used))
        return (msgs, procs, s.lock, s.queue, tuple(bundles), s.outcome, ids, s.dups_left,
                s.crashes_left, s.early_left)  # fmt: skip

    def successors(self, s: State) -> list[Step]:
        out: list[Step] = []
        for m in sorted(set(s.msgs)):
            out.append(self._deliver(s, m))
            if m.kind == WAKE:
                out.append((f"broker loses {_msg(m)}", s._replace(msgs=_remove(s.msgs, m)), None))
        for r in sorted(set(s.inflight)):
            out.append(self._land(s, r))
        for p in sorted(set(s.procs)):
            out.extend(self._proc_step(s, p))
        if s.lock == DEAD:
            out.append(("the crashed holder's lock expires (TTL)", s._replace(lock=FREE), None))
        for e in s.queue:
            what = f"waiter {_wid(*e[:2])} entry expires"
            out.append((what, s._replace(queue=_remove(s.queue, e)), None))
        if sum(s.down) < self.sc.down:
            for i in range(self.sc.nodes):
                if not s.down[i]:
                    inflight = tuple(r for r in s.inflight if r.node != i)
                    nxt = s._replace(down=_at(s.down, i, True), inflight=inflight)
                    out.append((f"node{i + 1} goes DOWN (for good)", nxt, None))
        return out

    # -- steps ------------------------------------------------------------------

    def _bad(self, kind: str, text: str) -> Optional[str]:
        return None if kind in self.sc.ignore else f"{kind}: {text}"

    def _deliver(self, s: State, m: Msg) -> Step:
        rest = s._replace(msgs=_remove(s.msgs, m))
        proc = Proc(m.task, m.kind, m.wid, m.copy, m.tries, ACQUIRE, (), m.tried)
        if not self.new and m.wid > 0 and self.sc.claim:
            return (f"worker runs {_msg(m)}: claims", self._send(rest, proc, FIRST_CLAIM), None)
        return (f"worker runs {_msg(m)}: starts", _with(rest, proc), None)

    def _send(self, s: State, p: Proc, step: int) -> State:
        """``p`` claims its waiter id: one SET NX request to every node that is up."""
        reqs = [ClaimReq(i, p.task, p.wid, p.copy, True) for i in range(self.sc.nodes)
                if not s.down[i]]  # fmt: skip
        inflight = _sorted((*s.inflight, *reqs))
        return _with(s._replace(inflight=inflight), p._replace(step=step, replies=()))

    def _land(self, s: State, r: ClaimReq) -> Step:
        held = [c for (t, w, c) in s.claims[r.node] if (t, w) == (r.task, r.wid)]
        value = held[0] if held else r.copy
        claims = s.claims
        if not held:
            claims = _at(claims, r.node, _sorted((*claims[r.node], (r.task, r.wid, r.copy))))
        base = _tidy(s._replace(claims=claims), list(_remove(s.inflight, r)))
        what = f"node{r.node + 1} claim {_wid(r.task, r.wid)} by copy {r.copy}: holds {value}"
        # A lost or late reply is the same as an early decision taken without it
        # (_decide_any considers every subset of the replies), so it is always delivered.
        for p in set(base.procs) if r.live else ():
            if p.step in CLAIMING and (p.task, p.wid, p.copy) == r[1:4]:
                q = p._replace(replies=_sorted((*p.replies, value)))
                return (what, base._replace(procs=_sorted((*_remove(base.procs, p), q))), None)
        return (what if r.live else f"{what} (reply not awaited)", base, None)

    def _proc_step(self, s: State, p: Proc) -> list[Step]:
        rest = s._replace(procs=_remove(s.procs, p))
        who = f"{_name(p.task)} {KIND_NAMES[p.kind]}"
        if p.step in CLAIMING:
            return self._decide_any(rest, p, who)
        if p.step == READ:
            return self._read_any(rest, p, who)
        if p.step == ACQUIRE:
            return self._acquire(s, rest, p, who)
        if p.step == REGISTER:
            # Registering and publishing the fallback are one step: no other step can
            # see the fallback message before it exists, so nothing is lost by it.
            nxt = _with(rest, p._replace(step=CHECK))
            published = "publishes NO fallback"
            if self.sc.fallback:
                nxt, m = _publish(nxt, p.task, FALLBACK, p.wid, p.tries)
                published = f"publishes {_msg(m)} (countdown)"
            return self._register(nxt, p, who, published)
        if p.step == CHECK:
            if s.lock == FREE:
                return [
                    (f"{who} sees the lock free: wakes", _with(rest, p._replace(step=WAKING)), None)
                ]
            return [(f"{who} sees the lock held: ends (waits)", rest, None)]
        if p.step == BODY:
            out: list[Step] = [
                (
                    f"{who} body ends, releases",
                    _with(rest, p._replace(step=WAKING))._replace(lock=FREE),
                    None,
                )
            ]
            if s.crashes_left > 0 and (p.wid > 0 or not self.sc.crash_claimants_only):
                out.append(self._crash(rest, p, who))
            return out
        return self._wake(rest, who)

    def _crash(self, rest: State, p: Proc, who: str) -> Step:
        crashed = rest._replace(lock=DEAD, crashes_left=rest.crashes_left - 1)
        what = f"{who} worker CRASHES in the body (lock kept until TTL)"
        if not self.sc.redeliver:
            return (what, crashed, None)
        kind = REDELIVERED_WAKE if p.kind in WAKES else p.kind
        m = Msg(p.task, kind, p.wid, p.copy, p.tries, p.tried)
        outcome = _at(crashed.outcome, p.task, CRASHED)
        nxt = crashed._replace(msgs=_sorted((*crashed.msgs, m)), outcome=outcome)
        return (f"{what}, the broker delivers {_msg(m)} again", nxt, None)

    def _register(self, s: State, p: Proc, who: str, published: str) -> list[Step]:
        entry = (p.task, p.wid, p.tries)
        queue = _sorted((*(e for e in s.queue if e[:2] != entry[:2]), entry))
        w = _wid(p.task, p.wid)
        return [
            (f"{who} registers waiter {w}, {published}", s._replace(queue=queue), None),
            (f"{who} registration of {w} lost, {published}", s, None),
        ]

    def _acquire(self, s: State, rest: State, p: Proc, who: str) -> list[Step]:
        sc = self.sc
        if s.lock == FREE:
            if self.new and p.wid > 0 and sc.claim:
                nxt = self._send(rest._replace(lock=p.task), p, CLAIM)
                return [(f"{who} acquires the lock, claims {_wid(p.task, p.wid)}", nxt, None)]
            return [self._start_body(rest, p, f"{who} acquires the lock")]
        if self.new and p.wid > 0 and sc.claim and p.tried:
            return self._keep(rest, p, f"{who} contended, its claim tried:")
        if self.new and p.wid > 0 and sc.claim and sc.claim_read:
            nxt = _with(rest, p._replace(step=READ))
            return [(f"{who} contended: reads the claim of {_wid(p.task, p.wid)}", nxt, None)]
        return self._contended(rest, p, who)

    def _contended(self, rest: State, p: Proc, who: str) -> list[Step]:
        """A contended copy that does not keep its ids (the claim is not its own)."""
        sc = self.sc
        if self.new and p.kind in WAKES:
            if not sc.wake_registers:
                return [(f"{who} contended: ends (registers nothing)", rest, None)]
            return self._register(rest, p, f"{who} contended:", "ends (no fallback, no retry)")
        if p.tries >= sc.budget:
            if self.new and p.wid > 0 and sc.claim:
                nxt = self._send(rest, p, LAST_CLAIM)
                w = _wid(p.task, p.wid)
                return [(f"{who} contended, retries spent: claims {w} to give up", nxt, None)]
            nxt, bad = self._give_up(rest, p.task, split=False)
            return [(f"{who} contended, retries spent: GIVES UP", nxt, bad)]
        wid, copy = rest.ids[p.task]
        if self.new and p.wid > 0:
            wid = p.wid  # the same waiter id for every copy of the task
        else:
            rest = rest._replace(ids=_at(rest.ids, p.task, (wid + 1, copy)))
        nxt = _with(rest, p._replace(wid=wid, tries=p.tries + 1, step=REGISTER))
        return [(f"{who} contended: waits as {_wid(p.task, wid)}", nxt, None)]

    def _start_body(self, rest: State, p: Proc, what: str) -> Step:
        t = p.task
        violation = None
        if rest.outcome[t] == RAN:
            violation = self._bad(RUN_TWICE, f"{_name(t)}'s body starts a second time")
        elif rest.outcome[t] == GAVE_UP:
            violation = self._bad(TWO_OUTCOMES, f"{_name(t)}'s body starts after it gave up")
        self.reruns += rest.outcome[t] == CRASHED
        if violation is None and any(q.step == BODY for q in rest.procs):
            violation = self._bad(OVERLAP, f"{_name(t)} starts while another body runs")
        # Its ids are kept only where a crash needs them (its message delivered again).
        keep = self.sc.redeliver or self.sc.crash_claimants_only
        body = _with(rest, p._replace(step=BODY, replies=()), keep_ids=keep)
        nxt = body._replace(lock=t, outcome=_at(rest.outcome, t, RAN))
        return (f"{what}, body STARTS", nxt, violation)

    def _give_up(self, s: State, task: int, split: bool) -> tuple[State, Optional[str]]:
        bad = None
        if split:
            bad = self._bad(SPLIT_GIVE_UP, f"{_name(task)} gives up on a split claim")
        if bad is None and s.outcome[task] == RAN:
            bad = self._bad(TWO_OUTCOMES, f"{_name(task)} gives up after its body ran")
        if s.outcome[task] == RAN:
            return s, bad
        return s._replace(outcome=_at(s.outcome, task, GAVE_UP)), bad

    def _decide_any(self, rest: State, p: Proc, who: str) -> list[Step]:
        """The decision on every reply once every request landed; early (the budget
        allowing) on any subset of the replies received (the rest lost or late)."""
        mine = (p.task, p.wid, p.copy)
        waiting = any(r.live and r[1:4] == mine for r in rest.inflight)
        subsets: set[tuple[int, ...]] = set() if waiting else {p.replies}
        if rest.early_left > 0:
            early = {
                tuple(sorted(p.replies[i] for i in range(len(p.replies)) if mask >> i & 1))
                for mask in range(1 << len(p.replies))
            }
            subsets |= early - (set() if waiting else {p.replies})
        # It stops listening: replies to its requests still on their way are lost.
        rest = _tidy(rest, [r._replace(live=r.live and r[1:4] != mine) for r in rest.inflight])
        out: dict[State, Step] = {}
        for replies in sorted(subsets):
            base, early_ = rest, waiting or replies != p.replies
            if early_:
                base = rest._replace(early_left=rest.early_left - 1)
            what, nxt, bad = self._decide(base, p._replace(replies=replies), who, early_)
            if nxt not in out or (bad and not out[nxt][2]):
                out[nxt] = (what, nxt, bad)
        return list(out.values())

    def _read_any(self, rest: State, p: Proc, who: str) -> list[Step]:
        """The claim read: what every node that is up holds now; early (the budget
        allowing) on any part of it (the other replies lost or late)."""
        mine = (p.task, p.wid)
        values = _sorted(
            next((c for t, w, c in node if (t, w) == mine), NIL)
            for node, down in zip(rest.claims, rest.down)
            if not down
        )
        subsets = {values}
        if rest.early_left > 0:
            subsets |= {
                tuple(sorted(values[i] for i in range(len(values)) if mask >> i & 1))
                for mask in range((1 << len(values)) - 1)
            }
        out: dict[State, Step] = {}
        for replies in sorted(subsets):
            early = replies != values
            base = rest._replace(early_left=rest.early_left - 1) if early else rest
            for step in self._read(base, p._replace(replies=replies), who, early):
                out.setdefault(step[1], step)
        return list(out.values())

    def may_be_claimed_by(self, replies: tuple[int, ...], copy: int) -> bool:
        """The claim read's verdict, as lock/waiters.py's ``may_be_claimed_by`` gives it
        (``replies``: the values of the nodes that answered, NIL for none): False only
        when they rule ``copy`` out -- a quorum names another copy, every node holds a
        claim and the plurality (ties to the smallest) is another copy's, or enough
        answered to decide, none names it, and it could not win the plurality even if
        every node that did not answer named it."""
        sc = self.sc
        named = [v for v in replies if v != NIL]
        counts = {v: named.count(v) for v in set(named)}
        if counts.get(copy, 0) >= sc.quorum:
            return True  # won
        if sc.nodes - len(replies) >= sc.nodes - sc.quorum + 1:
            return True  # too few answered: undecided
        if any(n >= sc.quorum for n in counts.values()):
            return False  # another copy won
        if len(named) == sc.nodes:
            return min(counts, key=lambda v: (-counts[v], v)) == copy
        if copy in counts:
            return True  # a split naming it
        if len(named) + sc.nodes - len(replies) < sc.nodes:
            return False  # a node holds no claim: no plurality yet
        counts[copy] = sc.nodes - len(replies)  # every silent node naming it
        return min(counts, key=lambda v: (-counts[v], v)) == copy

    def claimed_by_another(self, replies: tuple[int, ...], copy: int) -> bool:
        """The read's drop verdict, as lock/waiters.py's ``claimed_by_another`` gives it:
        another copy's claim on a quorum, or, every node answering with one, another
        copy's plurality (ties to the smallest)."""
        winner = claim_winner(tuple(v for v in replies if v != NIL), self.sc.nodes)
        return winner is not None and winner != copy

    def _dropped(self, replies: tuple[int, ...], copy: int) -> bool:
        rule = self.sc.drop_on_read
        if rule == "any":
            return any(v not in (NIL, copy) for v in replies)
        return rule == "final" and self.claimed_by_another(replies, copy)

    def _read(self, rest: State, p: Proc, who: str, early: bool) -> list[Step]:
        late = ", deadline passed" if early else ""
        read = f"reads claim {_wid(p.task, p.wid)} ({_values(p.replies)}{late})"
        if self._dropped(p.replies, p.copy):
            return [(f"{who} {read}: another copy's for good: stores nothing", rest, None)]
        if not self.may_be_claimed_by(p.replies, p.copy):
            return self._contended(rest, p._replace(replies=()), f"{who} {read}: not its own;")
        return self._keep(rest, p, f"{who} {read}: may be its own,")

    def _keep(self, rest: State, p: Proc, what: str) -> list[Step]:
        """A contended copy that keeps its ids: as after an undecided claim
        (publish_retry's ``keep``): same ids, one retry spent, nothing registered."""
        self.kept += 1
        if p.tries >= self.sc.budget:
            nxt = self._send(rest, p, LAST_CLAIM)
            return [(f"{what} retries spent: claims to give up", nxt, None)]
        again = Msg(p.task, self._again(p), p.wid, p.copy, p.tries + 1, p.tried)
        nxt = rest._replace(msgs=_sorted((*rest.msgs, again)))
        return [(f"{what} re-published, same ids, one retry spent", nxt, None)]

    def _winner(self, p: Proc) -> Optional[int]:
        if self.sc.claim_rule == "any" and p.copy in p.replies:
            return p.copy
        return claim_winner(p.replies, self.sc.nodes)

    def _decide(self, rest: State, p: Proc, who: str, early: bool) -> Step:
        winner = self._winner(p)
        late = ", deadline passed" if early else ""
        claim = f"claim {_wid(p.task, p.wid)} (replies {list(p.replies)}{late})"
        split = winner is None and len(p.replies) >= self.sc.quorum
        if split:
            self.splits += 1
            if self.sc.probe_split:
                return (f"{who} {claim}: SPLIT", rest, f"{SPLIT}: {_name(p.task)} {claim}")
        holding = p.step == CLAIM
        released = rest._replace(lock=FREE)
        if winner == p.copy:
            if holding:
                return self._start_body(rest, p, f"{who} WINS {claim}")
            if p.step == FIRST_CLAIM:
                return (f"{who} WINS {claim}", _with(rest, p._replace(step=ACQUIRE)), None)
            nxt, bad = self._give_up(rest, p.task, split=False)
            return (f"{who} WINS {claim}: GIVES UP", nxt, bad)
        if winner is not None:
            what = f"{who} loses {claim} to copy {winner}: stores nothing"
            if holding:
                return (
                    f"{what}, releases the lock",
                    _with(released, p._replace(step=WAKING)),
                    None,
                )
            return (what, rest, None)
        undecided = f"{who} {claim} undecided"
        base = _with(released, p._replace(step=WAKING)) if holding else rest
        spent = p.tries >= self.sc.budget
        if p.step == LAST_CLAIM or (
            holding and spent and self.sc.exhausted_undecided == "republish"
        ):
            if split and not early and any(rest.down):
                # Every node that is up answered and no answer can change: it goes round
                # until the down node answers again.
                if rest.outcome[p.task] in (PENDING, CRASHED):
                    base = base._replace(outcome=_at(base.outcome, p.task, SPINNING))
                return (f"{undecided}: goes round until the down node is back", base, None)
            again = Msg(p.task, self._again(p), p.wid, p.copy, p.tries, self.sc.claim_tried)
            nxt = base._replace(msgs=_sorted((*base.msgs, again)))
            return (f"{undecided}: re-published, same ids, no retry spent", nxt, None)
        if spent:
            nxt, bad = self._give_up(base, p.task, split and not early)
            return (f"{undecided}, retries spent: GIVES UP", nxt, bad)
        # Re-published with a countdown like a fallback (the broker keeps it as it keeps
        # any message: only the waker's publish can be missing), same ids.
        again = Msg(p.task, self._again(p), p.wid, p.copy, p.tries + 1, self.sc.claim_tried)
        nxt = base._replace(msgs=_sorted((*base.msgs, again)))
        return (f"{undecided}: re-published, same ids, one retry spent", nxt, None)

    def _again(self, p: Proc) -> int:
        """The kind of ``p``'s own copy re-published after an undecided claim."""
        if self.new and p.kind in WAKES and self.sc.republish_as == "wake":
            return REWAKE
        return FALLBACK

    def _wake(self, rest: State, who: str) -> list[Step]:
        if not rest.queue:
            return [(f"{who} finds no waiter", rest, None)]
        out: list[Step] = []
        for entry in rest.queue:
            task, wid, tries = entry
            popped, m = _publish(rest._replace(queue=_remove(rest.queue, entry)), task, WAKE,
                                 wid, tries)  # fmt: skip
            out.append((f"{who} pops {_wid(task, wid)}, publishes {_msg(m)}", popped, None))
            if rest.dups_left > 0:
                kept = popped._replace(queue=rest.queue, dups_left=rest.dups_left - 1)
                what = f"{who} pops {_wid(task, wid)} on a minority, publishes {_msg(m)}"
                out.append((what, kept, None))
        return out

    def lost(self, s: State) -> Optional[str]:
        """In a final state: the tasks that neither ran nor gave up."""
        missing = [_name(t) for t, o in enumerate(s.outcome) if o in (PENDING, CRASHED)]
        return f"{LOST}: {', '.join(missing)} never ran and never gave up" if missing else None


def claim_winner(replies: tuple[int, ...], nodes: int) -> Optional[int]:
    """The verdict of a claim round on ``replies`` (the value each node that answered
    holds afterwards): the copy id on a quorum; else, when all ``nodes`` answered, the
    id on the most nodes, ties to the smallest (values never change once set, so every
    copy computes the same); else None (undecided)."""
    counts = {v: replies.count(v) for v in set(replies)}
    winner = next((v for v, n in counts.items() if n >= nodes // 2 + 1), None)
    if winner is None and len(replies) == nodes:
        winner = min(counts, key=lambda v: (-counts[v], v))
    return winner


def _with(s: State, p: Proc, keep_ids: bool = False) -> State:
    if p.step in (CHECK, BODY, WAKING) and not keep_ids:  # its ids and replies no longer matter
        p = Proc(p.task, p.kind, 0, 0, 0, p.step, ())
    return s._replace(procs=_sorted((*s.procs, p)))


def _tidy(s: State, inflight: list[ClaimReq]) -> State:
    """``inflight`` without the requests nobody awaits that can change nothing (their
    node already holds a claim for their waiter id), each such request kept once."""
    held = {(i, t, w) for i, node in enumerate(s.claims) for t, w, _ in node}
    kept = {r for r in inflight if r.live or r[:3] not in held}
    return s._replace(inflight=_sorted(kept))


def _publish(s: State, task: int, kind: int, wid: int, tries: int) -> tuple[State, Msg]:
    """A new message with a fresh copy id."""
    w, copy = s.ids[task]
    m = Msg(task, kind, wid, copy, tries)
    return s._replace(msgs=_sorted((*s.msgs, m)), ids=_at(s.ids, task, (w, copy + 1))), m


def _wid(task: int, wid: int) -> str:
    return f"w{task + 1}.{wid}"


def _value(value: int) -> str:
    return "nil" if value == NIL else str(value)


def _values(replies: tuple[int, ...]) -> str:
    return "[" + ", ".join(map(_value, replies)) + "]"


def _msg(m: Msg) -> str:
    ids = f" {_wid(m.task, m.wid)} copy {m.copy}" if m.wid else ""
    return f"{_name(m.task)} {KIND_NAMES[m.kind]}{ids} (retries {m.tries})"


def _late_claim(sc: HandoffScenario) -> State:
    """T1's fallback (waiter w1.1, copy 1, one retry spent) won the lock, claimed, and
    decided the claim undecided before any request landed (its deadline): its three
    SET NX requests are still on their way, nobody awaits their replies. It gave the
    lock back and was re-published with the same ids (the claim-tried mark where the
    design has it); T2 took the lock and runs its body; w1.1 still waits in the queue.
    The shortest way here from the start takes 15 steps and a lock retry budget the
    breadth-first scenarios cannot afford (SAFETY.md, "A claim request that lands
    after its round")."""
    t1 = 0
    inflight = tuple(ClaimReq(i, t1, 1, 1, False) for i in range(sc.nodes))
    return State(
        (Msg(t1, FALLBACK, 1, 1, 1, sc.claim_tried),), (Proc(1, ORIGINAL, 0, 0, 0, BODY, ()),),
        1, ((t1, 1, 1),), tuple(() for _ in range(sc.nodes)), inflight,
        tuple(False for _ in range(sc.nodes)), (PENDING, RAN), ((2, 2), (1, 1)),
        sc.dup_wakes, sc.crashes, sc.early,
    )  # fmt: skip


#: States to start a scenario from, by name (``HandoffScenario.opening``).
OPENINGS = {"late-claim": _late_claim}
