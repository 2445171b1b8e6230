"""What one extension round asks for and what its replies mean: pure arithmetic.

A lease is extended by one round, alone (``Lease.extend``, through redlock.py) or in
a batch with the other leases the watchdog renews at the same moment (renewals.py).
Both ask the same two questions, answered here once:

- ``extension_ttl``: before the round, what ttl to ask for (bounded by ``max_hold``),
  or the ``Extension`` the lease ends with without a round (validity already gone,
  or at the bound);
- ``extension_outcome``: after the round, from the per-node replies (1: extended,
  0: refused, an exception: no answer), whether the lease was extended, is lost,
  or may be tried again by ``retry_by``.

Every time is on the lock's monotonic clock; ``started`` is taken before the round's
first byte goes out, so the new validity never counts time the round took.

No I/O, no clock: imports lease.py's ``Extension`` and quorum.py's ``enough_no``
only.
"""

from __future__ import annotations

from typing import Callable, Optional, Protocol, Sequence, Union

from .lease import Extension
from .quorum import enough_no

__all__ = ["Extended", "extension_outcome", "extension_ttl"]


class Extended(Protocol):
    """What the arithmetic reads of a lease (``Lease`` is one)."""

    @property
    def deadline(self) -> float: ...
    @property
    def acquired_at(self) -> float: ...
    @property
    def max_hold(self) -> Optional[float]: ...


def extension_ttl(
    lease: Extended, ttl: float, started: float, margin: Callable[[float], float]
) -> Union[float, Extension]:
    """The ttl a round starting at ``started`` asks for, or the lease's ``Extension``
    with no round: validity already ran out (lost; "max_hold reached" when it ran out
    at the bound), or ``max_hold`` is reached (all None: let it run out).
    ``margin(ttl)``: the drift allowance for ``ttl``."""
    left = None if lease.max_hold is None else lease.acquired_at + lease.max_hold - started
    at_bound = left is not None and left <= margin(ttl)
    if lease.deadline - started <= 0:
        reason = "max_hold reached" if at_bound else "validity ran out before it was extended"
        return Extension(reason=reason)
    if left is not None:
        if at_bound:
            return Extension()  # at the bound: let it run out
        ttl = min(ttl, left)
    return ttl


def extension_outcome(
    results: Sequence[object],
    quorum: int,
    ttl: float,
    started: float,
    finished: float,
    deadline: float,
    margin: float,
    node_timeout: float,
) -> Extension:
    """One lease's outcome from its round's per-node ``results``.

    Extended when a majority extended it within its validity (``deadline``, the one
    it had before the round). Lost when a majority refused (the key is not ours there
    any more) or when another round could not finish a node_timeout before the
    deadline (so the loss is known before the lease runs out). Otherwise -- slow,
    hung or unreachable nodes -- ``retry_by`` says until when another round is worth
    it. ``ttl``: what the round asked for; ``margin``: its drift allowance.
    """
    won = sum(1 for r in results if r == 1)
    if won >= quorum and finished < deadline:
        return Extension(deadline=started + ttl - margin)
    errors = [r for r in results if isinstance(r, BaseException)]
    detail = f" ({errors[0]})" if errors else ""
    reason = f"extension reached {won} of {len(results)} nodes, needed {quorum}{detail}"
    refused = sum(1 for r in results if r == 0)
    # A retry round must end a node_timeout before the deadline, so that its
    # failure, too, is known while the lease is still valid.
    retry_by = deadline - margin - 2 * node_timeout
    if refused >= enough_no(len(results), quorum) or finished >= retry_by:
        return Extension(reason=reason)
    return Extension(reason=reason, retry_by=retry_by)
