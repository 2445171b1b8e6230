"""Ticks: the numbers every beat gives the same due instance of an entry.

Beats started at different times, or with old schedule files, must agree on which
tick an entry is due for, so a tick depends on the schedule and the clock only,
never on a beat's own ``last_run_at``:

- crontab and solar entries: the latest due time at or before now (epoch seconds);
- interval entries (a number, a timedelta, ``celery.schedules.schedule``): the time
  bucket ``floor(epoch seconds / period)``.

:func:`lock_ttl` says how long a tick's lock must live for every beat to see it.
beat.py claims ticks; this module only numbers them. Imports Celery's schedules,
validate.py and errors.py; never Redis.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any, NamedTuple, Optional

from celery.schedules import schedule as interval_schedule
from celery.utils.time import maybe_make_aware

from ..errors import ConfigurationError
from ..lock import validate

__all__ = [
    "MIN_TTL",
    "ONE_OFF_TTL",
    "Tick",
    "aware",
    "check_entry",
    "entry_tick",
    "interval_period",
    "interval_tick",
    "lock_ttl",
]

#: The shortest lock a tick gets, and the shortest interval accepted, in seconds.
#: A bucket shorter than this is within the jitter of beat itself (it wakes 10 ms
#: early by design, a lock round may take up to ``redlock_node_timeout``, a loaded
#: host sleeps late) and of ordinary clock skew between hosts, so beats would not
#: agree on which bucket they are in.
MIN_TTL = 1.0
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


class Tick(NamedTuple):
    """One due instance of an entry, as every beat numbers it."""

    #: In the lock key and the ``redlock_beat_tick`` header: epoch seconds of the due
    #: time (crontab, solar) or the bucket number (intervals).
    number: int
    #: When this tick became due, epoch seconds.
    due: float
    #: When the next tick becomes due, epoch seconds (``None``: never, a one-off).
    next_due: Optional[float]


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


def aware(moment: datetime) -> datetime:
    made: datetime = maybe_make_aware(moment)
    return made


def interval_period(entry: Any) -> Optional[float]:
    """An interval entry's period in seconds (checked), or None for other schedules."""
    schedule = entry.schedule
    if not isinstance(schedule, interval_schedule):
        return None
    run_every = schedule.run_every
    try:
        seconds = validate.seconds("interval", run_every)
    except ConfigurationError:
        raise ConfigurationError(
            f"beat entry {entry.name!r}: the interval must be a positive number of "
            f"seconds, got {run_every!r}"
        ) from None
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
    base = aware(schedule.now())
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


def interval_tick(bucket: int, period: float) -> Tick:
    return Tick(bucket, bucket * period, (bucket + 1) * period)


def entry_tick(entry: Any, now: Optional[datetime] = None) -> Tick:
    """The tick of a due ``entry`` at ``now`` (default: the entry's clock).

    Intervals: the bucket ``floor(epoch / period)`` holding now. Other schedules: the
    latest due time at or before now, found by stepping the schedule forward from a
    short look-back window (widened while it holds none): it depends on the schedule
    and now only, never on ``entry.last_run_at``, which differs between beats.
    """
    moment = aware(now if now is not None else entry.default_now())
    period = interval_period(entry)
    if period is not None:
        return interval_tick(math.floor(moment.timestamp() / period), period)
    schedule = entry.schedule
    latest: Optional[datetime] = None
    upcoming: Optional[datetime] = None
    for lookback in _LOOKBACKS:
        latest, upcoming = _scan(schedule, moment - lookback, moment)
        if latest is not None:
            break
    else:
        # A sparse schedule, long overdue: step from the entry's own last run.
        latest, upcoming = _scan(schedule, aware(entry.last_run_at), moment)
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
    if interval_period(entry) is not None:
        return
    schedule = entry.schedule
    try:
        schedule.remaining_estimate(aware(entry.default_now()))
    except (NotImplementedError, AttributeError) as exc:
        raise ConfigurationError(
            f"beat entry {entry.name!r}: schedule {schedule!r} "
            f"({type(schedule).__name__}) is not supported: its next due time cannot "
            "be computed. Accepted: an interval (a number of seconds >= "
            f"{MIN_TTL:g}, a timedelta or celery.schedules.schedule), "
            "celery.schedules.crontab, celery.schedules.solar, or a schedule whose "
            "remaining_estimate(last_run_at) gives its next due time"
        ) from exc
