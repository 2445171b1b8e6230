"""The lock's rules driven by hand: scripted replies in, steps and outcomes out.

No Redis, no sockets, no real clock (h11's ``test_state.py`` drives its machine the
same way). Each test builds a ``LockRules`` over three made-up node addresses with a
clock it moves itself, takes an operation's steps, checks each ``Ask`` it yields --
the script, keys and arguments it would send, its deadline and when the round may
stop -- and sends back what the nodes would have answered: a reply (int, bytes, a
list), a redis-py exception instance, or ``NOT_AWAITED``, in node order, as
``NodeSet.round`` hands them over (see wire/round.py, lock/scripts.py).
"""

from __future__ import annotations

from typing import Any, TypeVar, Union

import pytest
from redis import exceptions as rexc

from celery_redlock.errors import AlreadyHeld, ConfigurationError, LockContended, QuorumUnavailable
from celery_redlock.lock import scripts
from celery_redlock.lock.acquire_replies import (
    CONTENDED,
    GRANTED,
    SPLIT,
    UNAVAILABLE,
    Attempt,
    is_granted,
    refused_for,
    verdict,
)
from celery_redlock.lock.commands import extend_command, release_command
from celery_redlock.lock.lease import Extension, Lease, next_renewal, renewal_interval
from celery_redlock.lock.quorum import is_one
from celery_redlock.lock.reentry import HeldLeases
from celery_redlock.lock.rules import LockRules
from celery_redlock.lock.settings import Settings
from celery_redlock.lock.steps import Ask, Pause, Settle, Steps, drive
from celery_redlock.lock.stored import (
    FENCE_COUNTER_TTL,
    FIRST_HOLD,
    fence_counter,
    hold_tombstone,
    reentry_holds,
    tombstone,
)
from celery_redlock.wire.resp import Command, parse
from celery_redlock.wire.round import NOT_AWAITED, Round
from celery_redlock.wire.script import Script

T = TypeVar("T")

NODES = ("10.0.0.1:6379/0", "10.0.0.2:6379/0", "10.0.0.3:6379/0")
TOKEN = "scripted-token-0123456789"
HOLDER = "worker-1:4242"
VALUE = f"{TOKEN}|{HOLDER}"
OTHER = b"another-holders-token-0123|worker-2:77"
#: The lock's ttl, node_timeout and drift, as a user would set them.
TTL, NODE_TIMEOUT, DRIFT = 10.0, 0.05, 0.01
MARGIN = TTL * DRIFT + 0.002  # drift allowance plus Redis' expiry precision
#: A lease's owner: the steps never call it (rounds are the driver's).
OWNER = object()


class FakeClock:
    """A monotonic clock that moves only when told to."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def timed_out(node: int) -> rexc.TimeoutError:
    return rexc.TimeoutError(f"{NODES[node]}: no reply within 50 ms")


def refused(node: int) -> rexc.ConnectionError:
    return rexc.ConnectionError(f"{NODES[node]}: Connection refused")


def make_rules(clock: FakeClock, nodes: int = 3, **settings: Any) -> LockRules:
    options = {"ttl": TTL, "node_timeout": NODE_TIMEOUT, "drift_factor": DRIFT, **settings}
    addresses = [f"10.0.0.{i + 1}:6379/0" for i in range(nodes)]
    held = HeldLeases(lambda: "the test's execution")
    return LockRules(Settings(**options), addresses, held, clock, wall_us=lambda: 7)


def sent(what: Union[Ask, Command]) -> tuple[Script, list[str], list[str]]:
    """What a round (or a command) sends each node: its script, keys and arguments,
    read back from the EVALSHA it packed."""
    command = what.command if isinstance(what, Ask) else what
    words, _ = parse(command.payload, 0)
    assert isinstance(words, list) and words[0] == b"EVALSHA"
    decoded = [w.decode() for w in words[2:]]
    count = int(decoded[0])
    return command.script, decoded[1 : 1 + count], decoded[1 + count :]


def never_sleep(seconds: float) -> None:
    pytest.fail(f"slept {seconds} s: no pause was expected")


def no_round(ask: Ask) -> list[object]:
    pytest.fail(f"asked for a round: {ask}")


def ask_of(step: object) -> Ask:
    assert isinstance(step, Ask), f"expected a round, got {step!r}"
    return step


def finish(steps: Steps[T], results: list[object]) -> T:
    """Send the last step its results; the operation's value."""
    with pytest.raises(StopIteration) as stop:
        steps.send(results)
    return stop.value.value  # type: ignore[no-any-return]


def acquire(
    rules: LockRules, key: Any = "job", *, blocking: bool = False, **kwargs: Any
) -> Steps[Attempt[Lease]]:
    return rules.acquire_steps(
        OWNER, Lease, key, kwargs.pop("ttl", None), blocking, kwargs.pop("timeout", None),
        HOLDER, kwargs.pop("token", TOKEN), **kwargs,
    )  # fmt: skip


def won(rules: LockRules, clock: FakeClock, key: str = "job") -> Lease:
    """A lease granted by every node, with no time passing."""
    steps = acquire(rules, key)
    next(steps)
    attempt = finish(steps, [1, 1, 1])
    assert attempt.lease is not None
    return attempt.lease


def extension_asked() -> tuple[Lease, Steps[Extension]]:
    """A lease granted by every node, and its extension's steps at their one round."""
    clock = FakeClock()
    rules = make_rules(clock)
    lease = won(rules, clock)
    steps = rules.extend_steps(lease, TTL)
    next(steps)
    return lease, steps


def expect_undo(steps: Steps[Attempt[Lease]], results: list[object]) -> tuple[Ask, Attempt[Lease]]:
    """Send a lost round's results: the undo it yields, then the attempt it returns."""
    undo = ask_of(steps.send(results))
    return undo, finish(steps, [])


# -- acquire ----------------------------------------------------------------------------


def test_acquire_asks_every_node_to_set_the_key_and_stops_at_a_quorum_either_way() -> None:
    rules = make_rules(FakeClock())
    ask = ask_of(next(acquire(rules)))
    script, keys, args = sent(ask)
    assert script is scripts.ACQUIRE
    assert keys == ["job", tombstone("job", VALUE)]
    assert args == [VALUE, "10000"]
    assert ask.timeout == NODE_TIMEOUT
    assert ask.is_yes is is_granted
    assert (ask.enough_yes, ask.enough_no) == (2, 2)
    assert ask.wait and not ask.deliver
    assert ask.undo is not None  # a cancelled round's release, built on demand
    assert sent(ask.undo())[0] is scripts.RELEASE


def test_a_quorum_of_grants_wins_a_lease_valid_for_ttl_less_elapsed_and_drift() -> None:
    clock = FakeClock()
    rules = make_rules(clock)
    steps = acquire(rules)
    next(steps)
    clock.advance(0.02)  # the round took 20 ms
    attempt = finish(steps, [1, timed_out(1), 1])
    lease = attempt.lease
    assert lease is not None
    assert (lease.key, lease.token, lease.holder, lease.value) == ("job", TOKEN, HOLDER, VALUE)
    assert lease.fence is None
    assert lease.validity == pytest.approx(TTL - 0.02 - MARGIN)
    assert lease.owner is OWNER
    assert rules.held.live(("job",)) is lease  # this execution holds it now


def test_grants_that_come_after_validity_ran_out_lose_and_are_undone_without_waiting() -> None:
    clock = FakeClock()
    rules = make_rules(clock)
    steps = acquire(rules)
    next(steps)
    clock.advance(TTL - MARGIN)  # a quorum said yes, too late to be of use
    undo, attempt = expect_undo(steps, [1, 1, 1])
    script, keys, args = sent(undo)
    assert script is scripts.RELEASE
    assert keys == ["job", tombstone("job", VALUE)]
    assert args == [VALUE, "10000"]
    assert (undo.timeout, undo.wait, undo.deliver) == (0.0, False, True)
    assert attempt.lease is None and attempt.unavailable is None
    assert attempt.holder_ttl == 0.0  # nobody holds it: try again at once
    assert rules.held.live(("job",)) is None


def test_a_contended_key_surfaces_the_holder_and_when_a_quorum_of_it_expires() -> None:
    rules = make_rules(FakeClock())
    steps = acquire(rules)
    next(steps)
    undo, attempt = expect_undo(steps, [[OTHER, 4000], 1, [OTHER, 2500]])
    assert sent(undo)[0] is scripts.RELEASE  # also the node that said yes
    assert attempt.lease is None and attempt.unavailable is None
    assert attempt.holder == "worker-2:77"
    # One more node must free for a quorum: the sooner of the holder's two expiries.
    assert attempt.holder_ttl == 2.5
    with pytest.raises(LockContended) as contended:
        attempt.outcome("job", True)
    assert (contended.value.holder, contended.value.ttl) == ("worker-2:77", 2.5)
    assert attempt.outcome("job", False) is None


def test_a_split_vote_among_live_nodes_is_contention_not_an_outage() -> None:
    clock = FakeClock()
    rules = make_rules(clock, nodes=4)  # quorum 3
    steps = acquire(rules)
    assert ask_of(next(steps)).enough_yes == 3
    undo, attempt = expect_undo(steps, [1, [OTHER, 3000], 1, [OTHER, 1000]])
    assert undo.deliver and not undo.wait
    assert attempt.lease is None and attempt.unavailable is None
    assert (attempt.holder, attempt.holder_ttl) == ("worker-2:77", 1.0)


def test_a_node_error_or_timeout_does_not_stop_a_quorum_of_grants() -> None:
    rules = make_rules(FakeClock())
    steps = acquire(rules)
    next(steps)
    attempt = finish(steps, [refused(0), 1, 1])
    assert attempt.lease is not None


def test_too_few_answers_make_the_attempt_unavailable_naming_the_silent_nodes() -> None:
    rules = make_rules(FakeClock())
    steps = acquire(rules)
    next(steps)
    error = rexc.ResponseError("OOM command not allowed when used memory > 'maxmemory'")
    undo, attempt = expect_undo(steps, [refused(0), 1, error])
    assert sent(undo)[0] is scripts.RELEASE
    assert attempt.lease is None
    unavailable = attempt.unavailable
    assert unavailable is not None
    assert set(unavailable.errors) == {NODES[0], NODES[2]}
    assert unavailable.errors[NODES[2]] is error
    assert unavailable.needed == 2
    with pytest.raises(QuorumUnavailable):
        attempt.outcome("job", False)


def test_a_blocking_acquire_pauses_until_the_holder_expires_then_tries_again() -> None:
    clock = FakeClock()
    rules = make_rules(clock, retry_delay=0.2)
    steps = acquire(rules, blocking=True, timeout=5.0)
    next(steps)
    undo = ask_of(steps.send([[OTHER, 100], [OTHER, 100], 1]))
    pause = steps.send([])
    assert isinstance(pause, Pause)
    assert pause.keys == ("job",)
    assert pause.longest is not None and 0.1 < pause.longest <= 0.105  # its expiry, a bit after
    assert pause.seconds <= pause.longest  # polling never waits past it
    clock.advance(pause.longest)
    again = ask_of(steps.send([]))
    assert sent(again)[0] is scripts.ACQUIRE
    assert sent(undo)[2][0] == sent(again)[2][0] == VALUE  # the caller's token, both times
    assert finish(steps, [1, 1, NOT_AWAITED]).lease is not None


def test_after_a_quorum_refused_only_the_refusing_nodes_messages_end_the_pause() -> None:
    """A quorum refused (one holder): what frees elsewhere -- a node that granted this
    attempt or was not heard -- cannot let the next attempt win, so only the
    refusing nodes' messages wake it (wake.py). A split wakes on any node's."""
    rules = make_rules(FakeClock(), nodes=5, retry_delay=0.2)
    steps = acquire(rules, blocking=True, timeout=5.0)
    next(steps)
    ask_of(steps.send([1, [OTHER, 900], NOT_AWAITED, [OTHER, 900], [OTHER, 900]]))  # undo
    pause = steps.send([])
    assert isinstance(pause, Pause) and pause.wake_on == frozenset({1, 3, 4})
    ask_of(steps.send([]))
    other = [b"someone-else|worker-3:78", 900]
    ask_of(steps.send([1, [OTHER, 900], 1, other, [OTHER, 900]]))  # a split: undone
    pause = steps.send([])
    assert isinstance(pause, Pause) and pause.wake_on is None


def test_a_blocking_acquire_gives_up_when_its_timeout_has_run_out() -> None:
    clock = FakeClock()
    rules = make_rules(clock)
    steps = acquire(rules, blocking=True, timeout=1.0)
    next(steps)
    clock.advance(1.0)
    undo, attempt = expect_undo(steps, [[OTHER, 9000], [OTHER, 9000], NOT_AWAITED])
    assert undo.deliver
    assert attempt.lease is None and attempt.holder_ttl == 9.0


def test_a_round_every_node_refused_is_not_undone() -> None:
    """Each node ran the script and set nothing of ours: no second script anywhere.
    One node not heard from (it may still apply our SET), and the undo goes out."""
    steps = acquire(make_rules(FakeClock()))
    next(steps)
    attempt = finish(steps, [[OTHER, 9000], [None, -2], [OTHER, 8000]])
    assert attempt.lease is None and attempt.holder == "worker-2:77"
    for silent in (NOT_AWAITED, timed_out(2), refused(2)):
        steps = acquire(make_rules(FakeClock()))
        next(steps)
        undo, attempt = expect_undo(steps, [[OTHER, 9000], [OTHER, 9000], silent])
        assert sent(undo)[0] is scripts.RELEASE and undo.deliver


def test_an_outage_ends_a_wait_without_timeout_after_retry_count_attempts() -> None:
    clock = FakeClock()
    rules = make_rules(clock, retry_count=2)
    steps = acquire(rules, blocking=True)
    next(steps)
    attempts = 1
    while True:
        undo = ask_of(steps.send([timed_out(0), timed_out(1), 1]))
        assert not undo.wait
        try:
            pause = steps.send([])
        except StopIteration as stop:
            attempt = stop.value
            break
        assert isinstance(pause, Pause)
        assert pause.longest == pause.seconds  # nobody to wait for: poll
        assert 0.1 <= pause.seconds <= 0.3  # retry_delay x 0.5..1.5
        ask_of(steps.send([]))
        attempts += 1
    assert attempts == 3  # the first, then retry_count more
    assert attempt.unavailable is not None


def test_a_noscript_reply_is_sent_again_as_eval_and_its_answer_counts() -> None:
    # The round, not the steps, deals with a node that forgot the script: the steps
    # only ever see the EVAL's reply.
    rules = make_rules(FakeClock())
    resent: list[bytes] = []

    def round_trip(ask: Ask) -> list[object]:
        tally = Round(3, ask.is_yes, ask.enough_yes, ask.enough_no)
        if tally.replied(0, rexc.NoScriptError("NOSCRIPT No matching script.")):
            resent.append(ask.command.fallback())
        assert tally.awaiting(0)
        tally.replied(1, 1)
        tally.replied(0, 1)  # the EVAL's reply
        assert tally.decided
        return tally.finish()

    attempt = drive(acquire(rules), round_trip, never_sleep)
    assert attempt.lease is not None
    assert len(resent) == 1
    words, _ = parse(resent[0], 0)
    assert isinstance(words, list) and words[:2] == [b"EVAL", scripts.ACQUIRE.source.encode()]


# -- fencing ----------------------------------------------------------------------------


def test_a_fenced_acquire_records_one_past_the_highest_counter_in_a_second_round() -> None:
    clock = FakeClock()
    rules = make_rules(clock, fencing=True)  # wall clock: 7 us, below the counters
    steps = acquire(rules)
    first = ask_of(next(steps))
    script, keys, _ = sent(first)
    assert script is scripts.ACQUIRE_FENCED
    assert keys == ["job", tombstone("job", VALUE), fence_counter("job")]
    clock.advance(0.01)
    second = ask_of(steps.send([[1, 41], [1, 40], timed_out(2)]))
    script, keys, args = sent(second)
    assert script is scripts.FENCE
    assert keys == ["job", fence_counter("job")]
    assert args == [VALUE, "42", str(int(FENCE_COUNTER_TTL * 1000))]
    assert second.is_yes is is_one and (second.enough_yes, second.enough_no) == (2, 2)
    assert second.timeout == NODE_TIMEOUT  # validity left is longer
    lease = finish(steps, [1, 1, NOT_AWAITED]).lease
    assert lease is not None and lease.fence == 42


def test_a_fence_is_at_least_the_wall_clock_in_microseconds() -> None:
    clock = FakeClock()
    rules = make_rules(clock, fencing=True)
    rules.wall_us = lambda: 1_700_000_000_000_000
    steps = acquire(rules)
    next(steps)
    second = ask_of(steps.send([[1, 41], [1, 40], [1, 3]]))
    assert sent(second)[2][1] == "1700000000000000"
    lease = finish(steps, [1, 1, 1]).lease
    assert lease is not None and lease.fence == 1_700_000_000_000_000


def test_a_fence_a_majority_did_not_record_loses_the_acquire_and_undoes_it() -> None:
    rules = make_rules(FakeClock(), fencing=True)
    steps = acquire(rules)
    next(steps)
    steps.send([[1, 5], [1, 5], [OTHER, 800]])
    undo, attempt = expect_undo(steps, [1, 0, 0])
    assert sent(undo)[0] is scripts.RELEASE and not undo.wait
    assert attempt.lease is None


# -- extend -----------------------------------------------------------------------------


def test_an_extension_a_quorum_granted_counts_validity_from_the_rounds_start() -> None:
    clock = FakeClock()
    rules = make_rules(clock)
    lease = won(rules, clock)
    clock.advance(3.0)
    started = clock()
    steps = rules.extend_steps(lease, 6.0)
    ask = ask_of(next(steps))
    script, keys, args = sent(ask)
    assert (script, keys, args) == (scripts.EXTEND, ["job"], [VALUE, "6000"])
    assert ask.is_yes is is_one and (ask.enough_yes, ask.enough_no) == (2, 2)
    assert ask.timeout == NODE_TIMEOUT
    clock.advance(0.01)
    outcome = finish(steps, [1, 0, 1])
    assert outcome.deadline == pytest.approx(started + 6.0 - (6.0 * DRIFT + 0.002))
    assert (outcome.reason, outcome.retry_by) == (None, None)


def test_an_extension_a_majority_refused_loses_the_lease() -> None:
    _, steps = extension_asked()
    outcome = finish(steps, [0, 1, 0])
    assert outcome.deadline is None and outcome.retry_by is None
    assert outcome.reason == "extension reached 1 of 3 nodes, needed 2"


def test_an_extension_that_met_only_slow_nodes_says_by_when_to_retry() -> None:
    lease, steps = extension_asked()
    outcome = finish(steps, [1, timed_out(1), timed_out(2)])
    assert outcome.deadline is None
    assert outcome.retry_by == pytest.approx(lease.deadline - MARGIN - 2 * NODE_TIMEOUT)
    assert outcome.reason is not None and "no reply within" in outcome.reason


def test_an_extension_after_validity_ran_out_sends_nothing() -> None:
    clock = FakeClock()
    rules = make_rules(clock)
    lease = won(rules, clock)
    clock.advance(TTL)
    with pytest.raises(StopIteration) as stop:
        next(rules.extend_steps(lease, TTL))
    assert stop.value.value == Extension(reason="validity ran out before it was extended")


# -- release ----------------------------------------------------------------------------


def test_a_release_a_quorum_confirmed_is_true_and_forgets_the_lease() -> None:
    clock = FakeClock()
    rules = make_rules(clock)
    lease = won(rules, clock)
    steps = rules.release_lease_steps(lease)
    ask = ask_of(next(steps))
    assert rules.held.live(("job",)) is None  # forgotten before the round
    script, keys, args = sent(ask)
    assert (script, keys, args) == (
        scripts.RELEASE,
        ["job", tombstone("job", VALUE)],
        [VALUE, "10000"],
    )
    # Stops at a quorum of deletions, never early on noes; reaches every node.
    assert (ask.enough_yes, ask.enough_no, ask.deliver) == (2, None, True)
    assert finish(steps, [1, 1, NOT_AWAITED]) is True


def test_a_release_enough_nodes_refused_is_false() -> None:
    clock = FakeClock()
    rules = make_rules(clock)
    steps = rules.release_lease_steps(won(rules, clock))
    next(steps)
    assert finish(steps, [0, timed_out(1), 0]) is False


def test_a_release_too_few_nodes_answered_raises_quorum_unavailable() -> None:
    clock = FakeClock()
    rules = make_rules(clock)
    steps = rules.release_lease_steps(won(rules, clock))
    next(steps)
    with pytest.raises(QuorumUnavailable) as caught:
        steps.send([1, refused(1), timed_out(2)])
    assert set(caught.value.errors) == {NODES[1], NODES[2]}


# -- re-enter ---------------------------------------------------------------------------


def test_re_entering_a_held_key_settles_then_counts_one_more_hold_on_the_nodes() -> None:
    clock = FakeClock()
    rules = make_rules(clock)
    held = won(rules, clock)
    steps = acquire(rules, reentrant=True, ttl=5.0)
    settle = next(steps)
    assert settle == Settle(held)  # no plain extension may land after the REENTER
    clock.advance(1.0)
    ask = ask_of(steps.send([]))
    assert held.hold == FIRST_HOLD  # the first lease now counts as a hold too
    script, keys, args = sent(ask)
    assert script is scripts.REENTER
    assert keys == ["job", reentry_holds("job", VALUE), hold_tombstone("job", VALUE, args[2])]
    assert args[:2] == [VALUE, "5000"]
    assert (ask.enough_yes, ask.enough_no) == (2, 2)
    again = finish(steps, [[1, 2], [1, 2], timed_out(2)]).lease
    assert again is not None and again is not held
    assert (again.token, again.fence, again.hold) == (held.token, held.fence, args[2])
    assert again.deadline <= held.deadline


def test_re_entering_without_reentrant_raises_already_held_at_once() -> None:
    clock = FakeClock()
    rules = make_rules(clock)
    won(rules, clock)
    with pytest.raises(AlreadyHeld):
        next(acquire(rules))


def test_a_re_entry_a_quorum_refused_is_undone_for_its_hold_only() -> None:
    clock = FakeClock()
    rules = make_rules(clock)
    held = won(rules, clock)
    steps = acquire(rules, reentrant=True)
    next(steps)
    hold = sent(ask_of(steps.send([])))[2][2]
    undo, attempt = expect_undo(steps, [[None, -2], [OTHER, 400], [1, 2]])
    script, keys, args = sent(undo)
    assert script is scripts.RELEASE_HOLD
    tombstones = [tombstone("job", VALUE), hold_tombstone("job", VALUE, hold)]
    assert keys == ["job", reentry_holds("job", VALUE), *tombstones]
    assert args[:2] == [VALUE, hold]
    assert attempt.lease is None
    assert rules.held.live(("job",)) is held  # the first lease is still this one's


# -- queries ----------------------------------------------------------------------------


def test_locked_needs_a_quorum_agreeing_on_one_value() -> None:
    rules = make_rules(FakeClock())
    steps = rules.locked_steps("job")
    ask = ask_of(next(steps))
    assert sent(ask)[:2] == (scripts.HOLDER, ["job"])
    assert finish(steps, [[OTHER, 900], [b"x|y", 900], [OTHER, 800]]) is True
    steps = rules.locked_steps("job")
    next(steps)
    assert finish(steps, [[None, -2], [b"x|y", 900], [OTHER, 800]]) is False


def test_holder_reads_each_nodes_value_and_ttl() -> None:
    rules = make_rules(FakeClock())
    steps = rules.holder_steps("job")
    next(steps)
    info = finish(steps, [[OTHER, 1500], refused(1), [OTHER, 1400]])
    assert info.holder == "worker-2:77"
    assert [n.node for n in info.nodes] == list(NODES)
    assert [n.ttl for n in info.nodes] == [1.5, None, 1.4]
    assert info.nodes[1].error is not None


# -- the blocking driver ----------------------------------------------------------------


class ScriptedRounds:
    """A round function for ``steps.drive``: hands out scripted results in order and
    keeps what it was asked."""

    def __init__(self, *results: list[object]) -> None:
        self.results = list(results)
        self.asked: list[Ask] = []

    def __call__(self, ask: Ask) -> list[object]:
        self.asked.append(ask)
        return self.results.pop(0)


def test_drive_runs_each_round_and_sleeps_through_a_pause_without_a_listener() -> None:
    clock = FakeClock()
    rules = make_rules(clock)
    rounds = ScriptedRounds([[OTHER, 50], [OTHER, 50], 1], [NOT_AWAITED] * 3, [1, 1, 1])
    slept: list[float] = []
    attempt = drive(acquire(rules, blocking=True), rounds, slept.append)
    assert attempt.lease is not None
    assert [sent(ask)[0] for ask in rounds.asked] == [
        scripts.ACQUIRE,
        scripts.RELEASE,  # the undo, not waited for
        scripts.ACQUIRE,
    ]
    assert [ask.wait for ask in rounds.asked] == [True, False, True]
    assert len(slept) == 1 and 0 < slept[0] <= 0.055


def test_drive_hands_a_pause_to_the_listener_when_there_is_one() -> None:
    rules = make_rules(FakeClock())
    rounds = ScriptedRounds([[OTHER, 50], [OTHER, 50], 1], [NOT_AWAITED] * 3, [1, 1, 1])
    heard: list[Pause] = []
    attempt = drive(acquire(rules, blocking=True), rounds, never_sleep, heard.append)
    assert attempt.lease is not None
    assert len(heard) == 1 and heard[0].keys == ("job",)


def test_drive_returns_at_once_when_the_steps_need_no_round() -> None:
    clock = FakeClock()
    rules = make_rules(clock)
    lease = won(rules, clock)
    clock.advance(TTL)
    outcome = drive(rules.extend_steps(lease, TTL), no_round, never_sleep)
    assert outcome.reason == "validity ran out before it was extended"


def test_drive_passes_each_rounds_results_to_the_step_that_asked() -> None:
    rules = make_rules(FakeClock())
    rounds = ScriptedRounds([0, 0, 1])
    assert drive(rules.extend_value_steps("job", VALUE, None), rounds, never_sleep) is False
    script, keys, args = sent(rounds.asked[0])
    holds = reentry_holds("job", VALUE)
    assert (script, keys, args) == (scripts.EXTEND_VALUE, ["job", holds], [VALUE, "10000"])


# -- one node down: a split vote is contention, not an outage -----------------------------

#: A node SIGKILLed: its connection is refused, at once.
DOWN = rexc.ConnectionError("10.0.0.1:6379/0: Connection refused")
THIRD = b"a-third-holders-token-01234|worker-3:99"


@pytest.mark.parametrize(
    ("results", "expected"),
    [
        # Five nodes, quorum 3.
        ([1, 1, 1, NOT_AWAITED, NOT_AWAITED], GRANTED),
        ([DOWN, 1, 1, DOWN, 1], GRANTED),
        # One node down, two contenders split the other four 2-2: nobody won.
        ([DOWN, 1, [OTHER, 900], 1, [OTHER, 800]], SPLIT),
        # ... and the round stopped at its third no: the two unheard nodes did not fail.
        ([DOWN, [OTHER, 900], [OTHER, 800], NOT_AWAITED, NOT_AWAITED], SPLIT),
        ([DOWN, [OTHER, 900], [THIRD, 800], 1, NOT_AWAITED], SPLIT),
        # A quorum of answers names one holder: contended, a node down or not.
        ([DOWN, [OTHER, 900], [OTHER, 800], [OTHER, 700], NOT_AWAITED], CONTENDED),
        ([[OTHER, 900], [OTHER, 800], [OTHER, 700], NOT_AWAITED, NOT_AWAITED], CONTENDED),
        # Three nodes failed: fewer than a quorum could answer.
        ([DOWN, DOWN, DOWN, NOT_AWAITED, NOT_AWAITED], UNAVAILABLE),
        ([DOWN, rexc.TimeoutError("no reply within 50 ms"), DOWN, 1, 1], UNAVAILABLE),
        ([DOWN, DOWN, DOWN, [OTHER, 900], [OTHER, 800]], UNAVAILABLE),
    ],
)
def test_a_rounds_verdict_is_unavailable_only_when_too_few_nodes_could_answer(
    results: list[object], expected: str
) -> None:
    assert verdict(results, 3, is_granted, refused_for) == expected


def test_the_verdict_counts_one_holder_by_its_whole_value_not_its_description() -> None:
    # Two leases described alike (same worker and pid, two tokens) are two holders.
    first, second = b"token-one-0123456789ab|beat@h:1", b"token-two-0123456789ab|beat@h:1"
    results: list[object] = [[first, 900], [first, 900], [second, 900]]
    assert verdict(results, 2, is_granted, refused_for) == CONTENDED
    assert verdict([[first, 9], [second, 9], DOWN], 2, is_granted, refused_for) == SPLIT


@pytest.mark.parametrize("quorum", [0, 6, -1, 2.5, True, "3"])
def test_a_verdict_asked_with_a_quorum_the_results_cannot_have_is_refused(quorum: Any) -> None:
    with pytest.raises(ValueError, match=r"quorum must be an int from 1 to the number of results"):
        verdict([1, 1, 1, 1, 1], quorum)


def test_one_node_down_and_a_two_two_split_is_a_split_vote_not_an_outage() -> None:
    rules = make_rules(FakeClock(), nodes=5)
    steps = acquire(rules)
    next(steps)
    _, attempt = expect_undo(steps, [DOWN, 1, [OTHER, 900], 1, [OTHER, 800]])
    assert attempt.lease is None and attempt.unavailable is None
    assert attempt.verdict == SPLIT and attempt.split
    with pytest.raises(LockContended) as contended:
        attempt.outcome("job", True)
    assert contended.value.split and contended.value.holder == "worker-2:77"
    assert "the vote split" in str(contended.value)
    assert attempt.outcome("job", False) is None  # not won, nothing raised


def test_a_round_stopped_at_its_third_no_with_one_node_down_is_not_an_outage() -> None:
    rules = make_rules(FakeClock(), nodes=5)
    steps = acquire(rules)
    assert ask_of(next(steps)).enough_no == 3
    _, attempt = expect_undo(steps, [DOWN, [OTHER, 900], [OTHER, 800], NOT_AWAITED, NOT_AWAITED])
    assert attempt.unavailable is None and attempt.verdict == SPLIT


def test_split_votes_with_a_node_down_never_count_toward_retry_count() -> None:
    """A wait without timeout ends on ``retry_count`` outages in a row; ten split
    rounds in a row with one node down are not outages: it keeps pausing, then wins."""
    clock = FakeClock()
    rules = make_rules(clock, nodes=5, retry_count=1)
    steps = acquire(rules, blocking=True)
    next(steps)
    for _ in range(10):
        ask_of(steps.send([DOWN, 1, [OTHER, 900], 1, [OTHER, 800]]))  # the undo
        pause = steps.send([])
        assert isinstance(pause, Pause)
        clock.advance(pause.seconds)
        assert sent(ask_of(steps.send([])))[0] is scripts.ACQUIRE
    assert finish(steps, [DOWN, 1, 1, 1, NOT_AWAITED]).lease is not None


def test_outages_still_end_a_wait_without_timeout_with_one_node_down_besides() -> None:
    rules = make_rules(FakeClock(), nodes=5, retry_count=0)
    steps = acquire(rules, blocking=True)
    next(steps)
    ask_of(steps.send([DOWN, DOWN, DOWN, 1, 1]))
    attempt = finish(steps, [])
    assert attempt.verdict == UNAVAILABLE and attempt.unavailable is not None
    with pytest.raises(QuorumUnavailable):
        attempt.outcome("job", True)


def test_the_renewal_schedule_both_drivers_keep() -> None:
    clock = FakeClock()
    rules = make_rules(clock)
    lease = won(rules, clock)
    every = renewal_interval(lease.ttl)
    assert every == TTL / 3
    now = clock()
    assert next_renewal(lease, every, True, now) == now + every
    lease.retry_by = now + 1.0  # only slow nodes met: soon again, by retry_by at the latest
    assert next_renewal(lease, every, False, now) == now + 1.0
    lease.retry_by = now + 60.0
    assert next_renewal(lease, every, False, now) == now + every / 3
    lease.retry_by = None  # at max_hold: nothing until validity runs out
    assert next_renewal(lease, every, False, now) == lease.deadline
    lease.mark_lost("refused")
    assert next_renewal(lease, every, False, now) is None


def test_a_lease_that_ran_out_at_max_hold_is_lost_saying_so() -> None:
    clock = FakeClock()
    rules = make_rules(clock, max_hold=TTL)
    lease = won(rules, clock)
    clock.advance(TTL)
    outcome = drive(rules.extend_steps(lease, TTL), no_round, never_sleep)
    assert outcome == Extension(reason="max_hold reached")


@pytest.mark.parametrize("build", [release_command, extend_command])
def test_a_hold_of_a_lease_on_several_keys_is_refused_naming_the_argument(build: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"^hold must be None .*got hold='h1'"):
        build(["a", "b"], VALUE, TTL, "h1")
