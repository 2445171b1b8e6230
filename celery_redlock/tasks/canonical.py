"""Canonical form of a task call's arguments, and its digest: the hashed part of a
lock key (keys.py builds the key around it).

The digest is BLAKE2b with a 16-byte digest (32 hex characters) of the canonical
encoding of the arguments: 128 bits make an accidental collision negligible, BLAKE2b
is in every CPython's hashlib (no OpenSSL needed) and takes the digest size as a
parameter rather than truncating a longer hash.

Canonical encoding: JSON with sorted keys, ``separators=(",", ":")``,
``ensure_ascii=False``, UTF-8 (lone surrogates kept by ``surrogatepass``), no NaN.
The key must be the same for the arguments a caller passes and for what a worker gets
back from Celery's default ``json`` serializer (``kombu.utils.json``), so the encoding
follows that round trip:

* tuples and lists encode alike (JSON delivers tuples as lists);
* ``True``, ``1``, ``1.0`` and ``"1"`` stay distinct (JSON keeps them distinct);
* dict keys that are int, float, bool or None are written the way JSON writes them
  (``1`` -> ``"1"``, ``True`` -> ``"true"``, ``None`` -> ``"null"``), because the
  worker receives them as those strings: ``{1: x}`` and ``{"1": x}`` are one call
  after the round trip, so they share a key. Sharing is the safe direction for a
  mutex (one call waits for the other); splitting would let the enqueue-time and
  run-time keys disagree. A dict holding both ``1`` and ``"1"`` loses a value in
  JSON: it is refused.
* kombu's tagged types -- datetime, date, time, Decimal, UUID, bytes -- encode as
  ``{"__type__": ..., "__value__": ...}``; a plain dict with exactly those two keys
  would be decoded into another type by the worker, so it is refused (and so can
  never collide with a tagged value).
* str, int and float subclasses (enums) encode as their plain value, as JSON does.

Anything else (objects, sets, NaN, recursive structures) raises ``LockKeyError``
naming the task and the argument (with a path such as ``items[3].when``). A
parameter left at a default that has no canonical form (a sentinel ``object()``)
is written as "the default": a call can only carry that very object by omitting
it. Under another serializer (pickle) values arrive unchanged, so the keys agree too.

A pure function of the arguments: imports errors.py only (no Celery, kombu or Redis).
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import hashlib
import json
import math
import uuid
from typing import Any, Mapping, Optional, Sequence

from ..errors import LockKeyError

__all__ = ["DIGEST_SIZE", "HOW_TO_FIX", "MAX_DEPTH", "canonical", "digest"]

#: Bytes of the BLAKE2b digest: 16 bytes, 32 hex characters.
DIGEST_SIZE = 16
#: Containers nested deeper than this are refused (far below Python's recursion limit,
#: which the caller's own stack shares).
MAX_DEPTH = 100
#: What an error about an argument that cannot be keyed suggests.
HOW_TO_FIX = "pass redlock_key a template or a list of argument names that leaves it out"

_ACCEPTED = (
    "str, int, float, bool, None, list, tuple, dict (keys str, int, float, bool or None), "
    "datetime, date, time, Decimal, UUID and bytes"
)

# Types JSON writes as they are: a container holding only these needs no walk.
_PLAIN = frozenset({str, int, bool, type(None)})
_STR = frozenset({str})
_TAG_KEYS = frozenset({"__type__", "__value__"})
# What a parameter left at an uncanonical default is written as. It has the shape of a
# tag, which no argument can have (such dicts are refused), so it collides with nothing.
_DEFAULT_TAG = {"__type__": "default", "__value__": None}


class _Unkeyable(Exception):
    """A value has no canonical form. ``path`` grows innermost-first while unwinding."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.path: list[str] = []


# -- canonical encoding ---------------------------------------------------------------


def _tag(value: Any) -> Any:
    """``json`` default hook: the tagged form of the types kombu's JSON restores."""
    # Each written as kombu writes it, so a value and its round trip agree.
    if isinstance(value, dt.datetime):  # before date: a datetime is a date
        return {"__type__": "datetime", "__value__": dt.datetime.isoformat(value)}
    if isinstance(value, dt.date):
        return {"__type__": "date", "__value__": value.isoformat()}
    if isinstance(value, dt.time):
        return {"__type__": "time", "__value__": value.isoformat()}
    if isinstance(value, decimal.Decimal):
        return {"__type__": "decimal", "__value__": str(value)}
    if isinstance(value, uuid.UUID):
        return {"__type__": "uuid", "__value__": value.hex}
    if isinstance(value, bytes):
        return {"__type__": "bytes", "__value__": base64.b64encode(value).decode("ascii")}
    raise TypeError(f"{type(value).__name__} slipped past the canonical walk")


_ENCODER = json.JSONEncoder(
    ensure_ascii=False,
    check_circular=False,  # the walk has refused cycles already
    allow_nan=False,
    sort_keys=True,
    separators=(",", ":"),
    default=_tag,
)


def _encode(value: Any) -> bytes:
    """The canonical bytes of a value the walk has accepted."""
    return _ENCODER.encode(value).encode("utf-8", "surrogatepass")


def digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=DIGEST_SIZE).hexdigest()


def _json_key(key: Any) -> str:
    """The str JSON writes for a dict key (and the worker therefore receives)."""
    if type(key) is str:
        return key
    if key is None:
        return "null"
    if key is True:
        return "true"
    if key is False:
        return "false"
    if isinstance(key, str):
        return str.__str__(key)
    try:
        if isinstance(key, int):
            return int.__repr__(key)
        if isinstance(key, float) and math.isfinite(key):
            return float.__repr__(key)
    except ValueError as exc:  # an int beyond the str conversion limit
        raise _Unkeyable(f"has a key JSON cannot write ({exc})") from None
    raise _Unkeyable(
        f"has a key {key!r:.60} of type {type(key).__name__}; JSON keys are str, "
        "int, float (finite), bool or None"
    )


def _segment(key: Any) -> str:
    return f".{key}" if isinstance(key, str) and key.isidentifier() else f"[{key!r:.40}]"


def _normal(value: Any, depth: int, active: set[int]) -> Any:
    """``value`` as JSON will write it: the object itself when nothing changes (no copies),
    else a rebuilt container (dict keys made str). Raises _Unkeyable."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    if kind is float:
        if math.isfinite(value):
            return value
        raise _Unkeyable(f"is {value!r}; NaN and infinity have no JSON form")
    if isinstance(value, (dict, list, tuple)):
        if depth >= MAX_DEPTH:
            raise _Unkeyable(f"nests containers deeper than {MAX_DEPTH} levels")
        ident = id(value)
        if ident in active:
            raise _Unkeyable("contains itself (a recursive structure)")
        active.add(ident)
        try:
            if isinstance(value, dict):
                return _normal_dict(value, depth + 1, active)
            return _normal_list(value, depth + 1, active)
        finally:
            active.discard(ident)
    if isinstance(value, (str, int)):  # subclasses (enums): JSON writes the plain value
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        raise _Unkeyable(f"is {value!r}; NaN and infinity have no JSON form")
    if isinstance(value, decimal.Decimal):
        if value.is_finite():
            return value
        raise _Unkeyable(f"is Decimal({str(value)!r}); only finite numbers make a key")
    if isinstance(value, (dt.date, dt.time, uuid.UUID, bytes)):
        return value
    where = "" if kind.__module__ == "builtins" else f"{kind.__module__}."
    raise _Unkeyable(f"is a {where}{kind.__qualname__}, which has no JSON form")


def _normal_list(value: Sequence[Any], depth: int, active: set[int]) -> Any:
    if _PLAIN.issuperset(map(type, value)):
        return value
    rebuilt: Optional[list[Any]] = None
    for index, item in enumerate(value):
        try:
            normal = _normal(item, depth, active)
        except _Unkeyable as exc:
            exc.path.append(f"[{index}]")
            raise
        if rebuilt is None and normal is not item:
            rebuilt = list(value[:index])
        if rebuilt is not None:
            rebuilt.append(normal)
    return value if rebuilt is None else rebuilt


def _normal_dict(value: Mapping[Any, Any], depth: int, active: set[int]) -> Any:
    if (
        _STR.issuperset(map(type, value))
        and _PLAIN.issuperset(map(type, value.values()))
        and not (len(value) == 2 and _TAG_KEYS.issuperset(value))
    ):
        return value
    rebuilt: dict[str, Any] = {}
    changed = False
    for key, item in value.items():
        try:
            name = _json_key(key)
            normal = _normal(item, depth, active)
        except _Unkeyable as exc:
            exc.path.append(_segment(key))
            raise
        if name in rebuilt:
            first = next(k for k in value if k is not key and _json_key(k) == name)
            raise _Unkeyable(
                f"has the keys {first!r} and {key!r}, which JSON writes as one key {name!r}"
            )
        rebuilt[name] = normal
        changed = changed or name is not key or normal is not item
    if len(rebuilt) == 2 and _TAG_KEYS.issuperset(rebuilt):
        raise _Unkeyable(
            "is a dict with exactly the keys '__type__' and '__value__', which the "
            "worker's JSON decoder turns into another type; rename a key"
        )
    return rebuilt if changed else value


# -- arguments -----------------------------------------------------------------------


def _normal_argument(task_name: str, defaults: Mapping[str, Any], name: str, value: Any) -> Any:
    try:
        return _normal(value, 0, set())
    except _Unkeyable as exc:
        if name in defaults and value is defaults[name]:
            return _DEFAULT_TAG
        segments = exc.path[::-1]
        path = name + "".join(segments[:12]) + ("..." if len(segments) > 12 else "")
        raise LockKeyError(
            f"task {task_name!r}: argument {path!r} {exc.reason}; a lock key needs "
            f"{_ACCEPTED}; or {HOW_TO_FIX}"
        ) from None


def canonical(
    task_name: str, arguments: Mapping[str, Any], defaults: Mapping[str, Any], max_bytes: int
) -> bytes:
    """The canonical bytes of ``{name: argument}`` (raises LockKeyError naming one).

    ``defaults``: the run signature's defaults; an argument that is its parameter's
    very default object is written as "the default" when it has no canonical form.
    """
    if _PLAIN.issuperset(map(type, arguments.values())):
        normal: Mapping[str, Any] = arguments
    else:
        normal = {
            name: _normal_argument(task_name, defaults, name, value)
            for name, value in arguments.items()
        }
    try:
        encoded = _encode(normal)
    except (ValueError, RecursionError) as exc:
        raise _encoding_failure(task_name, normal, exc) from exc
    if len(encoded) > max_bytes:
        sizes = {name: len(_encode(value)) for name, value in normal.items()}
        biggest = max(sizes, key=sizes.__getitem__)
        raise LockKeyError(
            f"task {task_name!r}: argument {biggest!r} is {sizes[biggest]} bytes as "
            f"canonical JSON, and the arguments ({len(encoded)} bytes) exceed the "
            f"{max_bytes}-byte limit for hashing a lock key (redlock_key_max_bytes); "
            f"{HOW_TO_FIX}"
        )
    return encoded


def _encoding_failure(
    task_name: str, normal: Mapping[str, Any], error: BaseException
) -> LockKeyError:
    """The LockKeyError naming the argument JSON could not write (a huge int, say)."""
    culprit, reason = "?", error
    for name, value in normal.items():
        try:
            _encode(value)
        except (ValueError, RecursionError) as exc:
            culprit, reason = name, exc
            break
    return LockKeyError(
        f"task {task_name!r}: argument {culprit!r} cannot be written as JSON ({reason}); "
        f"{HOW_TO_FIX}"
    )
