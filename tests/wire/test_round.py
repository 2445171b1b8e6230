"""The round's state machine on its own: events in, decision and results out; and
the finisher's schedule, fed with pools that only count its sweeps.

No sockets, so no servers here: the rounds over real nodes, and the finisher
reading real connections, are proven in test_redlock.py, test_tls_acl.py and
test_faults.py.
"""

from __future__ import annotations

import threading
import time

import pytest
from redis import exceptions as rexc

from celery_redlock.wire.late_replies import Finisher
from celery_redlock.wire.round import NOT_AWAITED, Round

NAMES = ["n0", "n1", "n2", "n3", "n4"]


def _is_one(reply: object) -> bool:
    return reply == 1


def test_decided_once_a_quorum_says_yes_and_the_rest_are_not_awaited() -> None:
    tally = Round(5, _is_one, enough_yes=3, enough_no=3)
    for i in (4, 0):
        assert tally.replied(i, 1) is False
        assert not tally.decided
    assert tally.awaited == [1, 2, 3]
    tally.replied(2, 1)
    assert tally.decided
    assert tally.finish() == [1, NOT_AWAITED, 1, NOT_AWAITED, 1]


def test_decided_once_a_quorum_can_no_longer_say_yes() -> None:
    tally = Round(5, _is_one, enough_yes=3, enough_no=3)
    refused = [b"holder", 1000]
    tally.replied(0, refused)
    tally.replied(1, 1)
    down = rexc.ConnectionError("n3: connection refused")
    tally.failed(3, down)
    assert not tally.decided
    tally.replied(4, rexc.ResponseError("ERR script error"))  # an error reply is a no
    assert tally.decided and (tally.yes, tally.no) == (1, 3)
    results = tally.finish()
    assert results[0] is refused and results[3] is down and results[2] is NOT_AWAITED


def test_failures_at_send_time_can_decide_before_any_reply() -> None:
    tally = Round(3, _is_one, enough_yes=2, enough_no=2)
    tally.failed(0, rexc.ConnectionError("n0"))
    tally.failed(1, rexc.ConnectionError("n1"))
    assert tally.decided
    assert tally.finish()[2] is NOT_AWAITED


def test_noscript_asks_for_a_resend_as_eval_and_keeps_the_node_awaited() -> None:
    tally = Round(3, _is_one, enough_yes=2, enough_no=2)
    assert tally.replied(1, rexc.NoScriptError("NOSCRIPT No matching script")) is True
    assert tally.awaiting(1) and (tally.yes, tally.no) == (0, 0)
    assert tally.replied(1, 1) is False
    assert not tally.awaiting(1) and tally.yes == 1


def test_without_thresholds_every_node_is_heard() -> None:
    tally = Round(3)  # is_yes=bool, never decided early
    for i, reply in enumerate([0, b"", [b"v", 5]]):
        tally.replied(i, reply)
        assert not tally.decided
    assert tally.awaited == []
    assert tally.finish() == [0, b"", [b"v", 5]]


def test_deadline_times_out_exactly_the_nodes_still_awaited() -> None:
    tally = Round(5, _is_one, enough_yes=3, enough_no=3)
    tally.replied(0, 1)
    tally.failed(1, rexc.ConnectionError("n1: refused"))
    tally.deadline_passed(NAMES, 0.05)
    results = tally.finish()
    assert results[0] == 1 and isinstance(results[1], rexc.ConnectionError)
    for i in (2, 3, 4):
        error = results[i]
        assert isinstance(error, rexc.TimeoutError)
        assert str(error) == f"{NAMES[i]}: no reply within 50 ms"


@pytest.mark.parametrize(("enough_yes", "enough_no"), [(0, 3), (3, 0)])
def test_a_threshold_of_zero_is_decided_from_the_start(enough_yes: int, enough_no: int) -> None:
    tally = Round(5, _is_one, enough_yes=enough_yes, enough_no=enough_no)
    assert tally.decided
    assert tally.finish() == [NOT_AWAITED] * 5


def test_the_round_module_does_no_io() -> None:
    import celery_redlock.wire.round as round_module

    names = set(vars(round_module))
    assert not names & {"socket", "select", "selectors", "ssl", "time", "asyncio"}


# -- the finisher's schedule (no sockets either: a pool that counts sweeps) ---------------


class _CountingPool:
    """Owes replies for ``sweeps`` sweeps, then nothing; raises on the first if told."""

    def __init__(self, sweeps: int, fail_first: bool = False) -> None:
        self.sweeps = sweeps
        self.fail_first = fail_first
        self.calls: list[float] = []
        self.done = threading.Event()

    def finish_owed(self, older_than: float) -> bool:
        self.calls.append(older_than)
        if self.fail_first and len(self.calls) == 1:
            raise OSError("a pool that fails must not stop the thread")
        if len(self.calls) >= self.sweeps:
            self.done.set()
            return False
        return True


def _wait_asleep(finisher: Finisher) -> None:
    give_up = time.monotonic() + 10
    while finisher._awake:
        assert time.monotonic() < give_up, "the finisher never went back to sleep"
        time.sleep(0.001)


def test_the_finisher_sweeps_a_noted_pool_until_it_owes_nothing_then_sleeps() -> None:
    finisher = Finisher(period=0.001)
    pool = _CountingPool(sweeps=3)
    finisher.note(pool)
    finisher.note(pool)  # noted twice before a sweep: swept as one
    assert pool.done.wait(10)
    _wait_asleep(finisher)
    assert pool.calls == [0.001] * 3  # asked only for replies owed a period or more
    again = _CountingPool(sweeps=1)
    finisher.note(again)  # wakes it once more
    assert again.done.wait(10)
    _wait_asleep(finisher)
    assert len(pool.calls) == 3 and len(again.calls) == 1


def test_a_pool_that_raises_is_dropped_and_the_others_are_still_swept() -> None:
    finisher = Finisher(period=0.001)
    failing, healthy = _CountingPool(sweeps=5, fail_first=True), _CountingPool(sweeps=2)
    finisher.note(failing)
    finisher.note(healthy)
    assert healthy.done.wait(10)
    _wait_asleep(finisher)
    assert len(failing.calls) == 1 and len(healthy.calls) == 2


@pytest.mark.parametrize(
    "line",
    [
        b"READONLY You can't write against a read only replica.",
        # Redis 6.2: the same error raised inside a script, wrapped.
        b"ERR Error running script (call to f_4c0e): @user_script:9: @user_script: 9: "
        b"-READONLY You can't write against a read only replica.",
    ],
)
def test_a_read_only_reply_is_known_on_redis_7_and_6(line: bytes) -> None:
    """A demoted master's refusal makes a Sentinel-managed node ask again where the
    master is: it must read as READONLY however the server words it."""
    from redis.exceptions import ReadOnlyError

    from celery_redlock.wire.resp import parse

    reply, _ = parse(b"-" + line + b"\r\n", 0)
    assert isinstance(reply, ReadOnlyError)
    plain, _ = parse(b"-ERR Error running script: @user_script:1: bad -x\r\n", 0)
    assert type(plain).__name__ == "ResponseError"
