"""Beat: run several ``celery beat`` processes, send each due entry once per tick.

Set-up -- two (or more) beats on different hosts, the same app and lock nodes, each
with its own schedule file::

    # celeryconfig.py
    redlock_nodes = ["redis://lock1:6379/0", "redis://lock2:6379/0", "redis://lock3:6379/0"]

    host-a$ celery -A proj beat -S redlock --schedule /var/lib/beat/schedule
    host-b$ celery -A proj beat -S redlock --schedule /var/lib/beat/schedule

A database-backed scheduler gets the same behaviour from the mixin (put it first)::

    from celery_redlock.beat import RedlockSchedulerMixin

    class LockedDatabaseScheduler(RedlockSchedulerMixin, DatabaseScheduler):
        pass

django-celery-beat's is ready-made:
``-S celery_redlock.contrib.django_celery_beat:RedlockDatabaseScheduler``.

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

What happens when beats race for a tick and split the nodes so that none wins a
quorum -- with all nodes up, or with a minority down (one of five: the other four
split 2-2): the round's verdict is a split, not an outage
(lock/acquire_replies.py), and each beat tries again after a short random pause
until one wins or ``redlock_beat_claim_timeout`` has passed; only then is the tick
logged as missed ("no beat won the lock: split between beats").

What happens when the lock nodes lose their quorum (a majority down or hung): no
beat can win a tick, so none is sent -- never unguarded. Each beat logs one ERROR
per missed tick ("not sent: lock nodes unavailable"), counts it in
``scheduler.missed_ticks`` and keeps running; the first tick after the nodes come
back is sent as usual. Missed ticks are not caught up (Celery does not either).

Settings (seconds; a scheduler subclass may set them as class attributes instead):
``redlock_beat_clock_skew`` and ``redlock_beat_claim_timeout`` (defaults and
meaning in options.py and docs/guides/configuration.md). The lock nodes, key prefix and
``redlock_node_timeout`` are the app's ``redlock_*`` settings. At start, beat
refuses with a ConfigurationError naming the entry an interval that is not
positive or shorter than ``MIN_TTL`` (1 s), and a schedule whose next due time
cannot be computed.

How ticks are numbered is in ticks.py; this module claims and sends them. It talks
to Redis only through :class:`~celery_redlock.Redlock`
(``config.app_config(app).redlock(...)``, and contention.py for split votes), and
imports no task code.
"""

from __future__ import annotations

import heapq
import logging
import math
import os
import socket
import time
from datetime import datetime, timezone
from enum import Enum
from typing import TYPE_CHECKING, Any, Optional

from celery.beat import PersistentScheduler
from celery.schedules import schedstate

from .errors import ConfigurationError, QuorumUnavailable
from .lock.redlock import Lease, Redlock
from .tasks.config import app_config
from .tasks.contention import Refused, acquire_confirmed
from .tasks.headers import ENTRY_HEADER, TICK_HEADER
from .tasks.options import DEFAULTS, checked
from .tasks.ticks import (
    MIN_TTL,
    Tick,
    aware,
    check_entry,
    entry_tick,
    interval_period,
    interval_tick,
    lock_ttl,
)

__all__ = [
    "DEFAULT_CLAIM_TIMEOUT",
    "DEFAULT_CLOCK_SKEW",
    "ENTRY_HEADER",
    "MIN_TTL",
    "TICK_HEADER",
    "RedlockScheduler",
    "RedlockSchedulerMixin",
    "Tick",
    "check_entry",
    "entry_tick",
    "lock_ttl",
]

logger = logging.getLogger(__name__)

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

if TYPE_CHECKING:
    from celery.beat import Scheduler as _SchedulerBase
else:
    _SchedulerBase = object


class Outcome(Enum):
    SENT = "sent"
    LOST = "sent by another beat"
    MISSED = "missed"


def _iso(epoch: float) -> str:
    spec = "seconds" if float(epoch).is_integer() else "milliseconds"
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec=spec)


def _duration_setting(app: Any, owner: object, name: str) -> float:
    """A beat duration from the class attribute, else the app setting, else default."""
    value = getattr(owner, name, None)
    source = f"{type(owner).__name__}.{name}"
    if value is None:
        value, source = app.conf.get(name), name
    if value is None:
        value = DEFAULTS[name]
    seconds: float = checked(name, value, shown_as=source)
    return seconds


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

    #: Seconds; overrides the ``redlock_beat_clock_skew`` setting (see options.py).
    redlock_beat_clock_skew: Optional[float] = None
    #: Seconds; overrides the ``redlock_beat_claim_timeout`` setting (see options.py).
    redlock_beat_claim_timeout: Optional[float] = None

    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        # Before the base __init__: it calls setup_schedule(), which checks entries.
        self.clock_skew = _duration_setting(app, self, "redlock_beat_clock_skew")
        self.claim_timeout = _duration_setting(app, self, "redlock_beat_claim_timeout")
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
        period = interval_period(entry)
        if period is None:
            return super().is_due(entry)
        now = aware(entry.default_now()).timestamp()
        bucket = math.floor(now / period)
        last = self._last_bucket(entry, period)
        saved = entry.last_run_at
        entry.last_run_at = datetime.fromtimestamp(last * period, timezone.utc)
        try:
            state = super().is_due(entry)
        finally:
            entry.last_run_at = saved
        if state[0] and bucket > last:
            self._due_ticks[entry.name] = interval_tick(bucket, period)
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
                if interval_period(entry) is None:
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
        return math.floor(aware(last_run_at).timestamp() / period)

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
        now = aware(entry.default_now())
        tick = self._due_ticks.pop(entry.name, None)
        if tick is None or (tick.next_due is not None and now.timestamp() >= tick.next_due):
            tick = entry_tick(entry, now)  # is_due was not asked, or long ago
        period = interval_period(entry)
        if period is not None and tick.next_due is not None:
            self._claimed_buckets[entry.name] = (period, tick.number)
            self._realign = (entry.name, tick.next_due + self.adjust(BOUNDARY_DELAY))
        return tick

    def _claim(self, entry: Any, tick: Tick, key: str) -> tuple[Outcome, str]:
        """Win the lock of ``tick``: (SENT, ""), (LOST, holder) or (MISSED, "reason:
        details")."""
        holder = f"beat@{socket.gethostname()}:{os.getpid()}"
        started = time.monotonic()
        give_up = started + self.claim_timeout
        if tick.next_due is not None:
            # Past the next tick's due time this tick is stale: let that one go out.
            give_up = min(give_up, started + tick.next_due - self._now(entry))
        try:
            result = acquire_confirmed(
                self.redlock,
                key,
                lambda: lock_ttl(tick, self._now(entry), self.clock_skew),
                holder,
                give_up,
                pause=(0.005, 0.03),
                on_split=lambda: logger.debug(
                    "beat tick lock split between beats, retrying: key %s", key
                ),
            )
        except QuorumUnavailable as exc:
            return Outcome.MISSED, f"lock nodes unavailable: {exc}"
        if not isinstance(result, Refused):
            self.redlock.hand_over(result)  # left to expire: this thread holds nothing
            return self._check_won(entry, tick, result)
        # Only a quorum holder has sent it; else the beats split the nodes between
        # them and each released its share.
        if result.holder is not None:
            return Outcome.LOST, result.holder
        return Outcome.MISSED, (
            "no beat won the lock: split between beats for "
            f"{time.monotonic() - started:.2f}s, last refused by "
            f"{result.last.holder or 'unknown'}"
        )

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
        return aware(entry.default_now()).timestamp()

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
