"""The celery soak's reading of a lost job (tools/celery_soak/report.py): a job whose
last copy was published again a moment before a whole worker was SIGKILLed is
counted as lost in kombu's transport, with the kill placed on the log's clock; a kill
before that publish, or long after it, leaves the job a loss of the package."""

from __future__ import annotations

import time

import pytest

from tools.celery_soak.faults import Fault
from tools.celery_soak.report import _republished_in_transit

#: A wall-clock moment at a whole second, and the log lines of a lock retry there.
AT = int(time.mktime(time.strptime("2026-11-28 06:11:35", "%Y-%m-%d %H:%M:%S")))
LOG = [
    "[gevent] [2026-11-28 06:11:35,734: INFO/MainProcess] Task soakapp.retry[t] received",
    "[gevent] [2026-11-28 06:11:35,735: WARNING/MainProcess] lock contended: task "
    "soakapp.retry[t] key redlock:soak:k1 held by x@threads (3.4s left) -> retry in 0.3s",
    "[gevent] [2026-11-28 06:11:35,743: INFO/MainProcess] Task soakapp.retry[t] ignored",
]
#: The faults' clock: monotonic = wall - this.
OFFSET = 1_000_000_000_000


def _kill_at(ms_after_second: float) -> Fault:
    wall = AT * 1_000_000_000 + int(ms_after_second * 1_000_000)
    return Fault("worker_kill", "threads", wall - OFFSET)


@pytest.mark.parametrize(
    ("kill_ms", "in_transport"),
    [(740, True), (735, True), (1700, True), (700, False), (1800, False)],
)
def test_a_copy_published_again_just_before_a_worker_kill_is_lost_in_transport(
    kill_ms: float, in_transport: bool
) -> None:
    assert _republished_in_transit(LOG, [_kill_at(kill_ms)], OFFSET) is in_transport


def test_a_log_that_does_not_end_in_a_publish_is_not_read_as_one() -> None:
    received_last = [*LOG, LOG[0]]
    assert not _republished_in_transit(received_last, [_kill_at(740)], OFFSET)
    assert not _republished_in_transit(LOG, [Fault("node_kill", "1", _kill_at(740).start)], OFFSET)
