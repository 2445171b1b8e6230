"""Beat: run several ``celery beat`` processes, send each due entry once per tick.

Set-up -- two (or more) beats on different hosts, the same app and lock nodes, each
with its own schedule file::

    # celeryconfig.py
    redlock_nodes = ["redis://lock1:6379/0", "redis://lock2:6379/0", "redis://lock3:6379/0"]

    host-a$ celery -A proj beat -S redlock --schedule /var/lib/beat/schedule
    host-b$ celery -A proj beat -S redlock --schedule /var/lib/beat/schedule

A database-backed scheduler gets the same behaviour from the mixin::

    from celery_redlock.beat import RedlockSchedulerMixin

    class LockedDatabaseScheduler(RedlockSchedulerMixin, DatabaseScheduler):
        pass

What happens per tick: every beat evaluates every entry as usual. When an entry is
due, the beat works out its *tick*, a number every beat agrees on, and tries to win
the lock ``{redlock_key_prefix}:beat:{entry name}:{tick}`` (one Redlock round):

- crontab and solar entries: the tick is the latest due time at or before now (epoch
  seconds), derived from the schedule alone -- not from this beat's ``last_run_at`` --
  so beats started at different times, or one with an old schedule file, agree;
- interval entries (a number, a timedelta, ``celery.schedules.schedule``): the tick
  is the time bucket ``floor(epoch seconds / period)``, and the entry becomes due on
  every beat just after each bucket boundary, whenever that beat started;
- the winner sends the task with the headers ``redlock_beat_tick`` (the tick) and
  ``redlock_beat_entry`` (the entry name) beside Celery's ``celery_beat_task``, and
  logs an INFO line; every other beat logs one INFO line "sent by another beat" with
  the holder. The lock is never released: it expires a little after the next tick
  is due (see :func:`lock_ttl`), long after every beat has evaluated this tick.

What happens when the lock nodes lose their quorum (a majority down or hung): no
beat can win a tick, so none is sent -- never unguarded. Each beat logs one ERROR
per missed tick ("not sent: lock nodes unavailable"), counts it in
``scheduler.missed_ticks`` and keeps running; the first tick after the nodes come
back is sent as usual. Missed ticks are not caught up (Celery does not either).

Settings (seconds; a scheduler subclass may set them as class attributes instead):
``redlock_beat_clock_skew`` (default 1.0) and ``redlock_beat_claim_timeout``
(default 1.0). The lock nodes, key prefix and ``redlock_node_timeout`` are the app's
``redlock_*`` settings. At start, beat refuses with a ConfigurationError naming the
entry an interval that is not positive or shorter than ``MIN_TTL`` (1 s), and a
schedule whose next due time cannot be computed.

This module talks to Redis only through :class:`~celery_redlock.redlock.Redlock`
(``config.app_config(app).redlock(...)``), and imports no task code.
"""

from __future__ import annotations

import heapq
import logging
import math
import os
import random
import socket
import time
from datetime import datetime, timedelta, timezone
from enum import Enum
from typing import TYPE_CHECKING, Any, NamedTuple, Optional

from celery.beat import PersistentScheduler
from celery.schedules import schedstate
from celery.schedules import schedule as interval_schedule
from celery.utils.time import maybe_make_aware

from .config import DEFAULTS, app_config
from .errors import ConfigurationError, LockContended, QuorumUnavailable
from .redlock import Lease, Redlock

__all__ = [
    "DEFAULT_CLAIM_TIMEOUT",
    "DEFAULT_CLOCK_SKEW",
    "ENTRY_HEADER",
    "MIN_TTL",
    "TICK_HEADER",
    "RedlockScheduler",
    "RedlockSchedulerMixin",
    "Tick",
    "lock_ttl",
]

logger = logging.getLogger(__name__)

#: Message header carrying the tick a beat sent the task for (an int).
TICK_HEADER = "redlock_beat_tick"
#: Message header carrying the name of the beat entry that sent the task.
ENTRY_HEADER = "redlock_beat_entry"

#: The shortest lock a tick gets, and the shortest interval accepted, in seconds.
#: A bucket shorter than this is within the jitter of beat itself (it wakes 10 ms
#: early by design, a lock round may take up to ``redlock_node_timeout``, a loaded
#: host sleeps late) and of ordinary clock skew between hosts, so beats would not
#: agree on which bucket they are in.
MIN_TTL = 1.0
#: Default of ``redlock_beat_clock_skew``, seconds: how far the beats' wall clocks
#: may disagree (plus how long a beat may stall between working out a tick and its
#: lock round). NTP keeps hosts within milliseconds; this is generous on purpose.
DEFAULT_CLOCK_SKEW: float = DEFAULTS["redlock_beat_clock_skew"]
#: Default of ``redlock_beat_claim_timeout``, seconds: how long a beat keeps trying
#: when a lock round for a tick was split between beats and nobody won a quorum.
DEFAULT_CLAIM_TIMEOUT: float = DEFAULTS["redlock_beat_claim_timeout"]
#: Seconds after a bucket boundary at which interval entries are evaluated: more than
#: the 10 ms that Celery's ``Scheduler.adjust`` takes off every sleep, so a beat wakes
#: just after the boundary rather than spinning up to it.
BOUNDARY_DELAY = 0.02
#: Lock TTL of a tick whose schedule has no next due time (a one-off), seconds.
ONE_OFF_TTL = 24 * 3600.0

# Windows searched back from now for the latest due time of a crontab or solar
# entry: the first non-empty one is short, so few schedule steps are evaluated.
_LOOKBACKS = (
    timedelta(minutes=1),
    timedelta(hours=1),
    timedelta(days=1),
    timedelta(days=32),
    timedelta(days=367),
)
_MAX_STEPS = 10_000
# remaining_estimate() reads the clock itself, so a computed due time can be a few
# microseconds early: step past it by more than that.
_STEP = timedelta(milliseconds=1)

if TYPE_CHECKING:
    from celery.beat import Scheduler as _SchedulerBase
else:
    _SchedulerBase = object


class Tick(NamedTuple):
    """One due instance of an entry, as every beat numbers it."""

    #: In the lock key and the ``redlock_beat_tick`` header: epoch seconds of the due
    #: time (crontab, solar) or the bucket number (intervals).
    number: int
    #: When this tick became due, epoch seconds.
    due: float
    #: When the next tick becomes due, epoch seconds (``None``: never, a one-off).
    next_due: Optional[float]


class Outcome(Enum):
    SENT = "sent"
    LOST = "sent by another beat"
    MISSED = "missed"


def lock_ttl(tick: Tick, now: float, clock_skew: float) -> float:
    """How long the lock of ``tick`` lives when taken at ``now`` (epoch seconds).

    A beat evaluates a tick at any moment until the next tick is due on *its* clock:
    late because it was busy or stalled, or because it just started with an old
    schedule file. Beat clocks disagree by up to ``clock_skew``. The lock must still
    be there for every such beat, so it lives until the next tick is due plus the
    skew: ~2 s for a 1 s interval, a day and a second for a daily crontab. It never
    blocks the next tick, which has another key; and a beat that looks later than
    that works out the next tick, not this one. At least MIN_TTL.
    """
    if tick.next_due is None:
        return max(MIN_TTL, ONE_OFF_TTL)
    return max(MIN_TTL, tick.next_due - now + clock_skew)


def _aware(moment: datetime) -> datetime:
    aware: datetime = maybe_make_aware(moment)
    return aware


def _iso(epoch: float) -> str:
    spec = "seconds" if float(epoch).is_integer() else "milliseconds"
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec=spec)


def _period(entry: Any) -> Optional[float]:
    """An interval entry's period in seconds (checked), or None for other schedules."""
    schedule = entry.schedule
    if not isinstance(schedule, interval_schedule):
        return None
    run_every = schedule.run_every
    seconds = run_every.total_seconds() if isinstance(run_every, timedelta) else float(run_every)
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigurationError(
            f"beat entry {entry.name!r}: the interval must be a positive number of "
            f"seconds, got {run_every!r}"
        )
    if seconds < MIN_TTL:
        raise ConfigurationError(
            f"beat entry {entry.name!r}: an interval of {seconds:g}s is shorter than "
            f"{MIN_TTL:g}s, the shortest the redlock scheduler accepts (beats could not "
            "agree on shorter time buckets); use an interval of at least "
            f"{MIN_TTL:g}s or a crontab"
        )
    return seconds


def _next_after(schedule: Any, after: datetime) -> datetime:
    """The schedule's first due time after ``after`` (to within microseconds:
    ``remaining_estimate`` reads the clock itself)."""
    base = _aware(schedule.now())
    upcoming: datetime = base + schedule.remaining_estimate(after)
    return upcoming


def _scan(
    schedule: Any, start: datetime, now: datetime
) -> tuple[Optional[datetime], Optional[datetime]]:
    """(the latest due time in (start, now], the first one after now) -- either None
    when there is none; the second also when the schedule stops advancing."""
    latest: Optional[datetime] = None
    after = start
    for _ in range(_MAX_STEPS):
        upcoming = _next_after(schedule, after)
        if upcoming <= after:
            return latest, None  # does not advance: a one-off
        if upcoming > now:
            return latest, upcoming
        latest = upcoming
        after = upcoming + _STEP
    return latest, None


def _interval_tick(bucket: int, period: float) -> Tick:
    return Tick(bucket, bucket * period, (bucket + 1) * period)


def entry_tick(entry: Any, now: Optional[datetime] = None) -> Tick:
    """The tick of a due ``entry`` at ``now`` (default: the entry's clock).

    Intervals: the bucket ``floor(epoch / period)`` holding now. Other schedules: the
    latest due time at or before now, found by stepping the schedule forward from a
    short look-back window (widened while it holds none): it depends on the schedule
    and now only, never on ``entry.last_run_at``, which differs between beats.
    """
    moment = _aware(now if now is not None else entry.default_now())
    period = _period(entry)
    if period is not None:
        return _interval_tick(math.floor(moment.timestamp() / period), period)
    schedule = entry.schedule
    latest: Optional[datetime] = None
    upcoming: Optional[datetime] = None
    for lookback in _LOOKBACKS:
        latest, upcoming = _scan(schedule, moment - lookback, moment)
        if latest is not None:
            break
    else:
        # A sparse schedule, long overdue: step from the entry's own last run.
        latest, upcoming = _scan(schedule, _aware(entry.last_run_at), moment)
    if latest is None:
        raise ConfigurationError(
            f"beat entry {entry.name!r}: its schedule {schedule!r} is due but reports no "
            "due time at or before now, so beats cannot agree on a tick"
        )
    due = float(round(latest.timestamp()))
    return Tick(int(due), due, None if upcoming is None else upcoming.timestamp())


def check_entry(entry: Any) -> None:
    """Raise ConfigurationError, naming ``entry``, when the redlock scheduler cannot
    number its ticks."""
    if _period(entry) is not None:
        return
    schedule = entry.schedule
    try:
        schedule.remaining_estimate(_aware(entry.default_now()))
    except (NotImplementedError, AttributeError) as exc:
        raise ConfigurationError(
            f"beat entry {entry.name!r}: schedule {schedule!r} "
            f"({type(schedule).__name__}) is not supported: its next due time cannot "
            "be computed. Accepted: an interval (a number of seconds >= "
            f"{MIN_TTL:g}, a timedelta or celery.schedules.schedule), "
            "celery.schedules.crontab, celery.schedules.solar, or a schedule whose "
            "remaining_estimate(last_run_at) gives its next due time"
        ) from exc


def _duration_setting(app: Any, owner: object, name: str, default: float, positive: bool) -> float:
    """A beat duration from the class attribute, else the app setting, else default."""
    value = getattr(owner, name, None)
    source = f"{type(owner).__name__}.{name}"
    if value is None:
        value, source = app.conf.get(name), name
    if value is None:
        return default
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, (int, float))
        or not math.isfinite(seconds)
        or seconds < 0
        or (positive and seconds == 0)
    ):
        bound = "> 0" if positive else ">= 0"
        raise ConfigurationError(
            f"{source} must be a number of seconds {bound} (int, float or timedelta), "
            f"got {type(value).__name__}: {value!r}"
        )
    return float(seconds)


class RedlockSchedulerMixin(_SchedulerBase):  # type: ignore[misc]
    """Makes any Celery ``Scheduler`` send each due entry once per tick across beats.

    Put it first: ``class MyScheduler(RedlockSchedulerMixin, SomeScheduler)``. It
    overrides ``is_due``, ``populate_heap`` and ``tick`` (interval entries become due
    just after bucket boundaries), ``apply_entry`` (win the tick's lock, then send
    through the base class), ``setup_schedule`` (reject entries it cannot tick) and
    ``close`` (a summary line). Entries sent by other means (``apply_async`` called
    directly) are not guarded.

    Counters: ``sent_ticks``, ``lost_ticks`` (sent by another beat), ``missed_ticks``.
    """

    #: Seconds the beats' clocks may disagree; the lock of a tick outlives the next
    #: tick's due time by this much. None: the ``redlock_beat_clock_skew`` setting,
    #: default 1.0.
    redlock_beat_clock_skew: Optional[float] = None
    #: Seconds a beat keeps retrying a tick whose lock round was split between beats
    #: (nobody won a quorum) before it gives the tick up as missed. None: the
    #: ``redlock_beat_claim_timeout`` setting, default 1.0.
    redlock_beat_claim_timeout: Optional[float] = None

    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        # Before the base __init__: it calls setup_schedule(), which checks entries.
        self.clock_skew = _duration_setting(
            app, self, "redlock_beat_clock_skew", DEFAULT_CLOCK_SKEW, positive=False
        )
        self.claim_timeout = _duration_setting(
            app, self, "redlock_beat_claim_timeout", DEFAULT_CLAIM_TIMEOUT, positive=True
        )
        config = app_config(app)  # bad redlock_* settings fail at beat start
        self.node_timeout = config.task_defaults.node_timeout
        if self.node_timeout >= MIN_TTL / 2:
            raise ConfigurationError(
                f"redlock_node_timeout ({self.node_timeout:g}s) is too long for beat: "
                f"a tick's lock round must fit well within {MIN_TTL:g}s; keep it below "
                f"{MIN_TTL / 2:g}s"
            )
        #: Ticks this beat won and sent.
        self.sent_ticks = 0
        #: Ticks another beat had won ("sent by another beat").
        self.lost_ticks = 0
        #: Ticks not sent by anyone as far as this beat knows (lock nodes unavailable,
        #: or no beat won the lock in time).
        self.missed_ticks = 0
        self._due_ticks: dict[str, Tick] = {}
        self._summarized: Optional[tuple[int, int, int]] = None
        # (entry name, heap time) of the interval entry the current tick sent.
        self._realign: Optional[tuple[str, float]] = None
        self._claimed_buckets: dict[str, tuple[float, int]] = {}
        super().__init__(app, *args, **kwargs)

    # -- the schedule ------------------------------------------------------------------

    def setup_schedule(self) -> None:
        super().setup_schedule()
        for entry in list(self.schedule.values()):
            check_entry(entry)

    def is_due(self, entry: Any) -> Any:
        """The base class's answer, with interval entries due at bucket boundaries.

        An interval entry's own ``last_run_at`` drifts with the moment this beat
        started: two beats could look at 10.95 and 11.05 and claim buckets 10 and 11,
        or one could skip a bucket. So the entry is asked as if it last ran at the
        start of the last bucket this beat claimed: it becomes due at the next
        boundary (an entry's own conditions, e.g. a database scheduler's
        ``enabled``, still apply), and every next check is set ``BOUNDARY_DELAY``
        after the following boundary.
        """
        period = _period(entry)
        if period is None:
            return super().is_due(entry)
        now = _aware(entry.default_now()).timestamp()
        bucket = math.floor(now / period)
        last = self._last_bucket(entry, period)
        saved = entry.last_run_at
        entry.last_run_at = datetime.fromtimestamp(last * period, timezone.utc)
        try:
            state = super().is_due(entry)
        finally:
            entry.last_run_at = saved
        if state[0] and bucket > last:
            self._due_ticks[entry.name] = _interval_tick(bucket, period)
            return schedstate(True, (bucket + 1) * period - now + BOUNDARY_DELAY)
        if bucket <= last:  # the next bucket has not begun: look just after it does
            return schedstate(False, (last + 1) * period - now + BOUNDARY_DELAY)
        return schedstate(False, state[1])

    def populate_heap(self, *args: Any, **kwargs: Any) -> None:
        """The base class's heap, with interval entries placed by ``is_due`` above:
        so even a beat's first look at an entry lands just after a boundary."""
        super().populate_heap(*args, **kwargs)
        heap = self._heap
        for index, event in enumerate(heap):
            entry = event[2]
            try:
                if _period(entry) is None:
                    continue
                due, next_check = self.is_due(entry)
            except Exception:  # the base class reports it when the entry comes up
                continue
            heap[index] = type(event)(self._when(entry, 0 if due else next_check), *event[1:])
        heapq.heapify(heap)

    def tick(self, *args: Any, **kwargs: Any) -> Any:
        """The base class's tick; then an interval entry just sent is put back on
        the heap for just after its next boundary. The base class counts the next
        check from when the send *finished*, so a slow lock round (a hung node
        costs up to ``redlock_node_timeout``) would push every later look at the
        entry that much past the boundary."""
        self._realign = None
        delay = super().tick(*args, **kwargs)
        heap = getattr(self, "_heap", None)
        if self._realign is not None and heap:
            name, wake = self._realign
            for index, event in enumerate(heap):
                if event[2].name == name and event[0] > wake:
                    heap[index] = type(event)(wake, *event[1:])
                    heapq.heapify(heap)
                    break
        return delay

    def _last_bucket(self, entry: Any, period: float) -> int:
        claimed = self._claimed_buckets.get(entry.name)
        if claimed is not None and claimed[0] == period:
            return claimed[1]
        last_run_at = entry.last_run_at or entry.default_now()
        return math.floor(_aware(last_run_at).timestamp() / period)

    # -- sending -------------------------------------------------------------------------

    def lock_key(self, entry: Any, tick: Tick) -> str:
        """``{prefix}:beat:{entry name}:{tick number}``."""
        return f"{app_config(self.app).key_prefix}:beat:{entry.name}:{tick.number}"

    @property
    def redlock(self) -> Redlock:
        return app_config(self.app).redlock(self.node_timeout, False)

    def apply_entry(self, entry: Any, producer: Any = None) -> None:
        """Send ``entry`` if this beat wins its tick's lock; never raises."""
        name = entry.name
        try:
            tick = self._tick_to_claim(entry)
        except Exception as exc:
            self.missed_ticks += 1
            logger.error("beat tick not sent: entry %r: %s", name, exc, exc_info=True)
            return
        key = self.lock_key(entry, tick)
        due = _iso(tick.due)
        try:
            outcome, detail = self._claim(entry, tick, key)
        except Exception as exc:
            outcome, detail = Outcome.MISSED, f"lock round failed: {type(exc).__name__}: {exc}"
            logger.debug("claim of %s failed", key, exc_info=True)
        if outcome is Outcome.LOST:
            self.lost_ticks += 1
            logger.info(
                "beat tick sent by another beat: entry %r tick %d (due %s) key %s holder %s",
                name, tick.number, due, key, detail,
            )  # fmt: skip
            return
        if outcome is Outcome.MISSED:
            self.missed_ticks += 1
            reason, _, why = detail.partition(": ")
            logger.error(
                "beat tick not sent: %s: entry %r tick %d (due %s) key %s; "
                "%d tick(s) missed so far (%s)",
                reason, name, tick.number, due, key, self.missed_ticks, why,
            )  # fmt: skip
            return
        self.sent_ticks += 1
        logger.info(
            "beat tick won: entry %r tick %d (due %s) key %s; sending",
            name, tick.number, due, key,
        )  # fmt: skip
        self._send(entry, tick, producer)

    def _tick_to_claim(self, entry: Any) -> Tick:
        now = _aware(entry.default_now())
        tick = self._due_ticks.pop(entry.name, None)
        if tick is None or (tick.next_due is not None and now.timestamp() >= tick.next_due):
            tick = entry_tick(entry, now)  # is_due was not asked, or long ago
        period = _period(entry)
        if period is not None and tick.next_due is not None:
            self._claimed_buckets[entry.name] = (period, tick.number)
            self._realign = (entry.name, tick.next_due + self.adjust(BOUNDARY_DELAY))
        return tick

    def _claim(self, entry: Any, tick: Tick, key: str) -> tuple[Outcome, str]:
        """Win the lock of ``tick``: (SENT, ""), (LOST, holder) or (MISSED, "reason:
        details")."""
        redlock = self.redlock
        holder = f"beat@{socket.gethostname()}:{os.getpid()}"
        started = time.monotonic()
        give_up = started + self.claim_timeout
        if tick.next_due is not None:
            # Past the next tick's due time this tick is stale: let that one go out.
            give_up = min(give_up, started + tick.next_due - self._now(entry))
        while True:
            now = self._now(entry)
            ttl = lock_ttl(tick, now, self.clock_skew)
            try:
                lease = redlock.try_acquire(key, ttl=ttl, blocking=False, holder=holder)
            except QuorumUnavailable as exc:
                return Outcome.MISSED, f"lock nodes unavailable: {exc}"
            except LockContended as exc:
                # Someone holds it -- or the beats split the nodes between them and
                # each released its share. Only a quorum holder has sent it.
                winner = redlock.holder(key).holder
                if winner is not None:
                    return Outcome.LOST, winner
                if time.monotonic() >= give_up:
                    return Outcome.MISSED, (
                        "no beat won the lock: split between beats for "
                        f"{time.monotonic() - started:.2f}s, last refused by "
                        f"{exc.holder or 'unknown'}"
                    )
                logger.debug("beat tick lock split between beats, retrying: key %s", key)
                time.sleep(random.uniform(0.005, 0.03))
                continue
            return self._check_won(entry, tick, lease)

    def _check_won(self, entry: Any, tick: Tick, lease: Lease) -> tuple[Outcome, str]:
        # A beat stalled between working out the tick and winning it may have won a
        # lock that the other beats' copies had already outlived: do not send then.
        if not lease.held:
            return Outcome.MISSED, "lock validity ran out before sending: stalled beat"
        if tick.next_due is not None and self._now(entry) >= tick.next_due + self.clock_skew:
            return Outcome.MISSED, "won too late: the other beats' locks may have expired"
        return Outcome.SENT, ""

    def _send(self, entry: Any, tick: Tick, producer: Any) -> None:
        # Through the base class (its logging, error handling, sync), with the tick in
        # the headers: on a copy of the options, so neither the entry nor a persisted
        # schedule keeps them.
        options = entry.options
        headers = dict(options.get("headers") or {})
        headers[TICK_HEADER] = tick.number
        headers[ENTRY_HEADER] = entry.name
        entry.options = {**options, "headers": headers}
        try:
            super().apply_entry(entry, producer=producer)
        finally:
            entry.options = options

    @staticmethod
    def _now(entry: Any) -> float:
        return _aware(entry.default_now()).timestamp()

    # -- the rest --------------------------------------------------------------------------

    @property
    def info(self) -> str:
        config = app_config(self.app)
        lines = [
            super().info,
            f"    . redlock -> {len(config.nodes)} lock node(s), keys "
            f"{config.key_prefix}:beat:<entry>:<tick>",
        ]
        return "\n".join(line for line in lines if line)

    def close(self) -> None:
        # Celery closes twice on SIGTERM (its signal handler, then beat's finally).
        counts = (self.sent_ticks, self.lost_ticks, self.missed_ticks)
        if counts != self._summarized:
            self._summarized = counts
            logger.info("beat ticks: %d sent, %d sent by another beat, %d missed", *counts)
        super().close()


class RedlockScheduler(RedlockSchedulerMixin, PersistentScheduler):  # type: ignore[misc]
    """Celery's default scheduler (a shelve file per beat) with the mixin:
    ``celery beat -S redlock``."""
