"""``AsyncRedlock``'s connections against real redis-server processes when replies
do not come one per read: a reply split across reads, several tasks' replies in one
read, a connection dropped in the middle of a reply.

Each node sits behind a ``Shaper``: a proxy on the test's own event loop that passes
what the client sends at once and hands the server's replies on as the test says.
It waits for events, not for time: "the client has read half a reply" is seen on the
client's connection (its unparsed bytes), since both run on one loop. What the
nodes hold is read by plain clients (the observer).
"""

from __future__ import annotations

import asyncio
import select
import time
from typing import Callable, Optional

import redis

from celery_redlock.asyncio import AsyncLease, AsyncRedlock
from celery_redlock.lock import scripts
from celery_redlock.testing import FaultProxy, RedisNodes
from celery_redlock.wire.resp import INCOMPLETE, Command, parse
from tests.support.tls_acl import Certs, TLSNode, tls_values

KEY_TTL = 30.0
NODE_TIMEOUT = 5.0


def _replies(data: bytes) -> int:
    """How many whole replies ``data`` holds."""
    count, pos = 0, 0
    while pos < len(data):
        reply, pos = parse(data, pos)
        if reply is INCOMPLETE:
            break
        count += 1
    return count


class Shaper:
    """A proxy in front of one node; ``mode`` says how replies reach the client:
    ``"pass"`` as they come; ``"split"`` each read in two writes, the second once
    the client holds the first half unparsed; ``"batch"`` kept until ``batch`` whole
    replies are there, then in one write; ``"drop"`` half of the next read, then the
    connection is cut."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.mode = "pass"
        self.batch = 1
        #: Whether the client holds part of a reply unparsed (set by the test).
        self.client_partial: Callable[[], bool] = lambda: False
        self.split_writes = 0
        self.batched_writes: list[int] = []
        self.port = 0
        self._server: Optional[asyncio.AbstractServer] = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(*self.target)

        async def upstream() -> None:
            while data := await client_r.read(65536):
                server_w.write(data)
            server_w.close()

        forward = asyncio.ensure_future(upstream())
        pending = b""
        try:
            while data := await server_r.read(65536):
                pending += data
                if self.mode == "batch" and _replies(pending) < self.batch:
                    continue
                if self.mode in ("split", "drop") and len(pending) > 1:
                    half = len(pending) // 2
                    client_w.write(pending[:half])
                    await self._until(self.client_partial)
                    if self.mode == "drop":
                        client_w.transport.abort()
                        return
                    self.split_writes += 1
                    pending = pending[half:]
                if self.mode == "batch":
                    self.batched_writes.append(_replies(pending))
                client_w.write(pending)
                pending = b""
        except (asyncio.CancelledError, ConnectionError):
            pass  # the test is over, or the client went away
        finally:
            forward.cancel()
            server_w.close()

    @staticmethod
    async def _until(check: Callable[[], bool]) -> None:
        """Until ``check()``: the client reads on this very loop, so a few turns do;
        bounded all the same (10 s of 1 ms naps)."""
        for _ in range(10000):
            if check():
                return
            await asyncio.sleep(0.001)
        raise AssertionError("the client never got there")


async def _shaped(cluster: RedisNodes, count: int) -> tuple[list[Shaper], list[str]]:
    """Shapers in front of the first ``count`` nodes; every node's URL."""
    shapers = [Shaper(server.host, server.port) for server in list(cluster)[:count]]
    for shaper in shapers:
        await shaper.start()
    urls = [f"redis://127.0.0.1:{s.port}/0" for s in shapers] + list(cluster.urls[count:])
    return shapers, urls


def _watch_partial(redlock: AsyncRedlock, shapers: list[Shaper]) -> None:
    """Let each shaper see when its node's connection holds an unparsed part."""
    for index, shaper in enumerate(shapers):

        def partial(index: int = index) -> bool:
            conn = redlock._nodes._conns[index]
            return conn is not None and bool(conn.inbuf)

        shaper.client_partial = partial


def _values(clients: list[redis.Redis], key: str) -> list[object]:
    return [client.get(key) for client in clients]


async def _on_every_node(clients: list[redis.Redis], key: str, value: Optional[bytes]) -> None:
    """Every node has ``value`` under ``key`` (None: no key), soon: an acquire or a
    release returns once a quorum answered, and the others' replies come after it
    (a loaded machine can take a while); bounded at 10 s."""
    for _ in range(1000):
        if _values(clients, key) == [value] * len(clients):
            return
        await asyncio.sleep(0.01)
    assert _values(clients, key) == [value] * len(clients)


def test_replies_split_across_reads_are_put_together(redis_nodes: RedisNodes) -> None:
    clients = [server.client() for server in redis_nodes]

    async def scenario() -> None:
        shapers, urls = await _shaped(redis_nodes, 5)
        redlock = AsyncRedlock(urls, ttl=KEY_TTL, node_timeout=NODE_TIMEOUT)
        _watch_partial(redlock, shapers)
        try:
            assert await redlock.locked("split") is False  # connections up, handshake read
            for shaper in shapers:
                shaper.mode = "split"
            lease = await redlock.acquire("split", blocking=False)
            assert lease is not None
            await _on_every_node(clients, "split", lease.value.encode())
            holder = await redlock.holder("split")  # a longer reply: [value, pttl]
            assert holder.holder == lease.holder
            assert await lease.release() is True
            await _on_every_node(clients, "split", None)
            # Three rounds, each returned once a quorum (3) had answered, and a node's
            # reply reaches the client only after its read was split in two. A node in
            # two rounds' quorums answered the first before the second was sent, so in
            # another read. (A straggler's replies may share a read: no count per node.)
            assert sum(shaper.split_writes for shaper in shapers) >= 3 * 3
        finally:
            redlock.close()
            for shaper in shapers:
                await shaper.stop()

    asyncio.run(scenario())


def test_many_tasks_replies_in_one_read_each_reach_their_round(
    redis_nodes: RedisNodes,
) -> None:
    clients = [server.client() for server in redis_nodes]
    tasks = 6

    async def scenario() -> None:
        shapers, urls = await _shaped(redis_nodes, 5)
        redlock = AsyncRedlock(urls, ttl=KEY_TTL, node_timeout=NODE_TIMEOUT)
        try:
            assert await redlock.locked("warm") is False
            for shaper in shapers:
                shaper.mode, shaper.batch = "batch", tasks
            keys = [f"batch:{i}" for i in range(tasks)]
            leases = await asyncio.gather(*(redlock.acquire(k, blocking=False) for k in keys))
            for key, lease in zip(keys, leases):
                assert isinstance(lease, AsyncLease)
                await _on_every_node(clients, key, lease.value.encode())
            assert len({lease.value for lease in leases if lease}) == tasks
            released = await asyncio.gather(*(lease.release() for lease in leases if lease))
            assert released == [True] * tasks
            for key in keys:
                await _on_every_node(clients, key, None)
            # Replies reached the client only in writes of at least ``tasks`` replies.
            # The first three nodes to answer wrote exactly the ``tasks`` acquires' (no
            # release is sent before a quorum answered them); a straggler's acquires may
            # share a write with its releases.
            assert all(w >= tasks for shaper in shapers for w in shaper.batched_writes)
            first = [shaper for shaper in shapers if shaper.batched_writes[:1] == [tasks]]
            assert len(first) >= 3
        finally:
            redlock.close()
            for shaper in shapers:
                await shaper.stop()

    asyncio.run(scenario())


def test_a_connection_cut_mid_reply_fails_that_node_and_reconnects_later(
    redis_nodes: RedisNodes,
) -> None:
    clients = [server.client() for server in redis_nodes]

    async def scenario() -> None:
        shapers, urls = await _shaped(redis_nodes, 1)
        redlock = AsyncRedlock(urls, ttl=KEY_TTL, node_timeout=NODE_TIMEOUT)
        _watch_partial(redlock, shapers)
        try:
            assert await redlock.locked("cut") is False
            first = redlock._nodes._conns[0]
            shapers[0].mode = "drop"
            # Won on the 4 others; the cut node's SET landed, its reply did not.
            lease = await redlock.acquire("cut", blocking=False)
            assert lease is not None and first is not None
            await Shaper._until(lambda: first.closed)  # the cut may follow the quorum
            await _on_every_node(clients, "cut", lease.value.encode())
            shapers[0].mode = "pass"
            # The release reconnects to the cut node and deletes the key there too.
            assert await lease.release() is True
            assert redlock._nodes._conns[0] is not first
            await _on_every_node(clients, "cut", None)
        finally:
            redlock.close()
            await shapers[0].stop()

    asyncio.run(scenario())


def test_replies_left_unread_through_a_stall_keep_their_connection(
    redis_nodes: RedisNodes,
) -> None:
    """A stalled process (a loaded machine) resumes a task before it reads the
    replies that came meanwhile: their connections are not taken for hung."""
    offset = [0.0]

    def clock() -> float:
        return time.monotonic() + offset[0]

    async def scenario() -> None:
        redlock = AsyncRedlock(
            redis_nodes.urls, ttl=KEY_TTL, node_timeout=NODE_TIMEOUT, clock=clock
        )
        try:
            assert await redlock.locked("warm") is False
            conns = list(redlock._nodes._conns)
            # Owed by every connection, nobody waits for it; not read before we yield.
            redlock._nodes.send_only(Command(scripts.HOLDER, ["stall"], []))
            for conn in conns:
                assert conn is not None and conn.transport is not None
                sock = conn.transport.get_extra_info("socket")
                readable, _, _ = select.select([sock.fileno()], [], [], 10.0)
                assert readable, "the node's reply is in the socket"
            offset[0] += 600.0  # the stall: every owed reply looks ten minutes old
            assert await redlock.locked("stall") is False
            assert redlock._nodes._conns == conns  # none reopened
            assert all(conn is not None and not conn.owed for conn in conns)
        finally:
            redlock.close()

    asyncio.run(scenario())


def test_an_acquire_queued_behind_a_tls_handshake_reaches_the_node(
    tls: list[TLSNode], certs: Certs, fault_proxy_factory: Callable[..., FaultProxy]
) -> None:
    # Node 2 is behind a proxy that delays every chunk by 0.6 s: its TLS handshake
    # outlasts every 0.3 s round. The acquire is decided by nodes 0 and 1; its SET to
    # node 2, queued until the handshake is done, must still land there afterwards.
    slow = fault_proxy_factory(("127.0.0.1", tls[2].tls_port))
    slow.delay(0.6)
    proxied = f"rediss://127.0.0.1:{slow.port}/0?ssl_ca_certs={certs.ca}&ssl_cert_reqs=required"
    urls = [tls[0].url(certs.ca), tls[1].url(certs.ca), proxied]

    async def main() -> None:
        redlock = AsyncRedlock(urls, ttl=KEY_TTL, node_timeout=0.3)
        try:
            await redlock.holder("tls:late-set")  # sets up the connections to nodes 0 and 1
            lease = await redlock.acquire("tls:late-set", blocking=False)
            assert lease is not None
            assert tls[2].plain.get("tls:late-set") is None  # the handshake is not done
            held = [lease.value.encode()] * 3
            give_up = time.monotonic() + 12.0  # a hang guard, far past the handshake
            while tls_values(tls, "tls:late-set") != held:
                assert time.monotonic() < give_up, "the SET never reached node 2"
                await asyncio.sleep(0.02)
            assert await lease.release() is True
        finally:
            redlock.close()

    asyncio.run(main())
