"""What each lock operation sends to one node, for one key or a set of keys.

Pure command builders shared by every driver (the sync ``Redlock`` and the asyncio
one): no sockets, no clock. A lease covers one key or, with ``acquire(["a", "b"])``,
a set of keys taken together (node-redlock's multi-resource locks): every key or
none, on each node in one script (scripts.py's ``*_MULTI``), in canonical (sorted)
order. The multi scripts reply in the shapes of the single-key ones, so one judge
reads both: ``refusal.is_granted`` / ``why_not`` for an acquire, ``reply == 1`` for
fence, extend and release, ``owned_judge`` for the read of ``Lease.owned``.

Timeline the set guards against, with one lock per key taken in turn::

    t0  A takes "a"              B takes "b"
    t1  A waits for "b"          B waits for "a"     (deadlock until a TTL runs out)

Taken as one set, on each node A either gets both keys or neither, so no node ever
holds half of A's set while B holds the other half.

Imports stored.py, resp.py, scripts.py, validate.py; must not import redlock.py,
lease.py or Celery.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence, Union

from ..errors import ConfigurationError
from ..wire.resp import Command
from . import permit_scripts, scripts, validate
from .stored import (
    FENCE_COUNTER_TTL,
    INTERNAL,
    fence_counter,
    hold_tombstone,
    permit_full,
    permit_grant,
    permit_of,
    permit_slot_prefix,
    permit_terms_record,
    permit_tombstone,
    reentry_holds,
    tombstone,
)

__all__ = [
    "MAX_KEYS",
    "Keys",
    "acquire_command",
    "extend_command",
    "extend_value_command",
    "fence_command",
    "lease_name",
    "lock_keys",
    "ms",
    "owned_command",
    "owned_judge",
    "reenter_command",
    "release_command",
]

#: How many keys one lease may take together: each is read and written on every
#: node inside one script, which blocks the node meanwhile.
MAX_KEYS = 64

#: A lease's keys, in canonical (sorted) order; one key for a plain lease.
Keys = tuple[str, ...]


def ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def lock_keys(key: object, name: str = "key") -> Keys:
    """The keys an acquire names: one str, or a list (or tuple) of distinct keys taken
    together, sorted. ``ConfigurationError`` naming ``name`` otherwise."""
    if isinstance(key, str):
        return (validate.lock_key_name(key, reserved=INTERNAL, name=name),)
    return validate.lock_key_list(key, reserved=INTERNAL, most=MAX_KEYS, name=name)


def lease_name(keys: Keys) -> str:
    """How a lease on ``keys`` is named (``lease.key``, logs, errors): the key itself,
    or the keys joined by ``+`` in canonical order (a name, not a key on the nodes)."""
    return "+".join(keys)


def _as_keys(keys: Union[str, Sequence[str]]) -> Keys:
    return (keys,) if isinstance(keys, str) else tuple(keys)


def _tombstones(keys: Keys, value: str) -> list[str]:
    return [tombstone(k, value) for k in keys]


def acquire_command(
    keys: Union[str, Sequence[str]], value: str, ttl: float, fenced: bool
) -> Command:
    """Set ``value`` on every key for ``ttl`` s where all are free (fenced: also read
    the highest fence counter of the keys)."""
    keys = _as_keys(keys)
    if len(keys) > 1:
        counters = [fence_counter(k) for k in keys] if fenced else []
        return Command(
            scripts.ACQUIRE_MULTI,
            [*keys, *_tombstones(keys, value), *counters],
            [value, ms(ttl), len(keys), "1" if fenced else "0"],
        )
    key = keys[0]
    if fenced:
        return Command(
            scripts.ACQUIRE_FENCED,
            [key, tombstone(key, value), fence_counter(key)],
            [value, ms(ttl)],
        )
    return Command(scripts.ACQUIRE, [key, tombstone(key, value)], [value, ms(ttl)])


def fence_command(keys: Union[str, Sequence[str]], value: str, fence: int) -> Command:
    """Record ``fence`` on every key's counter where all keys still hold ``value``."""
    keys = _as_keys(keys)
    counter_ttl = ms(FENCE_COUNTER_TTL)
    if len(keys) > 1:
        counters = [fence_counter(k) for k in keys]
        return Command(
            scripts.FENCE_MULTI, [*keys, *counters], [value, fence, len(keys), counter_ttl]
        )
    return Command(scripts.FENCE, [keys[0], fence_counter(keys[0])], [value, fence, counter_ttl])


def reenter_command(key: str, value: str, hold: str, ttl: float) -> Command:
    """One more hold of ``value`` on ``key`` for ``ttl`` seconds (scripts.REENTER)."""
    return Command(
        scripts.REENTER,
        [key, reentry_holds(key, value), hold_tombstone(key, value, hold)],
        [value, ms(ttl), hold],
    )


def _no_holds(keys: Keys, hold: Optional[str]) -> None:
    """A ``hold`` belongs to a lease on one key: one on several is never re-entered."""
    if hold is not None and len(keys) > 1:
        raise ConfigurationError(
            f"hold must be None for a lease on several keys ({', '.join(keys)}), got "
            f"hold={hold!r}: such a lease has no reentrant holds (reentrant=True takes "
            "one key)"
        )


def release_command(
    keys: Union[str, Sequence[str]], value: str, ttl: float, hold: Optional[str] = None
) -> Command:
    """Release ``value`` on every key (one ``hold`` of it, when it was re-entered); a
    tombstone for ``ttl`` s where a key is absent."""
    keys = _as_keys(keys)
    _no_holds(keys, hold)
    if len(keys) > 1:
        return Command(
            scripts.RELEASE_MULTI,
            [*keys, *_tombstones(keys, value)],
            [value, ms(ttl), len(keys)],
        )
    key = keys[0]
    permit = permit_of(key)
    if permit is not None:  # a lease on one of a key's permits (permits.py)
        base, kind, _ = permit
        return Command(
            permit_scripts.RELEASE_PERMIT,
            [
                key,
                permit_tombstone(base, kind, value),
                permit_terms_record(base, kind),
                permit_full(base, kind),
                permit_grant(base, kind, value),
            ],
            [value, ms(ttl), base, permit_slot_prefix(base, kind)],
        )
    if hold is None:
        return Command(scripts.RELEASE, [key, tombstone(key, value)], [value, ms(ttl)])
    return Command(
        scripts.RELEASE_HOLD,
        [key, reentry_holds(key, value), tombstone(key, value), hold_tombstone(key, value, hold)],
        [value, hold, ms(ttl)],
    )


def extend_command(
    keys: Union[str, Sequence[str]], value: str, ttl: float, hold: Optional[str] = None
) -> Command:
    """Extend ``value`` on every key to ``ttl`` s from now; once re-entered, never
    shorter than it was (another hold of the value may count on it)."""
    keys = _as_keys(keys)
    _no_holds(keys, hold)
    if len(keys) > 1:
        return Command(scripts.EXTEND_MULTI, list(keys), [value, ms(ttl), len(keys)])
    key = keys[0]
    if hold is None:
        return Command(scripts.EXTEND, [key], [value, ms(ttl)])
    return Command(scripts.EXTEND_HOLD, [key, reentry_holds(key, value)], [value, ms(ttl)])


def extend_value_command(keys: Union[str, Sequence[str]], value: str, ttl: float) -> Command:
    """Extend ``value`` on every key to ``ttl`` s from now, for a caller that holds no
    lease, so knows no hold: once re-entered, as a hold's extension (never shorter,
    the holds with the key), else as a plain one."""
    keys = _as_keys(keys)
    if len(keys) > 1:
        return extend_command(keys, value, ttl)
    key = keys[0]
    return Command(scripts.EXTEND_VALUE, [key, reentry_holds(key, value)], [value, ms(ttl)])


def owned_command(keys: Union[str, Sequence[str]], value: str) -> Command:
    """Read whether every key holds ``value`` (judge the reply with ``owned_judge``)."""
    keys = _as_keys(keys)
    if len(keys) > 1:
        return Command(scripts.OWNED_MULTI, list(keys), [value])
    return Command(scripts.HOLDER, [keys[0]], [])


def owned_judge(keys: Union[str, Sequence[str]], value: str) -> Callable[[object], bool]:
    """Whether a node's reply to ``owned_command`` says it holds ``value`` on every key."""
    if len(_as_keys(keys)) > 1:
        return lambda reply: reply == 1
    raw = value.encode()
    return lambda reply: isinstance(reply, list) and bool(reply) and reply[0] == raw
