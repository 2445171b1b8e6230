"""Queue once: at most one queued copy of a task per lock key.

With ``redlock_dedupe_queued=True``, ``delay`` / ``apply_async`` (and beat, which
calls them) first take a "queued" lock, the run-time lock key plus ``:queued``,
holding the new task id, and send the message with the lock's value in the
``redlock_queued`` header. One call may override ``on_queued``, ``queued_ttl`` and
``dedupe_queued`` with ``apply_async(..., redlock={...})``, or pass celery-once's
``once={"graceful": ..., "timeout": ...}`` (see call_options.py). A duplicate
enqueue publishes nothing and gets the queued copy's ``AsyncResult`` back (or
``AlreadyQueued``); with ``redlock_on_queued="replace"`` it replaces the queued copy
instead (replace.py). The queued copy hands its place back when it wins its run-time
lock (with ``redlock_queued_until="end"``: when its run ends, so that a duplicate
enqueue meanwhile gets the running copy), when it is skipped or failed, and when it
is revoked; a lost message frees it after ``redlock_queued_ttl``.

A copy sent as part of a canvas (a chain step, a group or chord member, a call with
``link`` / ``link_error``) is always sent and takes no queue place: the canvas waits
for that copy's own task id, or sends its callbacks with its message, so answering
with another copy's result would hang the canvas or drop its callbacks. The run-time
lock still keeps it from running beside another copy.

The functions take the RedlockTask as ``task`` (its ``redlock_options()``,
``lock_key()``, ``app``, ``request``): task.py calls them from its hooks. Imports
config.py, options.py, contention.py, headers.py, replace.py and errors.py; never
task.py.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

from celery.utils import uuid

from ..errors import AlreadyQueued, LockContended, QuorumUnavailable
from . import replace
from .call_options import call_options
from .config import TaskOptions, app_config
from .contention import acquire_or_contended
from .headers import QUEUED_HEADER, QUEUED_UNTIL_HEADER, header

__all__ = [
    "QUEUED_SUFFIX",
    "QUEUE_PLACE_PATIENCE",
    "enqueue",
    "hand_back",
    "hand_back_at_end",
    "hand_back_at_start",
    "hand_back_revoked",
]

# The name the logger had before the package was split into folders: users filter on it.
logger = logging.getLogger("celery_redlock.queue_once")

#: Appended to the run-time lock key to name the queued lock.
QUEUED_SUFFIX = ":queued"
#: How long an enqueue keeps trying for a clear answer about the queue place (seconds).
QUEUE_PLACE_PATIENCE = 2.0
#: apply_async options that make a call part of a canvas (Celery sets them).
CANVAS_OPTIONS = ("chain", "chord", "group_id", "link", "link_error", "parent_id")


def enqueue(
    task: Any,
    send: Callable[..., Any],
    args: Any,
    kwargs: Any,
    task_id: Optional[str],
    options: dict[str, Any],
) -> Any:
    """``task.apply_async(...)``: ``send`` it (the base class's apply_async), unless
    a copy with the same lock key is queued already. ``options`` may carry this call's
    ``redlock={...}`` or celery-once's ``once={...}`` (call_options.py)."""
    # Per-call options are ours: checked on every call, never sent with the message.
    opts = call_options(
        task.redlock_options(), options.pop("redlock", None), options.pop("once", None)
    )
    headers = options.get("headers") or {}
    if QUEUED_HEADER in headers or task.app.conf.task_always_eager:
        # A retry of a queued copy keeps its place; eager runs are never queued.
        return send(args, kwargs, task_id=task_id, **options)
    if not opts.dedupe_queued or any(options.get(name) for name in CANVAS_OPTIONS):
        return send(args, kwargs, task_id=task_id, **options)
    lock_key = task.lock_key(args, kwargs)
    key = lock_key + QUEUED_SUFFIX
    task_id = task_id or uuid()
    redlock = app_config(task.app).redlock(opts.node_timeout, False)
    try:
        lease = acquire_or_contended(
            redlock, key, opts.queued_ttl, task_id, QUEUE_PLACE_PATIENCE, retry_unavailable=True
        )
    except LockContended as exc:
        if opts.on_queued == "replace" and exc.holder:
            # Even a split place names copies that were queued: each one's fate leads
            # to the copy queued now (replacements swap the place node by node).
            return replace.enqueue(
                task, send, args, kwargs, task_id, options, opts, lock_key, key, exc.holder,
                QUEUE_PLACE_PATIENCE,
            )  # fmt: skip
        if exc.split or not exc.holder:
            # The vote split for the whole patience, nobody holds the place: not sent,
            # and the caller knows (pointing at a copy that may not exist would drop it).
            raise
        logger.info(
            "already queued: task %s key %s is queued as %s; not sent again",
            task.name, key, exc.holder,
        )  # fmt: skip
        if opts.on_queued == "raise":
            raise AlreadyQueued(key, exc.holder, exc.ttl) from None
        return task.AsyncResult(exc.holder)
    redlock.hand_over(lease)  # the message holds the place, not this thread
    options["headers"] = {**headers, QUEUED_HEADER: lease.value}
    if opts.queued_until == "end":
        options["headers"][QUEUED_UNTIL_HEADER] = "end"
    try:
        return send(args, kwargs, task_id=task_id, **options)
    except BaseException:
        try:
            lease.release()  # nothing was queued: free the place
        except QuorumUnavailable as exc:  # the send's error matters more; the place expires
            logger.warning("freeing queue place %s failed: %s", key, exc)
        raise


def hand_back_at_start(task: Any, key: str, options: TaskOptions) -> None:
    """The copy starts its body: free its queue place, unless it keeps it until the
    run ends (``redlock_queued_until="end"``: :func:`hand_back` after the run)."""
    if header(task.request, QUEUED_UNTIL_HEADER) != "end":
        hand_back(task, key, options)


def hand_back_at_end(task: Any, key: str, options: TaskOptions) -> None:
    """The copy's run has ended: free the queue place it kept until now, if it did."""
    if header(task.request, QUEUED_UNTIL_HEADER) == "end":
        hand_back(task, key, options)


def hand_back(task: Any, key: str, options: TaskOptions) -> None:
    """Free the running copy's queue place, if it holds one (``key``: its lock key)."""
    queued = header(task.request, QUEUED_HEADER)
    if not queued:
        return
    redlock = app_config(task.app).redlock(options.node_timeout, False)
    try:
        redlock.release_value(key + QUEUED_SUFFIX, str(queued))
    except Exception:  # it frees itself at redlock_queued_ttl
        logger.warning("could not free the queue place of %s", task.request.id, exc_info=True)


def hand_back_revoked(task: Any, request: Any) -> None:
    """A revoked copy never starts: free its queue place now rather than at its TTL."""
    value = (getattr(request, "request_dict", None) or {}).get(QUEUED_HEADER)
    if not value:
        return
    try:
        options: TaskOptions = task.redlock_options()
        key = task.lock_key(request.args, request.kwargs) + QUEUED_SUFFIX
        app_config(task.app).redlock(options.node_timeout, False).release_value(key, str(value))
    except Exception:
        logger.warning("could not free the queue place of revoked %s", request.id, exc_info=True)
