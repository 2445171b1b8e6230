"""The fixtures: lock nodes, worker and beat containers, and pytest-celery's own
broker and backend pointed at local ``redis:7`` containers.

Each fixture that needs Docker asks :func:`redlock_containers` first, which skips
the test with the reason :func:`.probe.missing_for_containers` gives (or fails it,
with ``REDLOCK_CONTAINERS_REQUIRED=1``), restores Celery's current app afterwards
(pytest-celery's broker, backend and setup each make an app, and making one makes
it current), and is torn down last. pytest-docker-tools' session ``docker_client``
is replaced by one that asks the same question. Everything started is removed after
the test, volumes included.

Imports pytest, Celery, pytest-celery and the rest of this folder.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType
from typing import Any, Callable, Optional

import pytest
from celery import Celery
from celery._state import get_current_app
from pytest_celery import (
    CeleryBackendCluster,
    CeleryBrokerCluster,
    CeleryTestBackend,
    CeleryTestBroker,
    CeleryTestNode,
    CeleryTestSetup,
    CeleryTestWorker,
    CeleryWorkerCluster,
)

from . import nodes, workers
from .nodes import RedisNodeContainer, RedlockNodeCluster
from .probe import missing_for_containers, required

#: ``make(name, pool="prefork", concurrency=2, *args)`` -> a ready worker container.
WorkerFactory = Callable[..., CeleryTestWorker]
#: ``make(*args)`` -> a ready ``celery beat -S redlock`` container.
BeatFactory = Callable[..., CeleryTestNode]


@pytest.fixture(scope="session")
def redlock_containers_missing() -> Optional[str]:
    """Why container tests cannot run here (None: they can); asked once a session."""
    return missing_for_containers()


def _unless_missing(reason: Optional[str]) -> None:
    if reason is not None:
        if required():
            pytest.fail(f"container tests required, but {reason}")
        pytest.skip(reason)


@pytest.fixture
def redlock_containers(redlock_containers_missing: Optional[str]) -> Iterator[None]:
    """Skip (or, required, fail) without Docker; restore Celery's current app after."""
    _unless_missing(redlock_containers_missing)
    previous = get_current_app()
    try:
        yield
    finally:
        previous.set_current()


@pytest.fixture(scope="session")
def docker_client(redlock_containers_missing: Optional[str]) -> Iterator[Any]:
    """pytest-docker-tools' Docker client, once Docker is known to be there: its own
    connects when made, and a session fixture is made before any function fixture
    could skip the test, so without a daemon every test would error instead."""
    _unless_missing(redlock_containers_missing)
    import docker

    client = docker.from_env()
    try:
        yield client
    finally:
        client.close()


def _redis(client: Any, network: Any) -> Iterator[RedisNodeContainer]:
    container = nodes.start(client, RedisNodeContainer, network.name)
    try:
        yield container
    finally:
        nodes.remove(container)


@pytest.fixture
def default_redis_broker(
    redlock_containers: None, docker_client: Any, default_pytest_celery_network: Any
) -> Iterator[RedisNodeContainer]:
    """pytest-celery's Redis broker as a local ``redis:7`` (its default pulls
    ``redis:latest``), reached from the test process where the tests run."""
    yield from _redis(docker_client, default_pytest_celery_network)


@pytest.fixture
def default_redis_backend(
    redlock_containers: None, docker_client: Any, default_pytest_celery_network: Any
) -> Iterator[RedisNodeContainer]:
    """pytest-celery's Redis result backend, as ``default_redis_broker``."""
    yield from _redis(docker_client, default_pytest_celery_network)


@pytest.fixture
def celery_broker(celery_redis_broker: CeleryTestBroker) -> CeleryTestBroker:
    """Redis only: pytest-celery would run every test on RabbitMQ and others too,
    pulling their images."""
    return celery_redis_broker


@pytest.fixture
def celery_backend(celery_redis_backend: CeleryTestBackend) -> CeleryTestBackend:
    """Redis only, as ``celery_broker``."""
    return celery_redis_backend


@pytest.fixture
def redlock_node_count() -> int:
    """How many lock nodes ``redlock_node_cluster`` starts (override it)."""
    return 3


@pytest.fixture
def redlock_node_cluster(
    redlock_containers: None,
    docker_client: Any,
    default_pytest_celery_network: Any,
    redlock_node_count: int,
) -> Iterator[RedlockNodeCluster]:
    """``redlock_node_count`` lock-node containers on the test's network."""
    cluster = nodes.start_cluster(
        docker_client, redlock_node_count, default_pytest_celery_network.name
    )
    try:
        yield cluster
    finally:
        cluster.teardown()


@pytest.fixture
def redlock_worker_tasks() -> set[ModuleType]:
    """The tasks modules the worker containers import (override it: their source is
    copied in, so they may import only what the worker image has)."""
    return set()


@pytest.fixture
def redlock_worker_settings() -> dict[str, Any]:
    """More settings for the containers' app (override it: ``beat_schedule``, your
    ``redlock_*`` settings, broker options); values must survive ``repr``."""
    return {}


@pytest.fixture
def redlock_worker_app(
    redlock_containers: None,
    celery_broker_cluster: CeleryBrokerCluster,
    celery_backend_cluster: CeleryBackendCluster,
    redlock_node_cluster: RedlockNodeCluster,
    redlock_worker_settings: dict[str, Any],
) -> Celery:
    """The app whose settings the containers get: broker, backend and lock nodes at
    their network URLs, then ``redlock_worker_settings``."""
    app = Celery("redlock_worker_app", set_as_current=False)
    app.conf.update(
        broker_url=";".join(celery_broker_cluster.config()["urls"]),
        result_backend=";".join(celery_backend_cluster.config()["urls"]),
        broker_connection_retry_on_startup=True,
        **redlock_node_cluster.worker_config(),
    )
    app.conf.update(redlock_worker_settings)
    return app


@pytest.fixture
def celery_setup_app(
    redlock_containers: None,
    celery_setup_cls: type[CeleryTestSetup],
    celery_setup_config: dict[str, Any],
    celery_setup_name: str,
    redlock_node_cluster: RedlockNodeCluster,
) -> Celery:
    """pytest-celery's test-side app (host URLs), with the lock nodes' host URLs as
    its ``redlock_nodes``."""
    app: Celery = celery_setup_cls.create_setup_app(celery_setup_config, celery_setup_name)
    app.conf.redlock_nodes = redlock_node_cluster.host_urls
    return app


@pytest.fixture(scope="session")
def redlock_worker_image(docker_client: Any) -> str:
    """The worker image's tag (built once a session when missing)."""
    return workers.build_worker_image(docker_client)


def _remove_all(containers: list[Any]) -> None:
    errors = []
    for container in reversed(containers):
        try:
            nodes.remove(container)
        except Exception as error:
            errors.append(error)
    if errors:
        raise errors[0]


@pytest.fixture
def redlock_container_starter(
    redlock_containers: None,
    docker_client: Any,
    default_pytest_celery_network: Any,
    redlock_worker_image: str,
    redlock_worker_app: Celery,
    redlock_worker_tasks: set[ModuleType],
) -> Iterator[Callable[..., Any]]:
    """``start(cls, command)``: a ready container of the worker image, the app and
    the tasks in it; all removed after the test."""
    files = workers.app_files(redlock_worker_app, redlock_worker_tasks)
    environment = {
        "CELERY_BROKER_URL": redlock_worker_app.conf.broker_url,
        "CELERY_RESULT_BACKEND": redlock_worker_app.conf.result_backend,
    }
    started: list[Any] = []

    def start(cls: type[Any], command: list[str]) -> Any:
        container = workers.start(
            docker_client,
            cls,
            redlock_worker_image,
            command,
            default_pytest_celery_network.name,
            files,
            environment,
        )
        started.append(container)
        return container

    try:
        yield start
    finally:
        _remove_all(started)


@pytest.fixture
def redlock_worker_factory(
    redlock_container_starter: Callable[..., Any], celery_setup_app: Celery
) -> WorkerFactory:
    """``make(name, pool="prefork", concurrency=2, *args)``: a ready worker container
    (a :class:`~pytest_celery.CeleryTestWorker` whose app is the test-side one)."""

    def make(name: str, pool: str = "prefork", concurrency: int = 2, *args: str) -> Any:
        command = workers.worker_command(name, pool, concurrency, *args)
        container = redlock_container_starter(workers.RedlockWorkerContainer, command)
        container.given_name = name
        return CeleryTestWorker(container, app=celery_setup_app)

    return make


@pytest.fixture
def redlock_beat_factory(
    redlock_container_starter: Callable[..., Any], celery_setup_app: Celery
) -> BeatFactory:
    """``make(*args)``: a ready ``celery beat -S redlock`` container running the
    worker app's ``beat_schedule``."""

    def make(*args: str) -> CeleryTestNode:
        command = workers.beat_command(*args)
        container = redlock_container_starter(workers.RedlockBeatContainer, command)
        return CeleryTestNode(container, app=celery_setup_app)

    return make


@pytest.fixture
def celery_worker_cluster(redlock_worker_factory: WorkerFactory) -> CeleryWorkerCluster:
    """pytest-celery's workers for ``celery_setup``: one worker container of ours."""
    return CeleryWorkerCluster(redlock_worker_factory("worker"))
