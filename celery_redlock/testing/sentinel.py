"""A Sentinel-managed Redis: one master, its replicas and the Sentinels watching them.

:class:`RedisSentinelGroup` starts a real master, ``replicas`` replicas and
``sentinels`` Sentinels (``redis-server CONF --sentinel``, the same binary as every
:class:`RedisServer`), each a :class:`RedisServer` on a free loopback port, and waits
until every Sentinel knows the replicas and the other Sentinels (so a failover can
happen at once). :meth:`RedisSentinelGroup.failover` forces one (``SENTINEL
FAILOVER``) and returns when every Sentinel names the new master and the old one has
been turned into its replica. Imports redis-py (through :mod:`.server`) and the
standard library only.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Callable, Optional
from urllib.parse import quote

import redis

from .ports import LOOPBACK
from .server import START_TIMEOUT, RedisServer

__all__ = ["FAILOVER_TIMEOUT", "RedisSentinel", "RedisSentinelGroup"]

#: Seconds a forced failover gets to be seen by every Sentinel and the old master.
FAILOVER_TIMEOUT = 60.0

_CONF_NAME = "sentinel.conf"


def _wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``condition`` (errors count as "not yet") until true; RuntimeError at timeout."""
    deadline = time.monotonic() + timeout
    pause = 0.01
    last: Optional[BaseException] = None
    while True:
        try:
            if condition():
                return
        except redis.RedisError as error:
            last = error
        if time.monotonic() > deadline:
            detail = f" (last error: {last})" if last else ""
            raise RuntimeError(f"{what}: not within {timeout:g} s{detail}")
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


class RedisSentinel(RedisServer):
    """One Sentinel process watching ``master_name`` at ``master_port`` on loopback.

    ``password``: the Sentinel's own ``requirepass``; ``master_password``: what it
    sends to the master and replicas (``sentinel auth-pass``). Its config file is
    written into its private directory (Sentinel rewrites it as it learns).
    """

    def __init__(
        self,
        master_name: str,
        master_port: int,
        *,
        quorum: int = 1,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 2000,
        master_password: Optional[str] = None,
        **server_kwargs: Any,
    ) -> None:
        extra = [*server_kwargs.pop("extra_args", ()), "--sentinel"]
        super().__init__(extra_args=extra, **server_kwargs)
        self.master_name = master_name
        name = master_name
        self._conf = [
            f"sentinel monitor {name} {LOOPBACK} {master_port} {quorum}",
            f"sentinel down-after-milliseconds {name} {down_after_ms}",
            f"sentinel failover-timeout {name} {failover_timeout_ms}",
            f"sentinel parallel-syncs {name} 1",
            *([f"sentinel auth-pass {name} {master_password}"] if master_password else []),
        ]

    def __repr__(self) -> str:
        return "<RedisSentinel " + super().__repr__()[len("<RedisServer ") :]

    def _leading_args(self) -> list[str]:
        conf = Path(self.directory) / _CONF_NAME
        if not conf.exists():  # kept across restarts with data: Sentinel's own state
            conf.write_text("\n".join(self._conf) + "\n")
        return [str(conf)]

    def master_address(self) -> Optional[tuple[str, int]]:
        """Where this Sentinel says the master is (None: it knows no such master)."""
        reply = self._control_client().execute_command(  # type: ignore[no-untyped-call]
            "SENTINEL", "get-master-addr-by-name", self.master_name
        )
        if not reply:
            return None
        host, port = reply
        return (host.decode() if isinstance(host, bytes) else str(host)), int(port)

    def master_state(self) -> dict[str, Any]:
        """``SENTINEL MASTER name`` as redis-py parses it (``num-slaves``...)."""
        state = self._control_client().sentinel_master(self.master_name)
        assert isinstance(state, dict)
        return state


class RedisSentinelGroup:
    """A master, ``replicas`` replicas and ``sentinels`` Sentinels, on loopback.

    ``password``: the master's and replicas' ``requirepass`` (and ``masterauth``);
    ``sentinel_password``: the Sentinels' own. ``down_after_ms`` and
    ``failover_timeout_ms``: the Sentinels' settings for the master::

        with RedisSentinelGroup(replicas=1, sentinels=3) as group:
            lock = Redlock([group.url])       # sentinel://...?master_name=mymaster
            old = group.master
            new = group.failover()            # old is new's replica now
    """

    def __init__(
        self,
        replicas: int = 1,
        sentinels: int = 3,
        *,
        master_name: str = "mymaster",
        password: Optional[str] = None,
        sentinel_password: Optional[str] = None,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 2000,
    ) -> None:
        if replicas < 1 or sentinels < 1:
            raise ValueError(
                f"a RedisSentinelGroup needs at least 1 replica and 1 Sentinel, got "
                f"replicas={replicas}, sentinels={sentinels}"
            )
        self.master_name = master_name
        self.password = password
        self.sentinel_password = sentinel_password
        self._replicas = replicas
        self._sentinel_count = sentinels
        self._down_after_ms = down_after_ms
        self._failover_timeout_ms = failover_timeout_ms
        #: The data servers, the first master at start (see :attr:`master`).
        self.servers: list[RedisServer] = []
        self.sentinels: list[RedisSentinel] = []

    def __repr__(self) -> str:
        return (
            f"<RedisSentinelGroup {self.master_name!r}: {self.servers!r}, "
            f"sentinels {self.sentinels!r}>"
        )

    # --- addresses --------------------------------------------------------------------

    @property
    def broker_url(self) -> str:
        """The Sentinels as kombu's ``broker_url`` names them (``master_name`` goes in
        ``broker_transport_options``, see :attr:`transport_options`)."""
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        parts = [f"sentinel://{auth}{LOOPBACK}:{s.port}/0" for s in self.sentinels[:1]]
        parts += [f"sentinel://{LOOPBACK}:{s.port}/0" for s in self.sentinels[1:]]
        return ";".join(parts)

    @property
    def transport_options(self) -> dict[str, Any]:
        """kombu's ``broker_transport_options`` for :attr:`broker_url`."""
        options: dict[str, Any] = {"master_name": self.master_name}
        if self.sentinel_password:
            options["sentinel_kwargs"] = {"password": self.sentinel_password}
        return options

    @property
    def url(self) -> str:
        """The lock node URL: ``sentinel://...;sentinel://...?master_name=NAME``."""
        query = f"?master_name={quote(self.master_name, safe='')}"
        if self.sentinel_password:
            query += f"&sentinel_password={quote(self.sentinel_password, safe='')}"
        return self.broker_url + query

    @property
    def master(self) -> RedisServer:
        """The data server the first running Sentinel names as master."""
        sentinel = next(s for s in self.sentinels if s.running)
        address = sentinel.master_address()
        if address is None:
            raise RuntimeError(f"{sentinel!r} knows no master {self.master_name!r}")
        return self._server_at(address[1])

    @property
    def replicas(self) -> list[RedisServer]:
        master = self.master
        return [server for server in self.servers if server is not master]

    def _server_at(self, port: int) -> RedisServer:
        for server in self.servers:
            if server.port == port:
                return server
        raise RuntimeError(f"no server of {self!r} listens on port {port}")

    # --- life cycle -------------------------------------------------------------------

    def start(self) -> None:
        """Start the master, then the replicas, then the Sentinels; return once every
        replica is in sync and every Sentinel sees the replicas and its peers. On
        failure everything is closed and the error raised."""
        try:
            auth = ["--masterauth", self.password] if self.password else []
            master = RedisServer(password=self.password, extra_args=auth)
            self.servers.append(master)
            master.start()
            for _ in range(self._replicas):
                replica = RedisServer(
                    password=self.password,
                    extra_args=[*auth, "--replicaof", LOOPBACK, str(master.port)],
                )
                self.servers.append(replica)
                replica.start()
            _wait_until(lambda: self._replicas_online(master), START_TIMEOUT, "replicas in sync")
            for _ in range(self._sentinel_count):
                sentinel = RedisSentinel(
                    self.master_name,
                    master.port,
                    quorum=self._sentinel_count // 2 + 1,
                    down_after_ms=self._down_after_ms,
                    failover_timeout_ms=self._failover_timeout_ms,
                    master_password=self.password,
                    password=self.sentinel_password,
                )
                self.sentinels.append(sentinel)
                sentinel.start()
            _wait_until(self._sentinels_ready, START_TIMEOUT, "Sentinels aware of each other")
        except BaseException:
            self.close()
            raise

    def _replicas_online(self, master: RedisServer) -> bool:
        info = master.info("replication")
        online = [
            value
            for key, value in info.items()
            if key.startswith("slave")
            and isinstance(value, dict)
            and value.get("state") == "online"
        ]
        return len(online) == len(self.servers) - 1

    def _sentinels_ready(self) -> bool:
        for sentinel in self.sentinels:
            state = sentinel.master_state()
            if int(state.get("num-slaves", 0)) < len(self.servers) - 1:
                return False
            if int(state.get("num-other-sentinels", 0)) < len(self.sentinels) - 1:
                return False
        return True

    def failover(self, timeout: float = FAILOVER_TIMEOUT) -> RedisServer:
        """Force a failover (``SENTINEL FAILOVER``) and return the new master, once
        every running Sentinel names it, it says it is a master, the old master (if
        it runs) has become its replica and every replica is in sync with it."""
        old = self.master
        sentinel = next(s for s in self.sentinels if s.running)

        def asked() -> bool:
            try:
                control = sentinel._control_client()
                control.execute_command(  # type: ignore[no-untyped-call]
                    "SENTINEL", "FAILOVER", self.master_name
                )
            except redis.ResponseError as error:
                # INPROG: under way already. NOGOODSLAVE (no replica judged fit yet)
                # is raised, and asked again by _wait_until.
                if "INPROG" not in str(error):
                    raise
            return True

        _wait_until(asked, timeout, f"SENTINEL FAILOVER {self.master_name}")

        def moved() -> bool:
            addresses = {s.master_address() for s in self.sentinels if s.running}
            if len(addresses) != 1:
                return False
            (address,) = addresses
            if address is None or address[1] == old.port:
                return False
            new = self._server_at(address[1])
            if new.info("replication").get("role") != "master":
                return False
            if old.running:
                replication = old.info("replication")
                if replication.get("role") != "slave" or replication.get("master_port") != new.port:
                    return False
            return self._replicas_online(new)

        _wait_until(moved, timeout, f"failover of {self.master_name} seen everywhere")
        return self.master

    def close(self) -> None:
        """Close every Sentinel, then every data server, even if closing one fails."""
        with contextlib.ExitStack() as closing:  # calls every callback, raises after
            for server in reversed([*self.sentinels, *self.servers]):
                closing.callback(server.close)

    def __enter__(self) -> RedisSentinelGroup:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        self.close()
