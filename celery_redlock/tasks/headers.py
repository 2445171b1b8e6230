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
    "AGAIN_HEADER",
    "ARRIVAL_HEADER",
    "CLAIM_TRIED_HEADER",
    "COPY_HEADER",
    "EARLIER_RUN_HEADER",
    "ENTRY_HEADER",
    "IDS_HEADERS",
    "QUEUED_HEADER",
    "QUEUED_UNTIL_HEADER",
    "RETRIES_HEADER",
    "TICK_HEADER",
    "WAITER_HEADER",
    "WOKEN_HEADER",
    "header",
    "kept_headers",
]

#: The tick a beat sent the task for (an int: epoch seconds or an interval bucket).
TICK_HEADER = "redlock_beat_tick"
#: The name of the beat entry that sent the task.
ENTRY_HEADER = "redlock_beat_entry"
#: Lock retries so far (kept apart from the task's own ``retries``).
RETRIES_HEADER = "redlock_retries"
#: The queued lock's value (queue once), for handing the queue place back...
QUEUED_HEADER = "redlock_queued"
#: ...and ``"end"`` when it is handed back when the run ends, not when it starts.
QUEUED_UNTIL_HEADER = "redlock_queued_until"
#: Hand-off (tasks/handoff.py): the waiter id this copy is one of two messages for...
WAITER_HEADER = "redlock_waiter"
#: ...this message's own copy id (a redelivery keeps it)...
COPY_HEADER = "redlock_copy"
#: ...set once this message's ids have tried a claim whose round was undecided: its
#: requests may still land, so it keeps its ids for good, reading nothing...
CLAIM_TRIED_HEADER = "redlock_claim_tried"
#: ...and the task's first contention time, ms since the epoch (its place in the queue).
ARRIVAL_HEADER = "redlock_arrival"
#: A release published this copy (a wake), not a countdown (its waiter's fallback).
WOKEN_HEADER = "redlock_woken"
#: This copy met its own task id's lock: an earlier run may have finished (redelivery.py).
EARLIER_RUN_HEADER = "redlock_earlier_run"

#: The lock published this copy again (a lock retry, a rate or cooldown come-back, a
#: wait for an earlier run): another copy of its task id may have run (redelivery.py).
AGAIN_HEADER = "redlock_again"

#: A copy's hand-off identity: kept together or dropped together.
IDS_HEADERS = (WAITER_HEADER, COPY_HEADER, CLAIM_TRIED_HEADER)

#: What a copy published again keeps of its message's headers: its lock retries, its
#: beat tick, its place in a hand-off queue, its queue-once place (and until when it
#: keeps it), its earlier run.
#: (A hand-off waiter's and copy's ids, and whether it was woken, are the message's
#: own: handoff.py decides.)
KEPT_HEADERS = (
    RETRIES_HEADER, TICK_HEADER, ENTRY_HEADER, ARRIVAL_HEADER, QUEUED_HEADER,
    QUEUED_UNTIL_HEADER, EARLIER_RUN_HEADER,
)  # fmt: skip


def header(request: Any, name: str) -> Any:
    """A custom header of the running message: Celery puts it on the request itself
    (worker) or in ``request.headers`` (eager ``apply(headers=...)``)."""
    value = getattr(request, name, None)
    if value is None:
        value = (getattr(request, "headers", None) or {}).get(name)
    return value


def kept_headers(request: Any) -> dict[str, Any]:
    """The headers to publish the running message again with: its own, those of
    :data:`KEPT_HEADERS` put back from the request (a worker's request may carry them
    as attributes only), without the hand-off ids (:data:`IDS_HEADERS`) and mark."""
    headers = dict(getattr(request, "headers", None) or {})
    for name in (*IDS_HEADERS, WOKEN_HEADER):
        headers.pop(name, None)
    for name in KEPT_HEADERS:
        value = header(request, name)
        if value is not None:
            headers[name] = value
    return headers
