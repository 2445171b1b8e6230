"""What both drivers agree on before any I/O: quorum arithmetic, reply predicates
and argument checks.

Pure functions and plain data; rules.py writes the operations with them and with
steps.py's step types. Must not import the node set, redlock.py, asyncio or Celery.
"""

from __future__ import annotations

from typing import Optional, Union

from ..errors import ConfigurationError, LockLost
from . import validate
from .lease import LeaseState
from .stored import INTERNAL

__all__ = [
    "CLOCK_PRECISION",
    "TOKEN_LENGTH",
    "clear_match",
    "enough_no",
    "is_answer",
    "is_one",
    "judge_exit",
    "lease_value",
    "quorum",
    "token_argument",
]

#: Redis expires a key up to 1 ms early; one more ms for our own clock's granularity.
CLOCK_PRECISION = 0.002
#: Bounds of a caller-chosen token's length, in characters (ours: 27).
TOKEN_LENGTH = (16, 256)


def quorum(n: int) -> int:
    """How many of ``n`` nodes make a majority."""
    return n // 2 + 1


def enough_no(n: int, need: Optional[int] = None) -> int:
    """How many of ``n`` nodes saying no (refusing, failing) put ``need`` yes (default:
    a majority) out of reach: ``n - need + 1``. As many nodes meet every quorum, so
    hearing that many is hearing at least one node of any quorum (wake-ups)."""
    return n - (quorum(n) if need is None else need) + 1


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


def judge_exit(
    lease: LeaseState, lost: Optional[str], released: Union[bool, BaseException]
) -> None:
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
