"""The kit's fixtures where pytest-celery (or the Docker SDK) is not installed: each
skips the test with the reason (fails it with ``REDLOCK_CONTAINERS_REQUIRED=1``).
Imports pytest and the standard library only."""

from __future__ import annotations

from typing import NoReturn

import pytest

from .probe import missing_for_containers, required


def _missing() -> NoReturn:
    reason = missing_for_containers() or "pytest-celery could not be imported"
    if required():
        pytest.fail(f"container tests required, but {reason}")
    pytest.skip(reason)


@pytest.fixture
def redlock_node_count() -> int:
    return 3


@pytest.fixture
def redlock_node_cluster() -> NoReturn:
    _missing()


@pytest.fixture
def redlock_worker_app() -> NoReturn:
    _missing()


@pytest.fixture
def redlock_worker_image() -> NoReturn:
    _missing()


@pytest.fixture
def redlock_worker_factory() -> NoReturn:
    _missing()


@pytest.fixture
def redlock_beat_factory() -> NoReturn:
    _missing()
