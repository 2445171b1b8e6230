"""Redis containers as pytest-celery components: a plain one (broker, result backend,
an observer) and the lock nodes, N independent masters configured as the safety
notes ask.

pytest-celery's :class:`~pytest_celery.RedisContainer` is the base; what changes is
where the test process reaches a container (:func:`.probe.host_address`) and how a
container goes away: :func:`remove` removes its anonymous ``/data`` volume with it
(the ``redis`` image declares one), so a test run leaves no volume behind.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis
from pytest_celery import CeleryTestCluster, CeleryTestNode, RedisContainer
from pytest_docker_tools.wrappers.container import wait_for_callable

from .probe import host_address, inside_container

#: The image every Redis container here runs (a stand-in where no registry answers:
#: tools/containers/build-base-images.sh).
REDIS_IMAGE = "redis:7"
#: Label on everything this kit starts, for a look afterwards (``docker ps -a
#: --filter label=celery-redlock.test``).
LABEL = "celery-redlock.test"
#: Seconds a container may take to start and log that it is ready.
START_TIMEOUT = 60


class RedisNodeContainer(RedisContainer):  # type: ignore[misc]
    """A ``redis:7`` container with no persistence: broker, backend, observer."""

    @classmethod
    def image(cls) -> str:
        return REDIS_IMAGE

    @property
    def host_url(self) -> str:
        host, port = self.host_address()
        return f"{self.prefix()}{host}:{port}/{self.vhost}"

    def host_address(self) -> tuple[str, int]:
        """(host, port) where the test process reaches this server."""
        self.reload()
        published = self.ports["6379/tcp"]
        return host_address(
            inside_container(), self.ips.primary, 6379, published[0] if published else None
        )

    def client(self, **kwargs: Any) -> redis.Redis:
        """A redis-py client from the test process (the caller closes it)."""
        return redis.Redis.from_url(self.host_url, **kwargs)


class RedlockNodeContainer(RedisNodeContainer):
    """One lock node: AOF fsynced on every write and no eviction, as the safety
    notes (SAFETY.md) ask (a lock key evicted or lost in a restart breaks mutual exclusion)."""

    @classmethod
    def command(cls, *args: str, **kwargs: Any) -> list[str]:
        return [
            "redis-server",
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--maxmemory-policy",
            "noeviction",
            "--protected-mode",
            "no",
            *args,
        ]


def start(client: Any, cls: type[RedisNodeContainer], network: str) -> RedisNodeContainer:
    """A started ``cls`` container on ``network``, its port published, once it logs
    that it is ready."""
    raw = client.containers.run(
        cls.image(),
        command=cls.command(),
        detach=True,
        network=network,
        ports=cls.ports(),
        labels={LABEL: cls.__name__},
    )
    container = cls(raw)
    try:
        wait_for_callable(f"{cls.__name__} {raw.name} ready", container.ready, START_TIMEOUT)
    except BaseException:
        remove(container)
        raise
    return container


def remove(container: Any) -> None:
    """Remove a container and its anonymous volumes (``v=True``: pytest-docker-tools
    removes containers without, which leaves the image's ``/data`` volume behind)."""
    container._container.remove(force=True, v=True)


def worker_settings(urls: Sequence[str]) -> dict[str, Any]:
    """The app settings a worker container needs to lock on these nodes."""
    return {"redlock_nodes": list(urls)}


class RedlockNode(CeleryTestNode):  # type: ignore[misc]
    """A lock node of a :class:`RedlockNodeCluster`."""

    @property
    def url(self) -> str:
        """The node's URL on the test network (what workers use)."""
        return str(self.container.url)

    @property
    def host_url(self) -> str:
        """The node's URL from the test process."""
        return str(self.container.host_url)

    def client(self, **kwargs: Any) -> redis.Redis:
        return redis.Redis.from_url(self.host_url, **kwargs)


class RedlockNodeCluster(CeleryTestCluster):  # type: ignore[misc]
    """N lock-node containers: independent masters, the shape Redlock runs on."""

    def _set_nodes(self, *nodes: Any, node_cls: type[Any] = RedlockNode) -> tuple[Any, ...]:
        return tuple(super()._set_nodes(*nodes, node_cls=node_cls))

    def __getitem__(self, index: int) -> RedlockNode:
        node: RedlockNode = self.nodes[index]
        return node

    @property
    def urls(self) -> list[str]:
        """The nodes' URLs on the test network, for worker containers."""
        return [node.url for node in self.nodes]

    @property
    def host_urls(self) -> list[str]:
        """The nodes' URLs from the test process, for looking at the lock keys."""
        return [node.host_url for node in self.nodes]

    def worker_config(self) -> dict[str, Any]:
        """The settings a worker container needs (``redlock_nodes``)."""
        return worker_settings(self.urls)

    def config(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {"urls": self.urls, "host_urls": self.host_urls}

    def teardown(self) -> None:
        """Remove every node container and its volume (one failing does not keep the
        others)."""
        errors = []
        for node in self.nodes:
            try:
                remove(node.container)
            except Exception as error:
                errors.append(error)
        if errors:
            raise errors[0]


def start_cluster(client: Any, count: int, network: str) -> RedlockNodeCluster:
    """``count`` lock-node containers on ``network``, all ready."""
    if count < 1:
        raise ValueError(f"a Redlock needs at least one node, not {count}")
    started: list[RedisNodeContainer] = []
    try:
        for _ in range(count):
            started.append(start(client, RedlockNodeContainer, network))
    except BaseException:
        for container in started:
            remove(container)
        raise
    return RedlockNodeCluster(*started)
