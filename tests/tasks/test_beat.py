"""RedlockScheduler: ticks, buckets, lock keys and bad input in-process (a fake wall
clock, real lock nodes); then real ``celery beat -S redlock`` processes.

The in-process beats run Celery's own ``Scheduler.tick`` loop against a fake clock
(each schedule's ``nowfun``), so a test can start beats at 10.95 and 11.05 and watch
them for ten periods in milliseconds. Lock rounds go to 5 real redis-servers.

The subprocess tests run three ``celery beat`` processes and one ``celery worker``
(tests/apps/beatapp.py) against a real Redis broker and 5 real lock nodes; the task reports
each execution and the tick header it carried to a third Redis, the observer. What
the beats claim is read from their logs (one line per beat per tick); what ran is
judged from the observer only.
"""

from __future__ import annotations

import logging
import math
import os
import re
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
import redis
from celery import Celery
from celery.beat import Scheduler
from celery.schedules import BaseSchedule, crontab, schedstate, schedule

from celery_redlock import ConfigurationError
from celery_redlock.beat import (
    ENTRY_HEADER,
    MIN_TTL,
    TICK_HEADER,
    RedlockScheduler,
    RedlockSchedulerMixin,
    Tick,
    entry_tick,
    lock_ttl,
)
from celery_redlock.testing import CeleryProcess, RedisNodes, RedisServer, RedisServerFactory
from tests.support.workers import app_process

#: A fake "now" far from any real key: 2027-01-15T08:00:00Z.
EPOCH = 1_800_000_000
BEAT_LOGGER = "celery_redlock.beat"

#: "beat tick won: entry 'count' tick 1800000011 ..." and its siblings.
OUTCOME = re.compile(
    r"beat tick (?P<what>won|sent by another beat|not sent: [^:]+): "
    r"entry '(?P<entry>[^']+)' tick (?P<tick>\d+)"
)
SUMMARY = re.compile(r"beat ticks: (\d+) sent, (\d+) sent by another beat, (\d+) missed")


def outcome_of(message: str) -> Optional[tuple[str, int]]:
    """``("won" | "lost" | "missed: <reason>", tick)`` of one outcome line, else None."""
    found = OUTCOME.search(message)
    if found is None:
        return None
    what = found["what"]
    kind = {"won": "won", "sent by another beat": "lost"}.get(
        what, what.replace("not sent", "missed")
    )
    return kind, int(found["tick"])


# -- in-process beats ---------------------------------------------------------------------


class Clock:
    """A settable wall clock, handed to schedules as ``nowfun``."""

    def __init__(self, epoch: float) -> None:
        self.epoch = epoch

    def __call__(self) -> datetime:
        return datetime.fromtimestamp(self.epoch, timezone.utc)


class RecordingScheduler(Scheduler):  # type: ignore[misc]
    """Celery's in-memory Scheduler that records what it would publish."""

    producer = None  # never connects to a broker

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        #: (entry name, headers, wall time) of every send.
        self.sent: list[tuple[str, dict[str, Any], float]] = []
        super().__init__(*args, **kwargs)

    def apply_async(
        self, entry: Any, producer: Any = None, advance: bool = True, **kw: Any
    ) -> None:
        headers = dict(entry.options.get("headers") or {})
        self.sent.append((entry.name, headers, entry.default_now().timestamp()))


class UnitScheduler(RedlockSchedulerMixin, RecordingScheduler):
    """The mixin on a non-persistent scheduler: what a database scheduler would do."""


#: Lock rounds of the in-process beats: the clock they tick by is fake, so a patient
#: node timeout costs nothing, and a round slowed by a loaded machine is not
#: mistaken for lock nodes gone (the default 0.05 s would log "missed").
NODE_TIMEOUT = 0.4


def make_app(nodes: list[str], beat_schedule: dict[str, Any], **conf: Any) -> Celery:
    app = Celery("beat_tests", broker="memory://", set_as_current=False)
    conf.setdefault("redlock_node_timeout", NODE_TIMEOUT)
    app.conf.update(redlock_nodes=nodes, beat_schedule=beat_schedule, result_expires=None, **conf)
    return app


def every_second(nodes: list[str], caplog: pytest.LogCaptureFixture) -> tuple[Clock, Celery]:
    """A fake clock at EPOCH and an app whose one entry, ``second``, is due every
    second of it; the beat's INFO lines captured."""
    caplog.set_level(logging.INFO, logger=BEAT_LOGGER)
    clock = Clock(EPOCH)
    return clock, make_app(
        nodes, {"second": {"task": "t", "schedule": schedule(1.0, nowfun=clock)}}
    )


@dataclass
class Simulation:
    """Beats started at given fake times, ticked in time order like ``celery beat``."""

    clock: Clock
    make: Callable[[], UnitScheduler]
    caplog: pytest.LogCaptureFixture
    beats: dict[str, UnitScheduler] = field(default_factory=dict)
    #: beat -> [(outcome, tick, fake time)] in order.
    outcomes: dict[str, list[tuple[str, int, float]]] = field(default_factory=dict)

    def run(self, starts: dict[str, float], until: float) -> None:
        wake = dict(starts)
        for _ in range(10_000):
            at, name = min((when, beat) for beat, when in wake.items())
            if at > until:
                return
            self.clock.epoch = max(self.clock.epoch, at)
            if name not in self.beats:
                self.beats[name] = self.make()
                self.outcomes[name] = []
                continue
            seen = len(self.caplog.records)
            delay = self.beats[name].tick()
            for record in self.caplog.records[seen:]:
                found = outcome_of(record.getMessage())
                if found is not None:
                    self.outcomes[name].append((*found, self.clock.epoch))
            wake[name] = self.clock.epoch + max(float(delay or 0.0), 0.0)
        raise AssertionError("the simulated beats never got past the end time")


def test_interval_ticks_are_time_buckets() -> None:
    clock = Clock(EPOCH)
    app = make_app(["redis://127.0.0.1:9/0"], {})
    entry = UnitScheduler.Entry(
        name="every10", task="t", schedule=schedule(timedelta(seconds=10), nowfun=clock), app=app
    )
    for offset, bucket in ((0.0, EPOCH // 10), (9.999, EPOCH // 10), (10.0, EPOCH // 10 + 1)):
        clock.epoch = EPOCH + offset
        assert entry_tick(entry) == Tick(bucket, bucket * 10.0, (bucket + 1) * 10.0)
    # A 1 s bucket claimed 20 ms after its boundary: the lock outlives the next
    # boundary by the clock skew allowance (1 s), never less than MIN_TTL.
    assert lock_ttl(Tick(5, 5.0, 6.0), now=5.02, clock_skew=1.0) == pytest.approx(1.98)
    assert lock_ttl(Tick(5, 5.0, 6.0), now=5.9, clock_skew=0.0) == MIN_TTL


def test_crontab_tick_is_the_latest_due_time_not_the_one_after_last_run() -> None:
    clock = Clock(EPOCH)
    app = make_app(["redis://127.0.0.1:9/0"], {})
    every5 = crontab(minute="*/5", nowfun=clock)
    entry = UnitScheduler.Entry(name="cron", task="t", schedule=every5, app=app)
    due = datetime(2027, 1, 15, 12, 5, tzinfo=timezone.utc).timestamp()
    # Looked at just after 12:05, or 40 s later; last run at 12:04:59 or at 11:00
    # (a beat that started with an old schedule file): always the 12:05 tick.
    for now, last_run in ((due + 0.02, due - 1), (due + 40, due - 3900), (due + 299, due - 1)):
        clock.epoch = now
        entry.last_run_at = datetime.fromtimestamp(last_run, timezone.utc)
        tick = entry_tick(entry)
        assert (tick.number, tick.due, tick.next_due) == (int(due), due, due + 300)
    daily = UnitScheduler.Entry(
        name="daily", task="t", schedule=crontab(minute=0, hour=4, nowfun=clock), app=app
    )
    clock.epoch = due  # 12:05: the last 04:00 was this morning
    morning = datetime(2027, 1, 15, 4, 0, tzinfo=timezone.utc).timestamp()
    tick = entry_tick(daily)
    assert tick == Tick(int(morning), morning, morning + 86400)
    assert lock_ttl(tick, due, 1.0) == pytest.approx(morning + 86400 - due + 1.0)


def test_crontab_beats_started_at_different_times_claim_the_same_tick(
    redis_nodes: RedisNodes, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=BEAT_LOGGER)
    due = datetime(2027, 1, 15, 12, 5, tzinfo=timezone.utc).timestamp()
    clock = Clock(due - 1)
    app = make_app(
        redis_nodes.urls, {"cron": {"task": "t", "schedule": crontab(minute="*/5", nowfun=clock)}}
    )
    fresh = UnitScheduler(app)  # started at 12:04:59
    clock.epoch = due - 3900
    stale = UnitScheduler(app)  # last ran at 11:00, say, then was down for an hour
    clock.epoch = due + 0.02
    assert fresh.is_due(fresh.schedule["cron"])[0]
    assert entry_tick(fresh.schedule["cron"]).number == due
    fresh.tick()
    clock.epoch = due + 40
    assert stale.is_due(stale.schedule["cron"])[0]
    assert entry_tick(stale.schedule["cron"]).number == due  # not 11:05, its next due
    stale.tick()
    assert [(name, headers[TICK_HEADER]) for name, headers, _ in fresh.sent] == [("cron", due)]
    assert stale.sent == []
    assert (fresh.sent_ticks, fresh.lost_ticks, stale.sent_ticks, stale.lost_ticks) == (1, 0, 0, 1)
    lines = [m for m in caplog.messages if "sent by another beat" in m]
    assert len(lines) == 1 and f"tick {int(due)} " in lines[0] and "holder beat@" in lines[0]


def test_interval_beats_started_at_different_times_each_claim_every_bucket_once(
    redis_nodes: RedisNodes, caplog: pytest.LogCaptureFixture
) -> None:
    """The drift pitfall: beats started at 10.95 and 11.05 would, left to Celery, look
    at the entry at x.95 and x.05 -- claiming different buckets for one run, or
    skipping one. Here both look just after every boundary, claim each bucket once,
    and exactly one sends it."""
    caplog.set_level(logging.INFO, logger=BEAT_LOGGER)
    clock = Clock(EPOCH)
    app = make_app(
        redis_nodes.urls,
        {"second": {"task": "t", "schedule": schedule(timedelta(seconds=1), nowfun=clock)}},
    )
    sim = Simulation(clock, lambda: UnitScheduler(app), caplog)
    sim.run({"a": EPOCH + 10.95, "b": EPOCH + 11.05}, until=EPOCH + 20.5)

    a, b = sim.outcomes["a"], sim.outcomes["b"]
    # a started in bucket 10 and claims from 11; b started in 11 and claims from 12.
    assert [tick for _, tick, _ in a] == list(range(EPOCH + 11, EPOCH + 21))
    assert [tick for _, tick, _ in b] == list(range(EPOCH + 12, EPOCH + 21))
    for _, tick, when in a + b:
        assert tick < when < tick + 0.05, "evaluated just after the bucket boundary"
    sent = Counter(h[TICK_HEADER] for beat in sim.beats.values() for _, h, _ in beat.sent)
    assert sent == Counter(range(EPOCH + 11, EPOCH + 21)), "each bucket sent exactly once"
    won = Counter(tick for what, tick, _ in a + b if what == "won")
    assert won == sent
    assert {what for what, _, _ in a + b} == {"won", "lost"}


def test_a_slow_send_does_not_push_the_next_look_past_the_boundary(
    redis_nodes: RedisNodes, caplog: pytest.LogCaptureFixture
) -> None:
    clock, app = every_second(redis_nodes.urls, caplog)

    class SlowPublisher(UnitScheduler):
        def apply_async(self, entry: Any, *args: Any, **kwargs: Any) -> None:
            super().apply_async(entry, *args, **kwargs)
            clock.epoch += 0.3  # a publish (or a lock round) that takes 300 ms

    sim = Simulation(clock, lambda: SlowPublisher(app), caplog)
    sim.run({"a": EPOCH + 0.5}, until=EPOCH + 6.5)
    sent = [
        (h[TICK_HEADER] - EPOCH, round(at - h[TICK_HEADER], 3)) for _, h, at in sim.beats["a"].sent
    ]
    # Each tick still goes out 10 ms after its boundary, not 310, 610, ... or 310 ms.
    assert sent == [(n, 0.01) for n in range(1, 7)]


def test_sent_message_carries_the_tick_and_the_lock_key_names_entry_and_tick(
    redis_nodes: RedisNodes,
) -> None:
    clock = Clock(EPOCH + 0.5)
    options = {"headers": {"mine": 1}, "queue": "q"}
    app = make_app(
        redis_nodes.urls,
        {"hello": {"task": "t", "schedule": schedule(1.0, nowfun=clock), "options": options}},
        redlock_key_prefix="myapp",
    )
    beat = UnitScheduler(app)
    entry = beat.schedule["hello"]
    tick = entry_tick(entry)
    assert beat.lock_key(entry, tick) == f"myapp:beat:hello:{EPOCH}"
    clock.epoch = EPOCH + 1.02
    ticking = time.monotonic()
    beat.tick()
    beat.tick()
    assert beat.sent == [
        ("hello", {"mine": 1, TICK_HEADER: EPOCH + 1, ENTRY_HEADER: "hello"}, EPOCH + 1.02)
    ]
    assert beat.schedule["hello"].options == options == {"headers": {"mine": 1}, "queue": "q"}
    key = f"myapp:beat:hello:{EPOCH + 1}"
    holding = beat.redlock.holder(key)
    since_set = time.monotonic() - ticking  # at least as long as the key has lived
    assert holding.holder is not None and holding.holder.startswith("beat@")
    # Left to expire, not released: it outlives the next boundary by the skew (1 s),
    # a TTL of 1.98 s less what has run down since it was set (1 ms rounding).
    assert holding.ttl is not None and 1.98 - since_set - 0.001 <= holding.ttl <= 1.98


def test_a_tick_is_not_sent_when_the_lock_nodes_lose_quorum(
    redis_nodes: RedisNodes, caplog: pytest.LogCaptureFixture
) -> None:
    clock, app = every_second(redis_nodes.urls, caplog)
    sim = Simulation(clock, lambda: UnitScheduler(app), caplog)
    sim.run({"a": EPOCH + 0.5}, until=EPOCH + 2.5)
    for node in redis_nodes[:3]:
        node.pause()
    try:
        sim.run({"a": clock.epoch}, until=EPOCH + 5.5)
    finally:
        for node in redis_nodes[:3]:
            node.resume()
    sim.run({"a": clock.epoch}, until=EPOCH + 7.5)

    beat = sim.beats["a"]
    assert [(what, tick - EPOCH) for what, tick, _ in sim.outcomes["a"]] == [
        ("won", 1),
        ("won", 2),
        ("missed: lock nodes unavailable", 3),
        ("missed: lock nodes unavailable", 4),
        ("missed: lock nodes unavailable", 5),
        ("won", 6),
        ("won", 7),
    ]
    assert [h[TICK_HEADER] - EPOCH for _, h, _ in beat.sent] == [1, 2, 6, 7]
    assert (beat.sent_ticks, beat.lost_ticks, beat.missed_ticks) == (4, 0, 3)
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 3
    assert all("not sent: lock nodes unavailable" in e for e in errors)
    assert "3 tick(s) missed so far" in errors[-1]


#: How long the beat below keeps retrying a split tick: room for many rounds of
#: NODE_TIMEOUT each, so "retried at least twice" does not depend on the machine.
SPLIT_CLAIM_TIMEOUT = 8 * NODE_TIMEOUT


class DropAfterRetries(logging.Handler):
    """Deletes the phantom beats' shares when the beat has logged its second retry:
    the split ends on an event, not after a TTL a slow round may overrun."""

    def __init__(self, nodes: Sequence[RedisServer], key: str) -> None:
        super().__init__(logging.DEBUG)
        self.nodes, self.key, self.retries = nodes, key, 0

    def emit(self, record: logging.LogRecord) -> None:
        if "lock split between beats, retrying" in record.getMessage():
            self.retries += 1
            if self.retries == 2:
                for node in self.nodes:
                    node.client().delete(self.key)


@pytest.mark.parametrize(("phantoms_leave", "outcome"), [(True, "won"), (False, "missed")])
def test_a_lock_split_between_beats_is_retried_until_someone_wins_or_time_runs_out(
    redis_nodes: RedisNodes,
    caplog: pytest.LogCaptureFixture,
    phantoms_leave: bool,
    outcome: str,
) -> None:
    """Beats racing for a tick can split the nodes so that nobody has a quorum; all
    give their share back. Here two phantom beats hold 2 + 1 of the 5 nodes: the real
    beat retries and wins once their shares are gone (deleted after its second retry),
    or, if they never go, gives the tick up as missed after
    ``redlock_beat_claim_timeout`` (never sends unguarded). A 10 s period, so the tick
    stays current (not stale) for the whole claim timeout."""
    caplog.set_level(logging.DEBUG, logger=BEAT_LOGGER)
    clock = Clock(EPOCH + 5)
    app = make_app(
        redis_nodes.urls, {"ten": {"task": "t", "schedule": schedule(10.0, nowfun=clock)}}
    )
    patient = type("Patient", (UnitScheduler,), {"redlock_beat_claim_timeout": SPLIT_CLAIM_TIMEOUT})
    beat = patient(app)
    clock.epoch = EPOCH + 10.02
    entry = beat.schedule["ten"]
    tick = entry_tick(entry)
    key = beat.lock_key(entry, tick)
    shares = redis_nodes[:3]
    for node, phantom in zip(shares, "aab"):
        node.client().set(key, f"token{phantom}|beat@phantom-{phantom}", px=600_000)
    dropper = DropAfterRetries(shares, key)
    logger = logging.getLogger(BEAT_LOGGER)
    if phantoms_leave:
        logger.addHandler(dropper)
    began = time.monotonic()
    try:
        beat.tick()
        beat.tick()
    finally:
        logger.removeHandler(dropper)
    took = time.monotonic() - began
    outcomes = [found for m in caplog.messages if (found := outcome_of(m))]
    retries = [m for m in caplog.messages if "lock split between beats, retrying" in m]
    assert len(retries) >= 2
    if outcome == "won":
        assert outcomes == [("won", tick.number)]
        assert [h[TICK_HEADER] for _, h, _ in beat.sent] == [tick.number]
    else:
        assert outcomes == [("missed: no beat won the lock", tick.number)]
        assert beat.sent == [] and beat.missed_ticks == 1
        assert took >= SPLIT_CLAIM_TIMEOUT


class NoEstimate(BaseSchedule):  # type: ignore[misc]
    """A schedule that can say "due" but not when it is next due."""

    def is_due(self, last_run_at: datetime) -> Any:
        return schedstate(False, 60.0)


@pytest.mark.parametrize(
    ("entry_schedule", "message"),
    [
        (0.5, r"'bad': an interval of 0.5s is shorter than 1s, the shortest"),
        (timedelta(seconds=0), r"'bad': the interval must be a positive number of seconds"),
        (timedelta(seconds=-5), r"'bad': the interval must be a positive number of seconds"),
        (NoEstimate(), r"'bad': schedule .* \(NoEstimate\) is not supported.*Accepted: "),
    ],
)
def test_entries_the_scheduler_cannot_tick_fail_at_beat_start(
    tmp_path: Path, entry_schedule: Any, message: str
) -> None:
    schedules = {
        "good": {"task": "t", "schedule": 1.0},
        "bad": {"task": "t", "schedule": entry_schedule},
    }
    app = make_app(["redis://127.0.0.1:9/0"], schedules)
    with pytest.raises(ConfigurationError, match=message):
        UnitScheduler(app)
    with pytest.raises(ConfigurationError, match=message):
        RedlockScheduler(app=app, schedule_filename=str(tmp_path / "schedule"))


SECONDS = "must be a number of seconds"


@pytest.mark.parametrize(
    ("attributes", "conf", "message"),
    [
        ({"redlock_beat_clock_skew": "soon"}, {}, rf"Skewed.redlock_beat_clock_skew {SECONDS}"),
        ({"redlock_beat_clock_skew": -1}, {}, rf"redlock_beat_clock_skew {SECONDS} >= 0"),
        ({"redlock_beat_claim_timeout": 0}, {}, rf"redlock_beat_claim_timeout {SECONDS} > 0"),
        ({}, {"redlock_node_timeout": 0.6}, r"redlock_node_timeout \(0.6s\) is too long for beat"),
        ({}, {"redlock_nodes": []}, r"redlock_nodes must be a non-empty list"),
    ],
)  # fmt: skip
def test_bad_settings_fail_at_beat_start(
    attributes: dict[str, Any], conf: dict[str, Any], message: str
) -> None:
    skewed = type("Skewed", (UnitScheduler,), attributes)
    app = make_app(["redis://127.0.0.1:9/0"], {"good": {"task": "t", "schedule": 1.0}})
    app.conf.update(conf)
    with pytest.raises(ConfigurationError, match=message):
        skewed(app)


def test_settings_accept_timedeltas_and_class_attributes() -> None:
    app = make_app(["redis://127.0.0.1:9/0"], {"good": {"task": "t", "schedule": 1.0}})
    tuned = type(
        "Tuned",
        (UnitScheduler,),
        {"redlock_beat_clock_skew": timedelta(seconds=2), "redlock_beat_claim_timeout": 0.5},
    )
    beat = tuned(app)
    assert (beat.clock_skew, beat.claim_timeout) == (2.0, 0.5)
    assert (UnitScheduler(app).clock_skew, UnitScheduler(app).claim_timeout) == (1.0, 1.0)


# -- real beats and a real worker ------------------------------------------------------

#: Seconds a process gets to start (a loaded 2-core machine is slow to import Celery).
START_TIMEOUT = 60.0


#: The time at the head of a Celery log line: ``[2027-01-15 08:00:01,234: INFO/...``
#: (local time, milliseconds cut off).
LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}):")


def logged_by(line: str) -> float:
    """A wall-clock time (epoch seconds) by which the line had been logged."""
    found = LOG_TIME.match(line)
    assert found is not None, f"no time at the head of {line!r}"
    return time.mktime(time.strptime(found[1], "%Y-%m-%d %H:%M:%S")) + (int(found[2]) + 1) / 1000


class Process(CeleryProcess):
    """One ``celery`` process, in its own process group, logging to its own file."""

    def outcomes(self) -> list[tuple[str, int]]:
        return [found for line in self.log().splitlines() if (found := outcome_of(line))]

    def claims(self) -> list[tuple[str, int, float]]:
        """(outcome, tick, logged by) per claim: the claim of tick N ran within
        [N, logged by] -- no beat claims a tick before it is due."""
        return [
            (*found, logged_by(line))
            for line in self.log().splitlines()
            if (found := outcome_of(line))
        ]

    def summary(self) -> Optional[tuple[int, int, int]]:
        """(sent, sent by another beat, missed) from the one line beat logs at exit."""
        found = SUMMARY.findall(self.log())
        assert len(found) <= 1, f"{self.name} logged its summary {len(found)} times"
        return (int(found[0][0]), int(found[0][1]), int(found[0][2])) if found else None


@dataclass
class Deployment:
    broker: RedisServer
    nodes: RedisNodes
    observer: redis.Redis
    env: dict[str, str]
    tmp_path: Path
    processes: list[Process] = field(default_factory=list)

    def _files(self, name: str) -> dict[str, Any]:
        return app_process("beatapp", self.tmp_path / f"{name}.log", self.env)

    def start_worker(self) -> Process:
        worker = Process.worker(
            name="worker",
            hostname="w1@%h",
            pool="solo",
            concurrency=1,
            **self._files("worker"),
        )
        self.processes.append(worker)
        worker.wait_ready(START_TIMEOUT)
        return worker

    def start_beat(self, name: str) -> Process:
        beat = Process.beat(
            name=name,
            schedule=self.tmp_path / f"{name}-schedule",
            pidfile=self.tmp_path / f"{name}.pid",
            **self._files(name),
        )
        self.processes.append(beat)
        return beat

    def start_beats(self, count: int) -> tuple[list[Process], float]:
        """``count`` beats, once each has claimed a tick; and the time when all had."""
        beats = [self.start_beat(f"beat{i + 1}") for i in range(count)]
        for beat in beats:
            beat.wait_for(beat.outcomes, START_TIMEOUT, "claimed a tick")
        return beats, time.time()

    def executions(self) -> tuple[int, Counter[int]]:
        """(the task's INCR counter, executions per tick header)."""
        runs = Counter(int(run.split()[0]) for run in self.observer.lrange("runs", 0, -1))
        return int(self.observer.get("executions") or 0), runs

    def drain(self, sent: int) -> tuple[int, Counter[int]]:
        """Wait until the worker has run the ``sent`` messages (or 15 s)."""
        deadline = time.monotonic() + 15
        while self.executions()[0] < sent and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # and nothing more arrives
        return self.executions()


@pytest.fixture
def deployment(
    redis_server_factory: RedisServerFactory, redis_nodes: RedisNodes, tmp_path: Path
) -> Iterator[Deployment]:
    broker = redis_server_factory()
    observer = redis_server_factory()
    env = dict(os.environ)
    env.update(
        BROKER_URL=broker.url,
        REDLOCK_NODES=",".join(redis_nodes.urls),
        OBSERVER_URL=observer.url,
        BEAT_INTERVAL="1",
    )
    client = observer.client(decode_responses=True)
    deployed = Deployment(broker, redis_nodes, client, env, tmp_path)
    try:
        yield deployed
    finally:
        for process in deployed.processes:
            process.kill()
        for process in deployed.processes:  # shown only when the test failed
            print(f"--- {process.name} log tail ---\n{process.tail()}")


def mid_bucket_after(moment: float) -> float:
    """The first half-second mark (x.5) at or after ``moment``: far from the
    boundaries where beats claim their ticks."""
    return math.ceil(moment - 0.5) + 0.5


def sleep_until(moment: float) -> float:
    time.sleep(max(0.0, moment - time.time()))
    return time.time()


def ticks(process: Process, kind: str) -> list[int]:
    return [tick for what, tick in process.outcomes() if what == kind]


@pytest.mark.slow
def test_three_beats_send_every_tick_exactly_once_even_when_one_is_killed(
    deployment: Deployment,
) -> None:
    deployment.start_worker()
    beats, ready = deployment.start_beats(3)
    kill = mid_bucket_after(ready + 8)
    killed_at = sleep_until(kill)
    beats[2].kill()
    ended_at = sleep_until(kill + 8)
    assert [beat.alive for beat in beats] == [True, True, False]
    for beat in beats[:2]:
        beat.stop()
    won = Counter(tick for beat in beats for tick in ticks(beat, "won"))
    executions, runs = deployment.drain(sum(won.values()))

    window = range(math.floor(ready) + 1, math.floor(ended_at))
    assert len(window) >= 15
    # No tick ran twice, and every run is the one beat's that won it.
    assert max(runs.values()) == 1
    assert runs == won and executions == sum(runs.values())
    # A tick of the window may be missing only where the logs say no beat sent it: no
    # beat won it (above), and none found it taken -- but the killed beat, which may
    # have won the tick it was claiming and died before sending or logging it. (A beat
    # held past a whole period by a loaded machine skips the tick: beat does not catch
    # up; one whose lock round timed out logs the tick missed.)
    killed_last = max((tick for _, tick in beats[2].outcomes()), default=0)
    missing = [tick for tick in window if runs[tick] == 0]
    for tick in missing:
        taken = [beat.name for beat in beats if tick in ticks(beat, "lost")]
        killed_claiming = killed_last < tick <= killed_at
        assert not taken or killed_claiming, f"tick {tick} found taken by {taken}, never ran"
    # Each beat claimed a tick at most once, and says so in its summary at exit.
    for beat in beats:
        claimed = [tick for _, tick in beat.outcomes()]
        assert len(claimed) == len(set(claimed)), f"{beat.name} claimed a tick twice"
    for beat in beats[:2]:
        missed = [what for what, _ in beat.outcomes() if what.startswith("missed")]
        summary = beat.summary()
        assert summary == (len(ticks(beat, "won")), len(ticks(beat, "lost")), len(missed))
    lost = sum(len(ticks(beat, "lost")) for beat in beats)
    print(
        f"\n[beat x3, kill -9 one] ticks {len(runs)} (window {len(window)}, not sent "
        f"{missing}), executions {executions}, duplicates suppressed {lost}, won per beat "
        f"{[len(ticks(b, 'won')) for b in beats]}, killed after {killed_at - ready:.1f}s "
        f"of {ended_at - ready:.1f}s"
    )


@pytest.mark.slow
def test_beats_survive_quorum_loss_and_never_send_unguarded(deployment: Deployment) -> None:
    """3 of 5 lock nodes are stopped for 3 s. Each claim is placed in time by what is
    known for sure: it ran between its tick's due time and the moment its outcome was
    logged; the outage is bracketed by the times before and after the pause and
    resume calls. A claim wholly inside the outage must be missed ("lock nodes
    unavailable"); a claim wholly outside it must not be missed; a claim across an
    edge may go either way. No tick runs twice, a tick no beat could claim while the
    nodes were up never runs, and a tick every beat claimed while they were up runs
    exactly once."""
    deployment.start_worker()
    beats, ready = deployment.start_beats(3)
    pause = mid_bucket_after(ready + 3)
    sleep_until(pause)
    pausing = time.time()
    for node in deployment.nodes[:3]:
        node.pause()
    paused_all = time.time()
    try:
        sleep_until(pause + 3)
        resuming = time.time()
    finally:
        for node in deployment.nodes[:3]:
            node.resume()
    resumed_all = time.time()
    ended_at = sleep_until(pause + 7)
    assert [beat.alive for beat in beats] == [True, True, True], "a beat died"
    for beat in beats:
        beat.stop()
    won = Counter(tick for beat in beats for tick in ticks(beat, "won"))
    executions, runs = deployment.drain(sum(won.values()))

    claims = {beat.name: beat.claims() for beat in beats}
    inside: dict[int, int] = Counter()  # tick -> claims wholly inside the outage
    outside: dict[int, int] = Counter()  # tick -> claims wholly outside it
    for name, made in claims.items():
        claimed = [tick for _, tick, _ in made]
        assert len(claimed) == len(set(claimed)), f"{name} claimed a tick twice"
        for what, tick, logged in made:
            if tick >= paused_all and logged <= resuming:
                inside[tick] += 1
                assert what == "missed: lock nodes unavailable", (name, what, tick)
            elif logged < pausing or tick >= resumed_all:
                # With all nodes up a claim is sent (won or found taken) -- or missed
                # when a loaded machine held its round past the node timeout: counted.
                outside[tick] += 1
    outage = sorted(tick for tick, count in inside.items() if count == len(beats))
    assert outage, f"no tick was claimed by every beat inside the outage: {claims}"
    assert [runs[tick] for tick in outage] == [0] * len(outage)
    window = range(math.floor(ready) + 1, math.floor(ended_at))
    up = [tick for tick in window if outside[tick] == len(beats)]
    # Of those, a tick some beat sent or found taken ran once; one every beat logged
    # missed did not run.
    sent = {tick for made in claims.values() for what, tick, _ in made if what in ("won", "lost")}
    up_sent = [tick for tick in up if tick in sent]
    assert [runs[tick] for tick in up] == [int(tick in sent) for tick in up]
    # The beats go on after the outage: a tick claimed after it was sent.
    assert [t for t in up_sent if t >= resumed_all], f"none sent after the outage: {claims}"
    assert max(runs.values()) == 1 and runs == won and executions == sum(runs.values())
    for beat in beats:
        missed = [tick for what, tick, _ in claims[beat.name] if what.startswith("missed")]
        assert beat.summary() == (len(ticks(beat, "won")), len(ticks(beat, "lost")), len(missed))
        errors = [line for line in beat.log().splitlines() if "ERROR" in line]
        assert len(errors) == len(missed), "\n".join(errors)
    lost = sum(len(ticks(beat, "lost")) for beat in beats)
    print(
        f"\n[beat x3, 3/5 nodes stopped {resuming - paused_all:.1f}s] ticks {len(runs)}, "
        f"executions {executions}, duplicates suppressed {lost}, outage ticks {outage}, "
        f"claims inside {sum(inside.values())}, outside {sum(outside.values())}"
    )


#: Entries of the one-node-down run: each is a tick a second that both beats race for.
SPLIT_ENTRIES = 5
#: Seconds the beats run with one node killed; the whole seconds judged (all but
#: the first and the last) carry SPLIT_ENTRIES x 20 = 100 ticks.
SPLIT_SECONDS = 21


def entry_outcomes(process: Process) -> list[tuple[str, str, int]]:
    """(outcome, entry, tick) of each outcome line of a beat's log."""
    found = []
    for line in process.log().splitlines():
        matched = OUTCOME.search(line)
        outcome = outcome_of(line)
        if matched is not None and outcome is not None:
            found.append((outcome[0], matched["entry"], outcome[1]))
    return found


@pytest.mark.slow
def test_two_beats_with_one_lock_node_killed_send_every_tick_exactly_once(
    deployment: Deployment,
) -> None:
    """One of 5 lock nodes is SIGKILLed; two beats race for 5 entries a second, for
    20 whole seconds: 100 ticks. The 4 live nodes are a quorum (3) and more: a vote the beats
    split 2-2 is retried, never read as an outage, so every tick runs exactly once --
    counted by the observer Redis the task reports to, not by the beats' word -- and
    no beat logs a tick missed or the lock nodes unavailable."""
    deployment.env["BEAT_ENTRIES"] = str(SPLIT_ENTRIES)
    deployment.start_worker()
    beats, _ = deployment.start_beats(2)
    deployment.nodes[0].kill()
    killed_at = time.time()
    ended_at = sleep_until(mid_bucket_after(killed_at + SPLIT_SECONDS))
    assert [beat.alive for beat in beats] == [True, True], "a beat died"
    for beat in beats:
        beat.stop()
    outcomes = [found for beat in beats for found in entry_outcomes(beat)]
    won = [(entry, tick) for what, entry, tick in outcomes if what == "won"]
    executions, _ = deployment.drain(len(won))
    runs = Counter(
        (entry, int(tick))
        for tick, entry, _ in (run.split() for run in deployment.observer.lrange("runs", 0, -1))
    )

    # The ticks due from the first whole second after the kill to the last before the end.
    window = range(math.floor(killed_at) + 1, math.floor(ended_at))
    expected = [
        (f"count{i}" if i else "count", tick) for tick in window for i in range(SPLIT_ENTRIES)
    ]
    assert len(expected) >= 100
    missed = [(what, entry, tick) for what, entry, tick in outcomes if what.startswith("missed")]
    unavailable = [line for beat in beats for line in beat.lines("lock nodes unavailable")]
    not_once = {tick: runs[tick] for tick in expected if runs[tick] != 1}
    print(
        f"\n[beat x2, lock node 1/5 killed] ticks expected {len(expected)}, sent once "
        f"{len(expected) - len(not_once)}, not once {not_once}, executions {executions}, "
        f"won per beat {[sum(1 for w, *_ in entry_outcomes(b) if w == 'won') for b in beats]}, "
        f"missed lines {len(missed)}, 'lock nodes unavailable' lines {len(unavailable)}"
    )
    assert not_once == {}, f"ticks not sent exactly once: {not_once}"
    assert max(runs.values()) == 1 and executions == sum(runs.values())
    assert missed == [], missed
    assert unavailable == [], "\n".join(unavailable[:5])
