"""One call's lock options, and celery-once's ``once`` spellings of them.

``apply_async(..., redlock={"on_queued": "raise", "queued_ttl": 120,
"dedupe_queued": False, "queued_until": "end"})`` overrides the queue-once options
for one call
(:data:`CALL_OPTIONS`); celery-once's ``apply_async(once={"graceful": ...,
"timeout": ...})`` is accepted as an alias (:data:`ONCE_OPTIONS`), and so is its
task-level ``once = {...}`` class attribute (:data:`ONCE_TASK_OPTIONS`), so that a
migration is a base-class change. Every value goes through options.py's rows.

Imports options.py, validate.py and errors.py only (no Celery, no Redis).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from ..errors import ConfigurationError
from ..lock import validate
from .options import BY_NAME, TaskOptions, check_replace, checked

__all__ = [
    "CALL_OPTIONS",
    "ONCE_OPTIONS",
    "ONCE_TASK_OPTIONS",
    "call_options",
    "once_task_options",
]


#: The task options one call may override: ``apply_async(..., redlock={"on_queued":
#: "raise"})`` (keys: the names without ``redlock_``).
CALL_OPTIONS: tuple[str, ...] = (
    "redlock_on_queued", "redlock_queued_ttl", "redlock_dedupe_queued", "redlock_queued_until",
)  # fmt: skip

#: celery-once's per-call ``apply_async(once={...})`` keys we accept, with their
#: meaning here. A call that passes ``once=`` is a queue-once call (as every call of a
#: celery-once task is): ``dedupe_queued`` is on for it.
ONCE_OPTIONS: dict[str, str] = {
    "graceful": 'True: on_queued="return" (the queued copy\'s AsyncResult, where '
    'celery-once returns an empty REJECTED result); False: on_queued="raise"',
    "timeout": "queued_ttl, seconds",
}
#: celery-once keys that are task-level there (its ``once`` class attribute, never read
#: per call): what to use here instead.
ONCE_TASK_LEVEL = {
    "keys": "the task option redlock_key=[argument names]",
    "unlock_before_run": 'the task option redlock_queued_until ("start" for True, "end" '
    "for False), or redlock={'queued_until': ...} per call",
}


#: celery-once's task-level ``once = {...}`` class attribute, read on a RedlockTask
#: (so a migration is a base-class change): each key and the task option it sets.
#: A task with ``once`` has ``redlock_dedupe_queued`` on, as every celery-once task.
ONCE_TASK_OPTIONS: dict[str, str] = {
    "graceful": 'redlock_on_queued ("return" for True, "raise" for False)',
    "timeout": "redlock_queued_ttl (seconds)",
    "keys": "redlock_key (a list of argument names)",
    "unlock_before_run": 'redlock_queued_until ("start" for True, "end" for False)',
}


def once_task_options(task_name: str, once: Any) -> dict[str, Any]:
    """The ``redlock_*`` task options a celery-once ``once`` class attribute stands
    for (see ONCE_TASK_OPTIONS); ConfigurationError naming the bad key or value."""
    names = ", ".join(repr(name) for name in ONCE_TASK_OPTIONS)
    if not isinstance(once, Mapping):
        raise ConfigurationError(
            f"task {task_name}: once must be a dict with keys among {names}, "
            f"got {type(once).__name__}: {once!r}"
        )
    values: dict[str, Any] = {"redlock_dedupe_queued": True}
    for name, value in once.items():
        shown = f"task {task_name}: once[{name!r}]"
        if name == "graceful":
            values["redlock_on_queued"] = "return" if validate.flag(shown, value) else "raise"
        elif name == "timeout":
            values["redlock_queued_ttl"] = checked("redlock_queued_ttl", value, shown_as=shown)
        elif name == "keys":
            if not isinstance(value, (list, tuple)) or not all(isinstance(k, str) for k in value):
                raise ConfigurationError(f"{shown} must be a list of argument names, got {value!r}")
            values["redlock_key"] = tuple(value)
        elif name == "unlock_before_run":
            values["redlock_queued_until"] = "start" if validate.flag(shown, value) else "end"
        else:
            raise ConfigurationError(f"{shown}: unknown key; accepted: {names}")
    return values


def call_options(options: TaskOptions, redlock: Any = None, once: Any = None) -> TaskOptions:
    """``options`` with one call's overrides: ``apply_async(redlock={...})``, or
    celery-once's ``apply_async(once={...})`` (see ONCE_OPTIONS). Raises
    ConfigurationError naming the bad key or value and what is accepted."""
    if redlock is not None and once is not None:
        raise ConfigurationError(
            "apply_async takes redlock={...} or celery-once's once={...}, not both; "
            "put everything in redlock={...}"
        )
    if redlock is not None:
        accepted = {BY_NAME[name].field: name for name in CALL_OPTIONS}
        values = _call_mapping("redlock", redlock, accepted)
        called = replace(
            options,
            **{
                field: checked(accepted[field], value, shown_as=f"redlock[{field!r}]")
                for field, value in values.items()
            },
        )
        if (called.on_queued == "replace") != (options.on_queued == "replace"):
            # A queued copy claims its fate when it starts only under the task's own
            # option: one call cannot make its copy replaceable, or replace a copy
            # that will not claim.
            raise ConfigurationError(
                "redlock['on_queued']: \"replace\" is a task option "
                '(redlock_on_queued="replace"), not switched on or off per call; one '
                'call may choose "return" or "raise" for a task whose option is not "replace"'
            )
        check_replace(called, "redlock['on_queued']")
        return called
    if once is None:
        return options
    for name in once if isinstance(once, Mapping) else ():
        if name in ONCE_TASK_LEVEL:
            raise ConfigurationError(
                f"once[{name!r}] is a task-level option in celery-once, never read per "
                f"call; use {ONCE_TASK_LEVEL[name]}"
            )
    overrides: dict[str, Any] = {"dedupe_queued": True}
    for name, value in _call_mapping("once", once, ONCE_OPTIONS).items():
        if name == "graceful":
            graceful = validate.flag("once['graceful']", value)
            overrides["on_queued"] = "return" if graceful else "raise"
        else:
            overrides["queued_ttl"] = checked(
                "redlock_queued_ttl", value, shown_as="once['timeout']"
            )
    return replace(options, **overrides)


def _call_mapping(argument: str, value: Any, accepted: Mapping[str, Any]) -> dict[str, Any]:
    """A per-call options dict, its keys among ``accepted``."""
    names = ", ".join(repr(name) for name in accepted)
    if not isinstance(value, Mapping):
        raise ConfigurationError(
            f"apply_async({argument}=...) must be a dict with keys among {names}, "
            f"got {type(value).__name__}: {value!r}"
        )
    for key in value:
        if key not in accepted:
            raise ConfigurationError(
                f"apply_async({argument}=...): unknown option {key!r}; accepted: {names}"
            )
    return dict(value)
