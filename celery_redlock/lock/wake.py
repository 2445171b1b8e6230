"""Hearing releases: a blocked synchronous acquire waits for the key's release.

Why: between attempts, a blocked ``acquire`` used to sleep a random 0.5..1.5 x
``retry_delay``, so it took the lock a median 55-92 ms after the holder let go.
Here every release script PUBLISHes on the key's *wake channel* (``<key>\\0wake``,
scripts.py) on each node where it deleted the key, and a blocked acquire listens:

1. its first attempt is refused: it SUBSCRIBEs to the channel on every node (a
   pooled pub/sub connection per node, see below) and waits for the confirmations,
   at most ``node_timeout``; then it attempts again at once. A release between the
   first attempt and the subscription is seen by that attempt; any later one is
   heard. Nothing falls between the two.
2. each later refusal waits for the first message from any node, bounded by the
   holder's remaining TTL (a crashed holder never publishes: its keys expire) and
   the caller's timeout. Where fewer than ``N - quorum + 1`` nodes could be
   subscribed, a release might be published only on nodes we do not hear (any
   quorum of the holder's keys meets that many nodes), so the wait is the polling
   one (``retry_delay``) instead -- still cut short by what is heard.
3. on the way out (won, gave up, or an error) it UNSUBSCRIBEs and returns the
   connections to the pool: one pub/sub connection per node per concurrently
   blocked acquire, reused, none left per acquire; ``Redlock.close`` closes them.

One release, one waiter per process (``Releases``): a message names its release
(the SHA-1 of a tag and the released value, the same on every node), and of the
waiters of one lock in a process, the first to look takes it and attempts; the
others keep waiting. Before, every waiter heard every release and attempted: 6
threads of one process queued on a key made 21 attempts for 6 releases (37 scripts
on a node, 13-15 now), 8 asyncio tasks 96 scripts (17 now; tests/lock/test_wake.py
and its asyncio twin count them on a node). A release is taken for ``TAKEN_FOR``
seconds; read later (a waiter busy in a long round), it wakes one more waiter: one
spare attempt. Its taker may take it again: an attempt made on the first messages
can reach a node before the release does and be refused there by the releasing
holder, and that node's message, coming after, is news to it (before, it was
dropped as taken, and the taker slept through the release; tests/lock/test_wake.py).
A taker's attempt that loses is undone, and the undo's message wakes the next
waiter. An empty message (``clear``, ``force_release``, or a release script of a
version before this one) wakes every waiter, as before.

Only what can matter wakes (``Pause.wake_on``): after an attempt a quorum refused
(one holder, or every permit taken), a waiter wakes only for messages from the
nodes that refused it. Any quorum meets those nodes, so no attempt can win before
every one of them in some quorum frees something, and each such freeing publishes
there (or expires, which the TTL bound covers); with at least ``N - quorum + 1`` of
them heard, every quorum meets one that is (else any node's message wakes, as
before). What frees elsewhere -- the waiter's own undo on the
nodes that granted it, the next waiter's -- restores what the attempt saw. Before,
a holder with a quorum and a node left free (a racing claim kept the holder's round
out there, then was undone) made a storm: every waiter's attempt was granted on that
node, undone, and its undo's message woke the next waiter, until the holder let go
(in a gevent worker with a limit of 3, a freed permit then waited a p90 of 0.7-1 s:
tests/workers/test_limits_workers.py; tests/lock/test_wake.py reproduces the storm
on real nodes).

What it does not change: safety (a message only ends a wait; the next attempt is
an ordinary quorum round), fairness (none: the waiter of a process that looks
first goes; across processes every process's one attempts, one wins, the others
see the new holder and wait again), and expiry (not published; the TTL bound
covers it, as it does keys deleted by hand; ``clear`` publishes each key it
deletes, as ``force_release`` does).

Permissions: PUBLISH runs under ``redis.pcall`` with its outcome ignored, so a
release never fails for it (Redis 7 ACL users get no channel by default:
``acl-pubsub-default resetchannels``); a node that refuses SUBSCRIBE (or cannot
be reached) is simply not heard: its waiters poll. The lock's ACL user wants
``+publish +subscribe +unsubscribe &<prefix>*`` for this (SAFETY.md).

I/O: a connection is set up by connection.py (address, Sentinel discovery, TLS,
AUTH/SELECT handshake on a non-blocking, never-patched socket); its pushes are
parsed here. Waiting for the subscriptions uses the original ``poll`` like a round
(at most ``node_timeout``); the long wait for a message uses the process's own
``select.select``, which under gevent/eventlet is cooperative, so a blocked acquire
never holds a hub longer than a round would. An injected ``sleep`` (tests) turns
hearing off: the lock then polls through it (redlock.py).

Imports connection.py, wire/script.py, node.py, quorum.py, resp.py and unpatched.py; must
not import node_set.py, redlock.py or Celery.
"""

from __future__ import annotations

import os
import select
import threading
from collections import deque
from typing import Callable, Collection, Final, Iterable, Mapping, Optional, Protocol, Sequence

from redis import exceptions as rexc

from ..wire import unpatched
from ..wire.connection import READY, Connection
from ..wire.node import Node
from ..wire.resp import INCOMPLETE, pack, parse
from .steps import Pause
from .stored import wake_channel

__all__ = ["Listener", "Releases", "Subscriber", "Wakeups", "wake_channel", "woken"]

_POLLIN: Final = unpatched.POLL_READ
_POLLOUT: Final = unpatched.POLL_WRITE
#: Seconds a release stays taken by the waiter it woke (its messages from every
#: node come within a round); read later, it wakes one more waiter.
TAKEN_FOR: Final = 2.0
#: Releases remembered before the ones older than ``TAKEN_FOR`` are forgotten.
_REMEMBERED: Final = 256

#: A message heard: its channel and what was published (a release's name, or empty).
Event = tuple[bytes, bytes]


class Releases:
    """The releases this process's waiters were woken by (see module): each wakes
    one waiter per process -- the one that took it, as often as it hears it again --
    and an empty message wakes every waiter."""

    def __init__(self) -> None:
        self._taken: dict[Event, tuple[float, object]] = {}  # -> when, and by whom
        self._lock = threading.Lock()  # threads; a green lock under gevent/eventlet

    def take(self, heard: Iterable[Event], now: float, taker: object) -> bool:
        """Take for ``taker`` (a waiter) the first release of ``heard`` that no other
        waiter here took: True when one was (the caller attempts for it), False when
        others took them all. A release ``taker`` took before is its own again: its
        attempt may have reached a node before the release did and lost there, and
        what that node says now (its message came after the refusal) is news to it."""
        with self._lock:
            taken = self._taken
            if len(taken) > _REMEMBERED:
                for event in [e for e, (at, _) in taken.items() if now - at > TAKEN_FOR]:
                    del taken[event]
            for event in heard:
                if not event[1]:
                    return True  # unnamed: every waiter
                at, by = taken.get(event, (None, None))
                if at is None or now - at > TAKEN_FOR or by is taker:
                    taken[event] = (now, taker)
                    return True
        return False


class Hearing(Protocol):
    """What ``woken`` reads of a lock's wake-ups (``Wakeups``, asyncio's ``AsyncWakeups``)."""

    releases: Releases
    heard_enough: int


def woken(
    subs: Mapping[int, Subscriber], wakeups: Hearing, wake_on: Optional[Collection[int]],
    now: float, taker: object,
) -> bool:  # fmt: skip
    """Whether what ``subs`` (by node index) heard since the last look wakes their
    waiter ``taker``: a release it takes (``wakeups.releases``), heard on a node of ``wake_on``
    (None: any) -- if at least ``wakeups.heard_enough`` of those are heard
    (confirmed), else on any node. What they heard is forgotten either way."""
    releases = wakeups.releases
    heard_on = sum(1 for i in wake_on or () if i in subs and subs[i].confirmed)
    if heard_on < wakeups.heard_enough:
        wake_on = None  # a quorum might free where none of them is heard: see module
    heard = [
        event for i, sub in subs.items() if wake_on is None or i in wake_on for event in sub.heard
    ]
    for sub in subs.values():
        sub.heard = []
    return bool(heard) and releases.take(heard, now, taker)


class Subscriber:
    """One pub/sub connection to one node: what it asked for and what it heard."""

    __slots__ = ("acks", "broken", "conn", "denied", "heard", "wanted", "watching")

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.acks: deque[bytes] = deque()  # SUBSCRIBEs whose reply is owed, in order
        self.wanted: set[bytes] = set()  # the current listener's channels
        self.watching: set[bytes] = set()  # ... of which the node confirmed these
        self.denied = False  # the node refused a SUBSCRIBE (ACL)
        self.heard: list[Event] = []  # messages on watched channels since the last look
        self.broken = False  # out of step or closed: never reuse

    def listen(self, channels: Sequence[bytes]) -> None:
        self.wanted = set(channels)
        for channel in channels:
            self._write(pack(b"SUBSCRIBE", channel))
            self.acks.append(channel)

    @property
    def confirmed(self) -> bool:
        return not self.broken and not self.denied and self.watching == self.wanted

    def stop(self) -> None:
        """Unsubscribe the listener's channels (their replies are read and dropped)."""
        channels = sorted(self.wanted)
        self.wanted, self.watching, self.heard, self.denied = set(), set(), [], False
        if channels and not self.broken:
            try:
                self._write(pack(b"UNSUBSCRIBE", *channels))
            except rexc.ConnectionError:
                self.broken = True

    def _write(self, payload: bytes) -> None:
        conn = self.conn
        if conn.sock is None:
            raise rexc.ConnectionError(f"{conn.node.address}: closed")
        conn.out += payload  # behind the handshake, in order
        if conn.state == READY:
            conn.flush()

    def read(self) -> None:
        """Take what has arrived (never waits). Raises ``redis.ConnectionError``."""
        conn = self.conn
        conn.read()  # set-up, handshake replies, and the bytes behind them
        if conn.expect or conn.state != READY:
            return  # the handshake's replies come first
        buf, pos = conn.inbuf, 0
        while pos < len(buf):
            push, pos = parse(buf, pos)
            if push is INCOMPLETE:
                break
            self._take(push)
        del buf[:pos]

    def _take(self, push: object) -> None:
        if isinstance(push, rexc.RedisError):
            if not self.acks:
                self.broken = True  # an error we did not ask for: out of step
                return
            if self.acks.popleft() in self.wanted:
                self.denied = True
            return
        if not isinstance(push, list) or len(push) != 3:
            self.broken = True
            return
        kind, channel = push[0], push[1]
        if kind == b"subscribe" and self.acks:
            if self.acks.popleft() == channel and channel in self.wanted:
                self.watching.add(channel)
        elif kind == b"message" and channel in self.watching:
            self.heard.append((channel, push[2]))

    def close(self) -> None:
        self.broken = True
        self.conn.close()


class Wakeups:
    """One lock's pub/sub connections: idle ones per node, reused by the next
    blocked acquire (``listener``)."""

    def __init__(self, nodes: Sequence[Node], heard_enough: int, node_timeout: float) -> None:
        self._nodes = list(nodes)
        self._idle: list[deque[Subscriber]] = [deque() for _ in self._nodes]
        #: Subscribed nodes that meet every quorum of the holder's keys (N - quorum + 1).
        self.heard_enough = heard_enough
        self.node_timeout = node_timeout
        #: The releases its waiters in this process took (one waiter per release).
        self.releases = Releases()
        self._pid = os.getpid()

    @property
    def node_count(self) -> int:
        return len(self._nodes)

    def node(self, i: int) -> Node:
        return self._nodes[i]

    def listener(self, clock: Callable[[], float], sleep: Callable[[float], None]) -> Listener:
        """A blocked acquire's subscriptions (its ``drive`` pause); ``close`` it."""
        if self._pid != os.getpid():  # forked: the connections are the parent's
            self._idle = [deque() for _ in self._nodes]
            self.releases = Releases()
            self._pid = os.getpid()
        return Listener(self, clock, sleep)

    def checkout(self, i: int, now: float) -> Optional[Subscriber]:
        idle = self._idle[i]
        while idle:
            try:
                sub = idle.pop()  # atomic: no lock needed between threads
            except IndexError:
                break
            try:
                sub.read()  # what came while idle (unsubscribe replies)
            except (rexc.RedisError, OSError):
                sub.close()
                continue
            if not sub.broken:
                return sub
            sub.close()
        try:
            return Subscriber(self._nodes[i].connect(now, self.node_timeout))
        except (rexc.RedisError, OSError):
            return None  # not heard: the waits on this node poll

    def checkin(self, i: int, sub: Subscriber) -> None:
        sub.stop()
        if sub.broken or sub.conn.sock is None:
            sub.close()
        else:
            self._idle[i].append(sub)

    def close(self) -> None:
        idle, self._idle = self._idle, [deque() for _ in self._nodes]
        for subs in idle:
            for sub in subs:
                sub.close()


class Listener:
    """One blocked acquire's subscriptions, and how its pauses wait (see module)."""

    def __init__(
        self, wakeups: Wakeups, clock: Callable[[], float], sleep: Callable[[float], None]
    ) -> None:
        self._wakeups = wakeups
        self._clock = clock
        self._sleep = sleep
        self._subs: dict[int, Subscriber] = {}
        self._started = False

    def pause(self, step: Pause) -> None:
        """Wait out ``step`` (quorum.drive's ``pause``)."""
        if not step.keys:
            self._sleep(step.seconds)
            return
        if not self._started:
            self._started = True
            self._subscribe(step.keys)
            if self._subs:
                self._forget_heard()  # the next attempt comes after these
                return  # attempt again now: a release before the subscription shows there
        started = self._clock()
        while self._subs:
            enough = self.heard_on() >= self._wakeups.heard_enough
            bound = step.longest if enough and step.longest is not None else step.seconds
            left = started + bound - self._clock()
            if any(sub.heard for sub in self._subs.values()):
                self._poll(0.0)  # the same release's messages from the other nodes
                if woken(self._subs, self._wakeups, step.wake_on, self._clock(), self):
                    return  # the next attempt comes after them
                continue  # released for another waiter here: this one waits on
            if left <= 0:
                return
            self._poll(left)
        left = started + step.seconds - self._clock()
        if left > 0:
            self._sleep(left)

    def _forget_heard(self) -> None:
        for sub in self._subs.values():
            sub.heard = []

    def heard_on(self) -> int:
        """Nodes on which every channel is confirmed subscribed."""
        return sum(1 for sub in self._subs.values() if sub.confirmed)

    def close(self) -> None:
        """Unsubscribe and hand the connections back (or close the broken ones)."""
        subs, self._subs = self._subs, {}
        for i, sub in subs.items():
            self._wakeups.checkin(i, sub)

    def _subscribe(self, keys: Sequence[str]) -> None:
        now = self._clock()
        for i in range(self._wakeups.node_count):
            sub = self._wakeups.checkout(i, now)
            if sub is None:
                continue
            node = self._wakeups.node(i)
            try:
                sub.listen([wake_channel(node.renamed_name(key)) for key in keys])
            except rexc.ConnectionError:
                sub.close()
                continue
            self._subs[i] = sub
        # The confirmations, under a round's deadline and a round's kind of wait.
        deadline = now + self._wakeups.node_timeout
        while self._subs and any(sub.acks for sub in self._subs.values()):
            left = deadline - self._clock()
            if left <= 0:
                break
            self._poll(left, cooperative=False)

    def _poll(self, seconds: float, cooperative: bool = True) -> None:
        """Wait up to ``seconds`` for any subscriber to have bytes; read them."""
        by_fd = {sub.conn.fileno(): (i, sub) for i, sub in self._subs.items()}
        if cooperative and unpatched.hub_kind():
            # The process's select: under gevent/eventlet it yields to the hub.
            reading = list(by_fd)
            writing = [fd for fd, (_, sub) in by_fd.items() if sub.conn.wants_write]
            ready, writable, _ = select.select(reading, writing, [], seconds)
            events = {*ready, *writable}
        else:
            poller = unpatched.poll()
            for fd, (_, sub) in by_fd.items():
                poller.register(fd, _POLLIN | (_POLLOUT if sub.conn.wants_write else 0))
            events = {fd for fd, _ in poller.poll(max(0, int(seconds * 1000 + 0.999)))}
        for fd in events:
            i, sub = by_fd[fd]
            try:
                sub.read()
            except (rexc.RedisError, OSError):
                sub.broken = True
            if sub.broken:
                sub.close()
                del self._subs[i]
