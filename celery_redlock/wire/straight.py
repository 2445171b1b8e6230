"""The usual round, straight through.

Most rounds are one script (or a batch of them) sent to plain nodes -- no Sentinel,
no cluster, no TLS -- each with an idle connection that is set up and in step. The
general round (node_set.py) spends much of its Python on what such a round never
meets: discovery budgets, hash slots and redirects, silent nodes, connections being
set up. This one takes every node's connection first (``take_in_step``) and gives up
before anything is sent when one is not ready, so the general round runs instead;
once sent, what can still happen -- a pooled connection the node had dropped, a
write the kernel took only in part, a NOSCRIPT resent as EVAL -- is handed back to
the general round's own code (``reconnect``, ``rest``), never handled twice.

Imported by node_set.py; must not import it.
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

from redis import exceptions as rexc

from . import unpatched
from .connection import READY, Connection
from .node import Node
from .resp import Command
from .round import Tally

__all__ = ["straight_round", "take_in_step"]

#: Node i's connection failed: a fresh one sent what it owes, or None (the tally was
#: told); given the seconds left of the round.
Reconnect = Callable[[int, Connection, BaseException, float], Optional[Connection]]


def take_in_step(
    nodes: Sequence[Node], now: float, owed_age: float, timeout: float
) -> Optional[list[Optional[Connection]]]:
    """Every node's connection for a straight round (``Node.take_in_step``; none owes
    a reply older than ``timeout``: no node is silent), or None, taking none."""
    conns: list[Optional[Connection]] = []
    for node in nodes:
        conn = node.take_in_step(now, owed_age, timeout)
        if conn is None:
            for taken, back in zip(nodes, conns):
                assert back is not None
                taken.put_back(back)
            return None
        conns.append(conn)
    return conns


def straight_round(
    tally: Tally,
    resend: Callable[[int, object], Optional[Command]],
    conns: list[Optional[Connection]],
    commands: Sequence[Command],
    now: float,
    deadline: float,
    clock: Callable[[], float],
    reconnect: Reconnect,
    rest: Callable[[], bool],
) -> bool:
    """Send ``commands`` on ``conns`` (from ``take_in_step``) and read the replies
    until ``tally`` is decided; True when ``deadline`` passed first. ``resend``: tells
    the tally of node i's reply; the command to send it again as EVAL, if any.
    ``rest``: the general round's reading loop, which takes over from wherever this
    one stops."""
    for i, conn in enumerate(conns):
        assert conn is not None
        try:
            for command in commands:
                conn.send(command.payload, command, now)
        except rexc.ConnectionError as exc:
            conn.close()  # once more on a fresh one, as the general round
            conns[i] = reconnect(i, conn, exc, deadline - now)
    if not all(conn is not None and conn.state == READY and not conn.out for conn in conns):
        return rest()
    poller = unpatched.poll()
    by_fd: dict[int, int] = {}
    for i, conn in enumerate(conns):
        assert conn is not None
        fd = conn.fileno()
        by_fd[fd] = i
        poller.register(fd, unpatched.POLL_READ)
    final = False
    while by_fd and not tally.decided and not final:
        remaining = deadline - clock()
        final = remaining <= 0  # then one more look without waiting, as _collect
        for fd, _ in poller.poll(0 if final else math.ceil(remaining * 1000)):
            i = by_fd[fd]
            conn = conns[i]
            assert conn is not None
            try:
                replies = conn.read()
            except (rexc.RedisError, OSError) as exc:
                conn.close()
                conns[i] = reconnect(i, conn, exc, max(0.0, deadline - clock()))
                return rest()
            for reply in replies:
                again = resend(i, reply)
                if again is not None:  # the node forgot our scripts
                    conn.send(again.fallback(), again, clock())
            if conn.out:  # a resend the kernel took only in part
                return rest()
            if not tally.awaiting(i):
                poller.unregister(fd)
                del by_fd[fd]
    return final and bool(by_fd)
