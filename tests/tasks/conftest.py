"""Fixtures of the tests with an embedded worker."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from celery_redlock import signals
from celery_redlock.testing import RedisServer
from tests.support.appfixture import Recorder, recording
from tests.support.starts import Observer


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    """Every lock signal (and ``task_postrun``) sent while the test runs."""
    with recording() as rec:
        yield rec
        # The events refer to results (a run's request keeps the results its body
        # published; a retry's exception keeps that request): free them now, while
        # the test's backend runs (see appfixture). Left to the next collection they
        # reconnect to a stopped Redis for 20 s each.
        rec.events.clear()


@pytest.fixture
def observer(broker: RedisServer) -> Observer:
    """Bodies report their stays and starts here, on the broker's Redis."""
    return Observer(broker.client())


@pytest.fixture
def contended() -> Iterator[list[dict[str, Any]]]:
    """What each ``lock_contended`` signal said (plain values only: the Recorder keeps
    the senders, and with them results that outlive the test's broker)."""
    seen: list[dict[str, Any]] = []

    def receiver(sender: Any = None, **kwargs: Any) -> None:
        seen.append(
            {
                k: kwargs.get(k)
                for k in ("action", "limit", "countdown", "attempt", "holder", "task_id")
            }
        )

    signals.lock_contended.connect(receiver, weak=False)
    yield seen
    signals.lock_contended.disconnect(receiver)
