"""Hearing releases on the event loop: a blocked ``AsyncRedlock`` acquire waits
for the key's release instead of sleeping ``retry_delay``.

The asyncio twin of the package's wake.py, with the same design (read it there):
every release script PUBLISHes on the key's wake channel (``<key>\\0wake``), and a
blocked acquire

1. at its first refusal SUBSCRIBEs on every node and waits for the confirmations,
   at most ``node_timeout``, then attempts again at once, so a release before the
   subscription is seen by that attempt and any later one is heard;
2. at each later refusal awaits the first message from any node, bounded by the
   holder's remaining TTL and the caller's timeout -- or, where fewer than
   ``N - quorum + 1`` nodes confirmed, by the polling delay (``Pause.seconds``);
3. on the way out (won, gave up, an error, or cancelled) UNSUBSCRIBEs and returns
   the connections to the pool, one per node per concurrently blocked acquire;
   ``AsyncRedlock.close`` closes the idle ones.

A subscriber's connection is an ``asyncio.Protocol``: connection.py's
``NodeConnection`` (the same address, TLS and AUTH/SELECT handshake), whose pushes
go as they come (``data_received``) to the synchronous subscriber's bookkeeping
(wake.py's ``Subscriber``: what was asked, confirmed, refused and heard; only its
writes differ) and wake the waiting acquire through one future; no task per
subscriber or per wait (a timer bounds the wait), no thread, no blocking I/O.
Cancelled while waiting, the acquire's ``close`` still runs: UNSUBSCRIBE is written
at once (a transport write never waits), so it keeps no subscription.

Imports node.py, quorum.py, resp.py, wake.py and this package's connection.py;
must not import nodes.py, redlock.py or Celery.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Optional, Sequence

from redis import exceptions as rexc

from ..lock.steps import Pause
from ..lock.wake import Releases, Subscriber, wake_channel, woken
from ..wire.node import Node
from ..wire.resp import INCOMPLETE, parse
from .connection import NodeConnection

__all__ = ["AsyncListener", "AsyncWakeups"]


class _Protocol(NodeConnection):
    """One pub/sub connection to one node: the handshake's replies, then pushes,
    each handed to its subscriber as it comes."""

    def __init__(self, node: Node, index: int, now: float) -> None:
        super().__init__(node, index, now)
        self.sub = AsyncSubscriber(self)

    def data_received(self, data: bytes) -> None:
        buf = self.inbuf
        buf += data
        pos = 0
        while pos < len(buf):
            push, after = parse(buf, pos)
            if push is INCOMPLETE:
                break
            pos = after
            if self.owed:  # the handshake's replies come first
                self.owed.popleft().replied(self, push)
            else:
                self.sub._take(push)  # the synchronous subscriber's bookkeeping
                if self.sub.broken:
                    self.close()  # out of step
            if self.closed:
                return
        del buf[:pos]
        self.sub.poke()

    def fail(self, error: BaseException) -> None:
        super().fail(error)
        self.sub.broken = True
        self.sub.poke()


class AsyncSubscriber(Subscriber):
    """What one node's connection asked for and heard: the synchronous
    subscriber's state and pushes (wake.py), written and read on the event loop."""

    __slots__ = ("listener", "protocol")

    def __init__(self, protocol: _Protocol) -> None:
        super().__init__(protocol)  # type: ignore[arg-type]  # only close() is called on it
        self.protocol = protocol
        self.listener: Optional[AsyncListener] = None  # told of every change

    def _write(self, payload: bytes) -> None:
        protocol = self.protocol
        if protocol.closed:
            raise rexc.ConnectionError(f"{protocol.node.address}: closed")
        protocol.outbuf.append(payload)  # behind the handshake, in order
        protocol.flush()  # written now, or once connected

    def read(self) -> None:
        """Pushes are taken as they come (``_Protocol.data_received``)."""

    def poke(self) -> None:
        if self.listener is not None:
            self.listener.poke()


class AsyncWakeups:
    """One lock's pub/sub connections: idle ones per node, reused by the next
    blocked acquire of the same event loop (``listener``)."""

    def __init__(self, nodes: Sequence[Node], heard_enough: int, node_timeout: float) -> None:
        self._nodes = list(nodes)
        self._idle: list[list[AsyncSubscriber]] = [[] for _ in self._nodes]
        #: Subscribed nodes that meet every quorum of the holder's keys (N - quorum + 1).
        self.heard_enough = heard_enough
        self.node_timeout = node_timeout
        #: The releases its waiters took: each wakes one of them (wake.py).
        self.releases = Releases()

    @property
    def node_count(self) -> int:
        return len(self._nodes)

    def listener(
        self, clock: Callable[[], float], sleep: Callable[[float], Awaitable[Any]]
    ) -> AsyncListener:
        """A blocked acquire's subscriptions (its pauses); ``close`` it."""
        return AsyncListener(self, clock, sleep)

    def node(self, i: int) -> Node:
        return self._nodes[i]

    def checkout(self, i: int, now: float) -> AsyncSubscriber:
        """An idle subscriber of this event loop, or a new one (connecting)."""
        loop = asyncio.get_running_loop()
        idle = self._idle[i]
        while idle:
            sub = idle.pop()
            if not sub.broken and sub.protocol.loop is loop:
                return sub
            sub.close()  # failed while idle, or an earlier event loop's
        return _Protocol(self._nodes[i], i, now).sub

    def checkin(self, i: int, sub: AsyncSubscriber) -> None:
        sub.stop()
        sub.listener = None
        if sub.broken or sub.protocol.transport is None:
            sub.close()  # never connected: not worth keeping
        else:
            self._idle[i].append(sub)

    def close(self) -> None:
        idle, self._idle = self._idle, [[] for _ in self._nodes]
        for subs in idle:
            for sub in subs:
                sub.close()


def _settle(wake: asyncio.Future[None]) -> None:
    if not wake.done():
        wake.set_result(None)


class AsyncListener:
    """One blocked acquire's subscriptions, and how its pauses wait (see module)."""

    def __init__(
        self,
        wakeups: AsyncWakeups,
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[Any]],
    ) -> None:
        self._wakeups = wakeups
        self._clock = clock
        self._sleep = sleep
        self._subs: dict[int, AsyncSubscriber] = {}
        self._started = False
        self._wake: Optional[asyncio.Future[None]] = None

    def poke(self) -> None:
        """Something arrived (a message, a confirmation, a failure): look again."""
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    async def pause(self, step: Pause) -> None:
        """Wait out ``step`` (an acquire's pause between attempts)."""
        if not step.keys:
            await self._sleep(step.seconds)
            return
        if not self._started:
            self._started = True
            await self._subscribe(step.keys)
            if self._subs:
                self._forget_heard()  # the next attempt comes after these
                return  # attempt again now: a release before the subscription shows there
        started = self._clock()
        while self._live():
            enough = self.heard_on() >= self._wakeups.heard_enough
            bound = step.longest if enough and step.longest is not None else step.seconds
            left = started + bound - self._clock()
            if any(sub.heard for sub in self._subs.values()):
                if woken(self._subs, self._wakeups, step.wake_on, self._clock(), self):
                    return  # the next attempt comes after them
                continue  # released for another waiter of this loop: wait on
            if left <= 0:
                return
            await self._wait(left)
        left = started + step.seconds - self._clock()
        if left > 0:
            await self._sleep(left)

    def _forget_heard(self) -> None:
        for sub in self._subs.values():
            sub.heard = []

    def _live(self) -> bool:
        """Drop the subscribers whose connection failed; whether any is left."""
        for i, sub in list(self._subs.items()):
            if sub.broken:
                sub.listener = None
                del self._subs[i]
        return bool(self._subs)

    def heard_on(self) -> int:
        """Nodes on which every channel is confirmed subscribed."""
        return sum(1 for sub in self._subs.values() if sub.confirmed)

    def close(self) -> None:
        """Unsubscribe and hand the connections back (or close the broken ones)."""
        subs, self._subs = self._subs, {}
        for i, sub in subs.items():
            self._wakeups.checkin(i, sub)

    async def _subscribe(self, keys: Sequence[str]) -> None:
        now = self._clock()
        for i in range(self._wakeups.node_count):
            sub = self._wakeups.checkout(i, now)
            sub.listener = self
            node = self._wakeups.node(i)
            try:
                sub.listen([wake_channel(node.renamed_name(key)) for key in keys])
            except rexc.ConnectionError:
                sub.close()
                continue
            self._subs[i] = sub
        # The confirmations, within a round's deadline.
        deadline = now + self._wakeups.node_timeout
        while self._live() and any(sub.acks for sub in self._subs.values()):
            left = deadline - self._clock()
            if left <= 0:
                break
            await self._wait(left)

    async def _wait(self, seconds: float) -> None:
        """Until ``poke`` or ``seconds`` passed: one future and one timer."""
        loop = asyncio.get_running_loop()
        wake = self._wake = loop.create_future()
        timer = loop.call_later(seconds, _settle, wake)
        try:
            await wake
        finally:
            timer.cancel()
            self._wake = None
