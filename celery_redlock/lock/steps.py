"""The step protocol: how an operation asks its driver for rounds and waits.

An operation (rules.py) is written once as *steps*, a generator that yields what it
needs done and returns the operation's value. It yields

- ``Ask``: one round -- the command to every node, its deadline, when it is decided
  (``is_yes``, ``enough_yes``/``enough_no``), and an ``undo`` sent without waiting
  if the round is abandoned (a cancelled asyncio acquire); it is sent the round's
  per-node results, in node order (a reply, a redis-py error, or ``NOT_AWAITED``);
- ``Pause``: a wait between acquire attempts, which a driver that hears releases
  (redlock.py through wake.py) ends at the key's release; sent ``[]``;
- ``Settle``: wait until no extension round of a lease is in flight; sent ``[]``.

The steps of every operation are ``LockRules``' methods (rules.py). A driver runs
them with its own I/O: ``drive`` here for a blocking round function (``Redlock``,
over ``NodeSet.round``), an ``await`` per round in asyncio/redlock.py. No sockets
and no clock: tests drive steps with scripted replies (tests/lock/test_steps.py).
Must not import the node set, redlock.py, asyncio or Celery.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Callable, NamedTuple, Optional, TypeVar, Union

from ..wire.resp import Command
from .lease import LeaseState

__all__ = ["Ask", "Pause", "Settle", "Steps", "drive"]

T = TypeVar("T")


class Ask(NamedTuple):
    """One round, as the steps of an operation ask for it (``NodeSet.round``'s
    arguments, and what to do if the round is abandoned half-way)."""

    command: Command
    timeout: float
    is_yes: Callable[[object], bool] = bool
    enough_yes: Optional[int] = None
    enough_no: Optional[int] = None
    wait: bool = True
    deliver: bool = False
    #: Builds what is sent to every node at once, without waiting, when the round is
    #: cancelled (asyncio): an acquire's release, so a cancelled acquire keeps nothing.
    undo: Optional[Callable[[], Command]] = None
    #: Decides the round early from the results so far (``AWAITED`` for a node not
    #: heard yet; wire/round.py): for outcomes that are not a count of yes.
    settled: Optional[Callable[[list[object]], bool]] = None


class Pause(NamedTuple):
    """Wait before the next step (a blocking acquire between attempts).

    A driver that cannot hear releases sleeps ``seconds`` (polling). One that can
    (the synchronous lock, wake.py) treats ``keys`` as the lock keys whose release
    ends the wait: at the first such pause it subscribes to their wake channels and
    does not wait (the next attempt comes after the subscription, so a release
    between that attempt and the next wait is heard); at the next ones it waits
    for a release up to ``longest`` (the holder's remaining TTL, bounded by the
    caller's timeout), or up to ``seconds`` where too few nodes could be heard.
    ``wake_on``: the nodes (by index) whose messages end the wait (None: any node's);
    after an attempt a quorum refused, those that refused it (wake.py)."""

    seconds: float
    keys: tuple[str, ...] = ()
    longest: Optional[float] = None
    wake_on: Optional[frozenset[int]] = None


class Settle(NamedTuple):
    """Wait until no extension round of ``lease`` is in flight (before its holds are
    counted: a plain EXTEND landing after a REENTER would shorten the key). The
    synchronous driver has nothing to wait for: ``Lease.count_holds`` takes the
    lease's lock, which an extension round holds."""

    lease: LeaseState


#: An operation written once for both drivers: yields rounds (sent their results),
#: pauses and settles (sent ``[]``), returns its value.
Steps = Generator[Union[Ask, Pause, Settle], list[object], T]


def drive(
    steps: Steps[T],
    round_trip: Callable[[Ask], list[object]],
    sleep: Callable[[float], None],
    pause: Optional[Callable[[Pause], None]] = None,
) -> T:
    """Run ``steps`` with a blocking round function and sleep; the operation's value.
    ``pause``: how a ``Pause`` is waited (default: ``sleep(pause.seconds)``)."""
    try:
        step = next(steps)
        while True:
            if isinstance(step, Ask):
                step = steps.send(round_trip(step))
            else:
                if isinstance(step, Pause):
                    if pause is None:
                        sleep(step.seconds)
                    else:
                        pause(step)
                step = steps.send([])
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
