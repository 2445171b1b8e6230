"""Lock nodes, workers and beats in Docker containers, as pytest-celery components.

Opt in from the ``conftest.py`` at the root of your tests::

    pytest_plugins = ["celery_redlock.testing.containers"]

Then a test gets N lock-node containers (``redis:7``, AOF fsynced on every write, no
eviction) beside pytest-celery's broker and backend (local ``redis:7``, never
RabbitMQ or ``redis:latest`` pulled), and worker and beat containers that run your
tasks modules with ``redlock_nodes`` pointing at the nodes::

    @pytest.fixture
    def redlock_worker_tasks():
        return {myproject.tasks}     # copied into the containers

    def test_import_runs_once(celery_setup, redlock_node_cluster):
        result = celery_setup.app.send_task("myproject.tasks.import_customer", (7,))
        assert result.get(timeout=30) == "imported"

Fixtures (``fixtures.py``): ``redlock_node_cluster`` (a :class:`RedlockNodeCluster`
of ``redlock_node_count`` nodes, default 3), ``redlock_worker_app`` (the settings the
containers get), ``redlock_worker_settings`` (yours, added to them),
``redlock_worker_tasks``, ``redlock_worker_image`` (the image tag),
``redlock_worker_factory`` and ``redlock_beat_factory`` (more containers, e.g. two
workers contending), and pytest-celery's ``celery_setup`` with one worker container
of ours. Each skips the test with the reason :func:`missing_for_containers` gives
where Docker, the images or pytest-celery are missing (``REDLOCK_CONTAINERS_REQUIRED=1``
fails it instead), and removes what it started, volumes included.

Modules: ``probe.py`` (what is missing; where the test process reaches a container),
``nodes.py`` (Redis containers and the node cluster), ``workers.py`` (the worker
image, worker and beat containers), ``app_template.py`` (their ``app.py``),
``fixtures.py``. This room may use Celery, pytest-celery and the rest of
``celery_redlock.testing``; nothing outside ``testing`` imports it.
"""

from __future__ import annotations

from .probe import BASE_IMAGES, REQUIRED_ENV, host_address, inside_container, missing_for_containers

__all__ = [
    "BASE_IMAGES",
    "REQUIRED_ENV",
    "host_address",
    "inside_container",
    "missing_for_containers",
]

try:
    from .fixtures import celery_backend as celery_backend
    from .fixtures import celery_broker as celery_broker
    from .fixtures import celery_setup_app as celery_setup_app
    from .fixtures import celery_worker_cluster as celery_worker_cluster
    from .fixtures import default_redis_backend as default_redis_backend
    from .fixtures import default_redis_broker as default_redis_broker
    from .fixtures import docker_client as docker_client
    from .fixtures import redlock_beat_factory as redlock_beat_factory
    from .fixtures import redlock_container_starter as redlock_container_starter
    from .fixtures import redlock_containers as redlock_containers
    from .fixtures import redlock_containers_missing as redlock_containers_missing
    from .fixtures import redlock_node_cluster as redlock_node_cluster
    from .fixtures import redlock_node_count as redlock_node_count
    from .fixtures import redlock_worker_app as redlock_worker_app
    from .fixtures import redlock_worker_factory as redlock_worker_factory
    from .fixtures import redlock_worker_image as redlock_worker_image
    from .fixtures import redlock_worker_settings as redlock_worker_settings
    from .fixtures import redlock_worker_tasks as redlock_worker_tasks
    from .nodes import RedisNodeContainer, RedlockNode, RedlockNodeCluster, RedlockNodeContainer
    from .workers import RedlockBeatContainer, RedlockWorkerContainer

    __all__ += [
        "RedisNodeContainer",
        "RedlockBeatContainer",
        "RedlockNode",
        "RedlockNodeCluster",
        "RedlockNodeContainer",
        "RedlockWorkerContainer",
    ]
except ModuleNotFoundError as missing:
    # Without pytest-celery (or the Docker SDK) the fixtures below only skip, with
    # the reason; the names stay, so a test asking for one is skipped, not an error.
    if missing.name not in ("pytest_celery", "pytest_docker_tools", "docker", "celery"):
        raise
    from .unavailable import redlock_beat_factory as redlock_beat_factory
    from .unavailable import redlock_node_cluster as redlock_node_cluster
    from .unavailable import redlock_node_count as redlock_node_count
    from .unavailable import redlock_worker_app as redlock_worker_app
    from .unavailable import redlock_worker_factory as redlock_worker_factory
    from .unavailable import redlock_worker_image as redlock_worker_image
