"""The tasks: one per way of using celery-redlock.

=====================  ==========================  ======================================
task                   lock key                    when another copy holds the lock
=====================  ==========================  ======================================
``report``             task name (no arguments)    skipped: a singleton, one at a time
``import_customer``    ``import:{customer_id}``    retried after a short jittered backoff
``long_job``           ``long:{job}``              retried; the lease (2 s) is renewed by
                                                   the watchdog through a 5 s run and
                                                   carries a fence for every SQLite write
``refresh_cache``      ``cache:{name}``            queue once: a second ``delay()`` while
                                                   one copy is queued publishes nothing
=====================  ==========================  ======================================

Every body reports to the observer (:mod:`example_project.observer`) around its
work; contention shows up in the worker log as celery-redlock's WARNING lines::

    lock contended: task example_project.import_customer[603e738d-…] key
        redlock:import:acme held by 0733db6c-…@w2@host:4242 (10.0s left) -> retry in
        1.0s (attempt 1/100)

Tasks are made with ``app.task(...)(function)`` rather than decorator syntax only
because Celery's decorators are untyped (``mypy --strict``).
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery.utils.log import get_task_logger

from celery_redlock import LockLost, RedlockTask, redlock_task

from . import observer, store
from .celery import app, settings

__all__ = ["import_customer", "long_job", "refresh_cache", "report"]

logger = get_task_logger(__name__)

#: How long each body works, seconds.
REPORT_SECONDS = 1.5
IMPORT_SECONDS = 0.3
CACHE_SECONDS = 0.3
#: The long job: this many steps of this many seconds (5 s) under a 2 s lease.
LONG_STEPS = 5
LONG_STEP_SECONDS = 1.0
LONG_TTL = 2.0

observer.connect_signals()


def _lock_key(task: RedlockTask, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    # Called directly (``report()``) a task runs without its lock: key it anyway.
    lease = task.redlock
    return lease.key if lease is not None else task.lock_key(args, kwargs)


def _worker(task: RedlockTask) -> str:
    return str(task.request.hostname or f"local:{os.getpid()}")


# -- a singleton: duplicates are dropped ---------------------------------------------------


def _report(self: RedlockTask) -> dict[str, Any]:
    lease = self.redlock
    with observer.holding(_lock_key(self, (), {}), _worker(self), self.request.id):
        observer.ran(self.name)
        validity = f"{lease.validity:.1f}s" if lease is not None else "no lease"
        logger.info("report: generating on %s (lock validity %s)", _worker(self), validity)
        time.sleep(REPORT_SECONDS)
    return {"worker": _worker(self)}


#: ``@redlock_task(app, bind=True, redlock_on_contended="skip")``: the decorator form.
report = redlock_task(
    app,
    name="example_project.report",
    bind=True,
    redlock_on_contended="skip",
    redlock_ttl=10,
)(_report)


# -- per customer: never two imports of one customer at once, every import runs ---------


def _import_customer(self: RedlockTask, customer_id: str, full: bool = False) -> dict[str, Any]:
    key = _lock_key(self, (customer_id,), {"full": full})
    with observer.holding(key, _worker(self), self.request.id):
        observer.ran(self.name)
        logger.info("import: customer %s (full=%s) on %s", customer_id, full, _worker(self))
        time.sleep(IMPORT_SECONDS)
    return {"customer_id": customer_id, "worker": _worker(self)}


import_customer = app.task(
    name="example_project.import_customer",
    bind=True,
    base=RedlockTask,
    redlock_key="import:{customer_id}",
    redlock_on_contended="retry",
    redlock_ttl=10,
    # Short backoff so the demo shows waiting copies getting their turn within
    # seconds; the default (1 s doubling to 60 s) suits real imports.
    redlock_retry_backoff=0.2,
    redlock_retry_backoff_max=1.0,
    redlock_max_retries=100,
)(_import_customer)


# -- long work: lease renewed while it runs, every write fenced -------------------------------


def _long_job(self: RedlockTask, job: str = "nightly") -> dict[str, Any]:
    lease = self.redlock
    if lease is None or lease.fence is None:
        raise RuntimeError("long_job needs its fenced lease: run it through a worker or apply()")
    fence = lease.fence
    connection = store.connect(settings.database)
    store.ensure_job(connection, job)
    observer.fence_taken(job, fence)
    where = f"{_worker(self)}:{os.getpid()}"
    with observer.holding(lease.key, _worker(self), self.request.id):
        observer.ran(self.name)
        logger.info("long job %s: started on %s with fence %d", job, where, fence)
        for step in range(1, LONG_STEPS + 1):
            lease.ensure_held()  # checkpoint: raises LockLost once the lease is gone
            time.sleep(LONG_STEP_SECONDS)  # the step's work
            progress = f"step {step}/{LONG_STEPS} by {where} (fence {fence})"
            written = store.write_progress(connection, job, progress, fence)
            observer.fence_write(job, fence, written)
            if not written:
                # A holder with a higher fence wrote while we were not looking: our
                # lease ended (a pause, a stall) and the database refused us.
                logger.error(
                    "long job %s: fenced write refused (fence %d): a later holder wrote "
                    "first; stopping",
                    job,
                    fence,
                )
                raise LockLost(lease.key, f"the database refused fence {fence}")
            logger.info("long job %s: %s written", job, progress)
    return {"job": job, "fence": fence, "extensions": lease.extensions}


long_job = app.task(
    name="example_project.long_job",
    bind=True,
    base=RedlockTask,
    redlock_key="long:{job}",
    redlock_on_contended="retry",
    redlock_ttl=LONG_TTL,  # shorter than the run: the watchdog renews it every ttl/3
    redlock_fencing=True,
    redlock_retry_backoff=0.5,
    redlock_retry_backoff_max=1.0,
    redlock_max_retries=100,
)(_long_job)


# -- queue once: at most one copy waiting in the queue -----------------------------------------


def _refresh_cache(self: RedlockTask, name: str) -> dict[str, Any]:
    with observer.holding(_lock_key(self, (name,), {}), _worker(self), self.request.id):
        observer.ran(self.name)
        logger.info("cache %s: refreshing on %s", name, _worker(self))
        time.sleep(CACHE_SECONDS)
    return {"cache": name}


refresh_cache = app.task(
    name="example_project.refresh_cache",
    bind=True,
    base=RedlockTask,
    redlock_key="cache:{name}",
    redlock_dedupe_queued=True,
    redlock_queued_ttl=60,
    redlock_on_contended="retry",
    redlock_ttl=10,
    redlock_retry_backoff=0.2,
    redlock_retry_backoff_max=1.0,
    redlock_max_retries=100,
)(_refresh_cache)
