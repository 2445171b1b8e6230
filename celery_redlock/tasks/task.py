"""RedlockTask: Celery tasks that never run twice at once for the same key.

Worker side -- declare the task with the base class (or the decorator)::

    from celery_redlock import RedlockTask, redlock_task

    @app.task(base=RedlockTask, redlock_key="import:{customer_id}", redlock_ttl=60)
    def import_customer(customer_id, full=False):
        ...

    @redlock_task(app, bind=True, redlock_on_contended="skip")
    def nightly_report(self):
        for chunk in chunks():
            self.redlock.ensure_held()          # raises LockLost if the lock was lost
            write(chunk, fence=self.redlock.fence)

Caller side -- nothing changes: ``import_customer.delay(42)``. A duplicate that finds
the lock taken is retried later (``"retry"``, the default), skipped (``"skip"``) or
failed with ``LockContended`` (``"fail"``); the worker logs one WARNING line per
contention naming the task, key, holder and what happens next. A skipped copy does not
run its body and ends SUCCESS with the ``Skipped`` marker as its value (skipped.py), so
``.get()``, groups, chords and links go on at once. A copy that meets its own task
id's lock (a redelivery) waits for that earlier run in every mode, and runs only if it
finished nothing (redelivery.py).

What happens to the lock when:

- the task returns or raises: released in ``after_return``;
- the task calls ``self.retry()`` (or ``autoretry_for`` does): released *before* the
  retry is published, so the next attempt finds the lock free;
- the task raises ``Ignore`` / ``Reject``: released by the ``task_postrun`` handler;
- the task hits its hard time limit or is revoked with ``terminate=True``: billiard
  sends SIGTERM first, ``SystemExit`` stops the body, and the ``task_postrun``
  handler releases the lock after it (renewal is bounded by the limit + one TTL);
- the worker child is SIGKILLed (OOM killer, a child that ignores SIGTERM): the
  child and its watchdog die, nothing is released, and the lock frees itself within
  ``redlock_ttl`` (the renewal stops at once);
- the message is redelivered (``acks_late``, visibility timeout, a killed child)
  while the first execution holds the lock: the redelivery does not share its token,
  meets the held lock and waits for it, then runs only if no result was stored;
- revoke before start: the task never ran, so it never held the lock.

Queue once (``redlock_dedupe_queued=True``): ``delay`` / ``apply_async`` (and beat,
which calls them) first take a "queued" lock keyed like the run-time lock plus
``:queued``, holding the new task id. A duplicate enqueue gets the queued copy's
``AsyncResult`` back (or ``AlreadyQueued``, with ``redlock_on_queued="raise"``) and
publishes nothing. When the queued copy wins its run-time lock, it hands the queued
lock back, so one running + one queued copy is possible; revoke hands it back too, and
a lost message frees it after ``redlock_queued_ttl``. ``app.send_task("name")`` does
not go through the task class and is not de-duplicated.

The lock is taken in ``before_start``, which Celery runs for every delivery and for
``apply()`` / ``task_always_eager``, not for a direct call ``task(x)`` (that runs
inline, unlocked, as Celery calls it without its hooks). Eager mode has no broker to
retry through: a contended copy waits inline, for at most the holder's remaining TTL
as first seen, and an outage of the lock nodes fails the call at once.

Per-execution state lives on ``self.request`` (one Context per run, per thread), never
on ``self``, which the threads pool shares. Each run is one *execution* for
reentrancy: the body may take the task's own key again with
``app_config(app).redlock(...).acquire(key, reentrant=True)`` (one more hold of the
task's lease), and without ``reentrant=True`` gets ``AlreadyHeld`` at once.
"""

from __future__ import annotations

import inspect
import logging
import os
import socket
import time
from typing import Any, Callable, Optional

from celery import Task
from celery.signals import task_postrun, task_revoked
from celery.utils import uuid

from .. import signals
from ..errors import ConfigurationError, LockContended, QuorumUnavailable
from ..lock import reentry
from ..lock.redlock import Lease
from ..lock.watchdog import get_watchdog
from ..skipped import SKIPPED, is_skipped, skipped_result
from . import cooldown, limits, queue_once, redelivery, replace, tick_once
from . import handoff as waiting
from .call_options import once_task_options
from .config import app_config
from .contention import SPLIT_VOTE_PATIENCE, report, retry_countdown, verdict
from .headers import RETRIES_HEADER, header
from .keys import lock_key, validate_spec
from .options import (
    OPTIONS,
    TASK_OPTIONS,
    TaskAttribute,
    TaskOptions,
    check_task_names,
)

__all__ = ["SKIPPED", "RedlockTask", "is_skipped", "redlock_task", "retry_countdown"]

# The name the logger had before the package was split into folders: users filter on it.
logger = logging.getLogger("celery_redlock.task")


def _static_option(task: Any, name: str) -> Any:
    """A class attribute as declared: a function given as redlock_key must not bind."""
    value = inspect.getattr_static(task, name, None)
    if isinstance(value, (staticmethod, classmethod)):
        return value.__func__
    if isinstance(value, TaskAttribute):
        return None  # not set by the task: the app setting applies
    return value


def _read_once(task_name: str, once: Any, declared: dict[str, Any]) -> None:
    """celery-once's ``once = {...}`` class attribute as the options it stands for."""
    if once is None:
        return
    for name, value in once_task_options(task_name, once).items():
        if declared[name] is not None:
            raise ConfigurationError(
                f"task {task_name}: {name} is set both as a class attribute and through "
                f"celery-once's once = {{...}}; keep one"
            )
        declared[name] = value


class RedlockTask(Task):  # type: ignore[misc]
    """A Celery task that holds a Redlock, keyed on its arguments, while it runs.

    Every ``redlock_*`` option (options.TASK_OPTIONS, each documented on its class
    attribute and in docs/guides/configuration.md) defaults to the app-wide setting
    of the same name; set it per task with ``@app.task(base=RedlockTask, ...)``.
    """

    # -- what the task body sees ------------------------------------------------------

    @property
    def redlock(self) -> Optional[Lease]:
        """This execution's Lease (``None`` outside a locked execution)."""
        return getattr(self.request, "redlock_lease", None)

    def lock_key(self, args: Any = (), kwargs: Any = None) -> str:
        """The lock key of a call with these arguments (same at enqueue and run time)."""
        options = self.redlock_options()
        config = app_config(self.app)
        return lock_key(
            self.name,
            self.run,
            tuple(args or ()),
            dict(kwargs or {}),
            prefix=config.key_prefix,
            spec=options.key,
            max_bytes=config.key_max_bytes,
        )

    def redlock_options(self) -> TaskOptions:
        """This task's validated lock options (raises ConfigurationError naming a bad one).

        Validated on first use and cached on the task instance (one per process).
        """
        cached: Optional[TaskOptions] = self.__dict__.get("_redlock_options")
        if cached is not None:
            return cached
        declared_names = {name for klass in type(self).__mro__ for name in vars(klass)}
        check_task_names(self.name, declared_names - {"redlock_options"})
        declared = {name: _static_option(self, name) for name in TASK_OPTIONS}
        _read_once(self.name, inspect.getattr_static(self, "once", None), declared)
        options = app_config(self.app).options_for(declared)
        validate_spec(self.name, self.run, options.key)
        self.__dict__["_redlock_options"] = options
        return options

    # -- Celery hooks ---------------------------------------------------------------------

    def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
        super().before_start(task_id, args, kwargs)
        self.request.redlock_traced = True
        # This run is the execution that holds the task's lock (reentry.py): the body
        # may re-acquire the key with reentrant=True; a redelivered copy is another run.
        # An eager task applied inside another's body restores the outer run's on exit.
        self.request.redlock_execution = reentry.execution.set(f"task {task_id} run {uuid()}")
        self._redlock_acquire(task_id, args, kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # With __call__ overridden, Celery's tracer calls the task instead of run(),
        # its request already pushed: run the body -- or return a skipped copy's
        # marker, so the normal success path stores it, counts a chord part and sends
        # the links -- without pushing a second, bare request. A direct call task(x)
        # (or a nested self(x) in the body) goes through Celery's own __call__.
        request = self.request_stack.top
        if request is None or not getattr(request, "redlock_traced", False):
            return super().__call__(*args, **kwargs)
        request.redlock_traced = False
        skipped = getattr(request, "redlock_skipped", None)
        if skipped is not None:
            return skipped
        return self.run(*args, **kwargs)

    def after_return(
        self, status: str, retval: Any, task_id: str, args: Any, kwargs: Any, einfo: Any
    ) -> None:
        self._redlock_release()
        super().after_return(status, retval, task_id, args, kwargs, einfo)

    def apply_async(
        self, args: Any = None, kwargs: Any = None, task_id: Optional[str] = None, **options: Any
    ) -> Any:
        return queue_once.enqueue(self, super().apply_async, args, kwargs, task_id, options)

    def retry(
        self,
        args: Any = None,
        kwargs: Any = None,
        exc: Optional[BaseException] = None,
        throw: bool = True,
        eta: Any = None,
        countdown: Optional[float] = None,
        max_retries: Optional[int] = None,
        **options: Any,
    ) -> Any:
        # Celery publishes the retry before raising and skips after_return on RETRY:
        # release first, or the next attempt would find our own lock. But only when a
        # retry will really be published and this body stops: with no retries left
        # Celery raises MaxRetriesExceededError (which the body may catch and go on),
        # and with throw=False the body goes on too -- keep the lock for the rest.
        limit = self.max_retries if max_retries is None else max_retries
        request = self.request
        if throw and not request.called_directly and (limit is None or request.retries < limit):
            self._redlock_release()
        return super().retry(args, kwargs, exc, throw, eta, countdown, max_retries, **options)

    # -- acquire ------------------------------------------------------------------------

    def _redlock_acquire(self, task_id: str, args: Any, kwargs: Any) -> None:
        request = self.request
        request.redlock_lease = request.redlock_skipped = request.redlock_ran_key = None
        options = self.redlock_options()
        config = app_config(self.app)
        key = self.lock_key(args, kwargs)
        worker = request.hostname or socket.gethostname()
        holder = f"{task_id}@{worker}:{os.getpid()}"
        redlock = config.redlock(options.node_timeout, options.fencing)
        request.redlock_inline_attempts = 0
        request.redlock_wait_until = None
        request.redlock_keeps_ids = False  # handoff.py: keep the waiter's ids
        request.redlock_skipped = tick_once.once_per_tick(
            self, config.key_prefix, options, redlock, holder, self._redlock_contended
        )
        if request.redlock_skipped is not None:
            return
        started = time.monotonic()
        while True:  # more than one round only in eager mode, which waits inline
            try:
                # Skipping or failing drops this copy: take_lease makes sure first.
                # Eager mode waits its own way (inline, for the holder's TTL).
                wait = 0.0 if request.is_eager else options.wait_timeout
                lease = limits.take_lease(redlock, key, options, holder, SPLIT_VOTE_PATIENCE, wait)
                waiting.claim_copy(self, key, options, lease)  # Ignore: another copy ran
                redelivery.drop_if_finished_earlier(self, key, options, lease)
                limits.admit_start(self, key, options, redlock, holder, lease)
                place = key + queue_once.QUEUED_SUFFIX  # replaced in the queue, or not run
                request.redlock_skipped = replace.claim_own_fate(
                    self, key, place, options, lease
                ) or cooldown.admit_cooldown(
                    self, config.key_prefix, key, options, redlock, holder, lease
                )
                if request.redlock_skipped is not None:
                    return
                break
            except (LockContended, QuorumUnavailable) as exc:
                if cooldown.is_cooldown(exc):
                    raise  # redlock_on_contended="fail" inside a cooldown: decided there
                holder_seen = exc.holder if isinstance(exc, LockContended) else None
                ttl = exc.ttl if isinstance(exc, LockContended) else None
                request.redlock_skipped = self._redlock_contended(
                    key, options, exc, holder_seen, ttl
                )
                if request.redlock_skipped is not None:
                    return
        self._redlock_hold(task_id, key, options, lease, started)

    def _redlock_hold(
        self, task_id: str, key: str, options: TaskOptions, lease: Optional[Lease],
        started: float,
    ) -> None:  # fmt: skip
        """This execution won ``lease`` (None: a rate only, no lease): bound and watch
        it, free the queue place."""
        request = self.request
        request.redlock_ran_key = key  # queue once "until executed": handed back at the end
        if lease is None:
            queue_once.hand_back_at_start(self, key, options)
            return
        hard_limit = (request.timelimit or (None, None))[0] or self.time_limit
        lease.max_hold = options.max_hold
        if hard_limit:
            # Renewal stops once the time limit has passed, but a renewal just before
            # it must still cover the kill, which comes a moment after the limit: the
            # bound is the limit plus one TTL, never the limit itself.
            lease.max_hold = min(options.max_hold, float(hard_limit) + options.ttl)
        request.redlock_lease = lease
        queue_once.hand_back_at_start(self, key, options)  # running: the next may queue
        if options.auto_extend:
            lease.on_extended(self._redlock_extended_callback(task_id))
            lease.on_lost(self._redlock_lost_callback(task_id))
            get_watchdog().watch(lease)
        signals.lock_acquired.send(
            sender=self, task_id=task_id, key=key, lease=lease, elapsed=time.monotonic() - started
        )

    def _redlock_contended(
        self,
        key: str,
        options: TaskOptions,
        exc: Exception,
        holder: Optional[str],
        ttl: Optional[float],
    ) -> Optional[dict[str, Any]]:
        """Retry, skip or fail this duplicate: raises, or returns the Skipped marker,
        or (eager mode) returns None after waiting inline: try again."""
        request = self.request
        attempt = self._redlock_retries() + 1
        outage = isinstance(exc, QuorumUnavailable)
        split = isinstance(exc, LockContended) and exc.split
        if holder and not (split or request.is_eager) and redelivery.is_earlier_run(self, holder):
            raise redelivery.wait_for_earlier_run(self, key, options, holder, ttl)
        # Ignore when another copy of its waiter ran; a redelivered claimant keeps its ids.
        waiting.settle_by_claim(self, key, options)
        if waiting.is_woken(self) and not (outage or request.redlock_keeps_ids):
            raise waiting.back_in_queue(self, key, options, holder, ttl)
        eager_left = None
        if request.is_eager and not self._redlock_inline_wait_over(ttl, options.ttl):
            eager_left = request.redlock_wait_until - time.monotonic()
        decided = verdict(
            options, attempt, ttl, outage=outage, eager=request.is_eager,
            eager_left=eager_left, split=split,
        )  # fmt: skip
        action, countdown = decided.action, decided.countdown
        if action != "retry":  # a woken copy of this waiter may run: claim it first
            waiting.claim_to_give_up(self, key, options, attempt)
        report(self, key, exc, holder, ttl, decided, attempt)
        if action == "retry":
            assert countdown is not None
            if request.is_eager:
                # apply() would run a Retry inline without its countdown, and with
                # task_eager_propagates raise it at the caller: wait here instead.
                time.sleep(countdown)
                request.redlock_inline_attempts = attempt
                return None
            raise waiting.publish_retry(self, key, options, countdown, attempt, exc)
        queue_once.hand_back(self, key, options)  # this copy will not run
        if action == "skip":
            return skipped_result(key, holder, str(exc), decided.exhausted)
        raise exc

    def _redlock_retries(self) -> int:
        """Lock retries so far: published ones (header), and inline waits (eager)."""
        inline = int(getattr(self.request, "redlock_inline_attempts", 0) or 0)
        try:
            return max(0, int(header(self.request, RETRIES_HEADER) or 0)) + inline
        except (TypeError, ValueError):
            return inline

    def _redlock_inline_wait_over(self, holder_ttl: Optional[float], ttl: float) -> bool:
        """Eager mode waits inline for at most the holder's remaining TTL as first
        seen (our own TTL if unknown): a holder that renews past it is long work
        the caller should not block on. False outside eager mode."""
        request = self.request
        if not request.is_eager:
            return False
        now = time.monotonic()
        if request.redlock_wait_until is None:
            bound = holder_ttl if holder_ttl is not None and holder_ttl > 0 else ttl
            request.redlock_wait_until = now + bound * (1 + app_config(self.app).drift_factor)
        return bool(now >= request.redlock_wait_until)

    def _redlock_extended_callback(self, task_id: str) -> Callable[[Lease], None]:
        def extended(lease: Lease) -> None:
            signals.lock_extended.send(sender=self, task_id=task_id, key=lease.key, lease=lease)

        return extended

    def _redlock_lost_callback(self, task_id: str) -> Callable[[Lease], None]:
        def lost(lease: Lease) -> None:
            reason = lease.lost_reason or "unknown"
            logger.error(
                "lock lost: task %s[%s] key %s: %s; the task no longer runs exclusively",
                self.name, task_id, lease.key, reason,
            )  # fmt: skip
            signals.lock_lost.send(
                sender=self, task_id=task_id, key=lease.key, lease=lease, reason=reason
            )

        return lost

    # -- release ------------------------------------------------------------------------

    def _redlock_release(self) -> None:
        """Release this execution's lease, if it won one and still has it. Idempotent."""
        lease = self.redlock
        if lease is None or lease.released:
            return
        get_watchdog().unwatch(lease)
        try:
            lease.release()
        except QuorumUnavailable as exc:  # the lock frees itself at its TTL
            logger.warning(
                "release of lock %s failed: %s; it expires within %.1fs", lease.key, exc, lease.ttl
            )
        except Exception:  # the lock frees itself at TTL; never fail the task here
            logger.exception("releasing lock %s failed; it expires within its TTL", lease.key)
            return
        signals.lock_released.send(
            sender=self,
            task_id=self.request.id,
            key=lease.key,
            lease=lease,
            held_for=time.monotonic() - lease.acquired_at,
        )
        options = self.redlock_options()
        if options.handoff:
            waiting.wake_next(self, lease.key, options, settled=True)


# The task options as documented class attributes, from the option table.
for _option in OPTIONS:
    if _option.scope == "task":
        setattr(RedlockTask, _option.name, TaskAttribute(_option))
del _option


def _release_on_every_exit(sender: Any = None, **_: Any) -> None:
    # Ignore, Reject and Retry raised by the body skip after_return; postrun runs in
    # the trace's finally, with the request still in place.
    if isinstance(sender, RedlockTask):
        sender._redlock_release()
        ran = getattr(sender.request, "redlock_ran_key", None)
        if ran is not None:  # queue once "until executed": the place is free now
            sender.request.redlock_ran_key = None
            queue_once.hand_back_at_end(sender, ran, sender.redlock_options())
        _end_execution(sender.request)


def _end_execution(request: Any) -> None:
    """The run is over: the execution before it (None, or an outer task's run that
    applied this one eagerly) is the current one again."""
    token = getattr(request, "redlock_execution", None)
    request.redlock_execution = None
    try:
        if token is not None:
            reentry.execution.reset(token)
            return
    except ValueError:  # set in another context (a pool that switched it)
        pass
    reentry.execution.set(None)


task_postrun.connect(_release_on_every_exit, weak=False)


def _hand_back_queued_on_revoke(request: Any = None, **_: Any) -> None:
    task = getattr(request, "task", None)
    if isinstance(task, RedlockTask):
        queue_once.hand_back_revoked(task, request)


task_revoked.connect(_hand_back_queued_on_revoke, weak=False)


def redlock_task(app: Any, *args: Any, **options: Any) -> Any:
    """``@redlock_task(app, redlock_on_contended="skip")``: ``app.task`` with RedlockTask
    as base; takes every ``app.task`` and ``redlock_*`` option."""
    options.setdefault("base", RedlockTask)
    return app.task(*args, **options)
