"""``redlock_limit``, ``redlock_rate`` and ``redlock_cooldown`` in real ``celery worker``
subprocesses (prefork and gevent), with faults: a lock node SIGSTOPped mid-run, a holder
SIGKILLed; the limit also without faults in eventlet, threads and solo workers.

tests/apps/limitsapp.py runs against a real Redis broker, 5 real lock nodes and a
third Redis, the observer. The limit and the rate are judged from what the bodies
told the observer (their intervals and start times, on one monotonic clock), never
from the lock's word. A body killed mid-run counts as inside from its start until
the kill. Every task sent must end SUCCESS (its message acknowledged late, a killed
one runs again). A holder killed outside prefork is its whole worker, every body inside
it: its messages come back through the unacked sweep (kombu's, on the event loop; on a
green worker tasks/green_sweep.py's) after ``visibility_timeout`` and run on the other
worker. The busy share of the permits and
the drain rate are printed for the report, never asserted: they measure speed, which a
loaded machine changes.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from statistics import median, quantiles
from typing import Any

import pytest
from celery.result import AsyncResult

from celery_redlock.testing import CeleryProcess
from tests.apps import limitsapp
from tests.support.observed import Interval, intervals, most_in_window, runs, starts
from tests.support.workers import Launch, Stack, eventually, wait_all

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Pool:
    name: str
    workers: int
    concurrency: int


POOLS = [
    pytest.param(Pool("prefork", 2, 4), id="prefork"),
    pytest.param(Pool("gevent", 2, 10), id="gevent"),
]
FAULTS = ["none", "node-stopped", "holder-killed"]
#: The other pools run the limit without faults (their faults, and the rate and the
#: cooldown on them, pass too but cost minutes each; the faults run on the two above).
OTHER_POOLS = [
    pytest.param(Pool("eventlet", 2, 10), id="eventlet"),
    pytest.param(Pool("threads", 2, 4), id="threads"),
    pytest.param(Pool("solo", 3, 1), id="solo"),
]


def send(stack: Stack, task: str, **kwargs: Any) -> AsyncResult:
    return stack.client.send_task(f"limitsapp.{task}", kwargs=kwargs)


def most_at_once(spans: Sequence[Interval]) -> int:
    """The most spans that overlap at one instant (a sweep over their ends)."""
    events = sorted([(s.start, 1) for s in spans] + [(s.end, -1) for s in spans])
    inside = most = 0
    for _, step in events:  # an end sorts before a start at the same instant
        inside += step
        most = max(most, inside)
    return most


def busy_share(spans: Sequence[Interval], permits: int) -> float:
    """Time inside summed over the spans, over permits x the span of the whole run."""
    if not spans:
        return 0.0
    whole = max(s.end for s in spans) - min(s.start for s in spans)
    return sum(s.end - s.start for s in spans) / (permits * whole) if whole else 0.0


def refill_gaps(spans: Sequence[Interval]) -> list[float]:
    """Milliseconds each freed permit stayed free before a body took it again (the
    earliest freed one first); a permit freed at the end, with nothing left to run,
    is not counted. The hand-off's latency, as the bodies saw it."""
    events = sorted([(s.start, 1) for s in spans] + [(s.end, -1) for s in spans])
    freed: list[int] = []
    gaps = []
    for at, step in events:
        if step < 0:
            freed.append(at)
        elif freed:
            gaps.append((at - freed.pop(0)) / 1e6)
    return gaps


@contextmanager
def fault(
    stack: Stack, launch: Launch, pool: Pool, kind: str, counter: str, after: int = 4
) -> Iterator[list[Interval]]:
    """Inject ``kind`` once ``after`` bodies began; yields the spans of killed bodies
    (their start until the kill), filled in when the fault happened."""
    killed: list[Interval] = []
    stopped = None
    if kind != "none":
        began = lambda: len(starts(stack.observer, counter)) >= after  # noqa: E731
        eventually(began, 60, f"{after} bodies began")
    if kind == "node-stopped":
        stopped = stack.nodes[0]
        stopped.pause()
    elif kind == "holder-killed":
        pid = starts(stack.observer, counter)[-1][1]
        # A prefork child (its worker lives on, another child takes over), or a
        # whole worker of another pool with every body inside it (the other lives on).
        os.kill(pid, signal.SIGKILL)
        now = time.monotonic_ns()
        ended = {(i.task_id, i.start) for i in intervals(stack.observer, counter)}
        killed.extend(
            Interval(t, p, s, now)
            for t, p, s in starts(stack.observer, counter)
            if p == pid and (t, s) not in ended
        )
    try:
        yield killed
    finally:
        if stopped is not None:
            stopped.resume()


def settle(
    stack: Stack,
    results: Sequence[AsyncResult],
    timeout: float,
    workers: Sequence[CeleryProcess],
    lossy: bool,
) -> list[str]:
    """Wait for every task to end SUCCESS; returns the ids lost in transit.

    ``lossy`` (a whole worker SIGKILLed: any pool but prefork): kombu's Redis transport
    pops a message with BRPOP and records it as unacked only once the worker has read the
    reply, so a worker killed in between loses it -- no sweep can bring it back. A
    task may then stay PENDING (its first copy or one the lock published again): at
    most one, the killed worker's one BRPOP in flight. The wait ends early once the
    broker holds no message at all, queued or unacked (a countdown waiting in a worker
    is unacked)."""
    if not lossy:
        wait_all(results, timeout=timeout)
        states = {r.id: r.state for r in results}
        assert [s for s in states.values() if s != "SUCCESS"] == [], states
        return []
    broker = stack.broker.client()
    deadline = time.monotonic() + timeout
    idle_since = None  # a message between BRPOP and its unacked record is in neither
    while True:
        unfinished = [r.id for r in results if r.state != "SUCCESS"]
        if broker.llen("celery") or broker.zcard("unacked_index"):
            idle_since = None
        elif idle_since is None:
            idle_since = time.monotonic()
        if not unfinished or (idle_since is not None and time.monotonic() - idle_since > 3):
            break
        assert time.monotonic() < deadline, f"{len(unfinished)} tasks not done in {timeout}s"
        time.sleep(0.5)
    assert len(unfinished) <= 1, unfinished
    return unfinished


def told(stack: Stack, workers: Sequence[CeleryProcess], counter: str, ids: set[str]) -> str:
    """What the bodies and the workers' logs say of ``ids``: a failure's evidence."""
    said = [f"{t} pid {p} began {s}" for t, p, s in starts(stack.observer, counter) if t in ids]
    spans = intervals(stack.observer, counter)
    said += [f"{i.task_id} pid {i.pid} ended {i.end}" for i in spans if i.task_id in ids]
    pattern = "|".join(sorted(ids))
    for worker in workers:
        said += [f"pid {worker.pid}: {line}" for line in worker.lines(pattern)]
    return "\n".join(said)


@pytest.mark.parametrize(
    ("pool", "kind"),
    [
        pytest.param(pool.values[0], kind, id=f"{pool.id}-{kind}")
        for pool in POOLS
        for kind in FAULTS
    ]
    + [pytest.param(pool.values[0], "none", id=f"{pool.id}-none") for pool in OTHER_POOLS],
)
def test_a_limit_of_3_over_40_copies_never_lets_a_fourth_in(
    stack: Stack, launch: Launch, pool: Pool, kind: str
) -> None:
    workers = launch("limitsapp", pool.workers, pool=pool.name, concurrency=pool.concurrency)
    lossy = pool.name != "prefork" and kind == "holder-killed"
    counter = f"limit-{kind}"
    task = "limited_handoff" if kind == "none" else "limited"
    results = [send(stack, task, tag="n", seconds=0.3, counter=counter) for _ in range(40)]
    with fault(stack, launch, pool, kind, counter) as killed:
        lost = settle(stack, results, 180, workers, lossy)
    spans = intervals(stack.observer, counter) + killed
    assert most_at_once(spans) <= limitsapp.LIMIT
    assert most_at_once(spans) == limitsapp.LIMIT  # the permits were used, not only kept
    executed = runs(stack.observer, counter)
    assert set(executed) == {r.id for r in results} - set(lost)
    if lossy:
        # Every body in the killed worker ran again, once; so may a task it finished
        # just before the kill without its result stored yet. Nothing else twice.
        dead = {w.pid for w in workers if not w.alive}
        in_dead = {t for t, p, _ in starts(stack.observer, counter) if p in dead}
        twice = {t: n for t, n in executed.items() if n > 1}
        odd = ({s.task_id for s in killed} - set(twice)) | (set(twice) - in_dead)
        assert not odd, told(stack, workers, counter, odd)
        assert set(twice.values()) <= {2}, twice
    else:
        assert sum(executed.values()) == 40 + len(killed)  # a killed body ran again, once
    gaps = refill_gaps(spans)
    print(
        f"limit {limitsapp.LIMIT}, {pool.name} {pool.workers}x-c{pool.concurrency}, fault "
        f"{kind}: 40 tasks SUCCESS, most inside {most_at_once(spans)}, busy share of the "
        f"permits {busy_share(spans, limitsapp.LIMIT):.0%} ({task}), a freed permit taken "
        f"again in {median(gaps):.0f} ms (p90 {quantiles(gaps, n=10)[-1]:.0f} ms), "
        f"{len(lost)} lost in transit"
    )


@pytest.mark.parametrize("pool", POOLS)
def test_copies_waiting_in_their_workers_take_each_freed_permit_at_once(
    stack: Stack, launch: Launch, pool: Pool
) -> None:
    # redlock_wait_timeout: the copies over the limit wait in their worker slots (4
    # prefork children or 10 greenlets a worker) and start when a permit frees,
    # without a trip through the broker.
    workers = launch("limitsapp", pool.workers, pool=pool.name, concurrency=pool.concurrency)
    counter = "limit-waiting"
    results = [
        send(stack, "limited_waiting", tag="w", seconds=0.3, counter=counter) for _ in range(40)
    ]
    settle(stack, results, 180, workers, lossy=False)
    spans = intervals(stack.observer, counter)
    assert most_at_once(spans) == limitsapp.LIMIT
    assert sum(runs(stack.observer, counter).values()) == 40
    gaps = refill_gaps(spans)
    print(
        f"limit {limitsapp.LIMIT}, {pool.name} {pool.workers}x-c{pool.concurrency}, copies "
        f"waiting in their workers: 40 tasks SUCCESS, most inside {most_at_once(spans)}, busy "
        f"share of the permits {busy_share(spans, limitsapp.LIMIT):.0%}, a freed permit taken "
        f"again in {median(gaps):.0f} ms (p90 {quantiles(gaps, n=10)[-1]:.0f} ms), "
        f"{sum(len(w.lines(r'lock contended: ')) for w in workers)} contended retries"
    )


@pytest.mark.parametrize(
    ("pool", "kind"),
    [
        pytest.param(pool.values[0], kind, id=f"{pool.id}-{kind}")
        for pool in POOLS
        for kind in FAULTS
    ],
)
def test_a_rate_of_20_per_second_over_200_copies_holds_in_every_window(
    stack: Stack, launch: Launch, pool: Pool, kind: str
) -> None:
    workers = launch("limitsapp", pool.workers, pool=pool.name, concurrency=pool.concurrency)
    lossy = pool.name != "prefork" and kind == "holder-killed"
    counter = f"rate-{kind}"
    seconds = 0.1 if kind == "holder-killed" else 0.0  # a body there is to kill
    results = [send(stack, "rated", tag="r", seconds=seconds, counter=counter) for _ in range(200)]
    with fault(stack, launch, pool, kind, counter):
        lost = settle(stack, results, 180, workers, lossy)
    admitted = sorted(int(t) for t in stack.observer.lrange(f"admitted:{counter}", 0, -1))
    began = sorted(start for _, _, start in starts(stack.observer, counter))
    executed = runs(stack.observer, counter)
    assert set(executed) == {r.id for r in results} - set(lost)
    # A killed body's task ran again: its first start was counted in the window too.
    # Otherwise each ran once: no countdown outlived the visibility timeout.
    assert len(began) == sum(executed.values()) >= 200 - len(lost)
    # A whole worker killed can take a copy between its admission and its body:
    # admitted, never begun (it runs again, admitted again). The window is judged on
    # every admission, those included.
    assert len(admitted) == len(began) or (lossy and len(admitted) > len(began))
    if kind != "holder-killed":
        assert set(executed.values()) == {1}
    # Any window of one second: at most RATE starts admitted (noted by the worker
    # the moment before_start returned, on the machine's monotonic clock).
    assert most_in_window(admitted, 1_000_000_000) <= limitsapp.RATE
    span = (began[-1] - began[0]) / 1e9
    comebacks = sum(len(worker.lines(r"rate reached: ")) for worker in workers)
    drained = (len(began) - 1) / span / limitsapp.RATE if span else 0.0
    print(
        f"rate {limitsapp.RATE}/s, {pool.name} {pool.workers}x-c{pool.concurrency}, fault "
        f"{kind}: {200 - len(lost)} tasks SUCCESS, {len(lost)} lost in transit "
        f"({len(began)} starts) in {span:.1f}s, drained at "
        f"{drained:.0%} of the rate, {comebacks / 200:.1f} come-backs per task, "
        f"most admitted in a 1 s window {most_in_window(admitted, 1_000_000_000)}, most "
        f"bodies begun in one {most_in_window(began, 1_000_000_000)}"
    )


@pytest.mark.parametrize(
    ("pool", "kind"),
    [
        pytest.param(pool.values[0], kind, id=f"{pool.id}-{kind}")
        for pool in POOLS
        for kind in FAULTS
    ],
)
def test_a_cooldown_of_3s_over_50_copies_in_10s_keeps_starts_apart(
    stack: Stack, launch: Launch, pool: Pool, kind: str
) -> None:
    workers = launch("limitsapp", pool.workers, pool=pool.name, concurrency=pool.concurrency)
    lossy = pool.name != "prefork" and kind == "holder-killed"
    counter = f"cool-{kind}"
    seconds = 1.0 if kind == "holder-killed" else 0.1  # a body there is to kill
    results: list[AsyncResult] = []

    def sender() -> None:  # 50 copies over 10 s, while the fault comes
        for _ in range(50):
            results.append(send(stack, "cooled", tag="c", seconds=seconds, counter=counter))
            time.sleep(0.2)

    sending = threading.Thread(target=sender)
    sending.start()
    try:
        with fault(stack, launch, pool, kind, counter, after=2) as killed:
            sending.join()
            lost = settle(stack, results, 120, workers, lossy)
    finally:
        sending.join()
    admitted = sorted(int(t) for t in stack.observer.lrange(f"admitted:{counter}", 0, -1))
    gaps = [(b - a) / 1e9 for a, b in zip(admitted, admitted[1:])]
    assert len(admitted) >= 3 and min(gaps) >= limitsapp.COOLDOWN, gaps
    outcomes = [r.result for r in results if r.id not in lost]
    skipped = [o for o in outcomes if o.get("redlock") == "SKIPPED"]
    for marker in skipped:  # each names the key and when the cooldown ends
        assert marker["key"].endswith("cool:c") and "cooldown of 3s" in marker["reason"]
        assert marker["until"] > 0
    executed = runs(stack.observer, counter)
    assert len(skipped) + len(executed) >= 50 - len(lost)
    assert sum(executed.values()) == len(admitted)
    # A killed body's task was delivered again: skipped inside the cooldown its own
    # start began, or run once it had passed (the gaps above hold either way).
    assert (len(killed) >= 1) == (kind == "holder-killed")
    print(
        f"cooldown {limitsapp.COOLDOWN:g}s, {pool.name} {pool.workers}x-c{pool.concurrency}, "
        f"fault {kind}: 50 tasks SUCCESS, {len(admitted)} starts, {len(skipped)} skipped, "
        f"shortest gap {min(gaps):.2f}s"
    )
