"""Value checks shared by every room: each returns the value in its working form or
raises ConfigurationError naming the setting (or argument) and what it accepts.

One rule per kind of value -- durations, choices, flags, counts, fractions, key
prefixes, lock key names, text, lists of node URLs -- so a setting, a task option, a
Redlock argument and a CLI option that take the same kind of value accept the same
values. The callers pass the name to put in the message (``redlock_ttl``, ``ttl``,
``Scheduler.redlock_beat_clock_skew``).

Durations are seconds: int, float or ``timedelta``, finite; bool is refused (it is
an int to Python, never a duration to a user). Their messages come in three
wordings, kept because users and tests read them:

- ``FAULT`` (Redlock's arguments) names the one thing wrong: not a number, not
  finite, or out of range;
- ``SETTING`` (app settings and task options) says "a finite number of seconds"
  for anything that is not one, or names the bound;
- ``RULE`` (beat's class-attribute-or-setting durations) states the whole rule.

Imports errors.py only: every other room may import this one.
"""

from __future__ import annotations

import math
import re
from datetime import timedelta
from typing import Any, Literal, Optional, Sequence

from ..errors import ConfigurationError

__all__ = [
    "FAULT",
    "MAX_PERMITS",
    "RULE",
    "SETTING",
    "UNLIMITED",
    "choice",
    "count",
    "flag",
    "fraction",
    "key_prefix",
    "key_spec",
    "lock_key_list",
    "lock_key_name",
    "node_list",
    "optional_rate",
    "optional_seconds",
    "permit_count",
    "rate",
    "seconds",
    "task_limit",
    "utf8_text",
]

#: A duration's lower bound: more than zero, zero or more, or none.
Bound = Optional[Literal["> 0", ">= 0"]]
Wording = Literal["fault", "setting", "rule"]
FAULT: Wording = "fault"
SETTING: Wording = "setting"
RULE: Wording = "rule"

_TYPES = "(int, float or timedelta)"


def optional_seconds(
    name: str, value: object, *, minimum: Bound = "> 0", wording: Wording = FAULT
) -> Optional[float]:
    """``None``, or :func:`seconds` (the range message then says "or None")."""
    if value is None:
        return None
    return _seconds(name, value, minimum, wording, optional=True)


def wait_limit(name: str, value: object) -> Optional[float]:
    """How long a blocking call may wait: seconds >= 0, or ``None`` / ``float("inf")``
    for no limit (returned as ``None``)."""
    if isinstance(value, float) and value == math.inf:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
        raise ConfigurationError(
            f"{name} must be >= 0 seconds, or None / float('inf') to wait until "
            f"acquired, got {value!r}"
        )
    try:
        return optional_seconds(name, value, minimum=">= 0")
    except ConfigurationError as exc:
        raise ConfigurationError(f"{exc} (None or float('inf'): wait until acquired)") from None


def seconds(name: str, value: object, *, minimum: Bound = "> 0", wording: Wording = FAULT) -> float:
    """A duration as float seconds: int, float or timedelta, finite, within ``minimum``."""
    return _seconds(name, value, minimum, wording, optional=False)


def _seconds(name: str, value: object, minimum: Bound, wording: Wording, optional: bool) -> float:
    number = value.total_seconds() if isinstance(value, timedelta) else value
    got = f"got {type(value).__name__}: {value!r}"
    rule = f"{name} must be a number of seconds{' ' + minimum if minimum else ''} {_TYPES}, {got}"
    if isinstance(number, bool) or not isinstance(number, (int, float)):
        if wording == RULE:
            raise ConfigurationError(rule)
        finite = "finite " if wording == SETTING else ""
        raise ConfigurationError(f"{name} must be a {finite}number of seconds {_TYPES}, {got}")
    if not math.isfinite(number):
        if wording == RULE:
            raise ConfigurationError(rule)
        if wording == SETTING:
            raise ConfigurationError(f"{name} must be a finite number of seconds {_TYPES}, {got}")
        raise ConfigurationError(f"{name} must be a finite number of seconds, got {number!r}")
    if (minimum == "> 0" and number <= 0) or (minimum == ">= 0" and number < 0):
        if wording == RULE:
            raise ConfigurationError(rule)
        or_none = " or None" if optional else ""
        raise ConfigurationError(f"{name} must be {minimum} seconds{or_none}, got {number!r}")
    return float(number)


def choice(name: str, value: object, accepted: Sequence[str]) -> str:
    """One of ``accepted`` (compared as given: no case folding)."""
    if value not in accepted:
        raise ConfigurationError(
            f"{name} must be one of {', '.join(repr(a) for a in accepted)}, got {value!r}"
        )
    return str(value)


def flag(name: str, value: object) -> bool:
    """True or False itself: ``"yes"`` or ``1`` is more likely a mistake than a wish."""
    if not isinstance(value, bool):
        raise ConfigurationError(f"{name} must be True or False, got {value!r}")
    return value


def count(name: str, value: object, *, minimum: int = 0) -> int:
    """An int (not a bool) of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigurationError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


#: The most permits one key may have (a limit's N, a rate's R): each acquire reads
#: up to that many slots inside one script on every node, which blocks it meanwhile.
MAX_PERMITS = 1000


def permit_count(name: str, value: object) -> int:
    """How many may hold a key at once (a limit's N): an int from 1 to MAX_PERMITS."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_PERMITS:
        raise ConfigurationError(
            f"{name} must be an int from 1 to {MAX_PERMITS} (how many may hold the key "
            f"at once), got {value!r}"
        )
    return value


#: ``redlock_limit``'s word for "no limit on how many at once" (a rate only).
UNLIMITED = "unlimited"


def task_limit(name: str, value: object) -> object:
    """A task's limit: an int from 1 to MAX_PERMITS, or ``"unlimited"``."""
    if value == UNLIMITED and isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_PERMITS:
        raise ConfigurationError(
            f"{name} must be an int from 1 to {MAX_PERMITS} (how many may run at once per "
            f'lock key) or "{UNLIMITED}" (with a rate only), got {value!r}'
        )
    return value


def optional_rate(name: str, value: object) -> Optional[tuple[int, float]]:
    """None (no rate) or a rate (``rate``)."""
    return None if value is None else rate(name, value)


_PERIODS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_RATE = re.compile(r"\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)?\s*([smhd])\s*", re.ASCII)


def rate(name: str, value: object) -> tuple[int, float]:
    """A rate as ``(starts, period in seconds)``: ``"R/s"``, ``"R/m"``, ``"R/h"``,
    ``"R/d"`` (also ``"R/10s"``: R per 10 seconds), or a ``(count, seconds)`` pair;
    R from 1 to MAX_PERMITS, the period finite and > 0."""
    accepted = (
        f'{name} must be "R/s", "R/m", "R/h" or "R/d" (optionally with a number before '
        f'the unit, "R/10s"), or a (count, seconds) pair, with R an int from 1 to '
        f"{MAX_PERMITS}; got {value!r}"
    )
    if isinstance(value, str):
        match = _RATE.fullmatch(value)
        if match is None:
            raise ConfigurationError(accepted)
        count_text, multiple, unit = match.groups()
        count_value: object = int(count_text)
        period: object = float(multiple or 1) * _PERIODS[unit]
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        count_value, period = value
    else:
        raise ConfigurationError(accepted)
    if isinstance(count_value, bool) or not isinstance(count_value, int):
        raise ConfigurationError(accepted)
    if not 1 <= count_value <= MAX_PERMITS:
        raise ConfigurationError(accepted)
    try:
        seconds_value = seconds(name + " period", period)
    except ConfigurationError:
        raise ConfigurationError(accepted) from None
    return count_value, seconds_value


def fraction(name: str, value: object) -> float:
    """A number in [0, 1) (a drift factor)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ConfigurationError(f"{name} must be in [0, 1), got {value!r}")
    return float(value)


def key_prefix(name: str, value: object) -> str:
    """A non-empty str of printable characters without spaces: every lock key starts
    with it, and keys are shown and typed as one token (logs, the CLI)."""
    if not (isinstance(value, str) and value and value.isprintable() and " " not in value):
        raise ConfigurationError(
            f"{name} must be a non-empty str without whitespace or control characters, "
            f"got {value!r}"
        )
    return value


def utf8_text(name: str, value: str) -> str:
    """Text UTF-8 can encode (no lone surrogates): keys and holders go on the wire."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigurationError(
            f"{name} must be text that UTF-8 can encode, got {value!r} ({exc.reason} at "
            f"position {exc.start})"
        ) from None
    return value


def lock_key_name(value: object, *, reserved: str, name: str = "key") -> str:
    """A lock key: non-empty UTF-8 text without ``reserved``, the character that
    separates a lock key from the lock's own keys beside it."""
    if not isinstance(value, str) or not value:
        raise ConfigurationError(
            f"{name} must be a non-empty str, got {type(value).__name__}: {value!r}"
        )
    if reserved in value:
        label = {"\x00": "NUL "}.get(reserved, "")
        raise ConfigurationError(
            f"{name} must not contain {label}({reserved!r}), got {value!r}: it separates a "
            "lock key from the lock's own keys (fence counters, release tombstones)"
        )
    return utf8_text(name, value)


def lock_key_list(value: object, *, reserved: str, most: int, name: str = "key") -> tuple[str, ...]:
    """Several lock keys taken together: a non-empty list or tuple of at most ``most``
    distinct lock keys (each as :func:`lock_key_name`), in canonical (sorted) order."""
    if not isinstance(value, (list, tuple)) or not value or len(value) > most:
        size = f"{len(value)} keys" if isinstance(value, (list, tuple)) else type(value).__name__
        shown = repr(value) if len(repr(value)) <= 200 else repr(value)[:200] + "..."
        raise ConfigurationError(
            f"{name} must be a non-empty str or a list of 1..{most} distinct non-empty str "
            f"keys, got {size}: {shown}"
        )
    keys = [
        lock_key_name(item, reserved=reserved, name=f"{name}[{i}]") for i, item in enumerate(value)
    ]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise ConfigurationError(
            f"{name} must list each key once, got {', '.join(repr(k) for k in twice)} more "
            "than once"
        )
    return tuple(sorted(keys))


def node_list(name: str, value: object) -> tuple[str, ...]:
    """A non-empty list of Redis URL strings, or one comma-separated string of them.

    Only the shape: each URL is parsed where a connection is made (node_set.py).
    """
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    if not isinstance(value, (list, tuple)) or not value:
        raise ConfigurationError(
            f"{name} must be a non-empty list of Redis URLs (or a comma-separated "
            f"string of them), got {value!r}"
        )
    for i, url in enumerate(value):
        if not isinstance(url, str):
            raise ConfigurationError(
                f"{name}[{i}] must be a Redis URL string, got {type(url).__name__}"
            )
    return tuple(value)


def key_spec(name: str, value: object) -> Any:
    """A task's lock key spec: None, a non-empty template str, a list (made a tuple)
    of argument names, or a callable. Whether the names fit the task's signature is
    checked where the signature is known (keys.validate_spec)."""
    if isinstance(value, list):
        value = tuple(value)
    if not (value is None or isinstance(value, (str, tuple)) or callable(value)):
        raise ConfigurationError(
            f"{name} must be None (all arguments), a template str such as "
            '"import:{customer_id}", a list of argument names, or a callable '
            f"returning a str; got {type(value).__name__}: {value!r}"
        )
    if isinstance(value, str) and not value:
        raise ConfigurationError(f"{name} must not be an empty string")
    return value
