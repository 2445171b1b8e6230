"""Names of the message headers celery-redlock adds to task messages.

Written by one side and read by another -- beat.py writes the tick headers and
task.py reads them; task.py writes the lock-retry and queue-once headers on a message
it publishes and reads them back when that message runs -- so both sides import the
names from here. Celery delivers a custom header as an attribute of the request in a
worker, and in ``request.headers`` for an eager ``apply(headers=...)``.

Imports nothing of the package.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ARRIVAL_HEADER",
    "COPY_HEADER",
    "ENTRY_HEADER",
    "QUEUED_HEADER",
    "RETRIES_HEADER",
    "TICK_HEADER",
    "WAITER_HEADER",
    "header",
]

#: The tick a beat sent the task for (an int: epoch seconds or an interval bucket).
TICK_HEADER = "redlock_beat_tick"
#: The name of the beat entry that sent the task.
ENTRY_HEADER = "redlock_beat_entry"
#: Lock retries so far (kept apart from the task's own ``retries``).
RETRIES_HEADER = "redlock_retries"
#: The queued lock's value (queue once), for handing the queue place back.
QUEUED_HEADER = "redlock_queued"
#: Hand-off (tasks/handoff.py): the waiter id this copy is one of two messages for...
WAITER_HEADER = "redlock_waiter"
#: ...this message's own copy id (a redelivery keeps it)...
COPY_HEADER = "redlock_copy"
#: ...and the task's first contention time, ms since the epoch (its place in the queue).
ARRIVAL_HEADER = "redlock_arrival"


def header(request: Any, name: str) -> Any:
    """A custom header of the running message: Celery puts it on the request itself
    (worker) or in ``request.headers`` (eager ``apply(headers=...)``)."""
    value = getattr(request, name, None)
    if value is None:
        value = (getattr(request, "headers", None) or {}).get(name)
    return value
