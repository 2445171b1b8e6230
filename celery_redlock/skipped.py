"""What a skipped copy of a task returns: the ``Skipped`` marker.

A copy dropped by ``redlock_on_contended="skip"`` (or ``redlock_on_retries_exhausted=
"skip"``, or a beat tick that already ran) ends like a success whose return value is
this marker, so Celery's own success path runs for it: the result is stored and ready
at once, a group or chord counts the copy as done, ``link`` callbacks and the next
step of a chain receive the marker. Nothing else about the copy is hidden: the WARNING
line and the ``lock_contended`` signal report it as before.

A copy replaced in the queue by a newer one (``redlock_on_queued="replace"``) ends the
same way with the ``Replaced`` marker, naming the copy that replaced it; the replacer
stores it the moment it replaces the copy, so a caller holding the old ``AsyncResult``
has it at once.

A plain dict, so any result serializer (json, msgpack, pickle) carries it unchanged.

Imports nothing of the package.
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = ["REPLACED", "SKIPPED", "is_replaced", "is_skipped", "replaced_result", "skipped_result"]

#: The marker's ``redlock`` value: ``result.get()["redlock"] == SKIPPED``.
SKIPPED = "SKIPPED"
#: ...and a replaced copy's: ``result.get()["redlock"] == REPLACED``.
REPLACED = "REPLACED"


def skipped_result(
    key: str,
    holder: Optional[str],
    reason: str,
    retries_exhausted: bool = False,
    until: Optional[float] = None,
) -> dict[str, Any]:
    """The return value of a skipped copy.

    ``key`` is the lock it met, ``holder`` who held it (``task-id@worker:pid``; None
    when unknown, e.g. the lock nodes were unreachable), ``reason`` a sentence saying
    why, ``retries_exhausted`` whether the copy retried ``redlock_max_retries`` times
    before giving up. A copy skipped inside a cooldown (``redlock_cooldown``) also
    carries ``until``: when the cooldown ends, in epoch seconds.
    """
    marker: dict[str, Any] = {
        "redlock": SKIPPED,
        "key": key,
        "holder": holder,
        "reason": reason,
        "retries_exhausted": retries_exhausted,
    }
    if until is not None:
        marker["until"] = until
    return marker


def is_skipped(value: object) -> bool:
    """True for the return value of a skipped copy (a chord callback's argument, a
    ``link`` callback's, ``AsyncResult.get()``'s)."""
    return isinstance(value, dict) and value.get("redlock") == SKIPPED


def replaced_result(key: str, by: str) -> dict[str, Any]:
    """The return value of a copy replaced in the queue: ``key`` its lock key, ``by``
    the task id of the copy that replaced it (``AsyncResult(by)`` follows it)."""
    return {
        "redlock": REPLACED,
        "key": key,
        "by": by,
        "reason": f"replaced in the queue by {by} before it started",
    }


def is_replaced(value: object) -> bool:
    """True for the return value of a copy replaced in the queue by a newer one."""
    return isinstance(value, dict) and value.get("redlock") == REPLACED
