# mypy: disallow-untyped-decorators=False
"""Hand-off's second look (tasks/handoff.py, ``_look_again``): a release that comes
between a copy's refused attempt and its registration finds it not yet queued and
wakes nobody, and the copy would wait for its fallback retry (seconds, up to
``redlock_retry_backoff_max``) while the lock or a permit sits free. The registration
reads, in the same script on each node, whether the lock (with a limit, the note that
every permit is taken) is still there; where a quorum finds it gone, the copy wakes
the queue itself -- and so runs as a woken copy, long before its fallback.

Real lock nodes, a real Redis broker, an embedded worker; the test releases a permit
its own lease holds exactly in that window (wrapping the registration), the way a
holder's release would fall there.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker

from celery_redlock import Redlock, RedlockTask
from celery_redlock.tasks import handoff
from celery_redlock.tasks.headers import WOKEN_HEADER, header
from celery_redlock.testing import RedisNodes, RedisServer
from tests.support.appfixture import Recorder, worker_test_app

#: Only guards against a hang.
HANG_GUARD = 30.0
#: The blockers' lease: a copy's fallback comes no sooner than 10% of the TTL left
#: (3 s), long after a wake.
BLOCKER_TTL = 30.0


@pytest.fixture
def app(redis_server: RedisServer) -> Iterator[Celery]:
    with RedisNodes(3) as nodes:
        yield from worker_test_app("lookagain", redis_server, nodes, 10.0, 60.0)


@pytest.mark.parametrize("limit", [1, 2], ids=["mutex", "limit-2"])
def test_a_release_between_a_refusal_and_the_registration_still_wakes_the_copy(
    app: Celery, recorder: Recorder, monkeypatch: pytest.MonkeyPatch, limit: int
) -> None:
    ran: list[bool] = []

    @app.task(
        shared=False, bind=True, base=RedlockTask, redlock_key="again:{tag}",
        name="c.again", redlock_limit=limit, redlock_ttl=5,
    )  # fmt: skip
    def again(self: Any, tag: str) -> str:
        ran.append(bool(header(self.request, WOKEN_HEADER)))
        return "ran"

    redlock = Redlock(app.conf.redlock_nodes)
    key = again.lock_key((), {"tag": "t"})
    blockers = [
        redlock.acquire(key, ttl=BLOCKER_TTL, holder=f"blocker-{i}", limit=limit)
        for i in range(limit)
    ]
    assert all(blockers)
    register = handoff._register

    def released_first(*args: Any, **kwargs: Any) -> Any:
        if blockers:  # the copy was refused; its registration has not run yet
            blockers.pop().release()  # type: ignore[union-attr]
        return register(*args, **kwargs)

    monkeypatch.setattr(handoff, "_register", released_first)
    try:
        with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
            result = again.apply_async(kwargs={"tag": "t"})
            assert result.get(timeout=HANG_GUARD) == "ran"
    finally:
        for lease in blockers:
            lease.release()  # type: ignore[union-attr]
    assert len(recorder.of("lock_contended")) == 1  # refused once, then woken
    assert ran == [True]  # the body ran once, as the wake, not as the fallback
