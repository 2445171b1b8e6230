"""What both drivers agree on before any I/O: quorum arithmetic, reply predicates,
argument checks, and how an operation asks for rounds (``Ask``, ``Pause``,
``Steps``, ``drive``).

Pure functions and plain data; rules.py's ``LockRules`` writes the operations
with them. Must not import nodes.py, redlock.py, admin.py, asyncio or Celery.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Callable, NamedTuple, Optional, TypeVar, Union

from . import validate
from .errors import ConfigurationError, LockLost
from .holders import INTERNAL
from .lease import Lease
from .resp import Command

__all__ = [
    "CLOCK_PRECISION",
    "TOKEN_LENGTH",
    "Ask",
    "Pause",
    "Settle",
    "Steps",
    "clear_match",
    "drive",
    "is_answer",
    "is_one",
    "judge_exit",
    "lease_value",
    "quorum",
    "token_argument",
]

T = TypeVar("T")

#: Redis expires a key up to 1 ms early; one more ms for our own clock's granularity.
CLOCK_PRECISION = 0.002
#: Bounds of a caller-chosen token's length, in characters (ours: 27).
TOKEN_LENGTH = (16, 256)


def quorum(n: int) -> int:
    """How many of ``n`` nodes make a majority."""
    return n // 2 + 1


def is_one(reply: object) -> bool:
    return reply == 1


def is_answer(reply: object) -> bool:
    return not isinstance(reply, BaseException)


def token_argument(token: object) -> str:
    """A caller-chosen token (``acquire(token=...)``), checked: it is stored before the
    ``|`` of ``token|holder``, so it may not contain one, and it must be long enough to
    be unique to one acquisition."""
    low, high = TOKEN_LENGTH
    if not isinstance(token, str):
        raise ConfigurationError(
            f"token must be a str of {low}..{high} characters without '|', "
            f"got {type(token).__name__}: {token!r}"
        )
    if not low <= len(token) <= high:
        raise ConfigurationError(
            f"token must be {low}..{high} characters long (unique to one acquisition, "
            f"e.g. secrets.token_urlsafe(20)), got {len(token)}"
        )
    if "|" in token or INTERNAL in token or "\n" in token:
        raise ConfigurationError(
            f"token must not contain '|' (it separates token and holder), NUL or a "
            f"newline, got {token!r}"
        )
    return validate.utf8_text("token", token)


def lease_value(value: object) -> str:
    """A lease's stored ``token|holder`` value as handed to another process, checked."""
    if not isinstance(value, str) or "|" not in value:
        raise ConfigurationError(
            f"value must be a lease's stored value, a 'token|holder' str, got {value!r}"
        )
    return value


def judge_exit(lease: Lease, lost: Optional[str], released: Union[bool, BaseException]) -> None:
    """Leaving a ``lock`` block that did not raise, after its release (``released``:
    its outcome, or the ``QuorumUnavailable`` it raised). ``LockLost`` when the
    lease was lost while the block ran (``lost``: why) or the release found it no
    longer ours; the ``QuorumUnavailable`` when the release reached no quorum."""
    if isinstance(released, BaseException):
        if lost is not None:
            raise LockLost(lease.key, lost) from released
        raise released
    if lost is not None or not released:
        raise LockLost(lease.key, lost or "the key no longer held this lease's token")


def clear_match(match: object) -> str:
    """``clear``'s glob, checked."""
    if not isinstance(match, str) or not match or INTERNAL in match:
        raise ConfigurationError(
            f"match must be a non-empty glob str without NUL (e.g. 'report:*'), got {match!r}"
        )
    return validate.utf8_text("match", match)


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


class Pause(NamedTuple):
    """Wait before the next step (a blocking acquire between attempts).

    A driver that cannot hear releases sleeps ``seconds`` (polling). One that can
    (the synchronous lock, wake.py) treats ``keys`` as the lock keys whose release
    ends the wait: at the first such pause it subscribes to their wake channels and
    does not wait (the next attempt comes after the subscription, so a release
    between that attempt and the next wait is heard); at the next ones it waits
    for a release up to ``longest`` (the holder's remaining TTL, bounded by the
    caller's timeout), or up to ``seconds`` where too few nodes could be heard."""

    seconds: float
    keys: tuple[str, ...] = ()
    longest: Optional[float] = None


class Settle(NamedTuple):
    """Wait until no extension round of ``lease`` is in flight (before its holds are
    counted: a plain EXTEND landing after a REENTER would shorten the key). The
    synchronous driver has nothing to wait for: ``Lease.count_holds`` takes the
    lease's lock, which an extension round holds."""

    lease: Lease


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
