"""RedlockTask in real ``celery worker`` subprocesses: prefork children, several
workers, the threads and solo pools, SIGKILLed children, hung lock nodes.

The workers run tests/apps/workerapp.py against a real Redis broker, 5 real lock nodes and
a third Redis, the observer, that the task bodies report to (occupancy, executions
per task id, monotonic intervals). Safety is judged from the observer, never from the
lock's own word. Each worker logs to its own file, which the tests read for the
contention WARNING and lock lost ERROR lines.

gevent and eventlet are covered, with every other pool, by tests/workers/test_pools.py.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Callable, Optional, Protocol

import pytest
from celery.result import AsyncResult

from celery_redlock import LockContended, is_skipped
from celery_redlock.testing import CeleryProcess
from celery_redlock.testing.children import process_state
from tests.apps import workerapp
from tests.support.observed import (
    Interval,
    effects,
    intervals,
    max_occupancy,
    overlaps,
    runs,
    starts,
)
from tests.support.workers import Launch, Stack, eventually, wait_all

#: Redis expiry is kept in whole milliseconds: allow this much rounding, in ns.
EXPIRY_SLACK_NS = 2_000_000
#: A 2 s lease is renewed at ttl/3: by this long after the body began (ns), it has been.
RENEWED_BY = 1_000_000_000


# -- workers ------------------------------------------------------------------------------

#: One ``celery worker`` process (and its pool children, in its process group).
Worker = CeleryProcess


StartWorkers = Callable[..., list[Worker]]


@pytest.fixture
def start_workers(launch: Launch) -> StartWorkers:
    """``start(count, pool=, concurrency=)``: that many ready workers (w1, w2, ...).

    Every worker's process group is SIGKILLed at teardown, whatever the test did.
    """

    def start(count: int = 1, pool: str = "prefork", concurrency: int = 2) -> list[Worker]:
        return launch("workerapp", count, pool=pool, concurrency=concurrency)

    return start


# -- helpers -------------------------------------------------------------------------------


def started_pid(stack: Stack, counter: str, task_id: str, timeout: float = 30) -> tuple[int, int]:
    """``(pid, start_ns)`` of the first body of ``task_id`` once it has begun."""

    def find() -> Optional[tuple[int, int]]:
        for tid, pid, start in starts(stack.observer, counter):
            if tid == task_id:
                return pid, start
        return None

    found: tuple[int, int] = eventually(find, timeout, f"task {task_id} started")
    return found


def sleep_until(monotonic_ns: int) -> None:
    time.sleep(max(0.0, (monotonic_ns - time.monotonic_ns()) / 1e9))


def kill_child(pid: int) -> int:
    """SIGKILL a prefork child; return the kill time (monotonic ns) once it is dead."""
    killed_at = time.monotonic_ns()
    os.kill(pid, signal.SIGKILL)

    def dead() -> bool:
        return process_state(pid) in (None, "Z")  # reaped, or a zombie

    eventually(dead, 10, f"child {pid} dead")
    return killed_at


def lock_frees_at(stack: Stack, key: str) -> int:
    """When a majority of the nodes will have dropped ``key`` (monotonic ns).

    Each node's expiry is at least (time before asking) + PTTL; a node without the
    key is free now. A new holder needs a majority of free nodes, so none can win
    before the majority-th earliest expiry.
    """
    expiries, holding = [], 0
    for node in stack.nodes:
        asked = time.monotonic_ns()
        pttl = node.client().pttl(key)
        holding += pttl > 0
        expiries.append(asked + max(0, pttl) * 1_000_000)
    majority = len(expiries) // 2 + 1
    assert holding >= majority, f"{key} is not held on a majority right after the kill"
    return sorted(expiries)[majority - 1]


def logged_at(line: str) -> float:
    """The wall-clock time (``time.time()``) of a worker log line, from its
    ``[YYYY-mm-dd HH:MM:SS,mmm: LEVEL/...]`` prefix: the earliest it was written (the
    millisecond it shows, truncated)."""
    found = re.match(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): ", line)
    assert found, f"no time in worker log line {line!r}"
    return datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


def lock_surely_free_by(stack: Stack, key: str) -> int:
    """By when a majority of the nodes will surely have dropped ``key`` (monotonic ns):
    :func:`lock_frees_at`'s upper twin. Each node's expiry is at most (time after its
    reply) + PTTL + 1 ms (PTTL truncates) + Redis's expiry slack."""
    expiries = []
    for node in stack.nodes:
        pttl = node.client().pttl(key)
        replied = time.monotonic_ns()
        expiries.append(replied + (max(0, pttl) + 1) * 1_000_000 + EXPIRY_SLACK_NS)
    return sorted(expiries)[len(expiries) // 2]


def send(stack: Stack, task: str, **kwargs: Any) -> AsyncResult:
    return stack.client.send_task(f"workerapp.{task}", kwargs=kwargs)


def contended_lines(workers: Sequence[Worker], task_id: Optional[str] = None) -> list[str]:
    pattern = r"WARNING/.*\] lock contended: task "
    if task_id is not None:
        pattern += r"workerapp\.\w+\[" + re.escape(task_id) + r"\]"
    return [line for worker in workers for line in worker.lines(pattern)]


class Observed(Protocol):
    """A test's servers with an observer (a ``Stack``, or the cluster tests' own)."""

    observer: Any


def check_exclusive(
    stack: Observed, counter: str, results: Sequence[AsyncResult]
) -> list[Interval]:
    """Every task succeeded, ran once, alone: the observer's verdict on one key."""
    states = {r.id: r.state for r in results}
    assert [s for s in states.values() if s != "SUCCESS"] == [], states
    executions = runs(stack.observer, counter)
    assert set(executions) == set(states)
    assert [tid for tid, n in executions.items() if n != 1] == []
    spans = intervals(stack.observer, counter)
    assert len(spans) == len(results)
    assert overlaps(spans) == []
    assert max_occupancy(stack.observer, counter) == 1
    return spans


# -- exclusivity across processes and workers ------------------------------------------------


@pytest.mark.slow
def test_two_prefork_workers_run_200_same_key_tasks_one_at_a_time_and_distinct_keys_in_parallel(
    stack: Stack, start_workers: StartWorkers
) -> None:
    workers = start_workers(2, pool="prefork", concurrency=2)
    began = time.monotonic()
    same = [
        send(stack, "hold", tag="same", seconds=0.005 + 0.015 * (i % 4) / 3, counter="same")
        for i in range(200)
    ]
    wait_all(same, timeout=120)
    same_took = time.monotonic() - began
    spans = check_exclusive(stack, "same", same)
    assert len({span.pid for span in spans}) >= 2  # more than one process took turns
    contended = contended_lines(workers)
    assert contended  # 4 processes on one key do meet the lock held

    began = time.monotonic()
    distinct = [
        send(stack, "hold", tag=f"d{i}", seconds=0.3, counter="distinct") for i in range(16)
    ]
    wait_all(distinct, timeout=60)
    distinct_took = time.monotonic() - began
    assert all(r.state == "SUCCESS" for r in distinct)
    assert set(runs(stack.observer, "distinct").values()) == {1}
    peak = max_occupancy(stack.observer, "distinct")
    assert peak > 1  # unrelated keys are not serialized
    print(
        f"same key: {len(same)} tasks in {same_took:.1f}s on "
        f"{len({s.pid for s in spans})} processes, {len(contended)} contentions, "
        f"0 overlaps, max occupancy 1; distinct keys: {len(distinct)} tasks in "
        f"{distinct_took:.1f}s, max occupancy {peak}"
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("pool", "count", "concurrency"),
    [("threads", 1, 4), ("solo", 2, 1)],
)
def test_same_key_tasks_run_one_at_a_time_in_other_pools(
    stack: Stack, start_workers: StartWorkers, pool: str, count: int, concurrency: int
) -> None:
    workers = start_workers(count, pool=pool, concurrency=concurrency)
    results = [send(stack, "hold", tag=pool, seconds=0.01, counter=pool) for _ in range(30)]
    wait_all(results, timeout=60)
    check_exclusive(stack, pool, results)
    print(
        f"{pool} x{count} -c {concurrency}: 30 tasks, {len(contended_lines(workers))} contentions"
    )


# -- the watchdog and lost locks -----------------------------------------------------------


@pytest.mark.slow
def test_watchdog_keeps_a_1s_lease_through_a_3_5s_task_in_a_prefork_child(
    stack: Stack, start_workers: StartWorkers
) -> None:
    (worker,) = start_workers(1, pool="prefork", concurrency=2)
    # The body runs until the duplicates have met its lock and at least 3.5 s: held
    # then, a 1 s lease must have been renewed 3 times, whatever the machine's speed.
    go = "go:watch"
    first = send(stack, "hold_ttl1", tag="watch", seconds=60, until=go, counter="watch")
    _, began = started_pid(stack, "watch", first.id)
    duplicates = []
    for offset in (1.2, 2.2):  # each after the 1 s lease would have expired unrenewed
        sleep_until(began + int(offset * 1e9))
        duplicates.append(send(stack, "hold_fail", tag="watch", seconds=0.01, counter="dup"))
    wait_all(duplicates, timeout=30)
    sleep_until(began + int(3.5e9))
    stack.observer.set(go, 1)
    outcome = first.get(timeout=30)
    for duplicate in duplicates:
        assert duplicate.state == "FAILURE"
        error = duplicate.result
        assert isinstance(error, LockContended), error
        assert error.key == workerapp.lock_key("watch")
        assert error.holder is not None and error.holder.startswith(first.id + "@w1@")
    assert outcome["held"] is True
    assert outcome["extensions"] >= 3  # held past 3.5 s on a 1 s lease
    assert runs(stack.observer, "dup") == {}  # no duplicate body ran
    assert worker.lines("lock lost") == []
    assert len(contended_lines([worker])) == 2


@pytest.mark.slow
def test_pausing_3_of_5_nodes_mid_task_logs_one_lock_lost_error(
    stack: Stack, start_workers: StartWorkers
) -> None:
    (worker,) = start_workers(1, pool="prefork", concurrency=2)
    # The body runs (holding the lock: it began) until the test has seen the loss.
    go = "go:lost"
    result = send(stack, "hold_ttl15", tag="lost", seconds=120, until=go, counter="lost")
    started_pid(stack, "lost", result.id)
    paused = list(stack.nodes)[:3]
    for node in paused:
        node.pause()
    try:
        # Found within the 1.5 s lease (its renewals fail); 30 s is a hang guard.
        eventually(lambda: worker.lines("lock lost:"), 30, "a lock lost line in the worker log")
    finally:
        for node in paused:
            node.resume()
    stack.observer.set(go, 1)
    outcome = result.get(timeout=30)
    assert outcome["held"] is False  # the body can see it
    lost = worker.lines(r"ERROR/.*\] lock lost: ")
    assert len(lost) == 1, lost
    assert f"workerapp.hold_ttl15[{result.id}]" in lost[0]
    assert f"key {workerapp.lock_key('lost')}:" in lost[0]


# -- crashes ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_sigkilled_holder_frees_its_lock_at_ttl_and_the_waiter_runs_then(
    stack: Stack, start_workers: StartWorkers
) -> None:
    """The dead child's watchdog dies with it: nothing renews or releases its lock,
    which frees at its TTL; the waiter (retry mode) runs then, not before."""
    (worker,) = start_workers(1, pool="prefork", concurrency=2)
    key = workerapp.lock_key("kill")
    holder = send(stack, "hold", tag="kill", seconds=60, counter="kill")  # ttl 2 s
    pid, began = started_pid(stack, "kill", holder.id)
    waiter = send(stack, "hold", tag="kill", seconds=0.05, counter="kill")
    eventually(lambda: contended_lines([worker], waiter.id), 20, "the waiter meets the lock")
    sleep_until(began + RENEWED_BY)  # the watchdog has renewed the lease by now

    killed_at = kill_child(pid)
    frees_at = lock_frees_at(stack, key)
    free_by = lock_surely_free_by(stack, key)
    free_by_wall = time.time() + (free_by - time.monotonic_ns()) / 1e9  # the log's clock
    stack.observer.decr("occ:kill")  # the dead body never will

    assert waiter.get(timeout=30)["held"] is True
    (span,) = intervals(stack.observer, "kill")
    assert span.task_id == waiter.id
    # Not before the dead holder's key expired on a majority of nodes...
    assert span.start >= frees_at - EXPIRY_SLACK_NS
    # ...and at the waiter's first try after that: tries are one at a time, so at most
    # one (begun while the key still held) met the dead holder's lock and logged it
    # after it had surely expired.
    met_holder = [
        line for line in contended_lines([worker], waiter.id) if f"held by {holder.id}@" in line
    ]
    assert met_holder, contended_lines([worker], waiter.id)  # the filter names the holder
    contended_after = [line for line in met_holder if logged_at(line) > free_by_wall]
    assert len(contended_after) <= 1, contended_after
    after_kill = (span.start - killed_at) / 1e9
    assert max_occupancy(stack.observer, "kill") == 1
    assert runs(stack.observer, "kill") == {holder.id: 1, waiter.id: 1}
    assert effects(stack.observer, "kill") == {waiter.id: 1}
    holder.get(timeout=30, propagate=False)
    assert holder.state == "FAILURE"  # WorkerLostError: acked early, not redelivered
    print(
        f"kill -> lock free on a majority: {(frees_at - killed_at) / 1e9:.3f}s; "
        f"kill -> waiter ran: {after_kill:.3f}s ({(span.start - frees_at) / 1e9:.3f}s "
        f"after expiry); waiter contended {len(contended_lines([worker], waiter.id))}x"
    )


@pytest.mark.slow
def test_acks_late_redelivery_after_a_sigkill_never_runs_beside_a_holder(
    stack: Stack, start_workers: StartWorkers
) -> None:
    """What happens: the child dies holding the lock. The worker notices the loss at
    its next pool check (at once or up to ~5 s later) and, as the task is acks_late
    with task_reject_on_worker_lost, requeues the message. The redelivery has its own
    token: it meets the dead holder's key (until its TTL) or the live contender, and
    retries until the lock is free. The body of that task id runs twice (the first cut
    short by the kill), its effect once, and never beside another holder."""
    (worker,) = start_workers(1, pool="prefork", concurrency=2)
    key = workerapp.lock_key("ack")
    first = send(stack, "hold_acks_late", tag="ack", seconds=60, again_seconds=0.3, counter="ack")
    pid, began = started_pid(stack, "ack", first.id)
    # A live contender: polling every 50 ms, it most likely takes the lock when the dead
    # holder's expires, and keeps it until the test says so: the redelivery meets it.
    other = send(stack, "hold_fast_retry", tag="ack", seconds=30, until="go:ack", counter="ack")
    eventually(lambda: contended_lines([worker], other.id), 20, "the contender meets the lock")
    sleep_until(began + RENEWED_BY)

    killed_at = kill_child(pid)
    frees_at = lock_frees_at(stack, key)
    stack.observer.decr("occ:ack")  # the dead body never will

    # The worker notices the dead child (at its next pool check, up to ~5 s) and
    # requeues the message; the redelivery then meets either the dead holder's key,
    # or the contender holding the lock, or wins it first and makes the contender wait.
    def redelivery_met_a_holder() -> bool:
        met_contender = any(
            f"held by {other.id}@" in line for line in contended_lines([worker], first.id)
        )
        return met_contender or runs(stack.observer, "ack").get(first.id, 0) == 2

    eventually(redelivery_met_a_holder, 30, "the redelivery met a holder or ran")
    stack.observer.set("go:ack", 1)

    wait_all([first, other], timeout=60)
    assert first.state == other.state == "SUCCESS"
    assert first.result["runs"] == 2  # the requeued message ran the body again
    spans = intervals(stack.observer, "ack")
    assert sorted(s.task_id for s in spans) == sorted([first.id, other.id])
    assert overlaps(spans) == []
    assert all(s.start >= frees_at - EXPIRY_SLACK_NS for s in spans)
    assert max_occupancy(stack.observer, "ack") == 1
    assert runs(stack.observer, "ack") == {first.id: 2, other.id: 1}
    assert effects(stack.observer, "ack") == {first.id: 1, other.id: 1}  # once per task id
    lines = contended_lines([worker], first.id)
    print(
        f"kill -> lock free: {(frees_at - killed_at) / 1e9:.3f}s; "
        + ", ".join(
            f"{'redelivery' if s.task_id == first.id else 'contender'} ran "
            f"+{(s.start - killed_at) / 1e9:.3f}s..+{(s.end - killed_at) / 1e9:.3f}s"
            for s in spans
        )
        + f"; redelivery contended {len(lines)}x, "
        f"{sum(f'held by {other.id}@' in line for line in lines)}x on the live contender"
    )


# -- retry hand-off --------------------------------------------------------------------------


@pytest.mark.slow
def test_self_retry_while_holding_hands_the_lock_to_the_next_attempt_in_prefork(
    stack: Stack, start_workers: StartWorkers
) -> None:
    (worker,) = start_workers(1, pool="prefork", concurrency=2)
    result = stack.client.send_task("workerapp.handoff", kwargs={"tag": "handoff"})
    assert result.get(timeout=30) == {"retries": 1, "held": True}
    assert contended_lines([worker], result.id) == []
    # retries == 1 says the retry happened; its log line may reach the file later.
    retried = r"Task workerapp\.handoff\[" + re.escape(result.id) + r"\] retry"
    eventually(lambda: worker.lines(retried), 30, "the retry logged")
    key = workerapp.lock_key("handoff")
    clients = [node.client() for node in stack.nodes]
    # after_return releases just after the result is stored.
    eventually(lambda: all(c.exists(key) == 0 for c in clients), 5, "lock released")


@pytest.mark.slow
def test_self_retry_with_no_retry_left_keeps_the_lock_for_the_rest_of_the_body(
    stack: Stack, start_workers: StartWorkers
) -> None:
    (worker,) = start_workers(1, pool="prefork", concurrency=2)
    first = send(stack, "retry_exhausted", tag="maxr", seconds=30, until="go:maxr", counter="maxr")
    started_pid(stack, "maxr", first.id)  # past self.retry(), in its fallback
    duplicate = send(stack, "hold_fast_retry", tag="maxr", seconds=0.2, counter="maxr")
    # The first body stays in its fallback until the duplicate met the lock or ran.
    eventually(
        lambda: (
            contended_lines([worker], duplicate.id) or duplicate.id in runs(stack.observer, "maxr")
        ),
        20,
        "the duplicate met the lock or ran",
    )
    stack.observer.set("go:maxr", 1)
    wait_all([first, duplicate], timeout=30)
    assert first.state == duplicate.state == "SUCCESS"
    assert overlaps(intervals(stack.observer, "maxr")) == []
    assert max_occupancy(stack.observer, "maxr") == 1
    assert first.result["held"] is True


# -- one lock node down --------------------------------------------------------------------


@pytest.mark.slow
def test_with_one_lock_node_killed_mid_run_no_skip_mode_copy_is_skipped_for_nobody(
    stack: Stack, start_workers: StartWorkers
) -> None:
    """30 same-key copies in skip mode on 2 prefork workers (4 children racing); one
    of the 5 lock nodes is SIGKILLed once the first body runs, and most copies come
    after. 4 nodes are still a quorum and more: a vote the copies split is retried,
    never read as an outage. Judged by the observer: one body at a time, every copy
    ran once or was skipped naming a holder that really ran; and no worker logged
    "lock nodes unavailable"."""
    workers = start_workers(2, pool="prefork", concurrency=2)
    body = {"tag": "one-down", "seconds": 0.1, "counter": "down"}
    results = [send(stack, "hold_skip", **body) for _ in range(6)]
    eventually(lambda: starts(stack.observer, "down"), 30, "a first body")
    stack.nodes[0].kill()
    for _ in range(6):  # the other 24 come after the kill, in bursts of racing copies
        results += [send(stack, "hold_skip", **body) for _ in range(4)]
        time.sleep(0.15)
    values = {r.id: r.get(timeout=60) for r in results}
    assert [r.state for r in results] == ["SUCCESS"] * 30
    ran = runs(stack.observer, "down")
    skipped = {tid: value for tid, value in values.items() if is_skipped(value)}
    unavailable = [line for w in workers for line in w.lines(r"lock nodes unavailable")]
    holders = {tid: (v["holder"] or "").split("@")[0] or None for tid, v in skipped.items()}
    print(
        f"\n[skip x30, lock node 1/5 killed] ran {len(ran)}, skipped {len(skipped)}, "
        f"skipped naming nobody {sum(1 for h in holders.values() if h is None)}, "
        f"'lock nodes unavailable' lines {len(unavailable)}, split WARNING lines "
        f"{sum(len(w.lines('vote split')) for w in workers)}"
    )
    assert max_occupancy(stack.observer, "down") == 1
    assert set(ran) | set(skipped) == set(values) and not set(ran) & set(skipped)
    assert [tid for tid, n in ran.items() if n != 1] == []
    assert {tid: h for tid, h in holders.items() if h not in ran} == {}, skipped
    assert unavailable == [], "\n".join(unavailable[:5])
