"""The Redlock-with-fencing protocol as a finite transition system.

This module is the *model* half of the model checker: it says what a state of
the system is (N Redis masters, a few clients, the requests in flight), which
steps may follow a state, and which steps break an invariant. It knows nothing
about search order; ``checker.py`` explores it breadth-first. Standard library
only, and it must not import ``celery_redlock``: the model is a second, independent
statement of the algorithm in DESIGN.md, so that a bug shared by both cannot hide.

What is modelled (one lock key throughout):

* Nodes hold the lock key (value = the client's unique token, with an expiry in
  ticks) and a fence counter (its week-long expiry is not modelled: an expired counter
  is a lost one, as after a restart, see SAFETY.md). ``acquire`` is SET NX PX (plus
  INCR of the counter in the *naive* fencing variant); ``fence`` is the round-2
  script "if the key holds my token, counter := max(counter, T)"; ``extend`` is
  compare-and-pexpire; ``release`` is compare-and-delete.
* Clients run round 1 (acquire on all nodes at once), optionally round 2 (fence),
  hold the lease, optionally extend it a bounded number of times, release it or
  let it lapse, and try again while their attempt budget lasts.
* The network delays and reorders requests arbitrarily; a request never
  delivered is a lost one, so loss needs no step of its own.
* Nodes crash and restart within a budget, with or without persistence of the
  lock keys and of the counters, and with a minimum down time (delayed restart).
* Time is discrete. One ``tick`` step advances real time for everybody.

Invariants, checked on every grant (the step where a client starts to believe
it holds the lease, for ``validity`` ticks of its clock):

1. Mutual exclusion: a lease window is [grant, grant + validity) in real time,
   so a grant while another client still has validity left is an overlap.
2. Fence order: with fencing, the fence granted must exceed every fence granted
   before it (the state keeps the highest granted so far).

Replies are not messages. A client's decision depends only on which yes/OK
replies it has counted when it closes the round, and any reply the node has
produced may or may not have arrived by then (delay, loss). So each client keeps
the results its nodes have produced for its open round, and ``close`` chooses
what it counted: nothing useful (deadline first: the round fails), or any set of
at least a quorum of them (which, for round 1, matters only through its highest
counter). That is exact, and it removes every reply-delivery interleaving.

Clocks. Safety only depends on how a holder's clock relates to the clocks of the
nodes that store its key: the holder believes it owns the lock until
``t0 + ttl - drift_margin`` on its clock, and a key set at ``s >= t0`` lasts until
``s + ttl`` on the node's clock. We therefore take client clocks as the reference
("real time") and fold the whole relative drift into the nodes: a node may expire
a key up to ``clock_drift`` ticks before real ``s + ttl`` (the ``expire`` step),
and must have expired it by then (inside ``tick``). Slower node clocks only keep
keys longer, which can never hurt safety, so they are not modelled. (The
``clock_fence`` variant additionally gives clients fixed clock *offsets*.)

Finiteness. Every time stored in a state is relative to "now" and saturates
(e.g. "ticks since t0" stops at ``ttl - drift_margin``, where validity is <= 0
whatever the exact value), so a tick maps the state space into itself and the
reachable set is finite without a time horizon. Attempts, extends and crashes
are bounded per scenario.

Other reductions, each exact (it never hides a violation):

* A node answering NO produces nothing: a NO counts for nothing in any round.
* Results for a round that has closed are dropped: the client ignores them.
* A fence/extend/release request whose token is not in the target node's key,
  and for which no acquire of that token to that node is still in flight, can
  never have an effect (only that acquire can put the token there), so it is
  garbage-collected.
* A crash with no minimum down time is one ``restart`` step: while such a node is
  down it only loses requests, which delay already covers.
* Node symmetry: nodes are interchangeable, and nothing but the node's own bundle
  (its state plus the requests addressed to it) refers to a node, so
  ``canonical()`` keys a state by the sorted multiset of node bundles.
* Client symmetry: clients with the same budget and clock are interchangeable.
* A state from which no grant can follow (every client done; or, without
  fencing, at most one client left, who can overlap nobody) is not expanded:
  invariants are only checked on grants.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional, TypeVar

# --------------------------------------------------------------------------- #
# Protocol variants and scenario configuration
# --------------------------------------------------------------------------- #

#: No fence at all: only mutual exclusion is checked.
FENCING_OFF = "off"
#: Each node INCRs its counter on a successful SET NX; fence = max over the yes
#: replies; no second round. (A tempting shortcut; the model shows it is unsound.)
FENCING_NAIVE = "naive"
#: DESIGN.md's scheme: round 1 reads counters, T = max + 1, round 2 stores
#: max(counter, T) only where the key still holds our token, needs a quorum.
FENCING_TWO_ROUND = "two_round"

MUTUAL_EXCLUSION = "mutual exclusion"
FENCE_ORDER = "fence order"

#: ``Scenario.expect`` values.
SAFE = "safe"
VIOLATES = "violation"


@dataclass(frozen=True)
class Scenario:
    """One configuration to explore: cluster size, timing, faults, protocol variant.

    Times are in ticks. ``expect`` says what the scenario is for: ``"safe"`` must
    be explored exhaustively with 0 violations; ``"violation"`` is a negative
    control (or a finding) that must produce a counterexample of kind
    ``expect_kind`` whose trace mentions ``expect_event``.
    """

    name: str
    description: str
    nodes: int = 3
    #: attempts (acquisitions tried) per client; its length is the number of clients.
    attempts: tuple[int, ...] = (1, 1)
    ttl: int = 3
    #: ticks subtracted from validity for clock drift (ttl*drift_factor + 2 ms).
    drift_margin: int = 1
    #: how many ticks early (relative to the holder's clock) a node may expire a key.
    clock_drift: int = 1
    #: validity = ttl - elapsed - margin (True, the algorithm) or ttl - margin (bug).
    subtract_elapsed: bool = True
    fencing: str = FENCING_OFF
    #: fence T = max(max counter + 1, client clock) instead of max counter + 1
    #: (counters then hold clock-like values). Requires ``fencing=two_round``.
    clock_fence: bool = False
    #: fixed offset of each client's clock, for ``clock_fence`` (bounded skew).
    clock_offsets: tuple[int, ...] = ()
    #: extensions allowed per lease.
    extends: int = 0
    #: node crashes allowed in the whole run, and how many may be down at once.
    crashes: int = 0
    max_down: int = 1
    #: minimum ticks a crashed node stays down before it may rejoin (0: at once).
    restart_delay: int = 0
    #: whether the lock key / the fence counter survive a crash (fsync=always).
    persist_keys: bool = False
    persist_counters: bool = False
    #: search bounds, so that every run terminates.
    max_depth: int = 200
    max_states: int = 3_000_000
    expect: str = SAFE
    expect_kind: str = ""
    expect_event: str = ""
    #: only run by ``python -m tools.modelcheck --full`` (too big for CI).
    full_only: bool = False
    #: False for scenarios known to exceed the bounds: then a search cut short
    #: by a bound without a violation is the expected result (no proof, but a
    #: bounded check), and the table says so.
    exhaustive: bool = True

    @property
    def clients(self) -> int:
        return len(self.attempts)

    @property
    def quorum(self) -> int:
        return self.nodes // 2 + 1

    def offset(self, client: int) -> int:
        return self.clock_offsets[client] if client < len(self.clock_offsets) else 0


# --------------------------------------------------------------------------- #
# State
# --------------------------------------------------------------------------- #

# Request kinds. The numbers only fix the canonical sort order.
ACQUIRE, FENCE, EXTEND, RELEASE = 0, 1, 2, 3

# Client phases.
IDLE, ROUND1, ROUND2, HOLDING, EXTENDING = 0, 1, 2, 3, 4

# Round stages carried by requests so that a result reaches only the round that
# asked for it: 1 = acquire, 2 = fence, 2 + k = k-th extension of the lease.
STAGE_ACQUIRE, STAGE_FENCE = 1, 2

#: A token is (client, attempt); attempt numbers start at 1, so this never matches.
Token = tuple[int, int]
NO_KEY: Token = (-1, 0)

#: ``Action.choice`` of a close that gives up (deadline before a usable quorum).
GIVE_UP = -(10**9)


class Request(NamedTuple):
    """A request in flight to one node (the node is the inbox it sits in)."""

    kind: int
    client: int
    attempt: int
    stage: int
    #: the fence value T for FENCE requests, else 0.
    fence: int


class Node(NamedTuple):
    """One Redis master together with the requests on their way to it.

    Keeping each node's inbox inside the node makes the node symmetry reduction
    a plain sort of the nodes (see ``Model.canonical``).
    """

    up: bool
    #: ticks spent down so far (saturates at the scenario's restart_delay).
    down_for: int
    key: Token
    #: ticks until the key's latest possible expiry (0 when there is no key).
    key_ttl: int
    #: the fence counter key (relative to now in the clock_fence variant).
    counter: int
    #: multiset of requests in flight to this node, kept sorted.
    inbox: tuple[Request, ...]


class Client(NamedTuple):
    """What a client process knows and is doing."""

    phase: int
    #: number of attempts started; the current token is (client, attempt).
    attempt: int
    stage: int
    #: ticks since the current round started (t0 for rounds 1 and 2, the extend
    #: round's own start for an extension); saturates at ttl - drift_margin.
    since: int
    #: sorted yes/OK results produced by nodes for the open round (round 1: each
    #: node's counter; other rounds: 0 each). The client may count any of them.
    results: tuple[int, ...]
    #: round 2: the fence T being stored.
    best: int
    #: while holding or extending: ticks of validity left.
    remaining: int
    extends: int


class State(NamedTuple):
    """The whole system at one instant."""

    nodes: tuple[Node, ...]
    clients: tuple[Client, ...]
    crashes_left: int
    #: highest fence granted so far (for the fence-order invariant).
    max_fence: int


class Action(NamedTuple):
    """What happened in one step; enough to print it, given the state before."""

    kind: str
    #: node or client index, or -1 for a tick.
    actor: int
    request: Optional[Request] = None
    #: for "close": GIVE_UP, or the highest counter among the results counted.
    choice: int = 0


class Violation(NamedTuple):
    """A broken invariant: MUTUAL_EXCLUSION or FENCE_ORDER, and what happened."""

    kind: str
    message: str
    #: for FENCE_ORDER: the fence just granted and the highest one before it
    #: (as stored: relative to now in the clock_fence variant).
    fence: int = 0
    previous: int = 0


Step = tuple[Action, State, Optional[Violation]]

CLIENT_IDLE = Client(IDLE, 0, 0, 0, (), 0, 0, 0)
TICK = Action("tick", -1)


def client_name(client: int) -> str:
    return "ABCDEFGH"[client]


def token_name(client: int, attempt: int) -> str:
    return f"{client_name(client)}#{attempt}"


def node_name(node: int) -> str:
    return f"node{node + 1}"


# --------------------------------------------------------------------------- #
# Transition relation
# --------------------------------------------------------------------------- #


class Model:
    """Successor function, invariants and canonical form for one ``Scenario``."""

    def __init__(self, scenario: Scenario) -> None:
        if scenario.clock_fence and scenario.fencing != FENCING_TWO_ROUND:
            raise ValueError("clock_fence needs fencing='two_round'")
        if scenario.clients > 8:
            raise ValueError("at most 8 clients")
        self.scenario = scenario
        self.ttl = scenario.ttl
        self.quorum = scenario.quorum
        self.fenced = scenario.fencing != FENCING_OFF
        self.naive = scenario.fencing == FENCING_NAIVE
        self.clock = scenario.clock_fence
        # Past this many ticks since a round's start its validity is <= 0
        # whatever the exact count, so "since" saturates here.
        self.since_cap = max(scenario.ttl - scenario.drift_margin, 0)
        # Client renamings that map the scenario onto itself (same attempt budget
        # and clock offset), other than the identity: the client symmetry group.
        profile = [(scenario.attempts[c], scenario.offset(c)) for c in range(scenario.clients)]
        self.client_perms = [
            perm
            for perm in itertools.permutations(range(scenario.clients))
            if perm != tuple(range(scenario.clients))
            and all(profile[c] == profile[perm[c]] for c in range(scenario.clients))
        ]
        # With a clock component, counters and fences are clock readings, stored
        # relative to now, and they saturate so that the state space stays finite:
        # - a counter (or round-1 result, or fence value on its way to a node) at
        #   or below ``counter_floor`` loses to every client's clock in
        #   T = max(counter + 1, clock), now and later, so its exact value is moot;
        #   the floor also stands for "no counter";
        # - a granted fence at or below ``fence_floor`` is below every fence a
        #   client can still be granted (rounds end within ttl of reading the
        #   clock), so the highest granted fence saturates there.
        if scenario.clock_fence:
            lowest = min(scenario.offset(c) for c in range(scenario.clients))
            self.counter_floor = lowest - 1
            self.fence_floor = lowest - self.ttl - 1
        else:
            self.counter_floor = self.fence_floor = 0

    # -- initial state ------------------------------------------------------ #

    def initial(self) -> State:
        sc = self.scenario
        nodes = tuple(Node(True, 0, NO_KEY, 0, self.counter_floor, ()) for _ in range(sc.nodes))
        clients = tuple(CLIENT_IDLE for _ in range(sc.clients))
        return State(nodes, clients, sc.crashes, self.fence_floor)

    # -- canonical form (symmetry reduction) --------------------------------- #

    def canonical(self, state: State) -> tuple[object, ...]:
        """A hashable key, equal for states that differ only by renaming nodes or
        by renaming clients that have the same configuration.

        Nothing outside a node (clients keep results, not node names) refers to
        a node, so sorting the nodes handles node renaming. The least key over
        the client renamings handles client symmetry. The key puts the clients
        first, so most renamings lose on the clients alone and their nodes are
        never rewritten.
        """
        clients = state.clients
        best_clients = clients
        best_perms: list[Optional[tuple[int, ...]]] = [None]  # None: the identity
        for perm in self.client_perms:
            renamed = [CLIENT_IDLE] * len(clients)
            for c, cl in enumerate(clients):
                renamed[perm[c]] = cl
            other = tuple(renamed)
            if other < best_clients:
                best_clients, best_perms = other, [perm]
            elif other == best_clients:
                best_perms.append(perm)
        rest = (state.crashes_left, state.max_fence)
        keys = [
            (
                best_clients,
                *rest,
                tuple(sorted(state.nodes)) if perm is None else _renamed(state.nodes, perm),
            )
            for perm in best_perms
        ]
        return min(keys)

    # -- successors ----------------------------------------------------------- #

    def successors(self, s: State) -> Iterator[Step]:
        sc = self.scenario
        # Invariants are only checked when a lease is granted. Once every client
        # is done (idle, attempts spent) nothing can be granted again; without
        # fencing, a lone client still going cannot overlap anybody either. Such
        # states cannot lead to a violation, so they are not expanded.
        unfinished = sum(
            1 for c, cl in enumerate(s.clients) if cl.phase != IDLE or cl.attempt < sc.attempts[c]
        )
        if unfinished == 0 or (unfinished == 1 and not self.fenced):
            return
        yield (TICK, self._tick(s), None)

        for i, node in enumerate(s.nodes):
            # A node whose clock runs fast drops the key up to clock_drift early.
            if node.key != NO_KEY and node.key_ttl <= sc.clock_drift:
                gone = Node(node.up, node.down_for, NO_KEY, 0, node.counter, node.inbox)
                gone = _without(gone, node.key)
                yield (Action("expire", i), _set_node(s, i, gone), None)
            previous: Optional[Request] = None
            for j, req in enumerate(node.inbox):
                if req == previous:  # identical copies lead to identical states
                    continue
                previous = req
                yield (Action("deliver", i, request=req), self._deliver(s, i, j), None)

        for c, client in enumerate(s.clients):
            phase = client.phase
            if phase == IDLE:
                if client.attempt < sc.attempts[c]:
                    yield (Action("start", c), self._start(s, c), None)
            elif phase == HOLDING:
                yield (Action("release", c), self._send_and_idle(s, c), None)
                if client.extends < sc.extends:
                    yield (Action("extend", c), self._extend(s, c), None)
            else:
                yield from self._closings(s, c)

        if s.crashes_left > 0 and sum(1 for n in s.nodes if not n.up) < sc.max_down:
            kind = "crash" if sc.restart_delay > 0 else "restart"
            for i, node in enumerate(s.nodes):
                if node.up:
                    yield (Action(kind, i), self._crash(s, i), None)
        for i, node in enumerate(s.nodes):
            if not node.up and node.down_for >= sc.restart_delay:
                back = Node(True, 0, node.key, node.key_ttl, node.counter, node.inbox)
                yield (Action("rejoin", i), _set_node(s, i, back), None)

    # -- individual steps ----------------------------------------------------- #

    def _tick(self, s: State) -> State:
        sc = self.scenario
        floor, clock = self.counter_floor, self.clock
        nodes = []
        for n in s.nodes:
            if n.key == NO_KEY and n.up and not clock:
                nodes.append(n)  # nothing here depends on time
                continue
            key, key_ttl, inbox = n.key, n.key_ttl, n.inbox
            if key != NO_KEY:
                # Also while down: with persistence, expiry is absolute, so time
                # keeps running for the key while the server is off.
                key_ttl -= 1
                if key_ttl <= 0:
                    key, key_ttl = NO_KEY, 0
            down_for = n.down_for if n.up else min(n.down_for + 1, sc.restart_delay)
            counter = n.counter
            if clock:
                counter = max(counter - 1, floor)
                if any(r.kind == FENCE for r in inbox):
                    inbox = tuple(
                        sorted(
                            r._replace(fence=max(r.fence - 1, floor)) if r.kind == FENCE else r
                            for r in inbox
                        )
                    )
            node = Node(n.up, down_for, key, key_ttl, counter, inbox)
            nodes.append(_without(node, n.key) if key != n.key else node)

        clients = list(s.clients)
        for c, cl in enumerate(s.clients):
            phase = cl.phase
            if phase in (ROUND1, ROUND2):
                results, best = cl.results, cl.best
                if clock and phase == ROUND1:  # round-1 results are counters
                    results = tuple(max(v - 1, floor) for v in results)
                elif clock:
                    best = max(best - 1, self.fence_floor)
                since = min(cl.since + 1, self.since_cap)
                clients[c] = Client(phase, cl.attempt, cl.stage, since, results, best, 0, 0)
            elif phase in (HOLDING, EXTENDING):
                if cl.remaining <= 1:
                    # Validity is over on the holder's own clock: the lease is gone,
                    # and an extension still in progress can no longer count.
                    clients[c] = Client(IDLE, cl.attempt, 0, 0, (), 0, 0, 0)
                elif phase == EXTENDING:
                    clients[c] = cl._replace(
                        since=min(cl.since + 1, self.since_cap), remaining=cl.remaining - 1
                    )
                else:
                    clients[c] = cl._replace(remaining=cl.remaining - 1)
        max_fence = max(s.max_fence - 1, self.fence_floor) if clock else s.max_fence
        return State(tuple(nodes), tuple(clients), s.crashes_left, max_fence)

    def _deliver(self, s: State, i: int, j: int) -> State:
        """Node ``i`` executes request ``j`` of its inbox atomically (one Lua script)."""
        node = s.nodes[i]
        req = node.inbox[j]
        inbox = node.inbox[:j] + node.inbox[j + 1 :]
        token = (req.client, req.attempt)
        key, key_ttl, counter = node.key, node.key_ttl, node.counter
        result: Optional[int] = None
        dead = False  # may the token's other requests here be dropped now?
        if req.kind == ACQUIRE:
            if key == NO_KEY:
                if self.naive:
                    counter += 1  # SET NX + INCR in one script
                key, key_ttl = token, self.ttl
                result = counter
            else:
                dead = True
        elif req.kind == FENCE:
            if key == token:
                counter = max(counter, req.fence)
                result = 0
        elif req.kind == EXTEND:
            if key == token:
                key_ttl = self.ttl
                result = 0
        elif key == token:  # RELEASE: compare-and-delete
            key, key_ttl = NO_KEY, 0
            dead = True
        changed = Node(node.up, node.down_for, key, key_ttl, counter, inbox)
        nxt = _set_node(s, i, _without(changed, token) if dead else changed)
        if result is not None:
            cl = s.clients[req.client]
            if cl.attempt == req.attempt and cl.stage == req.stage and cl.phase != HOLDING:
                results = tuple(sorted((*cl.results, result)))
                nxt = _set_client(nxt, req.client, cl._replace(results=results))
        return nxt

    def _start(self, s: State, c: int) -> State:
        attempt = s.clients[c].attempt + 1
        # Round 1 starts at t0 = now (since = 0).
        client = Client(ROUND1, attempt, STAGE_ACQUIRE, 0, (), 0, 0, 0)
        nodes = self._send_all(s.nodes, Request(ACQUIRE, c, attempt, STAGE_ACQUIRE, 0))
        return State(nodes, _replace_at(s.clients, c, client), s.crashes_left, s.max_fence)

    def _closings(self, s: State, c: int) -> Iterator[Step]:
        """Ways the client can end its open round (all replies in, or its deadline)."""
        sc = self.scenario
        cl = s.clients[c]
        if cl.phase == EXTENDING:
            # Counts only with a majority and while the old validity lasts (a
            # lapsed lease never gets here, see _tick); the new validity runs
            # from the extend round's start.
            validity = self.ttl - cl.since - sc.drift_margin
            done = Client(HOLDING, cl.attempt, cl.stage, 0, (), 0, cl.remaining, cl.extends + 1)
            yield (Action("close", c, choice=GIVE_UP), _set_client(s, c, done), None)
            if len(cl.results) >= self.quorum and validity > 0:
                won = done._replace(remaining=validity)
                yield (Action("close", c), _set_client(s, c, won), None)
            return

        yield (Action("close", c, choice=GIVE_UP), self._send_and_idle(s, c), None)
        if sc.subtract_elapsed:
            validity = self.ttl - cl.since - sc.drift_margin
        else:
            validity = self.ttl - sc.drift_margin  # the bug: elapsed time forgotten
        if validity <= 0 or len(cl.results) < self.quorum:
            return
        if cl.phase == ROUND2:
            yield self._grant(s, c, cl.best, validity, Action("close", c))
            return
        # Round 1 counted some set of >= quorum results. Only its highest counter
        # matters; v is possible iff at least a quorum of the results are <= v.
        results = cl.results
        for k in range(self.quorum - 1, len(results)):
            v = results[k]
            if k + 1 < len(results) and results[k + 1] == v:
                continue  # the same v again, with more results counted
            action = Action("close", c, choice=v)
            if sc.fencing != FENCING_TWO_ROUND:
                # No fencing, or naive: granted now, fence = highest counter counted.
                yield self._grant(s, c, v, validity, action)
                continue
            fence = v + 1
            if self.clock:
                fence = max(fence, sc.offset(c))  # this client's clock reads now + offset
            nodes = self._send_all(s.nodes, Request(FENCE, c, cl.attempt, STAGE_FENCE, fence))
            round2 = Client(ROUND2, cl.attempt, STAGE_FENCE, cl.since, (), fence, 0, 0)
            clients = _replace_at(s.clients, c, round2)
            yield (action, State(nodes, clients, s.crashes_left, s.max_fence), None)

    def _grant(self, s: State, c: int, fence: int, validity: int, action: Action) -> Step:
        """Client ``c`` now believes it holds the lease for ``validity`` ticks."""
        cl = s.clients[c]
        violation: Optional[Violation] = None
        for other, oc in enumerate(s.clients):
            # A window is [grant, grant + validity); so a grant while another
            # client still has validity left is an overlap in real time.
            if other != c and oc.phase in (HOLDING, EXTENDING):
                violation = Violation(
                    MUTUAL_EXCLUSION,
                    f"client {client_name(c)} granted while client {client_name(other)} "
                    f"still holds the lease for {oc.remaining} more tick(s)",
                )
                break
        if violation is None and self.fenced and fence <= s.max_fence:
            violation = Violation(
                FENCE_ORDER,
                f"client {client_name(c)} granted fence {fence}, not above the highest "
                f"fence granted before ({s.max_fence})",
                fence,
                s.max_fence,
            )
        holder = Client(HOLDING, cl.attempt, cl.stage, 0, (), 0, validity, 0)
        max_fence = max(s.max_fence, fence) if self.fenced else s.max_fence
        nxt = State(s.nodes, _replace_at(s.clients, c, holder), s.crashes_left, max_fence)
        return (action, nxt, violation)

    def _send_and_idle(self, s: State, c: int) -> State:
        """Release on ALL nodes (also those that said no) and stop: used for a lost
        round and for an ordinary release."""
        cl = s.clients[c]
        nodes = self._send_all(s.nodes, Request(RELEASE, c, cl.attempt, 0, 0))
        idle = Client(IDLE, cl.attempt, 0, 0, (), 0, 0, 0)
        return State(nodes, _replace_at(s.clients, c, idle), s.crashes_left, s.max_fence)

    def _extend(self, s: State, c: int) -> State:
        cl = s.clients[c]
        stage = STAGE_FENCE + cl.extends + 1
        nodes = self._send_all(s.nodes, Request(EXTEND, c, cl.attempt, stage, 0))
        ext = Client(EXTENDING, cl.attempt, stage, 0, (), 0, cl.remaining, cl.extends)
        return State(nodes, _replace_at(s.clients, c, ext), s.crashes_left, s.max_fence)

    def _crash(self, s: State, i: int) -> State:
        sc = self.scenario
        node = s.nodes[i]
        key, key_ttl = (node.key, node.key_ttl) if sc.persist_keys else (NO_KEY, 0)
        counter = node.counter if sc.persist_counters else self.counter_floor
        up = sc.restart_delay == 0  # no minimum down time: crash + restart in one step
        # The TCP connections die with the server: requests not yet executed are
        # gone (redis-py does not resend them on the new connection within a round).
        crashed = Node(up, 0, key, key_ttl, counter, ())
        return State(_replace_at(s.nodes, i, crashed), s.clients, s.crashes_left - 1, s.max_fence)

    # -- helpers ---------------------------------------------------------------- #

    @staticmethod
    def _send_all(nodes: tuple[Node, ...], req: Request) -> tuple[Node, ...]:
        """Put ``req`` in every live node's inbox (a down node refuses the connection)."""
        token = (req.client, req.attempt)
        out = []
        for n in nodes:
            # Skip a fence/extend/release that can never find its token here:
            # it is not the key, and no acquire of it is on its way.
            if n.up and (
                req.kind == ACQUIRE
                or n.key == token
                or any(r.kind == ACQUIRE and (r.client, r.attempt) == token for r in n.inbox)
            ):
                n = Node(n.up, n.down_for, n.key, n.key_ttl, n.counter, _insort(n.inbox, req))
            out.append(n)
        return tuple(out)


def _without(node: Node, token: Token) -> Node:
    """``node`` without the requests of ``token``, once that token can no longer be
    (or become) its key: its fence/extend/release requests can never do anything.

    Callers use it when the key stops being ``token`` (release, expiry) or when the
    acquire of ``token`` was refused; either way no acquire of it is in flight.
    """
    inbox = tuple(r for r in node.inbox if (r.client, r.attempt) != token)
    if len(inbox) == len(node.inbox):
        return node
    return Node(node.up, node.down_for, node.key, node.key_ttl, node.counter, inbox)


def _renamed(nodes: tuple[Node, ...], perm: tuple[int, ...]) -> tuple[tuple[object, ...], ...]:
    """``nodes`` sorted, with client c renamed perm[c] in keys and requests."""
    out = []
    for n in nodes:
        key = n.key if n.key == NO_KEY else (perm[n.key[0]], n.key[1])
        inbox = tuple(sorted([(r[0], perm[r[1]], r[2], r[3], r[4]) for r in n.inbox]))
        out.append((n.up, n.down_for, key, n.key_ttl, n.counter, inbox))
    out.sort()
    return tuple(out)


_T = TypeVar("_T")


def _replace_at(items: tuple[_T, ...], index: int, value: _T) -> tuple[_T, ...]:
    return (*items[:index], value, *items[index + 1 :])


def _set_node(s: State, i: int, node: Node) -> State:
    return State(_replace_at(s.nodes, i, node), s.clients, s.crashes_left, s.max_fence)


def _set_client(s: State, c: int, client: Client) -> State:
    return State(s.nodes, _replace_at(s.clients, c, client), s.crashes_left, s.max_fence)


def _insort(inbox: tuple[Request, ...], req: Request) -> tuple[Request, ...]:
    return tuple(sorted((*inbox, req)))


# --------------------------------------------------------------------------- #
# Scenario catalogue
# --------------------------------------------------------------------------- #

# CI scenarios use N=3 and two clients: ttl=2 without drift in general, ttl=3
# with one tick of drift where drift is the question, and ttl=1 (a lease lasts
# one tick) for the fenced variants, whose state spaces are the largest, so that
# together they run in well under a minute. --full asks the same questions on
# larger configurations: ttl=2 for every fenced variant, N=5, three clients.
_T1: dict[str, Any] = {"ttl": 1, "drift_margin": 0, "clock_drift": 0}
_T2: dict[str, Any] = {"ttl": 2, "drift_margin": 0, "clock_drift": 0}
_T3: dict[str, Any] = {"ttl": 3, "drift_margin": 1, "clock_drift": 1}
_TWO_ROUND: dict[str, Any] = {"fencing": FENCING_TWO_ROUND}


def _control(kind: str, event: str) -> dict[str, Any]:
    return {"expect": VIOLATES, "expect_kind": kind, "expect_event": event}


def scenarios() -> list[Scenario]:
    """Every scenario, CI ones first; ``full_only`` ones are only run by ``--full``."""
    return [
        # -- must be safe --------------------------------------------------------
        Scenario(
            "baseline",
            "plain Redlock, no faults: arbitrary delay/reorder/loss, clients give up anytime",
            **_T2,
        ),
        Scenario(
            "reacquire",
            "client A tries twice: stale requests of its first attempt still in flight",
            attempts=(2, 1),
            **_T1,
        ),
        Scenario(
            "clock-drift",
            "nodes expire keys up to 1 tick early; a drift margin of 1 tick covers it",
            **_T3,
        ),
        Scenario(
            "extend",
            "two extensions per lease (compare-and-pexpire, validity from the extend start)",
            extends=2,
            **_T3,
        ),
        Scenario(
            "delayed-restart",
            "a node crashes without persistence, stays down > ttl, rejoins empty",
            crashes=1,
            restart_delay=3,
            **_T2,
        ),
        Scenario(
            "persistence",
            "a node crashes with fsync=always: keys survive, their expiry runs while down",
            crashes=1,
            restart_delay=1,
            persist_keys=True,
            persist_counters=True,
            **_T2,
        ),
        Scenario(
            "fenced-persistence",
            "two-round fencing; a minority node crashes and restarts with persistence",
            crashes=1,
            persist_keys=True,
            persist_counters=True,
            **_TWO_ROUND,
            **_T1,
        ),
        Scenario(
            "fenced-extend",
            "two-round fencing with one lease extension",
            extends=1,
            **_TWO_ROUND,
            **_T1,
        ),
        Scenario(
            "fenced-delayed-restart-persisted-counter",
            "repair: delayed restart (lock keys lost) but the counter key is persisted",
            crashes=1,
            restart_delay=2,
            persist_counters=True,
            **_TWO_ROUND,
            **_T1,
        ),
        Scenario(
            "fenced-delayed-restart-clock-fence",
            "repair: delayed restart, nothing persisted, T = max(max counter + 1, clock); "
            "client clocks 1 tick apart",
            clock_fence=True,
            clock_offsets=(0, 1),
            crashes=1,
            restart_delay=2,
            **_TWO_ROUND,
            **_T1,
        ),
        # -- negative controls: must find a counterexample -----------------------
        Scenario(
            "restart-no-persistence",
            "control: a node restarts at once without persistence (redis.io's example)",
            crashes=1,
            **_control(MUTUAL_EXCLUSION, "CRASHES"),
            **_T2,
        ),
        Scenario(
            "restart-delay-too-short",
            "control: the crashed node rejoins empty after less than the ttl",
            crashes=1,
            restart_delay=1,
            **_control(MUTUAL_EXCLUSION, "rejoins"),
            **_T2,
        ),
        Scenario(
            "validity-ignores-elapsed",
            "control: validity = ttl - drift; the time spent acquiring is not subtracted",
            subtract_elapsed=False,
            **_control(MUTUAL_EXCLUSION, "NOT subtracted"),
            **_T2,
        ),
        Scenario(
            "drift-margin-too-small",
            "control: nodes may expire keys 1 tick early, no drift margin subtracted",
            ttl=3,
            drift_margin=0,
            clock_drift=1,
            **_control(MUTUAL_EXCLUSION, "early"),
        ),
        Scenario(
            "naive-fences",
            "control: fence = max of per-node INCR over the yes replies, no round 2",
            attempts=(1, 1, 1),
            fencing=FENCING_NAIVE,
            **_control(FENCE_ORDER, "INCR"),
            **_T1,
        ),
        # -- finding: the two-round scheme needs its counters to survive ---------
        Scenario(
            "fenced-delayed-restart",
            "finding: two-round fencing with delayed restart, nothing persisted: a node "
            "that lost its counter lets a later holder get a smaller fence",
            crashes=1,
            restart_delay=2,
            **_control(FENCE_ORDER, "counter lost"),
            **_TWO_ROUND,
            **_T1,
        ),
        # == --full only ==========================================================
        Scenario(
            "fenced-delayed-restart-ttl2",
            "finding, ttl=2: two-round fencing, delayed restart, nothing persisted",
            crashes=1,
            restart_delay=3,
            full_only=True,
            **_control(FENCE_ORDER, "counter lost"),
            **_TWO_ROUND,
            **_T2,
        ),
        Scenario(
            "fenced-delayed-restart-persisted-counter-ttl2",
            "repair, ttl=2: delayed restart, counter key persisted",
            crashes=1,
            restart_delay=3,
            persist_counters=True,
            full_only=True,
            **_TWO_ROUND,
            **_T2,
        ),
        Scenario(
            "fenced-delayed-restart-clock-fence-ttl2",
            "repair, ttl=2: delayed restart, T = max(max counter + 1, clock), skew 1 tick",
            clock_fence=True,
            clock_offsets=(0, 1),
            crashes=1,
            restart_delay=3,
            full_only=True,
            **_TWO_ROUND,
            **_T2,
        ),
        Scenario(
            "clock-fence-skew-beyond-restart-delay",
            "control, ttl=2: clock fence with client clocks 4 ticks apart > restart delay 3",
            clock_fence=True,
            clock_offsets=(0, 4),
            crashes=1,
            restart_delay=3,
            full_only=True,
            **_control(FENCE_ORDER, "rejoins"),
            **_TWO_ROUND,
            **_T2,
        ),
        Scenario(
            "fenced-persistence-ttl2",
            "two-round fencing, a node crashes with persistence, ttl=2",
            crashes=1,
            persist_keys=True,
            persist_counters=True,
            full_only=True,
            **_TWO_ROUND,
            **_T2,
        ),
        Scenario(
            "fenced-extend-ttl2",
            "two-round fencing with one extension, ttl=2",
            extends=1,
            full_only=True,
            **_TWO_ROUND,
            **_T2,
        ),
        Scenario(
            "baseline-3-clients",
            "plain Redlock, three clients",
            attempts=(1, 1, 1),
            full_only=True,
            **_T2,
        ),
        Scenario(
            "baseline-n5",
            "plain Redlock on 5 nodes with clock drift",
            nodes=5,
            full_only=True,
            **_T3,
        ),
        Scenario(
            "restart-no-persistence-n5",
            "control: redis.io's example on 5 nodes (A holds 3 of 5, one restarts empty)",
            nodes=5,
            crashes=1,
            full_only=True,
            **_control(MUTUAL_EXCLUSION, "CRASHES"),
            **_T3,
        ),
        Scenario(
            "delayed-restart-exactly-ttl",
            "boundary: the crashed node stays down exactly ttl ticks (no drift): enough",
            crashes=1,
            restart_delay=2,
            full_only=True,
            **_T2,
        ),
        Scenario(
            "delayed-restart-n5",
            "5 nodes, two (a minority) crash without persistence and restart delayed",
            nodes=5,
            crashes=2,
            max_down=2,
            restart_delay=3,
            full_only=True,
            **_T2,
        ),
        Scenario(
            "persistence-n5",
            "5 nodes, two crash and restart with persistence",
            nodes=5,
            crashes=2,
            max_down=2,
            restart_delay=1,
            persist_keys=True,
            persist_counters=True,
            full_only=True,
            **_T2,
        ),
        Scenario(
            "fenced-persistence-n5",
            "two-round fencing on 5 nodes, a node crashes with persistence (bounded search)",
            nodes=5,
            crashes=1,
            persist_keys=True,
            persist_counters=True,
            max_states=2_000_000,
            exhaustive=False,
            full_only=True,
            **_TWO_ROUND,
            **_T2,
        ),
        Scenario(
            "fenced-reacquire-persistence",
            "two-round fencing, client A tries twice, persistence crash (bounded search)",
            attempts=(2, 1),
            crashes=1,
            persist_keys=True,
            persist_counters=True,
            max_states=2_000_000,
            exhaustive=False,
            full_only=True,
            **_TWO_ROUND,
            **_T1,
        ),
    ]
