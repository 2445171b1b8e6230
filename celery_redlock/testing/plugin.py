"""The pytest plugin: fixtures that hand out real redis-server processes and proxies.

Registered through the ``pytest11`` entry point ``celery_redlock.testing`` (the
package re-exports these fixtures). Each fixture closes what it started, even when
the test fails. Imports pytest, and the rest of this package.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Union

import pytest

from .cluster import RedisCluster, RedisClusterFactory
from .proxy import FaultProxy, FaultProxyFactory
from .server import RedisServer, RedisServerFactory

__all__ = [
    "fault_proxy_factory",
    "redis_cluster_factory",
    "redis_nodes",
    "redis_server",
    "redis_server_factory",
]


def _close_all(things: Sequence[Union[RedisServer, RedisCluster, FaultProxy]]) -> None:
    errors: list[BaseException] = []
    for thing in reversed(things):
        try:
            thing.close()
        except Exception as error:
            errors.append(error)
    if errors:
        raise errors[0]


@pytest.fixture
def redis_server_factory() -> Iterator[RedisServerFactory]:
    """``make(**kwargs)``: a started :class:`RedisServer`; all closed after the test."""
    servers: list[RedisServer] = []

    def make(**kwargs: Any) -> RedisServer:
        server = RedisServer(**kwargs)
        servers.append(server)
        server.start()
        return server

    try:
        yield make
    finally:
        _close_all(servers)


@pytest.fixture
def redis_cluster_factory() -> Iterator[RedisClusterFactory]:
    """``make(n, **kwargs)``: a started :class:`RedisCluster` of n independent
    masters; all closed after the test."""
    clusters: list[RedisCluster] = []

    def make(n: int, **kwargs: Any) -> RedisCluster:
        cluster = RedisCluster(n, **kwargs)
        clusters.append(cluster)
        cluster.start()
        return cluster

    try:
        yield make
    finally:
        _close_all(clusters)


@pytest.fixture
def redis_server(redis_server_factory: RedisServerFactory) -> RedisServer:
    """One started redis-server on a free loopback port."""
    return redis_server_factory()


@pytest.fixture
def redis_nodes(redis_cluster_factory: RedisClusterFactory) -> RedisCluster:
    """Five started independent masters, the usual Redlock deployment."""
    return redis_cluster_factory(5)


@pytest.fixture
def fault_proxy_factory() -> Iterator[FaultProxyFactory]:
    """``make(server or (host, port))``: a :class:`FaultProxy` in front of it;
    all closed after the test."""
    proxies: list[FaultProxy] = []

    def make(target: Union[RedisServer, tuple[str, int]]) -> FaultProxy:
        proxy = FaultProxy(target)
        proxies.append(proxy)
        return proxy

    try:
        yield make
    finally:
        _close_all(proxies)
