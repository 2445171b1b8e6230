"""At most N holders per key (``redlock_limit = N``) over M lock nodes, as a finite
transition system, with its own breadth-first checker.

The question: which way of counting holders on a quorum keeps "never more than N
inside at once" with messages delayed, reordered or lost, clients crashing, and a
minority of nodes down or restarted empty after the largest TTL? Four designs:

* ``counter``: each node admits a holder while fewer than N are admitted there; a
  client is in when a majority admitted it. Unsafe for N > 1 (the negative control):
  with 3 nodes and N = 2, holders admitted on {1,2}, {2,3} and {1,3} fill every node
  to exactly 2, yet three are in. A per-node count needs a quorum q > N*M/(N+1).
* N *permit slots* ``key#0 .. key#N-1``, each an ordinary Redlock mutex (a node sets a
  slot only if it is free; a client holds slot s when a majority set s for its
  token), taken in one round in one of three ways:
  ``named-slot``: the client names one slot per round (any of the N: random and
  round-robin choices are both among the explored ones);
  ``all-free``: each node sets every free slot and returns them, the client keeps the
  lowest slot a majority set and releases the others;
  ``lowest-free``: each node sets its lowest free slot and returns it, the client
  keeps a slot a majority set; ``free-from-start`` (what the library does): the same
  from the client's starting slot (any of the N, one per round) on, wrapping. Nodes
  may pick different slots, so a round can win nothing while permits are free (a
  *split*): the client releases and retries.

Each slot design is safe for the mutex's own reason: two majorities meet, and a
node sets a slot only while it is free, so no slot has two holders and N slots
admit at most N.

What may happen, in any order: a client starts a round (its acquires queue on one
connection per node and are processed in order, each at any time or never: a lost
request is one never processed); a node processes an acquire and the reply reaches
the client or is lost; a client gives up a round at any time (its deadline or
validity ran out), then retries while it has attempts left; a client in leaves; a
node crashes; an entry its holder no longer counts disappears.

That last step stands for both a release and a TTL expiry: a release (after a lost
round, of the slots a winner does not keep, on leaving) only ever deletes entries
its holder no longer counts, and any such entry may also expire at any moment, so
releases need no messages of their own, and a client crash is a leave that releases
nothing. Time is coarse, as the validity margin makes it: an entry expires only
once its holder no longer counts it (its round was given up or lost, it won another
slot, or it left): a holder's validity ends before its keys' TTL does, whatever the
clocks do within the drift bound. A reply's delay is folded into its request's: a
client that learns later is inside for less time, so folding never hides a
violation. A crashed node keeps its entries invisible (every request to it fails)
and rejoins empty only once all of them would have expired: that is the delayed
restart (``delayed_restart=False``: it rejoins at once, empty, a control).

Invariants: never more than N clients inside; with slots, never two inside on one
slot. Standard library only; imports nothing of ``celery_redlock``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import NamedTuple, Optional

OVER_LIMIT = "more than N inside"
SLOT_SHARED = "two inside on one slot"

COUNTER, NAMED, ALL_FREE, LOWEST = "counter", "named-slot", "all-free", "lowest-free"
#: The library's choice (lock/permits.py): the first free slot from the client's
#: starting point (any of the N, the same on every node of its round), wrapping.
FROM_START = "free-from-start"
DESIGNS = (COUNTER, NAMED, ALL_FREE, LOWEST, FROM_START)

#: Client phases.
IDLE, ROUND, INSIDE, DONE = range(4)
#: A reply not in yet; else a bit mask of the slots the node set (counter: bit 0).
AWAITING = -1
#: A free slot; else the holding token (client * 16 + attempt).
FREE = -1
#: Node liveness: down for good, up, crashed (rejoins empty once its entries expired).
GONE, UP, CRASHED = 0, 1, 2
#: An acquire: (attempt, the named slot or -1).
Op = tuple[int, int]


class Col(NamedTuple):
    """One node and everything on the way to and from it (so that sorting the
    columns renames nodes)."""

    up: int
    #: counter: the admitted tokens, sorted; slots: per slot FREE or the token.
    data: tuple[int, ...]
    #: per client: its connection's requests not processed yet, in order.
    queues: tuple[tuple[Op, ...], ...]
    #: per client: its current round's reply from this node.
    replies: tuple[int, ...]


class Cl(NamedTuple):
    phase: int
    attempt: int
    #: the named slot during a round (named-slot), the held slot once inside.
    slot: int


class State(NamedTuple):
    cols: tuple[Col, ...]
    clients: tuple[Cl, ...]
    crashes_left: int


#: (what, client or node, client, detail) -- formatted only for traces.
Action = tuple[str, int, int, int]


@dataclass(frozen=True)
class LimitScenario:
    """Nodes, the limit, clients, faults, the design, and the expectation."""

    name: str
    description: str
    design: str = LOWEST
    nodes: int = 3
    limit: int = 2
    clients: int = 3
    #: rounds each client may try (a lost or given-up round is retried).
    attempts: int = 1
    #: nodes down from the start, for good.
    down: int = 0
    #: node crashes allowed in the run (each restarts empty, see delayed_restart).
    crashes: int = 0
    delayed_restart: bool = True
    #: replies may be lost (a request may always stay unprocessed for good).
    lossy: bool = True
    #: holders leave (release) when done; False: they stay in (splits are counted).
    leave: bool = True
    #: a round may be given up at any time (its deadline or validity ran out).
    deadline: bool = True
    expect: str = "safe"
    expect_kind: str = ""
    full_only: bool = False
    max_states: int = 3_000_000

    @property
    def quorum(self) -> int:
        return self.nodes // 2 + 1

    @property
    def width(self) -> int:
        return 1 if self.design == COUNTER else self.limit


def token(client: int, attempt: int) -> int:
    return client * 16 + attempt


def _at(items: tuple, i: int, value: object) -> tuple:  # type: ignore[type-arg]
    return (*items[:i], value, *items[i + 1 :])


class LimitModel:
    def __init__(self, sc: LimitScenario) -> None:
        if sc.design not in DESIGNS:
            raise ValueError(f"unknown design {sc.design!r}")
        self.sc = sc
        self.perms = list(itertools.permutations(range(sc.clients)))[1:]

    def initial(self) -> State:
        sc = self.sc
        data = () if sc.design == COUNTER else (FREE,) * sc.limit
        queues: tuple[tuple[Op, ...], ...] = ((),) * sc.clients
        cols = tuple(
            Col(GONE if k < sc.down else UP, data, queues, (AWAITING,) * sc.clients)
            for k in range(sc.nodes)
        )
        clients = (Cl(IDLE, 0, -1),) * sc.clients
        return State(cols, clients, sc.crashes)

    # -- moves ---------------------------------------------------------------- #

    def successors(self, s: State) -> list[tuple[Action, State]]:
        out: list[tuple[Action, State]] = []
        for c, cl in enumerate(s.clients):
            out.extend(self._client_moves(s, c, cl))
        for k, col in enumerate(s.cols):
            for c, queue in enumerate(col.queues):
                if queue:
                    out.extend(self._process(s, k, c))
            for i, tok in enumerate(col.data):
                if tok != FREE and not self._counted(s, tok, i):
                    out.append((("expire", k, tok // 16, i), self._expire(s, k, i)))
            if col.up == UP and s.crashes_left:
                out.append((("crash", k, -1, 0), self._crash(s, k)))
            if col.up == CRASHED and all(t == FREE for t in col.data):
                out.append((("rejoin", k, -1, 0), self._set_col(s, k, col._replace(up=UP))))
        return out

    def _client_moves(self, s: State, c: int, cl: Cl) -> list[tuple[Action, State]]:
        sc = self.sc
        out: list[tuple[Action, State]] = []
        if cl.phase == IDLE and cl.attempt < sc.attempts:
            for slot in range(sc.limit) if sc.design in (NAMED, FROM_START) else (-1,):
                out.append((("start", c, c, slot), self._start(s, c, slot)))
        if cl.phase == ROUND and sc.deadline:
            out.append((("give up", c, c, 0), self._set_client(s, c, cl._replace(phase=IDLE))))
        if cl.phase == INSIDE and sc.leave:
            out.append((("leave", c, c, cl.slot), self._set_client(s, c, cl._replace(phase=DONE))))
        return out

    def _start(self, s: State, c: int, slot: int) -> State:
        attempt = s.clients[c].attempt + 1
        s = self._send(s, c, (attempt, slot))
        cols = tuple(col._replace(replies=_at(col.replies, c, AWAITING)) for col in s.cols)
        return self._set_client(s._replace(cols=cols), c, Cl(ROUND, attempt, slot))

    def _process(self, s: State, k: int, c: int) -> list[tuple[Action, State]]:
        col = s.cols[k]
        (attempt, slot), rest = col.queues[c][0], col.queues[c][1:]
        col = col._replace(queues=_at(col.queues, c, rest))
        if col.up != UP:
            return [(("error", k, c, attempt), self._reply(s, k, c, col, attempt, 0))]
        data, granted = self._acquire(col.data, token(c, attempt), slot)
        col = col._replace(data=data)
        out = [(("acquire", k, c, granted), self._reply(s, k, c, col, attempt, granted))]
        if self.sc.lossy:
            out.append((("reply lost", k, c, granted), self._set_col(s, k, col)))
        return out

    def _acquire(self, data: tuple[int, ...], tok: int, slot: int) -> tuple[tuple[int, ...], int]:
        """What one node's script does with one acquire: the new data, the granted mask."""
        design = self.sc.design
        if design == COUNTER:
            if tok in data or len(data) >= self.sc.limit:
                return data, 0
            return tuple(sorted((*data, tok))), 1
        free = [i for i, holder in enumerate(data) if holder == FREE]
        if design == NAMED:
            take = [slot] if slot in free else []
        elif design == LOWEST:
            take = free[:1]
        elif design == FROM_START:
            limit = self.sc.limit
            take = [i for i in ((slot + j) % limit for j in range(limit)) if i in free][:1]
        else:
            take = free
        new = tuple(tok if i in take else holder for i, holder in enumerate(data))
        return new, sum(1 << i for i in take)

    def _reply(self, s: State, k: int, c: int, col: Col, attempt: int, granted: int) -> State:
        """The reply reaches the client; it decides once a majority set one slot
        (in) or every node has answered (a lost round)."""
        cl = s.clients[c]
        if cl.phase != ROUND or cl.attempt != attempt or col.replies[c] != AWAITING:
            return self._set_col(s, k, col)  # a late reply: not counted
        s = self._set_col(s, k, col._replace(replies=_at(col.replies, c, granted)))
        replies = [x.replies[c] for x in s.cols]
        for slot in range(self.sc.width):
            if sum(1 for r in replies if r > 0 and r >> slot & 1) >= self.sc.quorum:
                return self._set_client(s, c, Cl(INSIDE, attempt, slot))
        if AWAITING not in replies:
            return self._set_client(s, c, cl._replace(phase=IDLE))
        return s

    def _counted(self, s: State, tok: int, slot: int) -> bool:
        """Whether the entry's holder still counts it (then it cannot have expired,
        and the holder has not released it)."""
        cl = s.clients[tok // 16]
        if cl.attempt != tok % 16:
            return False
        if cl.phase == INSIDE:
            return self.sc.design == COUNTER or cl.slot == slot
        return cl.phase == ROUND

    def _expire(self, s: State, k: int, i: int) -> State:
        """Entry i of node k is released or expires."""
        col = s.cols[k]
        data = (
            col.data[:i] + col.data[i + 1 :]
            if self.sc.design == COUNTER
            else _at(col.data, i, FREE)
        )
        return self._set_col(s, k, col._replace(data=data))

    def _crash(self, s: State, k: int) -> State:
        s = s._replace(crashes_left=s.crashes_left - 1)
        col = s.cols[k]
        if self.sc.delayed_restart:
            return self._set_col(s, k, col._replace(up=CRASHED))
        empty = () if self.sc.design == COUNTER else (FREE,) * self.sc.limit
        return self._set_col(s, k, col._replace(data=empty))  # back at once, empty

    def _send(self, s: State, c: int, op: Op) -> State:
        """Queue op on the client's connection to every node."""
        cols = tuple(
            col._replace(queues=_at(col.queues, c, col.queues[c] + (op,))) for col in s.cols
        )
        return s._replace(cols=cols)

    @staticmethod
    def _set_col(s: State, k: int, col: Col) -> State:
        return s._replace(cols=_at(s.cols, k, col))

    @staticmethod
    def _set_client(s: State, c: int, cl: Cl) -> State:
        return s._replace(clients=_at(s.clients, c, cl))

    # -- invariants and symmetry --------------------------------------------------- #

    def violation(self, s: State) -> Optional[str]:
        inside = [cl for cl in s.clients if cl.phase == INSIDE]
        if len(inside) > self.sc.limit:
            return OVER_LIMIT
        if self.sc.design != COUNTER and len({cl.slot for cl in inside}) < len(inside):
            return SLOT_SHARED
        return None

    def canonical(self, s: State) -> tuple[object, ...]:
        """Equal for states that differ by renaming nodes or clients: the least of
        the client renamings, each with its nodes sorted."""
        best = (s.clients, s.crashes_left, tuple(sorted(s.cols)))
        for perm in self.perms:
            clients = [s.clients[0]] * len(s.clients)
            for c, cl in enumerate(s.clients):
                clients[perm[c]] = cl
            head = tuple(clients)
            if head > best[0]:
                continue
            key = (head, s.crashes_left, self._renamed(s.cols, perm))
            if key < best:
                best = key
        return best

    def _renamed(self, cols: tuple[Col, ...], perm: tuple[int, ...]) -> tuple[Col, ...]:
        def tok(t: int) -> int:
            return t if t == FREE else perm[t // 16] * 16 + t % 16

        out = []
        for col in cols:
            data = tuple(tok(t) for t in col.data)
            if self.sc.design == COUNTER:
                data = tuple(sorted(data))
            queues = [col.queues[0]] * len(perm)
            replies = [AWAITING] * len(perm)
            for c, p in enumerate(perm):
                queues[p], replies[p] = col.queues[c], col.replies[c]
            out.append(Col(col.up, data, tuple(queues), tuple(replies)))
        return tuple(sorted(out))
