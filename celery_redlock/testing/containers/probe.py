"""What this machine lacks for container tests, and where a container answers the
test process.

Imports nothing but the standard library at module level (the Docker SDK only inside
:func:`missing_for_containers`), so it answers "pytest-celery is not installed"
where it is not, instead of failing to import.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable
from typing import Optional

#: The images every container test starts: the lock nodes, broker and backend run
#: ``redis:7``; the worker and beat image is built on ``python:3.12-slim``.
BASE_IMAGES = ("redis:7", "python:3.12-slim")
#: Set to 1 (CI's tools/containers/container-checks.sh does) to turn every "cannot run
#: here" skip into a failure: a check that must run may not pass by skipping.
REQUIRED_ENV = "REDLOCK_CONTAINERS_REQUIRED"
#: Seconds the probe waits for the Docker daemon to answer a ping.
PING_TIMEOUT = 5


def inside_container() -> bool:
    """True when the tests themselves run in a container (as pytest-docker-tools
    decides it): then a container is reached at its address on the bridge network,
    not at a port published on 127.0.0.1 of a machine the tests are not on."""
    return os.path.isfile("/.dockerenv") or os.path.isfile("/run/.containerenv")


def host_address(inside: bool, ip: str, port: int, published: Optional[int]) -> tuple[str, int]:
    """Where the test process reaches a container's ``port``.

    pytest-celery's Redis containers say ``localhost:<published port>`` whatever
    pytest-docker-tools decided, which is wrong when the tests run in a container
    themselves (``/.dockerenv``): there the published port is on the Docker host, and
    the container answers on its own address and port instead.
    """
    if inside:
        return ip, port
    if published is None:
        raise ValueError(f"port {port} is not published, and the tests run outside Docker")
    return "127.0.0.1", published


def required() -> bool:
    """Whether a missing capability fails the test rather than skipping it."""
    return os.environ.get(REQUIRED_ENV, "") not in ("", "0")


def missing_for_containers(images: Iterable[str] = BASE_IMAGES) -> Optional[str]:
    """Why container tests cannot run here, or None when they can.

    Checked in order, the first missing thing named: pytest-celery (and the Docker
    SDK it brings), a Docker daemon that answers, the base ``images`` in its store.
    Nothing is started or pulled: a machine without Docker pays one failed connect.
    """
    for module, package in (("pytest_celery", "pytest-celery"), ("docker", "docker")):
        if importlib.util.find_spec(module) is None:
            return f"{package} is not installed (pip install 'celery-redlock[test]')"
    import docker
    from docker.errors import DockerException, ImageNotFound

    try:
        client = docker.from_env(timeout=PING_TIMEOUT)
        client.ping()
    except (DockerException, OSError) as error:
        return (
            f"no Docker daemon answers ({str(error).splitlines()[0][:160]}); start one "
            "(as root: tools/containers/docker-daemon.sh start)"
        )
    try:
        absent = []
        for image in images:
            try:
                client.images.get(image)
            except ImageNotFound:
                absent.append(image)
    finally:
        client.close()
    if absent:
        return (
            f"no {', '.join(absent)} image in the Docker daemon's store: `docker pull` "
            "it, or build a stand-in with tools/containers/build-base-images.sh"
        )
    return None
