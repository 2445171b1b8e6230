"""Fixtures of the tests with an embedded worker."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.appfixture import Recorder, recording


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    """Every lock signal (and ``task_postrun``) sent while the test runs."""
    with recording() as rec:
        yield rec
