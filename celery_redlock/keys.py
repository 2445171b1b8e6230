"""The lock key of a task call: one name per distinct call, the same at enqueue and run time.

``lock_key(task_name, run, args, kwargs)`` binds the arguments to ``run``'s signature
(defaults applied, so ``f(1, b=2)``, ``f(a=1, b=2)``, ``f(b=2, a=1)`` and ``f(1)`` with
``b=2`` as default are one call) and names the lock after them. ``spec`` (the task's
``redlock_key``) chooses how:

* ``None`` -- every argument: ``<prefix>:<task name>:<digest>``.
* ``["customer_id", ...]`` -- only these arguments: ``<prefix>:<task name>:<digest>``;
  ``[]`` means one lock for the task whatever its arguments.
* ``"import:{customer_id}"`` -- a template naming a *resource*: ``<prefix>:import:42``.
  It carries no task name, so tasks that share a template share the lock on purpose.
* a callable -- ``spec(*args, **kwargs)`` returns the key text: ``<prefix>:<text>``
  (hashed to ``#<32 hex>`` when longer than 200 characters, unprintable, holding
  whitespace or starting with ``#``).

A template value that is a str, int, bool or UUID is written as its text (``42``,
``acme``, ``True``) when that text is 1 to 64 printable characters without space,
``#``, braces or the character that follows the field in the template; any other
value is written as ``#`` + 32 hex digits of the hash of its canonical form. So a
key reads back one way: text stops exactly where the next literal starts, a hashed
part has a fixed length, and text never starts with ``#``. Two values share a part
only when they are equal or have the same text: ``42`` and ``"42"`` name the same
resource, on purpose.

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

This module is a pure function of (task name, run callable, args, kwargs): it must
not import Celery's app machinery, kombu or Redis.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import functools
import hashlib
import inspect
import json
import math
import string
import uuid
from typing import Any, Callable, Mapping, NamedTuple, Optional, Sequence, Union

from .errors import LockKeyError

__all__ = ["KeySpec", "lock_key", "validate_spec"]

#: What a task's ``redlock_key`` may be: see the module docstring.
KeySpec = Union[None, str, Sequence[str], Callable[..., str]]

#: Bytes of the BLAKE2b digest: 16 bytes, 32 hex characters.
DIGEST_SIZE = 16
#: A template value longer than this (characters) is hashed.
TEMPLATE_PART_MAX = 64
#: A callable's key text longer than this (characters) is hashed.
CALLABLE_KEY_MAX = 200
#: Containers nested deeper than this are refused (far below Python's recursion limit,
#: which the caller's own stack shares).
MAX_DEPTH = 100

_ACCEPTED = (
    "str, int, float, bool, None, list, tuple, dict (keys str, int, float, bool or None), "
    "datetime, date, time, Decimal, UUID and bytes"
)
_HOW_TO_FIX = "pass redlock_key a template or a list of argument names that leaves it out"

# Types JSON writes as they are: a container holding only these needs no walk.
_PLAIN = frozenset({str, int, bool, type(None)})
_STR = frozenset({str})
_TAG_KEYS = frozenset({"__type__", "__value__"})
# What a parameter left at an uncanonical default is written as. It has the shape of a
# tag, which no argument can have (such dicts are refused), so it collides with nothing.
_DEFAULT_TAG = {"__type__": "default", "__value__": None}
# Characters a template value written as text must not contain: whitespace and braces
# keep keys one readable token; '#' starts a hashed part, so text never looks like one.
_TEMPLATE_FORBIDDEN = " #{}"


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


def _digest(data: bytes) -> str:
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


# -- signatures and binding -----------------------------------------------------------


class _Plan(NamedTuple):
    """What binding needs from a run callable's signature, worked out once per callable."""

    signature: inspect.Signature
    names: tuple[str, ...]  # every parameter, in order
    name_set: frozenset[str]
    positional: tuple[str, ...]  # parameters a positional argument may fill, in order
    defaults: Mapping[str, Any]
    var_keyword: Optional[str]  # the **kwargs parameter's name
    # No *args, **kwargs or positional-only parameter: a dict build replaces
    # Signature.bind (about 4x faster) for calls that bind cleanly.
    simple: bool


def _build_plan(run: Callable[..., Any]) -> _Plan:
    signature = inspect.signature(run)
    params = list(signature.parameters.values())
    kinds = {p.kind for p in params}
    var_keyword = next((p.name for p in params if p.kind is p.VAR_KEYWORD), None)
    return _Plan(
        signature=signature,
        names=tuple(p.name for p in params),
        name_set=frozenset(p.name for p in params),
        positional=tuple(
            p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ),
        defaults={p.name: p.default for p in params if p.default is not p.empty},
        var_keyword=var_keyword,
        simple=not kinds
        & {
            inspect.Parameter.VAR_POSITIONAL,
            inspect.Parameter.VAR_KEYWORD,
            inspect.Parameter.POSITIONAL_ONLY,
        },
    )


# Keyed on the callable: a bound method (bind=True tasks, class-based run) hashes and
# compares by its function and the identity of its instance, so each ``task.run``
# access hits. Bounded: tasks are few, but closures made per call would not be.
_cached_plan = functools.lru_cache(maxsize=1024)(_build_plan)


def _plan(task_name: str, run: Callable[..., Any]) -> _Plan:
    try:
        return _cached_plan(run)
    except (TypeError, ValueError):  # unhashable, or no signature: say which below
        pass
    try:
        return _build_plan(run)
    except (TypeError, ValueError) as exc:
        raise LockKeyError(
            f"task {task_name!r}: cannot read the signature of its run callable {run!r:.80} ({exc})"
        ) from exc


def _bind(
    task_name: str, plan: _Plan, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> dict[str, Any]:
    """Parameter name -> argument, defaults applied; ``*args`` as a tuple, ``**kwargs``
    as a dict."""
    if plan.simple and len(args) <= len(plan.positional):
        arguments = dict(zip(plan.positional, args))
        clean = True
        for name, value in kwargs.items():
            if name in arguments or name not in plan.name_set:
                clean = False  # Signature.bind says what is wrong
                break
            arguments[name] = value
        if clean:
            if len(arguments) < len(plan.names):
                for name, default in plan.defaults.items():
                    arguments.setdefault(name, default)
            if len(arguments) == len(plan.names):
                return arguments
    try:
        bound = plan.signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise LockKeyError(
            f"task {task_name!r}: the arguments do not fit run{plan.signature} ({exc}); "
            "the call would fail"
        ) from None
    bound.apply_defaults()
    return dict(bound.arguments)


def _accepted_names(plan: _Plan) -> str:
    names = ", ".join(plan.names) or "(none)"
    if plan.var_keyword is not None:
        names += f" (and the keys of **{plan.var_keyword})"
    return names


def _lookup(task_name: str, plan: _Plan, arguments: Mapping[str, Any], name: str) -> Any:
    if name in arguments:
        return arguments[name]
    extra = arguments.get(plan.var_keyword) if plan.var_keyword is not None else None
    if isinstance(extra, Mapping) and name in extra:
        return extra[name]
    raise LockKeyError(
        f"task {task_name!r}: redlock_key names the argument {name!r}, which "
        f"{'was not passed' if plan.var_keyword else 'is not a parameter of run'}; "
        f"accepted names: {_accepted_names(plan)}"
    )


# -- canonical arguments --------------------------------------------------------------


def _normal_argument(task_name: str, plan: _Plan, name: str, value: Any) -> Any:
    try:
        return _normal(value, 0, set())
    except _Unkeyable as exc:
        if name in plan.defaults and value is plan.defaults[name]:
            return _DEFAULT_TAG
        segments = exc.path[::-1]
        path = name + "".join(segments[:12]) + ("..." if len(segments) > 12 else "")
        raise LockKeyError(
            f"task {task_name!r}: argument {path!r} {exc.reason}; a lock key needs "
            f"{_ACCEPTED}; or {_HOW_TO_FIX}"
        ) from None


def _canonical(task_name: str, plan: _Plan, arguments: Mapping[str, Any], max_bytes: int) -> bytes:
    """The canonical bytes of ``{name: argument}`` (raises LockKeyError naming one)."""
    if _PLAIN.issuperset(map(type, arguments.values())):
        normal: Mapping[str, Any] = arguments
    else:
        normal = {
            name: _normal_argument(task_name, plan, name, value)
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
            f"{_HOW_TO_FIX}"
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
        f"{_HOW_TO_FIX}"
    )


# -- templates ------------------------------------------------------------------------


class _Piece(NamedTuple):
    literal: str  # text before the field
    field: Optional[str]  # None for the trailing literal
    forbidden: str  # characters the field's value may not contain when written as text


class _BadTemplate(Exception):
    pass


@functools.lru_cache(maxsize=256)
def _parse_template(template: str) -> tuple[_Piece, ...]:
    """The template's literal text and fields; raises _BadTemplate saying what is wrong."""
    if not template:
        raise _BadTemplate("is an empty template")
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise _BadTemplate(
            f"is not a valid template ({exc}); write literal braces as {{{{ }}}}"
        ) from None
    pieces: list[_Piece] = []
    for index, (literal, field, format_spec, conversion) in enumerate(parsed):
        if literal and not (literal.isprintable() and " " not in literal):
            raise _BadTemplate(f"has whitespace or control characters in {literal!r}")
        if field is None:
            pieces.append(_Piece(literal, None, ""))
            continue
        if field == "" or field.isdigit():
            raise _BadTemplate(
                f"has the positional field {{{field}}}; name a parameter, e.g. {{customer_id}}"
            )
        if "." in field or "[" in field:
            raise _BadTemplate(
                f"has the field {{{field}}}; attribute and index access are not supported, "
                "name a parameter"
            )
        if conversion or format_spec:
            raise _BadTemplate(
                f"has a conversion or format spec in the field {{{field}}}; values are "
                "written by celery-redlock, name the parameter only"
            )
        following = parsed[index + 1][0] if index + 1 < len(parsed) else ""
        if not following and index + 1 < len(parsed) and parsed[index + 1][1] is not None:
            raise _BadTemplate(
                f"has the fields {{{field}}}{{{parsed[index + 1][1]}}} side by side; "
                f"separate them with literal text, e.g. {{{field}}}:{{{parsed[index + 1][1]}}}"
            )
        # Text stops at the first character of the literal after it, so the key reads
        # back unambiguously: text parts contain none of it, hashed parts are fixed-length.
        pieces.append(_Piece(literal, field, _TEMPLATE_FORBIDDEN + following[:1]))
    return tuple(pieces)


def _template(task_name: str, template: str) -> tuple[_Piece, ...]:
    try:
        return _parse_template(template)
    except _BadTemplate as exc:
        raise LockKeyError(f"task {task_name!r}: redlock_key {template!r:.120} {exc}") from None


def _as_text(value: Any) -> Optional[str]:
    """The text a value is written as in a template, if it is one of the textual types."""
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, int):
        try:
            return int.__repr__(value)
        except ValueError:  # beyond the str conversion limit: hash it
            return None
    if isinstance(value, uuid.UUID):
        return str(value)
    return None


def _template_part(task_name: str, plan: _Plan, piece: _Piece, value: Any, max_bytes: int) -> str:
    text = _as_text(value)
    if (
        text is not None
        and 0 < len(text) <= TEMPLATE_PART_MAX
        and text.isprintable()
        and not any(c in text for c in piece.forbidden)
    ):
        return text
    assert piece.field is not None
    return "#" + _digest(_canonical(task_name, plan, {piece.field: value}, max_bytes))


# -- the API --------------------------------------------------------------------------


def _check_settings(task_name: str, prefix: str, max_bytes: int) -> None:
    if not (isinstance(task_name, str) and task_name):
        raise LockKeyError(f"the task name must be a non-empty str, got {task_name!r}")
    if not (isinstance(prefix, str) and prefix and prefix.isprintable() and " " not in prefix):
        raise LockKeyError(
            f"task {task_name!r}: redlock_key_prefix must be a non-empty str without "
            f"whitespace or control characters, got {prefix!r}"
        )
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise LockKeyError(
            f"task {task_name!r}: redlock_key_max_bytes must be a positive int, got {max_bytes!r}"
        )


def _names(task_name: str, spec: Any) -> tuple[str, ...]:
    if isinstance(spec, (bytes, bytearray)) or not isinstance(spec, Sequence):
        raise LockKeyError(
            f"task {task_name!r}: redlock_key must be None (all arguments), a template str "
            f"such as 'import:{{customer_id}}', a list of argument names or a callable; "
            f"got {spec!r:.80}"
        )
    names = tuple(spec)
    for name in names:
        if not (isinstance(name, str) and name):
            raise LockKeyError(
                f"task {task_name!r}: redlock_key lists {name!r}, which is not an argument "
                "name (a non-empty str)"
            )
    return names


def _callable_key(
    task_name: str, spec: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]
) -> str:
    label = getattr(spec, "__qualname__", None) or repr(spec)
    try:
        result = spec(*args, **kwargs)
    except Exception as exc:
        raise LockKeyError(
            f"task {task_name!r}: the redlock_key callable {label} raised {exc!r:.200}"
        ) from exc
    if not (isinstance(result, str) and result):
        raise LockKeyError(
            f"task {task_name!r}: the redlock_key callable {label} must return a non-empty "
            f"str; it returned {result!r:.80} ({type(result).__name__})"
        )
    text = str.__str__(result)
    if (
        len(text) <= CALLABLE_KEY_MAX
        and text.isprintable()
        and " " not in text
        and not text.startswith("#")
    ):
        return text
    # Long or unprintable text is hashed; text that starts with '#' too, so it can
    # never pass for a hash.
    return "#" + _digest(text.encode("utf-8", "surrogatepass"))


def lock_key(
    task_name: str,
    run: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    *,
    prefix: str = "redlock",
    spec: KeySpec = None,
    max_bytes: int = 1 << 20,
) -> str:
    """The lock key of the call ``run(*args, **kwargs)`` of the task ``task_name``.

    A pure function: the same call gives the same key in every process, at enqueue
    time and at run time (after Celery's JSON round trip). ``prefix`` is the app's
    ``redlock_key_prefix`` (default ``"redlock"``), ``spec`` the task's
    ``redlock_key`` (see the module docstring), ``max_bytes`` the largest canonical
    encoding hashed (default 1 MiB). Raises LockKeyError naming the task and the
    argument when no key can be made.
    """
    _check_settings(task_name, prefix, max_bytes)
    if spec is not None and not isinstance(spec, str) and callable(spec):
        return f"{prefix}:{_callable_key(task_name, spec, args, kwargs)}"
    plan = _plan(task_name, run)
    arguments = _bind(task_name, plan, args, kwargs)
    if spec is None:
        return f"{prefix}:{task_name}:{_digest(_canonical(task_name, plan, arguments, max_bytes))}"
    if isinstance(spec, str):
        parts = [prefix, ":"]
        for piece in _template(task_name, spec):
            parts.append(piece.literal)
            if piece.field is not None:
                value = _lookup(task_name, plan, arguments, piece.field)
                parts.append(_template_part(task_name, plan, piece, value, max_bytes))
        return "".join(parts)
    chosen = {name: _lookup(task_name, plan, arguments, name) for name in _names(task_name, spec)}
    return f"{prefix}:{task_name}:{_digest(_canonical(task_name, plan, chosen, max_bytes))}"


def validate_spec(task_name: str, run: Callable[..., Any], spec: KeySpec) -> None:
    """Check a task's ``redlock_key`` once, when the task class is set up.

    Template fields and listed names must be parameters of ``run`` (any name goes when
    ``run`` takes ``**kwargs``); templates take named fields only; a callable must be
    callable. Raises LockKeyError naming the task and what is wrong.
    """
    if spec is None:
        return
    if not isinstance(spec, str) and callable(spec):
        return
    plan = _plan(task_name, run)
    if isinstance(spec, str):
        fields = [p.field for p in _template(task_name, spec) if p.field is not None]
        if not fields and spec in plan.name_set:
            raise LockKeyError(
                f"task {task_name!r}: redlock_key {spec!r} is a template without fields, "
                f"so every call would share one key; for the argument write "
                f"'{{{spec}}}' (a template) or [{spec!r}] (a list of names)"
            )
        names: Sequence[str] = fields
        what = "template field"
    else:
        names = _names(task_name, spec)
        what = "argument name"
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise LockKeyError(
                f"task {task_name!r}: redlock_key lists {', '.join(duplicates)} more than once"
            )
    if plan.var_keyword is None:
        for name in names:
            if name not in plan.name_set:
                raise LockKeyError(
                    f"task {task_name!r}: redlock_key has the {what} {name!r}, which is "
                    f"not a parameter of run{plan.signature}; accepted names: "
                    f"{_accepted_names(plan)}"
                )
