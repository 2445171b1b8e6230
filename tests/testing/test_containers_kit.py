"""celery_redlock.testing.containers without Docker: why a container test skips,
the settings and files a worker container gets, where a container is reached from.

The containers themselves run in tests/containers (CI: container-checks.sh).
"""

from __future__ import annotations

import io
import tarfile
from importlib import metadata
from pathlib import Path

import pytest
from celery import Celery
from celery._state import get_current_app

from celery_redlock.testing.containers import missing_for_containers, probe, workers
from celery_redlock.testing.containers.nodes import worker_settings
from tests.containers import tasks

#: A Docker endpoint nothing listens on.
NO_DAEMON = "unix:///nonexistent/docker.sock"


def test_inside_a_container_a_container_is_reached_at_its_own_address() -> None:
    assert probe.host_address(True, "172.18.0.5", 6379, 49153) == ("172.18.0.5", 6379)
    assert probe.host_address(True, "172.18.0.5", 6379, None) == ("172.18.0.5", 6379)


def test_outside_one_a_container_is_reached_at_its_published_port() -> None:
    assert probe.host_address(False, "172.18.0.5", 6379, 49153) == ("127.0.0.1", 49153)
    with pytest.raises(ValueError, match="not published"):
        probe.host_address(False, "172.18.0.5", 6379, None)


def test_without_a_daemon_the_reason_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", NO_DAEMON)
    reason = missing_for_containers()
    assert reason is not None
    assert reason.startswith("no Docker daemon answers")
    assert "docker-daemon.sh" in reason


def test_required_turns_on_with_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(probe.REQUIRED_ENV, raising=False)
    assert not probe.required()
    monkeypatch.setenv(probe.REQUIRED_ENV, "0")
    assert not probe.required()
    monkeypatch.setenv(probe.REQUIRED_ENV, "1")
    assert probe.required()


def test_a_worker_container_locks_on_the_nodes_network_urls() -> None:
    urls = ["redis://a1b2c3:6379/0", "redis://d4e5f6:6379/0", "redis://a7b8c9:6379/0"]
    assert worker_settings(urls) == {"redlock_nodes": urls}


def test_the_image_pins_what_is_installed_here() -> None:
    pins = workers.pinned_requirements()
    assert pins == [f"{name}=={metadata.version(name)}" for name in workers.PINNED]
    text = workers.dockerfile(pins, from_checkout=True)
    assert text.startswith(f"FROM {workers.WORKER_BASE_IMAGE}\n")
    assert f"celery=={metadata.version('celery')}" in text
    assert "COPY checkout /opt/celery-redlock" in text


def test_the_image_is_named_after_its_content() -> None:
    root = workers.checkout_root()
    assert root is not None and (root / "celery_redlock" / "__init__.py").is_file()
    context = workers.image_context(root)
    assert "checkout/pyproject.toml" in context
    assert "checkout/celery_redlock/testing/containers/workers.py" in context
    assert not any("__pycache__" in path for path in context)
    same = workers.archive(workers.image_context(root))
    assert workers.image_tag(workers.archive(context)) == workers.image_tag(same)
    changed = {**context, "checkout/README.md": b"changed"}
    assert workers.image_tag(workers.archive(changed)) != workers.image_tag(same)


def test_an_archive_has_the_folders_above_each_file() -> None:
    data = workers.archive({"tests/containers/tasks.py": b"x = 1\n", "app.py": b""})
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        names = {member.name: member.isdir() for member in tar.getmembers()}
        found = tar.extractfile("tests/containers/tasks.py")
        assert found is not None and found.read() == b"x = 1\n"
    assert names == {
        "tests": True,
        "tests/containers": True,
        "tests/containers/tasks.py": False,
        "app.py": False,
    }


def test_the_app_in_a_container_has_the_test_apps_settings(tmp_path: Path) -> None:
    app = Celery(tasks.WORKER_APP, set_as_current=False)
    urls = ["redis://n1:6379/0", "redis://n2:6379/0", "redis://n3:6379/0"]
    app.conf.update(
        broker_url="redis://broker:6379/0",
        beat_schedule={"tick": {"task": "containers.tick", "schedule": 1.0}},
        **worker_settings(urls),
    )
    files = workers.app_files(app, {tasks})
    assert files["tests/containers/tasks.py"] == Path(tasks.__file__).read_bytes()
    source = files["app.py"]
    assert source is not None
    previous = get_current_app()
    namespace: dict[str, object] = {"__name__": "app"}
    try:
        exec(compile(source, str(tmp_path / "app.py"), "exec"), namespace)
    finally:
        previous.set_current()
    carried = namespace["app"]
    assert isinstance(carried, Celery)
    assert carried.main == tasks.WORKER_APP
    assert carried.conf.redlock_nodes == urls
    assert carried.conf.broker_url == "redis://broker:6379/0"
    assert carried.conf.beat_schedule["tick"]["schedule"] == 1.0
    assert {"containers.hold", "containers.late", "containers.tick"} <= set(carried.tasks)
    # Only the containers' app gets the tasks, not every app the session makes.
    assert "containers.hold" not in Celery("another", set_as_current=False).tasks


INNER = """
pytest_plugins = ["celery_redlock.testing.containers"]
"""
INNER_TEST = """
def test_nodes(redlock_node_cluster):
    pass

def test_count(redlock_node_count):
    assert redlock_node_count == 3
"""


@pytest.mark.parametrize("strict", [False, True], ids=["skips", "required-fails"])
def test_opting_in_without_a_daemon_skips_with_the_reason(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, strict: bool
) -> None:
    monkeypatch.setenv("DOCKER_HOST", NO_DAEMON)
    monkeypatch.setenv(probe.REQUIRED_ENV, "1" if strict else "0")
    pytester.makeconftest(INNER)
    pytester.makepyfile(INNER_TEST)
    result = pytester.runpytest_subprocess("-rs", "-p", "no:cacheprovider")
    if strict:
        result.assert_outcomes(passed=1, errors=1)
        result.stdout.fnmatch_lines(["*container tests required, but no Docker daemon answers*"])
    else:
        result.assert_outcomes(passed=1, skipped=1)
        result.stdout.fnmatch_lines(["SKIPPED*no Docker daemon answers*"])
