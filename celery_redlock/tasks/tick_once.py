"""A beat tick runs once even if several beats sent it (``redlock_beat_tick`` header).

Beat's header names the entry and the tick (ticks.py); the first copy to start takes
``<prefix>:beat-ran:<entry>:<tick>`` (never released; it expires after
``redlock_ttl``), and a later copy of that tick is skipped with the ``Skipped``
marker. A later attempt of the same copy (a lock retry) is recognised by its task id
and goes on. task.py calls :func:`once_per_tick` first thing in ``before_start``.

Imports contention.py, headers.py, options.py, redelivery.py, lock/redlock.py,
signals, errors and skipped.py; never task.py.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

from .. import signals
from ..errors import LockContended, QuorumUnavailable
from ..lock.redlock import Redlock
from ..skipped import skipped_result
from . import redelivery
from .contention import SPLIT_VOTE_PATIENCE, acquire_or_contended
from .headers import ENTRY_HEADER, TICK_HEADER, header
from .options import TaskOptions

__all__ = ["once_per_tick"]

# The task's own lines go under the task logger: users filter on it.
logger = logging.getLogger("celery_redlock.task")


def once_per_tick(
    task: Any,
    prefix: str,
    options: TaskOptions,
    redlock: Redlock,
    holder: str,
    contended: Callable[..., Optional[dict[str, Any]]],
) -> Optional[dict[str, Any]]:
    """The Skipped marker for a later copy of a beat tick, None to go on
    (``contended``: the task's handling of a contended copy, for a split vote)."""
    request = task.request
    tick, entry = header(request, TICK_HEADER), header(request, ENTRY_HEADER)
    if tick is None or not entry:
        return None
    key = f"{prefix}:beat-ran:{entry}:{tick}"
    try:
        acquire_or_contended(redlock, key, options.ttl, holder, SPLIT_VOTE_PATIENCE)
    except QuorumUnavailable:
        return None  # the run-time lock below meets the same outage and handles it
    except LockContended as exc:
        if exc.split:  # nobody holds the tick: that it ran is unproven, come back
            return contended(key, options, exc, exc.holder, exc.ttl)
        if redelivery.is_earlier_run(task, exc.holder):
            return None
        logger.warning(
            "beat tick already ran: task %s[%s] entry %s tick %s ran as %s -> skipped",
            task.name, request.id, entry, tick, exc.holder or "unknown",
        )  # fmt: skip
        signals.lock_contended.send(
            sender=task, task_id=request.id, key=key, holder=exc.holder, ttl=exc.ttl,
            action="skip", countdown=None, attempt=None,
        )  # fmt: skip
        return skipped_result(key, exc.holder, f"beat tick {tick} of {entry} already ran")
    return None
