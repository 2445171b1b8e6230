"""The pytest plugin: fixtures that hand out real redis-server processes and proxies.

Registered through the ``pytest11`` entry point ``celery_redlock.testing`` (the
package re-exports these fixtures). Each fixture closes what it started, even when
the test fails. Imports pytest, and the rest of this package.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from typing import Any, Union

import pytest

from .nodes import RedisNodes, RedisNodesFactory
from .proxy import FaultProxy, FaultProxyFactory
from .server import RedisServer, RedisServerFactory
from .sharded import ShardedCluster, ShardedClusterFactory

__all__ = [
    "fault_proxy_factory",
    "redis_cluster_factory",
    "redis_nodes",
    "redis_nodes_factory",
    "redis_server",
    "redis_server_factory",
    "sharded_cluster_factory",
]


def _close_all(
    things: Sequence[Union[RedisServer, RedisNodes, ShardedCluster, FaultProxy]],
) -> None:
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
def redis_nodes_factory() -> Iterator[RedisNodesFactory]:
    """``make(n, **kwargs)``: a started :class:`RedisNodes` of n independent
    masters; all closed after the test."""
    sets: list[RedisNodes] = []

    def make(n: int, **kwargs: Any) -> RedisNodes:
        nodes = RedisNodes(n, **kwargs)
        sets.append(nodes)
        nodes.start()
        return nodes

    try:
        yield make
    finally:
        _close_all(sets)


@pytest.fixture
def sharded_cluster_factory() -> Iterator[ShardedClusterFactory]:
    """``make(masters=3, replicas=0, **kwargs)``: a started :class:`ShardedCluster`
    (Redis Cluster mode: one store sharded over masters, not independent masters);
    all closed after the test."""
    clusters: list[ShardedCluster] = []

    def make(masters: int = 3, **kwargs: Any) -> ShardedCluster:
        cluster = ShardedCluster(masters, **kwargs)
        clusters.append(cluster)
        cluster.start()
        return cluster

    try:
        yield make
    finally:
        _close_all(clusters)


@pytest.fixture
def redis_cluster_factory(redis_nodes_factory: RedisNodesFactory) -> RedisNodesFactory:
    """Deprecated name of ``redis_nodes_factory`` (the nodes are independent masters,
    not Redis Cluster mode); removed in 0.3."""
    warnings.warn(
        "the redis_cluster_factory fixture is now redis_nodes_factory "
        "(independent masters, not Redis Cluster); the old name goes in 0.3",
        DeprecationWarning,
        stacklevel=2,
    )
    return redis_nodes_factory


@pytest.fixture
def redis_server(redis_server_factory: RedisServerFactory) -> RedisServer:
    """One started redis-server on a free loopback port."""
    return redis_server_factory()


@pytest.fixture
def redis_nodes(redis_nodes_factory: RedisNodesFactory) -> RedisNodes:
    """Five started independent masters, the usual Redlock deployment."""
    return redis_nodes_factory(5)


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
