"""N independent redis-server masters: the shape Redlock runs on.

Not Redis Cluster mode: no slots, no replication, the nodes know nothing of each
other. Imports redis-py (through :mod:`.server`) and the standard library only.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import Any, Callable, Optional, Union, overload

from .server import RedisServer

__all__ = ["RedisNodes", "RedisNodesFactory"]


class RedisNodes(Sequence[RedisServer]):
    """N independent masters, each its own :class:`RedisServer` — not Redis Cluster
    mode: no slots, no replication, the nodes know nothing of each other. That is
    the topology Redlock asks for.

    ``RedisNodes(5, appendonly=True)`` passes the keywords to every server (all
    but ``port``: each gets its own). Index and iterate it like a list::

        with RedisNodes(5) as nodes:
            lock = Redlock(nodes.urls)
            nodes[0].pause()
    """

    def __init__(self, n: int, **server_kwargs: Any) -> None:
        if n < 1:
            raise ValueError(f"a RedisNodes needs at least 1 server, got n={n}")
        if "port" in server_kwargs:
            raise ValueError("RedisNodes gives every server its own free port; drop 'port'")
        self._servers = [RedisServer(**server_kwargs) for _ in range(n)]

    @overload
    def __getitem__(self, index: int) -> RedisServer: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[RedisServer]: ...

    def __getitem__(self, index: Union[int, slice]) -> Union[RedisServer, Sequence[RedisServer]]:
        return self._servers[index]

    def __len__(self) -> int:
        return len(self._servers)

    def __iter__(self) -> Iterator[RedisServer]:
        return iter(self._servers)

    def __repr__(self) -> str:
        return f"<RedisNodes of {len(self)} masters: {self._servers!r}>"

    @property
    def urls(self) -> list[str]:
        return [server.url for server in self._servers]

    def start(self) -> None:
        """Spawn every server that is down, then wait for them all: the start-ups
        overlap. On failure every server is closed and the error raised."""
        try:
            spawned = [server for server in self._servers if server.pid is None]
            for server in spawned:
                if server._closed:
                    raise RuntimeError(f"{server!r} is closed")
                server._spawn()
            for server in spawned:
                server._await_ready(may_change_port=not server._fixed_port)
        except BaseException:
            self.close()
            raise

    def flushall(self) -> None:
        """FLUSHALL on every running server (paused and dead ones are skipped)."""
        for server in self._servers:
            if server.running:
                server._control_client().flushall()

    def close(self) -> None:
        """Close every server, even if closing one fails. Idempotent."""
        errors: list[BaseException] = []
        for server in self._servers:
            try:
                server.close()
            except Exception as error:
                errors.append(error)
        if errors:
            raise errors[0]

    def __enter__(self) -> RedisNodes:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        self.close()


#: ``make(n, **RedisServer kwargs) -> RedisNodes``, started (the fixture's type).
RedisNodesFactory = Callable[..., RedisNodes]
