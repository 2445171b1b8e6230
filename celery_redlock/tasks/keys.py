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

The hashed parts are digests of the arguments' canonical form (canonical.py): the
same call gives the same digest before and after Celery's JSON round trip.

This module is a pure function of (task name, run callable, args, kwargs): it must
not import Celery's app machinery, kombu or Redis.
"""

from __future__ import annotations

import functools
import inspect
import string
import uuid
from typing import Any, Callable, Mapping, NamedTuple, Optional, Sequence, Union

from ..errors import ConfigurationError, LockKeyError
from ..lock import validate
from .canonical import canonical, digest

__all__ = ["KeySpec", "lock_key", "validate_spec"]

#: What a task's ``redlock_key`` may be: see the module docstring.
KeySpec = Union[None, str, Sequence[str], Callable[..., str]]

#: A template value longer than this (characters) is hashed.
TEMPLATE_PART_MAX = 64
#: A callable's key text longer than this (characters) is hashed.
CALLABLE_KEY_MAX = 200
# Characters a template value written as text must not contain: whitespace and braces
# keep keys one readable token; '#' starts a hashed part, so text never looks like one.
_TEMPLATE_FORBIDDEN = " #{}"


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


def _hashed(task_name: str, plan: _Plan, arguments: Mapping[str, Any], max_bytes: int) -> str:
    """The digest of these arguments' canonical form."""
    return digest(canonical(task_name, arguments, plan.defaults, max_bytes))


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
    return "#" + _hashed(task_name, plan, {piece.field: value}, max_bytes)


# -- the API --------------------------------------------------------------------------


def _check_settings(task_name: str, prefix: str, max_bytes: int) -> None:
    if not (isinstance(task_name, str) and task_name):
        raise LockKeyError(f"the task name must be a non-empty str, got {task_name!r}")
    try:
        validate.key_prefix("redlock_key_prefix", prefix)
        validate.count("redlock_key_max_bytes", max_bytes, minimum=1)
    except ConfigurationError as exc:
        raise LockKeyError(f"task {task_name!r}: {exc}") from None


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
    return "#" + digest(text.encode("utf-8", "surrogatepass"))


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
        return f"{prefix}:{task_name}:{_hashed(task_name, plan, arguments, max_bytes)}"
    if isinstance(spec, str):
        parts = [prefix, ":"]
        for piece in _template(task_name, spec):
            parts.append(piece.literal)
            if piece.field is not None:
                value = _lookup(task_name, plan, arguments, piece.field)
                parts.append(_template_part(task_name, plan, piece, value, max_bytes))
        return "".join(parts)
    chosen = {name: _lookup(task_name, plan, arguments, name) for name in _names(task_name, spec)}
    return f"{prefix}:{task_name}:{_hashed(task_name, plan, chosen, max_bytes)}"


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
