"""Celery worker and beat containers, and the image they run.

The image (:func:`build_worker_image`): ``python:3.12-slim``, celery, kombu and
redis-py pinned to the versions installed where the tests run (a container test
must exercise what the other tests do), and celery-redlock -- from this checkout
when the kit runs from one, else the released version installed here.

A container gets its app the way pytest-celery's built-in worker does: the source of
the tasks modules and an ``app.py`` written by
:class:`~pytest_celery.vendors.worker.volume.WorkerInitialContent` from
``app_template.py``, carrying the test's app settings. They are copied into the
created container before it starts (``put_archive``), not into a volume: nothing is
left to remove but the container.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import tarfile
from collections.abc import Iterable, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any, Optional

from pytest_celery import CeleryWorkerContainer
from pytest_celery.vendors.worker.volume import WorkerInitialContent
from pytest_docker_tools.wrappers.container import wait_for_callable

from . import app_template
from .nodes import LABEL, START_TIMEOUT, remove

#: The image the worker image is built on.
WORKER_BASE_IMAGE = "python:3.12-slim"
#: Distributions pinned in the image to their versions here. psutil: pytest-celery's
#: ``utils.py``, copied next to ``app.py``, imports it.
PINNED = ("celery", "kombu", "redis", "psutil")
#: What of the checkout the image needs to install celery-redlock.
CHECKOUT_FILES = ("pyproject.toml", "setup.py", "README.md")
#: Where the app and the tasks modules go in the container (on ``PYTHONPATH``).
APP_DIR = "/app"


def pinned_requirements(names: Iterable[str] = PINNED) -> list[str]:
    """``name==version`` for each distribution, as installed here."""
    return [f"{name}=={metadata.version(name)}" for name in names]


def checkout_root() -> Optional[Path]:
    """This package's checkout, or None when it is installed from a wheel."""
    root = Path(__file__).resolve().parents[3]
    pyproject = root / "pyproject.toml"
    if pyproject.is_file() and 'name = "celery-redlock"' in pyproject.read_text():
        return root
    return None


def dockerfile(requirements: Sequence[str], from_checkout: bool) -> str:
    """The worker image's Dockerfile: pinned requirements first (a layer cached
    across checkouts), then celery-redlock."""
    pip = "RUN pip install --no-cache-dir"
    if from_checkout:
        install = f"COPY checkout /opt/celery-redlock\n{pip} /opt/celery-redlock"
    else:
        install = f"{pip} celery-redlock=={metadata.version('celery-redlock')}"
    return "\n".join(
        [
            f"FROM {WORKER_BASE_IMAGE}",
            f"{pip} {' '.join(requirements)}",
            install,
            f"WORKDIR {APP_DIR}",
            f"ENV PYTHONPATH={APP_DIR} PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1",
            "",
        ]
    )


def _add(tar: tarfile.TarFile, name: str, data: Optional[bytes]) -> None:
    """A file (or, for None, a folder) with fixed owner and time: the same content
    makes the same archive, so the image tag below names the content."""
    info = tarfile.TarInfo(name)
    info.mtime = 0
    if data is None:
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(info)
    else:
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))


def archive(files: Mapping[str, Optional[bytes]]) -> bytes:
    """A tar of ``files`` (path -> content), the folders above each path included."""
    folders = sorted({str(parent) for path in files for parent in Path(path).parents} - {"."})
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for folder in folders:
            _add(tar, folder, None)
        for path in sorted(files):
            _add(tar, path, files[path])
    return buffer.getvalue()


def image_context(root: Optional[Path]) -> dict[str, Optional[bytes]]:
    """The build context: the Dockerfile, and the checkout's package when there is one."""
    files: dict[str, Optional[bytes]] = {
        "Dockerfile": dockerfile(pinned_requirements(), root is not None).encode()
    }
    if root is not None:
        for name in CHECKOUT_FILES:
            if (root / name).is_file():
                files[f"checkout/{name}"] = (root / name).read_bytes()
        for path in sorted((root / "celery_redlock").rglob("*")):
            if path.is_file() and path.suffix in (".py", ".typed"):
                files[f"checkout/{path.relative_to(root)}"] = path.read_bytes()
    return files


def image_tag(context: bytes) -> str:
    """The worker image's tag: the context's hash, so an unchanged checkout reuses
    the image and a changed one never runs a stale one."""
    return f"celery-redlock-worker:{hashlib.sha256(context).hexdigest()[:12]}"


def build_worker_image(client: Any) -> str:
    """The worker image's tag, built first when no image of that tag exists; then
    the images of earlier checkouts are removed, but for those a container still uses
    (each edit of the package makes a new one)."""
    context = archive(image_context(checkout_root()))
    tag = image_tag(context)
    if not client.images.list(name=tag):
        client.images.build(
            fileobj=io.BytesIO(context), custom_context=True, tag=tag, rm=True, forcerm=True
        )
        _remove_older(client, tag)
    return tag


def _remove_older(client: Any, tag: str) -> None:
    from docker.errors import APIError

    repository = tag.partition(":")[0]
    for image in client.images.list(name=repository):
        for old in image.tags:
            if old != tag:
                # An image a container still uses (another session's) is kept.
                with contextlib.suppress(APIError):
                    client.images.remove(old)


class RedlockWorkerContainer(CeleryWorkerContainer):  # type: ignore[misc]
    """A ``celery worker`` container of the worker image (ready: it logs "ready.")."""

    #: The ``-n`` name it was started with (pytest-celery's is one per class).
    given_name = "worker"

    def worker_name(self) -> str:
        """The worker's name: :class:`~pytest_celery.CeleryTestWorker` says
        ``hostname()`` is ``<name>@<container hostname>``."""
        return self.given_name


class RedlockBeatContainer(CeleryWorkerContainer):  # type: ignore[misc]
    """A ``celery beat -S redlock`` container of the worker image."""

    @property
    def ready_prompt(self) -> str:
        return "beat: Starting..."


def app_files(app: Any, tasks: Iterable[ModuleType]) -> dict[str, Optional[bytes]]:
    """``/app``'s files: ``app.py`` carrying ``app``'s settings, pytest-celery's
    ``utils.py``, and the source of each tasks module (pytest-celery's own, ``ping``
    and friends, when none is given)."""
    content = WorkerInitialContent(
        app_module=app_template, utils_module=CeleryWorkerContainer.utils_module()
    )
    content.add_modules("tasks", set(tasks) or CeleryWorkerContainer.tasks_modules())
    content.set_app_name(app.main)
    content.set_config_from_object(app)
    generated: dict[str, bytes] = content.generate()
    return dict(generated)


def worker_command(name: str, pool: str, concurrency: int, *args: str) -> list[str]:
    return [
        "celery", "-A", "app", "worker", "--loglevel=INFO", "-n", f"{name}@%h",
        "--pool", pool, "--concurrency", str(concurrency), *args,
    ]  # fmt: skip


def beat_command(*args: str) -> list[str]:
    # The schedule file in the container's own /tmp: two beats never share one.
    return [
        "celery", "-A", "app", "beat", "-S", "redlock", "--loglevel=INFO",
        "--schedule", "/tmp/celerybeat-schedule", *args,
    ]  # fmt: skip


def start(
    client: Any,
    cls: type[CeleryWorkerContainer],
    image: str,
    command: Sequence[str],
    network: str,
    files: Mapping[str, Optional[bytes]],
    environment: Mapping[str, str],
) -> Any:
    """A started ``cls`` container, ``files`` in ``/app``, once it logs ready."""
    raw = client.containers.create(
        image,
        command=list(command),
        environment=dict(environment),
        network=network,
        labels={LABEL: cls.__name__},
    )
    container = cls(raw)
    try:
        raw.put_archive(APP_DIR, archive(files))
        raw.start()
        wait_for_callable(f"{cls.__name__} {raw.name} ready", container.ready, START_TIMEOUT)
    except BaseException:
        remove(container)
        raise
    return container
