"""Signals sent by RedlockTask, for metrics, alerts and logs (sender = the task).

Connect as with any Celery signal::

    from celery_redlock import signals

    @signals.lock_contended.connect
    def count_contention(sender, key, holder, action, **kwargs):
        metrics.incr("lock.contended", tags={"task": sender.name, "action": action})

Every signal passes ``task_id`` and ``key``; the others are listed per signal.
Receivers run in the worker, in the thread that caused the event (``lock_extended``
and ``lock_lost`` usually in the watchdog thread): keep them quick and never block.
"""

from __future__ import annotations

from celery.utils.dispatch import Signal

__all__ = ["lock_acquired", "lock_contended", "lock_extended", "lock_lost", "lock_released"]

lock_acquired = Signal(
    name="lock_acquired",
    providing_args={"task_id", "key", "lease", "elapsed"},
)
"""The task won its lock. ``lease``: the Lease; ``elapsed``: seconds the acquire took."""

lock_contended = Signal(
    name="lock_contended",
    providing_args={
        "task_id", "key", "holder", "ttl", "action", "countdown", "attempt", "limit",
    },
)  # fmt: skip
"""Another holder has the lock. ``holder``: who (``task-id@worker:pid``); ``ttl``: seconds
until it frees (None if unknown); ``action``: ``"retry"``, ``"skip"`` or ``"fail"``, or
``"wait"`` for a copy over its rate or one that met its own task id's earlier
delivery (it comes back, spending no lock retry), ``"replaced"`` for a queued copy
that a newer one replaced (``redlock_on_queued="replace"``; ``holder``: the
replacement's task id; its body does not run);
``countdown`` (seconds) when it comes back, ``attempt`` (1-based lock retry) when
retrying, else None; ``limit``: what was reached on a key with several permits
(``"limit 5/5"``, ``"rate 100/m"``), None for a mutex."""

lock_extended = Signal(
    name="lock_extended",
    providing_args={"task_id", "key", "lease"},
)
"""The watchdog extended the lease (``lease.validity`` is the new guarantee)."""

lock_lost = Signal(
    name="lock_lost",
    providing_args={"task_id", "key", "lease", "reason"},
)
"""The lease is no longer guaranteed (an extension failed, or max_hold was reached).
Sent once per lease. The task should stop, or rely on its fence."""

lock_released = Signal(
    name="lock_released",
    providing_args={"task_id", "key", "lease", "held_for"},
)
"""The task's lease was released; ``held_for``: seconds since it was acquired."""
