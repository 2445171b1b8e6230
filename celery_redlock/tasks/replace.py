"""Replace the queued copy (``redlock_on_queued="replace"``), the Celery side.

Queue once keeps one queued copy per lock key (queue_once.py). With ``"replace"`` a
duplicate enqueue does not give up its arguments: the new copy N takes the place of
the queued copy V, V never runs its body and its result is the ``Replaced`` marker
naming N, stored at once (a caller holding V's ``AsyncResult`` learns it without
waiting). Pass the same ``countdown`` on every call for a debounce: each replacement
starts the delay again, and the body runs once, with the last arguments, after the
calls stop.

Who wins is V's *fate* (lock/places.py): a claim record on the lock nodes, set once.

- :func:`enqueue` -- the place names V: N is sent first, then V's fate claimed for
  N. Won: V will never run; the place is swapped to N, and V's marker stored. Lost to
  V itself: V has started (nothing else is queued): the place is swapped to N. Lost
  to a newer copy X: V was already replaced by X; replace X the same way. Still
  undecided after the enqueue's patience (nodes silent or split): nothing more -- V
  may run as well as N (each once, never at once); nothing is dropped. Sending first
  is what the model asked for: a caller that dies after its claim landed would
  otherwise leave V replaced by a copy never sent.
- :func:`claim_own_fate` -- a queued copy that won its run-time lock claims its own
  fate before its body. Won: it runs (and can no longer be replaced). Lost: it was
  replaced; it ends with the ``Replaced`` marker, its body not run (``lock_contended``
  with ``action="replaced"``, ``holder`` its replacement). Undecided: it
  comes back later, as a split lock vote does.

Every task sharing a lock key must agree on ``"replace"`` (a copy of a task without it
never claims its fate, so it would run although replaced); one call cannot switch it
(call_options.py). The protocol and its model: SAFETY.md, "Replacing the pending copy".

Imports lock/places.py, lock/waiters.py, signals, errors, skipped, config.py,
headers.py, limits.py and options.py; never task.py or queue_once.py.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any, Callable, Optional

from .. import signals
from ..errors import LockContended, QuorumUnavailable
from ..lock import places, waiters
from ..lock.redlock import Lease, Redlock
from ..lock.stored import new_value
from ..skipped import replaced_result
from .config import app_config
from .headers import QUEUED_HEADER, header
from .limits import give_back
from .options import TaskOptions

__all__ = ["claim_own_fate", "enqueue", "fate_ttl"]

# The queue-once logger: replacing is what a duplicate enqueue does.
logger = logging.getLogger("celery_redlock.queue_once")

#: Pause between two claim rounds that could not decide (seconds, at random up to).
UNDECIDED_PAUSE = 0.05


def fate_ttl(options: TaskOptions) -> float:
    """How long a copy's fate is kept: as long as its place, and then as long as a
    hand-off claim (a copy that waits for its lock past its place's expiry)."""
    return options.queued_ttl + options.handoff_claim_ttl


def enqueue(
    task: Any,
    send: Callable[..., Any],
    args: Any,
    kwargs: Any,
    task_id: str,
    options: dict[str, Any],
    opts: TaskOptions,
    key: str,
    place: str,
    queued: str,
    patience: float,
) -> Any:
    """``key``'s queue place ``place`` names the queued copy ``queued``: send this call's
    copy (``task_id``) with ``send``, as queue_once.enqueue would, and replace the
    queued copy by it; the new copy's ``AsyncResult`` (see the module docstring)."""
    redlock = app_config(task.app).redlock(opts.node_timeout, False)
    value = new_value(task_id)
    # Sent first: a copy is replaced only for a copy that exists (a caller dying after
    # its claim landed would otherwise leave the old copy replaced by nothing).
    options["headers"] = {**(options.get("headers") or {}), QUEUED_HEADER: value}
    result = send(args, kwargs, task_id=task_id, **options)
    give_up = time.monotonic() + patience
    chain = [queued]  # the copies followed: the place may name any of them
    while True:
        claim = places.fate(
            redlock.node_set, redlock.quorum, place, chain[-1], task_id, fate_ttl(opts),
            redlock.node_timeout,
        )  # fmt: skip
        if claim.winner in (task_id, chain[-1]):
            break  # replaced it, or it has started: either way this copy is next
        if claim.winner is not None and claim.winner not in chain:
            chain.append(claim.winner)  # already replaced by a newer copy: replace that
        elif time.monotonic() >= give_up:
            logger.warning(
                "replace: task %s key %s: cannot tell whether %s can still be replaced "
                "(claim %s): it may run as well as %s",
                task.name, place, chain[-1], claim.verdict, task_id,
            )  # fmt: skip
            return result
        else:
            time.sleep(random.uniform(0, UNDECIDED_PAUSE))
    _swap(redlock, place, chain, value, opts)
    if claim.winner == task_id:
        logger.info(
            "replace: task %s key %s: queued copy %s replaced by %s",
            task.name, place, chain[-1], task_id,
        )  # fmt: skip
        _store_replaced(task, chain[-1], key, task_id)
    return result


def _swap(redlock: Redlock, place: str, chain: list[str], value: str, opts: TaskOptions) -> None:
    """Make the place name this copy where it names a copy of ``chain`` (each replaced,
    the last one replaced or started) or is free. Best effort: a place left naming a
    replaced copy leads the next replacer here through that copy's fate."""
    try:
        places.swap(
            redlock.node_set, redlock.quorum, place, chain, value, opts.queued_ttl,
            redlock.node_timeout,
        )  # fmt: skip
    except Exception:
        logger.warning("replace: swapping the queue place %s failed", place, exc_info=True)


def _store_replaced(task: Any, replaced: str, key: str, by: str) -> None:
    """Store the replaced copy's ``Replaced`` marker now, as its own start would."""
    if task.ignore_result:
        return  # (a caller's app without a backend stores nothing: Celery's no-op)
    try:
        task.backend.store_result(replaced, replaced_result(key, by), "SUCCESS")
    except Exception:  # the replaced copy stores it itself when it arrives
        logger.warning("replace: storing the result of replaced %s failed", replaced, exc_info=True)


def claim_own_fate(
    task: Any, key: str, place: str, options: TaskOptions, lease: Optional[Lease]
) -> Optional[dict[str, Any]]:
    """A queued copy of a ``"replace"`` task that won ``lease`` on ``key`` (its queue
    place: ``place``): claim its own fate.
    None to run the body; the ``Replaced`` marker (``lease`` given back) when a newer
    copy replaced it. Raises ``LockContended(split=True)`` or ``QuorumUnavailable``
    (``lease`` given back) when undecided: the copy comes back as after a split vote."""
    request = task.request
    if options.on_queued != "replace" or not header(request, QUEUED_HEADER) or request.is_eager:
        return None
    redlock = app_config(task.app).redlock(options.node_timeout, False)
    claim = places.fate(
        redlock.node_set, redlock.quorum, place, request.id, request.id, fate_ttl(options),
        redlock.node_timeout,
    )  # fmt: skip
    if claim.verdict == waiters.CLAIM_WON:
        return None
    give_back(lease, key)
    if claim.winner is not None:
        logger.info(
            "replace: task %s[%s] key %s: replaced in the queue by %s -> not run",
            task.name, request.id, key, claim.winner,
        )  # fmt: skip
        signals.lock_contended.send(
            sender=task, task_id=request.id, key=key, holder=claim.winner, ttl=None,
            action="replaced", countdown=None, attempt=None,
        )  # fmt: skip
        return replaced_result(key, claim.winner)
    if claim.verdict == waiters.CLAIM_SPLIT:
        raise LockContended(place, None, None, split=True)
    errors = claim.errors or {"fate": "too few nodes answered"}
    raise QuorumUnavailable(place, errors, redlock.quorum)
