"""Celery redelivery and exit rows in real ``celery worker`` subprocesses (prefork).

Two workers, ``-c 1`` each, run tests/apps/redeliveryapp.py against a real Redis broker
whose ``visibility_timeout`` is 2 s, 3 real lock nodes and an observer Redis the task
bodies report to (occupancy, executions per task id, monotonic intervals): safety is
judged from the observer and from the lock nodes themselves, never from the lock's
own word. The workers are shared by the module; each test uses its own lock key.

Rows (docs/guides/contention.md, "What happens to the lock when..."):

- redelivered while the first run still holds the lock (visibility timeout, same
  task id): the copy waits for that run in every mode and is dropped once it has
  stored its result; a child killed mid-body (reject_on_worker_lost): the copy waits
  for the dead run's lease and runs;
- SoftTimeLimitExceeded raised in the body: released in ``after_return`` at once;
- hard time limit (child SIGKILLed): nothing releases it, it frees within its TTL;
- revoked before it starts: it never held the lock;
- ``revoke(terminate=True)`` while running: it frees within its TTL.

The retry hand-off in prefork (``self.retry()`` while holding) is in
test_celery_workers.py and not repeated here.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, Callable, Optional

import pytest
import redis
from celery import Celery
from celery.exceptions import SoftTimeLimitExceeded, TimeLimitExceeded
from celery.result import AsyncResult

from celery_redlock import QuorumUnavailable, Redlock
from celery_redlock.testing import CeleryProcess, RedisNodes, RedisServer
from celery_redlock.testing.children import process_state
from tests.apps import redeliveryapp
from tests.support import observed
from tests.support.appfixture import free_results
from tests.support.observed import Interval
from tests.support.workers import READY_TIMEOUT, app_env, eventually, launch_workers, stop_workers
from tools.faultlab.evidence import RecordingClock

pytestmark = pytest.mark.slow

#: Redis expiry is kept in whole milliseconds: allow this much rounding, in ns.
EXPIRY_SLACK_NS = 2_000_000
#: Scheduling slack on a loaded 2-core machine, seconds.
SLACK = 1.5


# -- the stack ------------------------------------------------------------------------------


#: One ``celery worker`` process and its pool children (its process group).
Worker = CeleryProcess


@dataclass
class Stack:
    broker: RedisServer
    nodes: RedisNodes
    node_clients: list[redis.Redis]  # one per lock node, decode_responses=True
    observer: redis.Redis
    client: Celery
    workers: list[Worker]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    logs = tmp_path_factory.mktemp("redelivery")
    with (
        RedisServer() as broker,
        RedisServer() as observer_server,
        RedisNodes(3) as nodes,
    ):
        env = app_env(broker.url, nodes, observer_server.url)
        # Each worker also takes a queue of its own, for a test that must know which
        # worker runs what (a message a busy -c 1 worker reserved waits for it).
        workers = launch_workers(
            "redeliveryapp", ["w1", "w2"], logs, env, queues=[["celery", "w1"], ["celery", "w2"]],
            concurrency=1,
        )  # fmt: skip
        client = Celery("redelivery_client", broker=broker.url, backend=broker.url)
        client.conf.broker_connection_retry_on_startup = True
        try:
            yield Stack(
                broker,
                nodes,
                [node.client(decode_responses=True) for node in nodes],
                observer_server.client(decode_responses=True),
                client,
                workers,
            )
        finally:
            free_results()
            client.close()
            stop_workers(workers, lines=30)


# -- what the observer and the nodes saw ------------------------------------------------------


def intervals(stack: Stack, counter: str) -> list[Interval]:
    return observed.intervals(stack.observer, counter)


def starts(stack: Stack, counter: str) -> list[tuple[str, int, int]]:
    return observed.starts(stack.observer, counter)


def runs(stack: Stack, counter: str) -> dict[str, int]:
    return observed.runs(stack.observer, counter)


def max_occupancy(stack: Stack, counter: str) -> int:
    return observed.max_occupancy(stack.observer, counter)


def started(stack: Stack, counter: str, task_id: str, timeout: float = 30) -> tuple[int, int]:
    """``(pid, start_ns)`` of the first body of ``task_id`` once it has begun."""

    def find() -> Optional[tuple[int, int]]:
        for tid, pid, start in starts(stack, counter):
            if tid == task_id:
                return pid, start
        return None

    found: tuple[int, int] = eventually(find, timeout, f"task {task_id} started")
    return found


@dataclass(frozen=True)
class Sighting:
    """One look at ``key`` on every node: the values and PTTLs (ms) it found, between
    ``asked`` and ``answered`` (monotonic ns)."""

    asked: int
    answered: int
    values: list[Optional[str]]
    pttls: list[int]

    def holders(self, holding: Callable[[Optional[str]], bool]) -> int:
        return sum(holding(value) for value in self.values)


def sight(stack: Stack, key: str) -> Sighting:
    asked = time.monotonic_ns()
    values, pttls = [], []
    for client in stack.node_clients:
        pipe = client.pipeline(transaction=True)
        pipe.get(key)
        pipe.pttl(key)
        value, pttl = pipe.execute()
        values.append(None if value is None else str(value))
        pttls.append(int(pttl))
    return Sighting(asked, time.monotonic_ns(), values, pttls)


@dataclass
class Freeing:
    """Sightings of a lock until its holder is off a majority of nodes.

    ``last_held``: the last sighting with the holder on a majority (None if never
    seen so): it held at some moment after ``last_held.asked``. ``first_free``: the
    first without: it was free by ``first_free.answered``. Each bound is used on its
    side; how late a poll wakes only widens the gap between them."""

    sightings: list[Sighting]
    last_held: Optional[Sighting]
    first_free: Sighting


def watch_freeing(
    stack: Stack,
    key: str,
    holding: Callable[[Optional[str]], bool],
    timeout: float,
    *,
    appear_first: bool = False,
    every_node: bool = False,
    first_look: Optional[threading.Event] = None,
) -> Freeing:
    """Look at ``key`` every 5 ms until the holder (``holding(value)``) is off a
    majority (``every_node``: off every node); with ``appear_first``, only once it
    has been seen on a majority. ``first_look`` is set once the first sighting is in
    (a caller can then act, knowing the watch began before)."""
    majority = len(stack.node_clients) // 2 + 1
    free_below = 1 if every_node else majority
    sightings: list[Sighting] = []
    last_held = None
    seen = not appear_first
    deadline = time.monotonic() + timeout
    while True:
        sighting = sight(stack, key)
        sightings.append(sighting)
        if first_look is not None:
            first_look.set()
        count = sighting.holders(holding)
        seen = seen or count >= majority
        if seen and count < free_below:
            return Freeing(sightings, last_held, sighting)
        if count >= majority:
            last_held = sighting
        assert time.monotonic() < deadline, f"{key}: not freed within {timeout}s"
        time.sleep(0.005)


def deleted_early(freeing: Freeing, holding: Callable[[Optional[str]], bool]) -> list[str]:
    """Nodes where the holder's key vanished before the expiry a PTTL had shown for it
    (it was deleted -- released -- not expired)."""
    found = []
    for node in range(len(freeing.first_free.values)):
        expires_after: Optional[int] = None  # earliest expiry shown by any PTTL so far
        for seen in freeing.sightings:
            if holding(seen.values[node]) and seen.pttls[node] > 0:
                shown = seen.asked + seen.pttls[node] * 1_000_000 - EXPIRY_SLACK_NS
                expires_after = shown if expires_after is None else max(expires_after, shown)
            elif expires_after is not None and seen.answered < expires_after:
                found.append(
                    f"node {node}: gone at {_ms(seen.answered)}, expiry {_ms(expires_after)}"
                )
                break
    return found


def lock_keys(stack: Stack, key: str) -> list[list[str]]:
    """Every key at or under ``key`` (the lock, its tombstones), per node."""
    return [sorted(str(k) for k in client.keys(key + "*")) for client in stack.node_clients]


def send(stack: Stack, task: str, queue: Optional[str] = None, **kwargs: Any) -> AsyncResult:
    """Send ``task``; ``queue``: to that worker's own queue (``"w1"``, ``"w2"``)."""
    return stack.client.send_task(f"redeliveryapp.{task}", kwargs=kwargs, queue=queue)


def finished_earlier(stack: Stack, task_id: str) -> list[tuple[str, str]]:
    """``(worker, line)`` for each copy of ``task_id`` dropped because an earlier
    delivery had finished."""
    pattern = re.escape(task_id) + r"\] key \S+: an earlier delivery of this task id already"
    return [(w.name, line) for w in stack.workers for line in w.lines(pattern)]


def contended(stack: Stack, task_id: str) -> list[tuple[str, str]]:
    """``(worker, line)`` for each contention WARNING about ``task_id``."""
    pattern = r"WARNING/.*\] lock contended: task redeliveryapp\.\w+\[" + re.escape(task_id)
    return [(w.name, line) for w in stack.workers for line in w.lines(pattern)]


def _ms(ns: int) -> str:
    return f"{ns / 1e9:.3f}s"


# -- 10: visibility-timeout redelivery of a still-running task ---------------------------------


def test_redelivered_running_task_waits_for_its_first_run_and_never_runs_again(
    stack: Stack,
) -> None:
    """What Celery does: the Redis transport hands the unacked message to the idle
    worker ~2-3 s after the first worker took it (the first still runs it: a
    visibility timeout is not a lease). The copy has the same task id but not the
    first run's token: it meets the lock held under its own task id and waits for
    that run (published again, no lock retry spent, no state stored) while the first
    run renews its lease. Once the first run has stored SUCCESS and released, the
    copy wins the lock, reads SUCCESS and is dropped: the body ran once. (Celery's
    ``worker_deduplicate_successful_tasks``, off by default, would not catch it: it
    skips only messages flagged ``redelivered``, and the wait is a new message.)"""
    counter = "vis-retry"
    # The first body runs until the test has seen the copy meet its lock: an event,
    # not a body long enough to outlast a redelivery expected at ~2-3 s.
    go = f"go:{counter}"
    result = send(stack, "long_acks_late", tag=counter, seconds=60.0, counter=counter, until=go)
    first_pid, _ = started(stack, counter, result.id)
    met = eventually(lambda: contended(stack, result.id), 15, "the redelivered copy met the lock")
    copy_worker, line = met[0]
    # The copy is told who holds the lock: the first delivery of the same task id, on
    # the other worker.
    owner = re.search(rf"held by {re.escape(result.id)}@(w\d)@\S+:{first_pid} ", line)
    assert owner is not None, line
    assert owner.group(1) != copy_worker
    assert "an earlier delivery of this task id -> waits for it" in line, line
    stack.observer.set(go, 1)

    outcome = result.get(timeout=20)
    dropped = eventually(lambda: finished_earlier(stack, result.id), 20, "the copy was dropped")
    assert "already finished (SUCCESS)" in dropped[0][1]
    assert runs(stack, counter) == {result.id: 1}  # the copy never ran the body
    assert outcome["runs"] == 1 and outcome["held"] is True
    assert max_occupancy(stack, counter) == 1
    lines = contended(stack, result.id)
    assert all(f"held by {result.id}@{owner.group(1)}@" in text for _, text in lines)
    print(
        f"copy redelivered to {copy_worker}, waited {len(lines)}x for the first run on "
        f"{owner.group(1)}, then dropped: {dropped[0][1].split('] ', 1)[-1]}"
    )


def test_redelivered_running_task_in_skip_mode_waits_too_and_runs_once(stack: Stack) -> None:
    counter = "vis-skip"
    go = f"go:{counter}"  # the first body runs until the copy has met its lock
    result = send(
        stack, "long_acks_late_skip", tag=counter, seconds=60.0, counter=counter, until=go
    )
    first_pid, _ = started(stack, counter, result.id)
    met = eventually(lambda: contended(stack, result.id), 15, "the redelivered copy met the lock")
    copy_worker, line = met[0]
    owner = re.search(rf"held by {re.escape(result.id)}@(w\d)@\S+:{first_pid} ", line)
    assert owner is not None and owner.group(1) != copy_worker, line
    assert "-> waits for it" in line, line  # not skipped: the first run may have died
    stack.observer.set(go, 1)
    outcome = result.get(timeout=20)
    eventually(lambda: finished_earlier(stack, result.id), 20, "the copy was dropped")
    assert runs(stack, counter) == {result.id: 1}
    assert outcome["runs"] == 1 and outcome["held"] is True
    assert max_occupancy(stack, counter) == 1
    assert result.state == "SUCCESS"  # the first run's (the copy stores none)


def test_a_skip_mode_task_whose_child_is_killed_mid_body_runs_again_and_succeeds(
    stack: Stack,
) -> None:
    """acks_late + reject_on_worker_lost: the child running the body is SIGKILLed,
    Celery requeues the message, and the copy meets the lock still held under its own
    task id by the dead run. Dropping it (skip) would leave the task PENDING forever:
    it waits until the dead run's lease has run out, finds no result stored, and
    runs."""
    counter = "killed-skip"
    go = f"go:{counter}"  # holds a body until the test lets it end
    key = redeliveryapp.lock_key(counter)
    result = send(
        stack, "killed_skip", tag=counter, seconds=60.0, counter=counter, until=go,
    )  # fmt: skip
    try:
        started(stack, counter, result.id)
        # Kill the process the nodes name as the holder (on a loaded machine a body
        # stalled past the 2 s visibility timeout can have been handed out again).
        holder = eventually(lambda: _majority_holder(stack, key), 15, "the lock's holder")
        holder_pid = int(holder.rsplit(":", 1)[1])
        killed_at = time.monotonic_ns()
        os.kill(holder_pid, signal.SIGKILL)
    finally:
        stack.observer.set(go, 1)  # any body of this task ends at once from now on
    outcome = result.get(timeout=30)
    assert result.state == "SUCCESS" and outcome["runs"] >= 2
    assert outcome["pid"] != holder_pid
    assert any(start > killed_at for _, _, start in starts(stack, counter))
    lines = [line for _, line in contended(stack, result.id)]
    # The copy met the dead run's lease and waited for it (it used to be skipped).
    assert lines, "the requeued copy never met the dead run's lease"
    assert all("-> waits for it" in line for line in lines), lines
    print(
        f"holder {holder_pid} killed mid-body; the copy waited {len(lines)}x for the dead "
        "run's lease, then ran: SUCCESS"
    )


def _majority_holder(stack: Stack, key: str) -> Optional[str]:
    """The holder part of the value a majority of nodes keeps for ``key``."""
    values = [v for v in sight(stack, key).values if v]
    for value in set(values):
        if values.count(value) > len(stack.node_clients) // 2:
            return value.split("|", 1)[-1]
    return None


# -- 11: time limits and revokes -------------------------------------------------------------


def test_soft_time_limit_raised_in_the_body_releases_the_lock_at_once(stack: Stack) -> None:
    counter = "soft"
    key = redeliveryapp.lock_key(counter)
    ttl = 30.0  # redeliveryapp.soft_limited's lease

    def ours(value: Optional[str]) -> bool:
        return value is not None and f"|{result.id}@" in value

    result = send(stack, "soft_limited", tag=counter, seconds=10.0, counter=counter)
    # Watched from the send on: the lock is seen however soon the 1 s limit ends it.
    freeing = watch_freeing(stack, key, ours, ttl / 2, appear_first=True, every_node=True)
    result.get(timeout=20, propagate=False)
    assert result.state == "FAILURE"
    assert isinstance(result.result, SoftTimeLimitExceeded), result.result
    # Released by after_return, not left to its 30 s TTL: gone from the nodes before
    # the expiry their PTTLs showed.
    assert freeing.first_free.values == [None] * len(stack.node_clients)
    released = deleted_early(freeing, ours)
    assert len(released) >= len(stack.node_clients) // 2 + 1, released
    assert runs(stack, counter) == {result.id: 1}


def test_hard_time_limit_frees_the_lock_within_its_ttl_and_the_waiter_runs(
    stack: Stack,
) -> None:
    """The child is SIGKILLed at the 1 s hard limit; after_return runs in the parent
    with an empty request, so nothing releases the lock. What frees it: the key's TTL.
    The watchdog bounds the lease by ``max_hold = time_limit + ttl`` (task.py: a
    renewal just before the kill must still cover it), so the key ends at most
    ``time_limit + ttl`` after the acquire: a renewal due at ttl/3 = 1 s may land just
    before the kill at the 1 s limit, or the kill may come first and the 3 s TTL of the
    acquire runs out."""
    counter = "hard"
    key = redeliveryapp.lock_key(counter)
    ttl, time_limit = 3.0, 1.0  # redeliveryapp.hard_limited's lease and hard limit
    result = send(stack, "hard_limited", tag=counter, seconds=30.0, counter=counter)

    def first(value: Optional[str]) -> bool:
        return value is not None and f"|{result.id}@" in value

    # Watched from the send on, so the lock is seen however soon the limit frees it.
    with ThreadPoolExecutor(1) as pool:
        watching = pool.submit(watch_freeing, stack, key, first, 30.0, appear_first=True)
        _, began = started(stack, counter, result.id)
        waiter = send(stack, "hold", tag=counter, seconds=0.05, counter=counter + "-waiter")
        freeing = watching.result()
    assert freeing.last_held is not None
    # Never seen held past max_hold (limit + ttl) from the acquire, which came before
    # the body began.
    assert freeing.last_held.asked <= began + int((time_limit + ttl) * 1e9) + EXPIRY_SLACK_NS
    result.get(timeout=20, propagate=False)
    assert result.state == "FAILURE"
    assert isinstance(result.result, TimeLimitExceeded), result.result
    assert intervals(stack, counter) == []  # the body was killed, never finished
    assert waiter.get(timeout=20)["held"] is True
    assert runs(stack, counter + "-waiter") == {waiter.id: 1}
    print(
        f"hard limit 1 s, lease 3 s: lock freed between {_ms(freeing.last_held.asked - began)}"
        f" and {_ms(freeing.first_free.answered - began)} after the body began"
    )


def _alive(pid: int) -> bool:
    return process_state(pid) not in (None, "Z", "X")


def test_no_one_takes_the_lock_while_a_hard_time_limited_body_still_runs(
    stack: Stack,
) -> None:
    """At the hard limit billiard sends SIGTERM (SIGKILL 0.1 s later if needed):
    SystemExit stops the body, and the lock is released only after that, by the
    task_postrun handler at the end of the trace -- while the child process is still
    exiting. So the oracle is the body's own heartbeat (an RPUSH every 10 ms while it
    sleeps), not the child's pid: no heartbeat may come after a contender won."""
    counter = "hard-race"
    key = redeliveryapp.lock_key(counter)
    # won_at: the contender's own last clock reading before acquire() returned -- its
    # quorum was in by then, however late this thread runs afterwards.
    clock = RecordingClock()
    contender = Redlock(stack.nodes.urls, ttl=5, node_timeout=0.25, clock=clock)
    client = stack.observer
    result = send(
        stack, "hard_limited", tag=counter, seconds=30.0, counter=counter, until=f"stop:{counter}"
    )
    pid, began = started(stack, counter, result.id)
    won_at = None
    try:
        while won_at is None:
            with contextlib.suppress(QuorumUnavailable):  # a slow round: try again
                lease = contender.acquire(key, blocking=False)
                if lease is not None:
                    won_at = clock.last_ns()
                    lease.release()
            assert (time.monotonic_ns() - began) / 1e9 < 30, "the lock was never freed"
            time.sleep(0.0005)
        # Once the child is gone, every heartbeat it sent has landed.
        eventually(lambda: not _alive(pid), 30, "the time-limited child exited")
        beats = [int(b) for b in client.lrange(f"beats:stop:{counter}", 0, -1)]
        assert beats, "the body never beat: the oracle saw nothing"
        assert won_at is not None and max(beats) < won_at, "the body still ran when one won"
    finally:
        contender.close()
        result.get(timeout=20, propagate=False)


def test_revoke_before_start_never_takes_the_lock(stack: Stack) -> None:
    """Sent with an ETA, revoked before it: the task is discarded at its ETA and never
    touches the lock. "Before" is made sure of, not hoped for: the revoke waits for
    both workers' replies, and a trial whose replies came after the ETA is void and
    repeated with a countdown twice as long."""
    countdown = 1.0
    for trial in range(5):
        counter = f"revoked-{trial}"  # a void trial's task may run: its own key
        key = redeliveryapp.lock_key(counter)
        sending = time.monotonic()
        result = stack.client.send_task(
            "redeliveryapp.hold", kwargs={"tag": counter, "seconds": 0.05, "counter": counter},
            countdown=countdown,
        )  # fmt: skip
        replies = stack.client.control.revoke(
            result.id, reply=True, timeout=countdown, limit=len(stack.workers)
        )
        if len(replies) == len(stack.workers) and time.monotonic() < sending + countdown:
            break
        countdown *= 2
    else:
        pytest.fail("no revoke reached both workers before its task's ETA")

    def discarded() -> bool:
        return any(
            re.search(r"[Dd]iscarding revoked task.*" + re.escape(result.id), line)
            for w in stack.workers
            for line in w.log().splitlines()
        )

    seen: list[list[str]] = []
    deadline = time.monotonic() + READY_TIMEOUT
    while not (discarded() and result.state == "REVOKED"):  # then it is gone for good
        seen.extend(k for k in lock_keys(stack, key) if k)
        assert time.monotonic() < deadline, "the revoked task was never discarded"
        time.sleep(0.02)
    seen.extend(k for k in lock_keys(stack, key) if k)
    assert seen == []  # neither a lock nor a release tombstone, at any time
    assert runs(stack, counter) == {}


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGKILL"])
def test_revoke_terminate_while_running_frees_the_lock_within_its_ttl(
    stack: Stack, signame: str
) -> None:
    """``revoke(terminate=True)`` signals the prefork child running the task. What
    happens: with the default SIGTERM, billiard's handler in the child raises
    SystemExit inside the body, so the release on every exit runs and the lock is
    free within milliseconds; with SIGKILL nothing runs, and the lock frees when its
    2 s lease (renewed every 0.67 s) runs out -- its keys vanish no earlier than their
    PTTLs said. Either way: free within the TTL of the revoke, and the waiter does not
    run while it is held."""
    counter = f"terminate-{signame}"
    key = redeliveryapp.lock_key(counter)
    ttl = 2.0  # redeliveryapp.hold's lease
    # The holder on one worker, the waiter on the other: sent to the shared queue, the
    # waiter could be reserved by the holder's busy -c 1 worker (or by one busy with a
    # copy an earlier test left). Each signal has its own holder's worker: a revoke's
    # SIGKILL sent to a worker whose child had been terminated by SIGTERM before was
    # seen to miss the running child (the body ran its 30 s; billiard's bookkeeping).
    holder_on, waiter_on = ("w1", "w2") if signame == "SIGTERM" else ("w2", "w1")
    result = send(stack, "hold", holder_on, tag=counter, seconds=30.0, counter=counter)

    def first(value: Optional[str]) -> bool:
        return value is not None and f"|{result.id}@" in value

    child, _ = started(stack, counter, result.id)
    waiter = send(stack, "hold", waiter_on, tag=counter, seconds=0.05, counter=counter + "-waiter")
    eventually(lambda: contended(stack, waiter.id), 15, "the waiter met the lock")
    looked = threading.Event()
    revokes = 0
    with ThreadPoolExecutor(1) as pool:
        watching = pool.submit(watch_freeing, stack, key, first, 30.0, first_look=looked)
        # The first sighting comes before the revoke: the running body holds the lock
        # then (the waiter met it), so last_held is set by construction.
        assert looked.wait(30), "the watch never took its first look"
        while True:
            revoking = time.monotonic_ns()
            if revokes < 2:
                # The worker signals the child, then replies: by the reply, it is told.
                replies = stack.client.control.revoke(
                    result.id, terminate=True, signal=signame, reply=True,
                    timeout=READY_TIMEOUT, limit=len(stack.workers),
                )  # fmt: skip
                assert len(replies) == len(stack.workers), replies
            else:  # the revokes missed it: the same signal, straight to the child
                os.kill(child, getattr(signal, signame))
            signalled_by = time.monotonic_ns()
            revokes += 1
            try:
                freeing = watching.result(timeout=ttl + SLACK)
                break
            except FutureTimeout:
                if not _alive(child):
                    freeing = watching.result()  # judged below, as any other
                    break
                # Not free a TTL later and the child still runs: it outlived its signal
                # (seen on a loaded machine, after other tests had worked the workers:
                # the body slept its full 30 s, holding the lock as it must). Revoke
                # again, then signal the child itself; the lock is judged from the
                # signal the child did not outlive.
                assert revokes < 3, f"the child outlived {revokes} signals"
    assert freeing.last_held is not None  # held when the revoke went out
    # Never seen held a TTL after the child was signalled (SLACK: a renewal it sent
    # just before and a loaded node ran late).
    assert freeing.last_held.asked <= signalled_by + int((ttl + SLACK) * 1e9)
    released = deleted_early(freeing, first)
    if signame == "SIGKILL":
        assert released == []  # nothing released it: its keys ran out their TTL
    eventually(lambda: result.state == "REVOKED", 10, "the task marked REVOKED")
    assert waiter.get(timeout=20)["held"] is True
    (span,) = intervals(stack, counter + "-waiter")
    assert intervals(stack, counter) == []  # the terminated body never finished
    # Not before the lock was free: the first holder still held after last_held.asked.
    assert span.start > freeing.last_held.asked
    print(
        f"revoke terminate ({signame}): first holder gone from a majority between "
        f"{_ms(freeing.last_held.asked - revoking)} and "
        f"{_ms(freeing.first_free.answered - revoking)} after the revoke; "
        f"released on {len(released)} node(s) before expiry; signals sent: {revokes} (the "
        f"third, if any, straight to the child)"
    )
