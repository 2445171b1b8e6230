"""Talking to N Redis nodes at once: the synchronous round.

A lock operation is one *round*: the same command goes to every node, then the
replies are read as they arrive -- one ``poll`` over all the sockets, from one thread,
under one deadline shared by the whole round. The round stops as soon as its outcome
is decided (a quorum said yes, or too many said no), so a hung node costs at most the
round's deadline, never a deadline per node, and usually nothing at all.

The rooms this one drives:

- round.py counts: a sans-IO state machine told of each reply, failure and the
  deadline; it says when the outcome is decided and what each node's result is;
- connection.py talks to one node: non-blocking socket, handshake pipelined in front
  of the first command, replies owed from earlier rounds read and dropped in order;
- node.py is one node: URL -> address, TLS, handshake, and the idle connections;
- resp.py packs commands and parses replies.

What stays here is I/O policy: checking connections out and back in, the poll loop,
one reconnect within the round for a pooled connection the node had dropped, handing
connections that still owe replies to the finisher (late_replies.py reads them soon after
the round, so a release reaches every node), and fork safety (a process that finds
itself forked drops the parent's connections).

This module must not import Celery, redlock.py or task code.
"""

from __future__ import annotations

import math
import os
import select
import time
from typing import Callable, Final, NamedTuple, Optional, Sequence

from redis import exceptions as rexc

from ..errors import ConfigurationError
from . import late_replies as finisher
from . import unpatched
from .cluster import redirect_target
from .cluster_node import ClusterNode, make_node
from .connection import MIN_OWED_AGE, READY, Connection, owed_age
from .node import Node
from .resp import Command, pack
from .round import NOT_AWAITED, Batch, Round, Tally
from .straight import straight_round, take_in_step

__all__ = ["NOT_AWAITED", "Batch", "Command", "Node", "NodeSet", "pack"]

_POLLIN: Final = unpatched.POLL_READ
_POLLOUT: Final = unpatched.POLL_WRITE

# This process's pid, refreshed after a fork (a getpid per round is measurable).
_PID = os.getpid()


def _after_fork() -> None:
    global _PID
    _PID = os.getpid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


class _Route(NamedTuple):
    """What one node is sent in a round, and the hash slot it goes to (a cluster's)."""

    commands: tuple[Command, ...]
    slot: Optional[int]


class _Driven(NamedTuple):
    """A tally and how its replies map back to commands."""

    tally: Tally
    #: Tell the tally of node i's next reply; the command to send again as EVAL, if any.
    resend: Callable[[int, object], Optional[Command]]
    #: The commands node i still owes replies to, in order (sent again on reconnect).
    unanswered: Callable[[int], Sequence[Command]]


def _as_redis_error(exc: BaseException, address: str) -> BaseException:
    """A failure as the round reports it: redis-py's error classes only."""
    if isinstance(exc, rexc.RedisError):
        return exc
    return rexc.ConnectionError(f"{address}: {exc}")


class NodeSet:
    """N nodes and the round: one command to all of them, replies as they arrive."""

    def __init__(self, specs: Sequence[object], clock: Callable[[], float] = time.monotonic):
        self.nodes = [make_node(spec, i) for i, spec in enumerate(specs)]
        # Nodes whose address may have to be asked first (Sentinels, a cluster's map).
        self._discovering = any(
            node.sentinel is not None or node.cluster is not None for node in self.nodes
        )
        #: Whether a node is a Redis Cluster (its commands are routed by slot, one key
        #: per command: the lock renews such leases one by one, not in a batch).
        self.clustered = any(node.cluster is not None for node in self.nodes)
        seen: dict[tuple[str, ...], int] = {}
        for i, node in enumerate(self.nodes):
            if node.identity in seen:
                raise ConfigurationError(
                    f"nodes: {node.address} is listed twice (nodes[{seen[node.identity]}] "
                    f"and nodes[{i}]); Redlock needs N independent Redis masters"
                )
            seen[node.identity] = i
        #: Whether a round may go straight (straight.py): plain nodes only.
        self._straight = not self._discovering and not any(node.tls for node in self.nodes)
        self._clock = clock
        self._pid = _PID
        # How long a reply may stay owed, for the longest round deadline seen.
        self._owed_age = MIN_OWED_AGE

    def __len__(self) -> int:
        return len(self.nodes)

    def _check_fork(self) -> None:
        if self._pid != _PID:
            for node in self.nodes:
                node.reset()
            self._pid = _PID

    def close(self) -> None:
        for node in self.nodes:
            node.reset()

    def finish_owed(self, older_than: float) -> bool:
        """The finisher's sweep (see late_replies.py): read what idle connections have
        owed for over ``older_than`` seconds; True while some still owe."""
        if self._pid != _PID:
            return False  # the parent's connections
        now = self._clock()
        owing = False
        due: list[tuple[Node, Connection]] = []
        for node in self.nodes:
            for conn in node.idle_owing():
                if conn.state == READY and conn.owed_for(now) < older_than:
                    owing = True  # the next round on it may well read it first
                else:
                    due.append((node, conn))
        if not due:
            return owing
        # Take only what can move now (bytes in, room to write, or given up on):
        # a hung node's connection stays in the pool for rounds to use.
        poller = unpatched.poll()
        for _, conn in due:
            poller.register(conn.fileno(), _POLLIN | (_POLLOUT if conn.wants_write else 0))
        ready = {fd for fd, _ in poller.poll(0)}
        for node, conn in due:
            if conn.fileno() in ready or conn.owed_for(now) > self._owed_age:
                owing = node.finish(conn, now, self._owed_age) or owing
            else:
                owing = True
        return owing

    def round(
        self,
        command: Command,
        timeout: float,
        is_yes: Callable[[object], bool] = bool,
        enough_yes: Optional[int] = None,
        enough_no: Optional[int] = None,
        wait: bool = True,
        deliver: bool = False,
        settled: Optional[Callable[[list[object]], bool]] = None,
    ) -> list[object]:
        """Send ``command`` to every node and collect one reply per node.

        Stops when ``enough_yes`` replies satisfy ``is_yes`` or ``enough_no`` do not
        (errors count as no), when every node has answered, or at ``timeout``
        seconds. The result has one entry per node: the reply, ``NOT_AWAITED`` when
        the outcome was decided before that node answered, or an exception instance
        (``redis.ConnectionError``, ``redis.TimeoutError`` for a node that did not
        answer in time, ``redis.ResponseError`` for a script error).

        ``wait=False`` writes and returns at once (a failed acquire's clean-up must
        not wait on hung nodes): to each node's idle connection, or with
        ``deliver=True`` to a new one being set up where none is idle (the pool's are
        busy with other threads' or greenlets' rounds); their replies are read and
        dropped by the next round on the same connection (or the finisher), which
        also keeps the clean-up in order behind the command it undoes on a
        connection they share.

        Every command reaches every node it was written or queued to, also those
        the round stopped waiting for: a connection still being set up keeps it
        (sent once set up), and a NOSCRIPT reply that comes after the round is
        resent as EVAL. ``deliver=True``: also where no idle connection is left for
        a round that does not wait (a release, an undo): a new one is opened.
        ``settled``: decides the round early from the results so far
        (wire/round.py).
        """
        tally = Round(len(self.nodes), is_yes, enough_yes, enough_no, settled)

        def resend(i: int, reply: object) -> Optional[Command]:
            return command if tally.replied(i, reply) else None

        self._drive(
            (command,), _Driven(tally, resend, lambda i: (command,)), timeout, wait, deliver
        )
        return tally.finish()

    def batch_round(self, commands: Sequence[Command], tally: Batch, timeout: float) -> None:
        """Send every one of ``commands`` to every node, pipelined, in one round.

        ``tally`` (a ``Batch`` made for these commands, in this order) is told of each
        reply, failure and the deadline, as in ``round``: the round stops once every
        item of the batch is decided, every node has answered every command, or at
        ``timeout`` seconds. Read the outcome with ``tally.finish()``. A command still
        queued behind a connection's set-up when the round ends goes out after it
        (as in ``round``; EXTEND_MANY changes only keys that hold our value).
        """

        def resend(i: int, reply: object) -> Optional[Command]:
            again = tally.replied(i, reply)
            return None if again is None else commands[again]

        def unanswered(i: int) -> list[Command]:
            return [commands[c] for c in tally.unanswered(i)]

        self._drive(commands, _Driven(tally, resend, unanswered), timeout, True, False)

    def _drive(
        self,
        commands: Sequence[Command],
        driven: _Driven,
        timeout: float,
        wait: bool,
        deliver: bool,
    ) -> None:
        """One round of ``commands`` to every node: send, collect, check back in."""
        self._check_fork()
        tally = driven.tally
        now = self._clock()
        if wait and timeout > 0:
            age = owed_age(timeout)
            if age > self._owed_age:
                self._owed_age = age
        routes = self._routes(commands)  # before anything is sent: may refuse
        silent: set[int] = set()
        conns = (
            take_in_step(self.nodes, now, self._owed_age, timeout)
            if wait and self._straight
            else None
        )
        if conns is not None:
            straight = conns  # what the general loop reads on from, where it must

            def reconnect(
                i: int, conn: Connection, exc: BaseException, budget: float
            ) -> Optional[Connection]:
                return self._reconnect(driven, conn, exc, now, i, budget)

            def rest() -> bool:
                return self._collect(driven, straight, now + timeout, routes, silent)

            timed_out = straight_round(
                tally, driven.resend, conns, commands, now, now + timeout, self._clock,
                reconnect, rest,
            )  # fmt: skip
        else:
            conns = self._send_all(routes, tally, now, timeout, wait, deliver, silent)
            if 2 * len(silent) >= len(conns):
                silent.clear()  # a silent majority: more likely a slow client, waited for
            timed_out = wait and self._collect(driven, conns, now + timeout, routes, silent)
        late = tally.awaited if timed_out else ()
        if timed_out:
            tally.deadline_passed([node.address for node in self.nodes], timeout, silent)
        owing = False
        for i, (node, conn) in enumerate(zip(self.nodes, conns)):
            if i in late and (node.sentinel is not None or node.cluster is not None):
                # A hung master is what Sentinels (a cluster) fail over: ask them
                # again next round (the connection is dropped once the address moves).
                node.forget_address()
            if conn is None:
                continue
            if i in late and conn.behind_for(now) > self._owed_age:
                # Behind for long and no answer in time: out of step (requests lost
                # on the way) or slower than the deadline for long. Start afresh.
                conn.close()
            elif node.checkin(conn, now):
                owing = True
        if owing:
            finisher.note(self)

    def _routes(self, commands: Sequence[Command]) -> list[_Route]:
        """What each node is sent: the commands as it stores names (a cluster node's
        renamed, node.route) and the hash slot they go to. ConfigurationError when a
        cluster node cannot take them (keys in several slots)."""
        plain = _Route(tuple(commands), None)
        if not self.clustered:
            return [plain] * len(self.nodes)
        routes = []
        for node in self.nodes:
            if node.cluster is None:
                routes.append(plain)
                continue
            routed = [node.route(command) for command in commands]
            slots = {slot for _, slot in routed if slot is not None}
            if len(slots) > 1:
                raise ConfigurationError(
                    f"{node.address}: one round's commands span hash slots {sorted(slots)}; "
                    "a Redis Cluster node takes one key per round"
                )
            routes.append(_Route(tuple(c for c, _ in routed), next(iter(slots), None)))
        return routes

    def _send_all(
        self,
        routes: Sequence[_Route],
        tally: Tally,
        now: float,
        timeout: float,
        wait: bool,
        deliver: bool = False,
        silent: Optional[set[int]] = None,
    ) -> list[Optional[Connection]]:
        """Write ``commands`` to every node; the connection each one is awaited on.
        A node with no idle connection gets a new one, unless the round neither waits
        nor must deliver (a command that may be dropped). Into ``silent`` go the
        nodes whose connection has owed a reply for longer than ``timeout`` already:
        silent for a whole round's deadline (hung, stopped), their answer to this
        round can only come behind that one. When they are a minority, ``_collect``
        does not wait for them on its own: once only they are left to answer, it
        looks at them once more without waiting and ends the round as at its
        deadline. Waiting would cost every undecided round its deadline: with two of
        five nodes stopped, each split vote held its slots that long, and the
        waiters it refused with them. A silent majority is waited for as before
        (more likely a slow client than most nodes hung)."""  # fmt: skip
        conns: list[Optional[Connection]] = [None] * len(self.nodes)
        # Nodes whose address is known are written first; each Sentinel-managed node
        # still to be found then gets a share of what is left of the deadline, one
        # share staying for the replies, so that hung Sentinels cost their own node,
        # not the others (node.py).
        order: Sequence[int] = range(len(self.nodes))
        to_find = 0
        if self._discovering:
            order = sorted(order, key=lambda i: self.nodes[i].needs_discovery)
            to_find = sum(1 for node in self.nodes if node.needs_discovery)
        discovering = self._discovering
        for i in order:
            node = self.nodes[i]
            try:
                # Only a node that asks Sentinels or a cluster where to go spends it.
                budget = max(0.0, now + timeout - self._clock()) if discovering else timeout
                if to_find and node.needs_discovery:
                    budget /= to_find + 1  # and a share left for the replies
                    to_find -= 1
                # A clean-up that must be delivered (an undo, wait=False) opens a
                # connection where every pooled one is busy with another caller's
                # round: dropped, it would leave our entry on that node for its TTL.
                commands, slot = routes[i]
                conn = node.checkout(wait or deliver, now, self._owed_age, budget, slot)
                if conn is None:
                    continue
                conns[i] = conn
                if silent is not None and conn.owed_for(now) > timeout:
                    silent.add(i)
                try:
                    for command in commands:
                        conn.send(command.payload, command, now)
                except rexc.ConnectionError:
                    if conn.born == now or not wait:
                        raise
                    # A pooled connection the node dropped (restart, idle timeout):
                    # once more on a fresh one, within the same round.
                    conn.close()
                    conns[i] = conn = node.connect(now, budget, slot)
                    for command in commands:
                        conn.send(command.payload, command, now)
            except (rexc.RedisError, OSError) as exc:
                if node.cluster is not None:
                    node.forget_address()  # a server gone: the map may be stale
                tally.failed(i, _as_redis_error(exc, node.address))
                failed = conns[i]
                if failed is not None:
                    failed.close()
                    conns[i] = None
        return conns

    def _collect(
        self,
        driven: _Driven,
        conns: list[Optional[Connection]],
        deadline: float,
        routes: Sequence[_Route],
        silent: set[int],
    ) -> bool:
        """Read replies until decided (False) or the deadline passed (True); the
        ``silent`` nodes (a minority) are not waited for on their own (``_send_all``)."""
        tally = driven.tally
        started = self._clock()
        clustered = self.clustered
        redirected: set[int] = set()  # cluster nodes redirected this round (once each)
        poller = unpatched.poll()
        by_fd: dict[int, int] = {}
        for i, conn in enumerate(conns):
            if conn is not None and tally.awaiting(i):  # a straight round's rest: some answered
                fd = conn.fileno()
                by_fd[fd] = i
                poller.register(fd, _POLLIN | (_POLLOUT if conn.wants_write else 0))
        final = False
        while by_fd and not tally.decided and not final:
            remaining = deadline - self._clock()
            # Past the deadline, look once more without waiting: a thread that woke
            # late (GIL, busy CPU) must not ignore replies already in the sockets.
            final = remaining <= 0 or (bool(silent) and silent.issuperset(by_fd.values()))
            events = poller.poll(0 if final else math.ceil(remaining * 1000))
            for fd, event in events:
                i = by_fd.get(fd, -1)
                conn = conns[i] if i >= 0 else None
                if conn is None:
                    continue
                try:
                    if event & select.POLLOUT:
                        conn.advance()
                    replies = conn.read() if event & _POLLIN or conn.state != READY else []
                except (rexc.RedisError, OSError) as exc:
                    poller.unregister(fd)
                    del by_fd[fd]
                    conn.close()
                    budget = max(0.0, deadline - self._clock())
                    fresh = self._reconnect(driven, conn, exc, started, i, budget, routes[i].slot)
                    if fresh is not None:
                        conns[i] = fresh
                        by_fd[fresh.fileno()] = i
                        poller.register(fresh.fileno(), _POLLIN | _POLLOUT)
                    continue
                # A cluster node's MOVED / ASK: the command goes on to the server named.
                redirect: Optional[tuple[bool, int, str, int]] = None
                moved_to: Optional[Connection] = None
                for reply in replies:
                    if clustered and routes[i].slot is not None and i not in redirected:
                        redirect = redirect_target(reply)
                        if redirect is not None:
                            redirected.add(i)
                            budget = max(0.0, deadline - self._clock())
                            moved_to = self._redirect(driven, i, redirect, budget)
                            break  # one command per cluster round: nothing behind it
                    again = driven.resend(i, reply)
                    if again is not None:  # the node forgot our scripts
                        again = self._as_sent(i, again)
                        conn.send(again.fallback(), again, self._clock())
                if redirect is not None:
                    poller.unregister(fd)
                    del by_fd[fd]
                    if self.nodes[i].checkin(conn, self._clock()):  # the redirect was read
                        finisher.note(self)  # it still owes older replies
                    conns[i] = moved_to  # None: the node failed (the tally was told)
                    if moved_to is not None:
                        by_fd[moved_to.fileno()] = i
                        poller.register(moved_to.fileno(), _POLLIN | _POLLOUT)
                    continue
                if not tally.awaiting(i):
                    poller.unregister(fd)
                    del by_fd[fd]
                elif conn.sock is not None:
                    poller.modify(fd, _POLLIN | (_POLLOUT if conn.wants_write else 0))
        return final and bool(by_fd)

    def _reconnect(
        self,
        driven: _Driven,
        conn: Connection,
        exc: BaseException,
        started: float,
        i: int,
        budget: float,
        slot: Optional[int] = None,
    ) -> Optional[Connection]:
        """Node ``i``'s connection failed mid-round: a fresh one that was sent the
        commands still unanswered, or None when the node has failed this round (the
        tally is told). ``budget``: seconds left of the round (see ``Node.connect``);
        ``slot``: where the commands go (a cluster node's)."""
        node = self.nodes[i]
        if isinstance(exc, (rexc.ConnectionError, OSError)) and conn.born < started:
            # A pooled connection the node had dropped (restart, idle timeout): once
            # more on a fresh one, within this round. The scripts are idempotent for
            # our own value, so a resend is safe.
            try:
                fresh = node.connect(started, budget, slot)
                for command in driven.unanswered(i):
                    command = self._as_sent(i, command)
                    fresh.send(command.payload, command, started)
            except (rexc.RedisError, OSError) as again:  # OSError: e.g. out of fds
                exc = again
            else:
                return fresh
        if node.cluster is not None:
            node.forget_address()
        driven.tally.failed(i, _as_redis_error(exc, node.address))
        return None

    def _as_sent(self, i: int, command: Command) -> Command:
        """``command`` as node ``i`` is sent it (renamed on a cluster node)."""
        return command if self.nodes[i].cluster is None else self.nodes[i].route(command)[0]

    def _redirect(
        self, driven: _Driven, i: int, target: tuple[bool, int, str, int], budget: float
    ) -> Optional[Connection]:
        """Cluster node ``i`` answered ``MOVED`` or ``ASK`` (``target``): its unanswered
        commands sent where it says (``ClusterNode.follow``), or None when that fails
        (the tally is told). Once per node and round: a second redirect is a no."""
        node = self.nodes[i]
        assert isinstance(node, ClusterNode)
        try:
            return node.follow(target, driven.unanswered(i), self._clock(), self._owed_age, budget)
        except (rexc.RedisError, OSError) as exc:
            node.forget_address()
            driven.tally.failed(i, _as_redis_error(exc, node.address))
            return None
