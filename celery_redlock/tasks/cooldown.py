"""Cooldowns for tasks (``redlock_cooldown``): after a body of a lock key starts, no
other body of that key starts for that many seconds, across every worker.

task.py calls :func:`admit_cooldown` once a copy has its lease and its rate turn,
just before the body. A cooldown is a rate of one start per cooldown, counted on the
lock nodes' clocks (``Redlock.admit``, lock/permits.py), under its own key:
``<prefix>:cooldown:<the lock key after its prefix>`` (the lock key itself may carry
a ``redlock_rate``, and every caller of one key must give the same rate). It is
measured from the start, not the end, of the body that began it: a body longer
than the cooldown keeps others out with its lock, not its cooldown.

A copy that starts inside the cooldown follows ``redlock_on_contended``:

- ``"skip"``: it ends SUCCESS with the skipped marker, whose ``until`` is when the
  cooldown ends (epoch seconds, as this worker's clock reads the nodes' wait);
- ``"retry"``: it is published again for when the cooldown ends, spending no lock
  retry (a cooldown is no contention that more tries could win); eager mode waits
  inline, as for a rate;
- ``"fail"``: ``LockContended`` naming the cooldown and the seconds left.

A beat tick inside the cooldown is skipped whatever the mode: sent again later, it
would be a tick at the wrong time. A copy delivered again after its earlier
delivery met its own lock (``redelivery.py``: the earlier run died in the body) is
let through without counting a start: the start in the window was its own.

Imports lock/redlock.py, headers.py, limits.py, options.py, queue_once.py,
republish.py, signals.py, skipped.py and errors.py; never task.py.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Optional

from .. import signals
from ..errors import LockContended, RedlockError
from ..lock.redlock import Lease, Redlock
from ..skipped import skipped_result
from . import queue_once
from .headers import EARLIER_RUN_HEADER, TICK_HEADER, header, kept_headers
from .limits import give_back, longest_countdown
from .options import TaskOptions
from .republish import copy_signature, publish_again

__all__ = ["admit_cooldown", "cooldown_key", "is_cooldown"]

#: What a copy refused by a cooldown is told it reached: ``cooldown of 3s``.
REACHED = "cooldown of"

# The name the task's own lines go under: users filter on it.
logger = logging.getLogger("celery_redlock.task")


def cooldown_key(prefix: str, key: str) -> str:
    """Where the cooldown of lock key ``key`` is counted (beside the beat ticks'
    ``<prefix>:beat-ran:...``)."""
    return f"{prefix}:cooldown:{key.removeprefix(prefix + ':')}"


def admit_cooldown(
    task: Any, prefix: str, key: str, options: TaskOptions, redlock: Redlock, holder: str,
    lease: Optional[Lease],
) -> Optional[dict[str, Any]]:  # fmt: skip
    """Count this start in the key's cooldown and return None (start the body), or,
    inside the cooldown, give ``lease`` back and: return the skipped marker, raise
    the ``Ignore`` of a copy published for when it ends, or raise ``LockContended``
    (see the module docstring). Raises ``QuorumUnavailable`` (``lease`` given back)
    when too few nodes answered."""
    cooldown = options.cooldown
    request = task.request
    if cooldown is None or (header(request, EARLIER_RUN_HEADER) and not request.is_eager):
        return None
    tick = header(request, TICK_HEADER) is not None
    waits_inline = request.is_eager and options.on_contended == "retry" and not tick
    try:
        wait = redlock.admit(
            cooldown_key(prefix, key), (1, cooldown), holder=holder,
            timeout=None if waits_inline else 0, reserve=False,
        )  # fmt: skip
    except RedlockError:
        give_back(lease, key)
        raise
    if wait == 0.0:
        return None
    give_back(lease, key)
    action = "skip" if tick else options.on_contended
    exc = LockContended(key, None, wait, limit=f"{REACHED} {cooldown:g}s")
    countdown = min(wait, longest_countdown(task.app)) if action == "retry" else None
    then = {
        "skip": "skipped",
        "retry": f"comes back in {countdown or 0:.1f}s (no lock retry spent)",
        "fail": "fails",
    }[action]
    logger.warning(
        "cooldown: task %s[%s] key %s: a body started less than %gs ago, the next may "
        "start in %.1fs -> %s",
        task.name, request.id, key, cooldown, wait, then,
    )  # fmt: skip
    signals.lock_contended.send(
        sender=task, task_id=request.id, key=key, holder=None, ttl=wait, action=action,
        countdown=countdown, attempt=None, limit=exc.limit,
    )  # fmt: skip
    if action != "retry":
        queue_once.hand_back(task, key, options)  # this copy will not run
    if action == "skip":
        reason = f"cooldown of {cooldown:g}s: the next start may come in {wait:.1f}s"
        return skipped_result(key, None, reason, until=time.time() + wait)
    if action == "retry":
        assert countdown is not None
        headers = kept_headers(request)
        why = f"cooldown: comes back in {countdown:.1f}s"
        raise publish_again(task, copy_signature(task, headers), headers, countdown, why, exc)
    raise exc


def is_cooldown(exc: BaseException) -> bool:
    """``exc`` is the ``LockContended`` of a copy failed inside a cooldown."""
    return isinstance(exc, LockContended) and str(exc.limit or "").startswith(REACHED)
