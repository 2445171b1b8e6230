"""Publishing a copy again: the one way every lock retry leaves a worker.

A copy that does not run now -- a lock retry (handoff.py), a come-back at its rate
turn (limits.py), a redelivery waiting for its own earlier run (redelivery.py) -- is
published again under the same task id and this delivery ends. Not with Celery's
``Retry``: the tracer stores RETRY *after* the new message is out, and Celery's guard
against overwriting a finished task reads and then writes. A worker paused between
the two (SIGSTOP, a long GC, a VM migration) stores RETRY over the SUCCESS the new
copy stored meanwhile, and the task never looks finished::

    worker A: publish copy 2 ... read state (PENDING) -- paused --------- write RETRY
    worker B:                 copy 2 runs, stores SUCCESS

So RETRY is stored *before* the copy is published (nothing can have finished yet),
and the delivery ends with ``Ignore``, which stores nothing and acks the message.
Celery's own ``self.retry()`` is untouched. The copy carries ``AGAIN_HEADER``: if
this delivery's ack is lost (its worker dies first), the broker hands it out again
beside the copy, and whichever runs second finds the task finished (redelivery.py).

Imports headers.py and Celery; never task.py.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from celery.exceptions import Ignore

from .headers import AGAIN_HEADER

__all__ = ["copy_signature", "publish_again"]

# The name the task's own lines go under: users filter on it.
logger = logging.getLogger("celery_redlock.task")


def copy_signature(task: Any, headers: dict[str, Any]) -> Any:
    """The running message as a signature, with ``headers``."""
    return task.signature_from_request(task.request, None, None, headers=headers)


def publish_again(
    task: Any,
    signature: Any,
    headers: dict[str, Any],
    countdown: float,
    why: str,
    shown: Optional[BaseException],
) -> Ignore:
    """Store RETRY with ``shown`` as its reason (None: store nothing -- the state is
    another delivery's), publish ``signature`` in ``countdown`` s, and return the
    ``Ignore`` that ends this delivery (``why``: the worker's "ignored" line)."""
    if shown is not None:
        _store_retry(task, shown)
    signature.apply_async(countdown=countdown, headers={**headers, AGAIN_HEADER: 1})
    return Ignore(why)


def _store_retry(task: Any, shown: BaseException) -> None:
    request = task.request
    ignored = task.ignore_result or getattr(request, "ignore_result", False)
    if ignored and not task.store_errors_even_if_ignored:
        return  # what Celery's tracer does with a RETRY
    try:
        task.backend.mark_as_retry(request.id, shown, request=request)
    except Exception:  # the state is for people; the copy is what counts
        logger.warning("could not store RETRY for %s", request.id, exc_info=True)
