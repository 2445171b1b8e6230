"""The option table: every ``redlock_*`` setting and task option, declared once.

Each :class:`Option` row says the name, the default, the unit, the check
(validate.py), the scope and a one-line doc. Everything else is derived from the rows:

- ``DEFAULTS`` (name -> default) and ``TASK_OPTIONS`` (the names a task may set);
- :func:`task_options`, which validates raw values into a :class:`TaskOptions`
  (its fields are the task rows' names without ``redlock_``; tests/tasks/test_options.py
  checks that the two agree, since the dataclass is spelled out for mypy);
- the unknown-name check of a task's attributes (:func:`check_task_names`; the app
  settings' names are checked where they are read, config.py);
- the ``RedlockTask`` class attributes: task.py installs one :class:`TaskAttribute`
  per task row. It reads as ``None`` ("use the app setting") and carries the row's
  doc, so ``help(RedlockTask)`` and IDEs list every option with its meaning; a
  task sets it like any class attribute (``@app.task(base=RedlockTask,
  redlock_ttl=60)``), which shadows it in the task's own class;
- the table of the configuration page, docs/guides/configuration.md
  (:func:`configuration_table`; tests/tasks/test_options.py fails when the page
  disagrees: paste the function's output to fix it).

Scopes: ``app`` -- an app-wide setting in ``app.conf`` only; ``task`` -- an app-wide
default in ``app.conf`` that a task may override; ``beat`` -- an app-wide setting or a
scheduler class attribute, checked when beat starts (beat.py), never by a worker.

Imports lock/validate.py, lock/settings.py (the one ttl-against-node_timeout rule) and
errors.py only (no Celery, no Redis).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Iterable, Literal, Optional, Union

from ..errors import ConfigurationError
from ..lock import validate
from ..lock.settings import outlasts_a_round

__all__ = [
    "DEFAULTS",
    "OPTIONS",
    "TASK_OPTIONS",
    "Option",
    "TaskAttribute",
    "TaskOptions",
    "check_replace",
    "check_task_names",
    "configuration_table",
    "task_options",
]

Scope = Literal["app", "task", "beat"]

ON_CONTENDED = ("retry", "skip", "fail")
ON_EXHAUSTED = ("fail", "skip")
ON_QUEUED = ("return", "raise", "replace")
QUEUED_UNTIL = ("start", "end")


@dataclass(frozen=True)
class Option:
    """One setting or task option."""

    name: str
    default: Any
    #: ``(name, raw value) -> checked value``; raises ConfigurationError naming it.
    check: Callable[[str, Any], Any]
    scope: Scope
    #: What it is for (the configuration page's "meaning" column, the task attribute's doc).
    doc: str
    #: Unit of the value, shown after the default: "s" for seconds.
    unit: str = ""
    #: The configuration page's default column, when the default needs words rather than a value.
    default_doc: Optional[str] = None

    @property
    def field(self) -> str:
        """The TaskOptions field: the name without ``redlock_``."""
        return self.name[len("redlock_") :]


_seconds = partial(validate.seconds, wording=validate.SETTING)
_beat_seconds = partial(validate.seconds, wording=validate.RULE)

OPTIONS: tuple[Option, ...] = (
    Option(
        "redlock_nodes",
        None,
        validate.node_list,
        "app",
        "list of Redis URLs (`redis://`, `rediss://`, `unix://`, or `sentinel://` "
        "naming Sentinels and `?master_name=`), one per independent master; a "
        "comma-separated string is accepted too",
        default_doc="the broker URL, if it is Redis or Sentinel",
    ),
    Option("redlock_key_prefix", "redlock", validate.key_prefix, "app", "prefix of every lock key"),
    Option(
        "redlock_drift_factor",
        0.01,
        validate.fraction,
        "app",
        "clock-rate error allowed for, as a fraction of the TTL",
    ),
    Option(
        "redlock_key_max_bytes",
        1 << 20,
        partial(validate.count, minimum=1),
        "app",
        "largest canonical form of a call's arguments hashed into a key; larger fails "
        "with `LockKeyError` (use a template or a list of argument names)",
        unit="bytes",
    ),
    Option(
        "redlock_node_timeout",
        0.05,
        _seconds,
        "task",
        "deadline of one round to all nodes",
        unit="s",
    ),
    Option(
        "redlock_key",
        None,
        validate.key_spec,
        "task",
        "`None`: task name + all arguments (bound to the signature, defaults applied, "
        'hashed); a template `"import:{customer_id}"` (shared by every task using it); '
        "a list of argument names; or a callable returning a str",
    ),
    Option(
        "redlock_ttl",
        30.0,
        _seconds,
        "task",
        "lease length; the watchdog renews at ttl/3",
        unit="s",
    ),
    Option(
        "redlock_limit",
        1,
        validate.task_limit,
        "task",
        "how many bodies may run at once per lock key across every worker (1 to 1000; "
        '1: a mutex); each holds its own lease on one of the key\'s permits. `"unlimited"`: '
        "no such limit, with `redlock_rate` or `redlock_cooldown` only",
    ),
    Option(
        "redlock_rate",
        None,
        validate.optional_rate,
        "task",
        'at most R body starts per lock key in any window of the period: `"10/s"`, '
        '`"100/m"`, `"1000/h"`, `"5/10s"` or `(count, seconds)`; on the lock nodes\' '
        "clocks. A copy over the rate comes back when the window admits it, without "
        "spending `redlock_max_retries`",
    ),
    Option(
        "redlock_cooldown",
        None,
        partial(validate.optional_seconds, wording=validate.SETTING),
        "task",
        "after a body of a lock key starts, no other body of that key starts for this "
        "long, across every worker, on the lock nodes' clocks. A copy inside it follows "
        '`redlock_on_contended`: `"skip"` (the marker\'s `until` says when it ends), '
        '`"retry"` (comes back then, spending no lock retry) or `"fail"`; a beat tick '
        "inside it is skipped",
        unit="s",
    ),
    Option(
        "redlock_on_contended",
        "retry",
        partial(validate.choice, accepted=ON_CONTENDED),
        "task",
        '`"retry"`, `"skip"` (logged; ends SUCCESS with the skipped marker, see '
        '"Results of a skipped copy") or `"fail"` (`LockContended`)',
    ),
    Option(
        "redlock_wait_timeout",
        0.0,
        partial(_seconds, minimum=">= 0"),
        "task",
        "a copy that finds the lock taken (every permit, with a limit) first waits up to "
        "this long inside the worker, holding its worker slot, and starts the moment the "
        "lock frees; only then does it follow `redlock_on_contended`. 0: it does at once. "
        "The wait counts toward the task's time limits",
        unit="s",
    ),
    Option(
        "redlock_retry_backoff",
        1.0,
        _seconds,
        "task",
        "first lock retry's backoff ceiling; doubles per attempt (full jitter), at least "
        "10% of the holder's remaining TTL",
        unit="s",
    ),
    Option(
        "redlock_retry_backoff_max",
        60.0,
        _seconds,
        "task",
        "cap on one lock retry's countdown",
        unit="s",
    ),
    Option(
        "redlock_max_retries",
        20,
        validate.count,
        "task",
        "lock retries, counted apart from the task's own `max_retries` / `request.retries`",
    ),
    Option(
        "redlock_on_retries_exhausted",
        "fail",
        partial(validate.choice, accepted=ON_EXHAUSTED),
        "task",
        '`"fail"` or `"skip"` after the last lock retry (an outage of the lock nodes always '
        "fails: nobody is known to hold the lock)",
    ),
    Option(
        "redlock_auto_extend",
        True,
        validate.flag,
        "task",
        "renew the lease while the task runs (one watchdog thread per process)",
    ),
    Option(
        "redlock_max_hold",
        3600.0,
        _seconds,
        "task",
        "the watchdog stops renewing after this (also bounded by the task's hard time limit)",
        unit="s",
    ),
    Option(
        "redlock_fencing",
        False,
        validate.flag,
        "task",
        "give the lease a strictly increasing fence (one extra round per acquire)",
    ),
    Option(
        "redlock_dedupe_queued",
        False,
        validate.flag,
        "task",
        "queue once: at most one queued copy per lock key (`delay`, `apply_async`, beat); "
        "a duplicate enqueue gets the queued copy's `AsyncResult`",
    ),
    Option(
        "redlock_queued_ttl",
        3600.0,
        _seconds,
        "task",
        "how long a queued copy keeps its place; a lost or purged message frees it after this",
        unit="s",
    ),
    Option(
        "redlock_on_queued",
        "return",
        partial(validate.choice, accepted=ON_QUEUED),
        "task",
        'duplicate enqueue: `"return"` the queued copy\'s `AsyncResult`, `"raise"` '
        '`AlreadyQueued`, or `"replace"` the queued copy (the newest arguments run; the '
        "replaced copy ends at once with the `Replaced` marker naming its replacement)",
    ),
    Option(
        "redlock_queued_until",
        "start",
        partial(validate.choice, accepted=QUEUED_UNTIL),
        "task",
        'queue once: a copy keeps its place until it `"start"`s (a duplicate may then '
        'queue while it runs) or until it `"end"`s ("until executed": a duplicate '
        "enqueue while it runs gets the running copy's `AsyncResult`, or "
        "`AlreadyQueued`); a run longer than `redlock_queued_ttl` frees the place then",
    ),
    Option(
        "redlock_handoff",
        True,
        validate.flag,
        "task",
        'hand-off: a contended copy (`"retry"`) also waits in a queue on the lock nodes, '
        "and a release runs the earliest waiter at once (its lock-retry countdown stays as "
        "the fallback). Off: copies wait out their countdowns, and a body's run-once no "
        "longer rests on the waiter claims surviving on the nodes (SAFETY.md)",
    ),
    Option(
        "redlock_handoff_claim_ttl",
        86400.0,
        _seconds,
        "task",
        "hand-off: how long a waiter's claim is kept; a waiter's second message delayed "
        "longer than this after the first ran could run the body again. Must be longer "
        "than `redlock_retry_backoff_max` + `redlock_ttl`",
        unit="s",
    ),
    Option(
        "redlock_beat_clock_skew",
        1.0,
        partial(_beat_seconds, minimum=">= 0"),
        "beat",
        "how far the beats' clocks may disagree; a tick's lock outlives the next tick's "
        "due time by this much",
        unit="s",
    ),
    Option(
        "redlock_beat_claim_timeout",
        1.0,
        partial(_beat_seconds, minimum="> 0"),
        "beat",
        "how long a beat retries a tick whose lock round was split between beats (nobody "
        "won a quorum) before it gives the tick up as missed",
        unit="s",
    ),
)

BY_NAME: dict[str, Option] = {option.name: option for option in OPTIONS}
#: Every setting with its default.
DEFAULTS: dict[str, Any] = {option.name: option.default for option in OPTIONS}
#: Options a task may override with a class attribute.
TASK_OPTIONS: tuple[str, ...] = tuple(o.name for o in OPTIONS if o.scope == "task")


def checked(name: str, value: Any, *, shown_as: Optional[str] = None) -> Any:
    """``value`` checked by the row ``name``; errors call it ``shown_as`` (default:
    the name), e.g. ``MyScheduler.redlock_beat_clock_skew``."""
    return BY_NAME[name].check(shown_as or name, value)


@dataclass(frozen=True)
class TaskOptions:
    """One task's validated lock options (app defaults, overridden by the task).

    One field per task row of OPTIONS, in the same order (see the module docstring).
    """

    node_timeout: float
    key: Union[str, tuple[str, ...], Callable[..., str], None]
    ttl: float
    limit: Union[int, str]
    rate: Optional[tuple[int, float]]
    cooldown: Optional[float]
    on_contended: str
    wait_timeout: float
    retry_backoff: float
    retry_backoff_max: float
    max_retries: int
    on_retries_exhausted: str
    auto_extend: bool
    max_hold: float
    fencing: bool
    dedupe_queued: bool
    queued_ttl: float
    on_queued: str
    queued_until: str
    handoff: bool
    handoff_claim_ttl: float


def task_options(values: dict[str, Any]) -> TaskOptions:
    """Turn raw ``redlock_*`` values into TaskOptions, or raise naming the bad one."""
    options = TaskOptions(**{BY_NAME[n].field: checked(n, values[n]) for n in TASK_OPTIONS})
    outlasts_a_round(options.ttl, options.node_timeout, ("redlock_ttl", "redlock_node_timeout"))
    if options.limit == validate.UNLIMITED and options.rate is None and options.cooldown is None:
        raise ConfigurationError(
            f'redlock_limit="{validate.UNLIMITED}" needs redlock_rate or redlock_cooldown: '
            "without, nothing would limit the task (give a rate, a cooldown, or a limit "
            f"from 1 to {validate.MAX_PERMITS})"
        )
    check_replace(options, "redlock_on_queued")
    if options.retry_backoff_max < options.retry_backoff:
        raise ConfigurationError(
            f"redlock_retry_backoff_max ({options.retry_backoff_max}s) must be >= "
            f"redlock_retry_backoff ({options.retry_backoff}s)"
        )
    # A waiter's claim must outlive its fallback copy (countdown up to the backoff
    # bound, plus the lock's ttl), or the fallback could run the body again.
    longest_fallback = options.retry_backoff_max + options.ttl
    if options.handoff and options.handoff_claim_ttl <= longest_fallback:
        raise ConfigurationError(
            f"redlock_handoff_claim_ttl ({options.handoff_claim_ttl}s) must be longer than "
            f"redlock_retry_backoff_max + redlock_ttl ({longest_fallback}s)"
        )
    return options


def check_replace(options: TaskOptions, shown: str) -> None:
    """``on_queued="replace"`` (``shown``: how the caller named it) needs queue once,
    with the place handed back at the start: a running copy cannot be replaced."""
    if options.on_queued != "replace":
        return
    if not options.dedupe_queued:
        raise ConfigurationError(
            f'{shown}="replace" needs redlock_dedupe_queued=True (queue once): without '
            "it no copy is queued once, so there is none to replace"
        )
    if options.queued_until != "start":
        raise ConfigurationError(
            f'{shown}="replace" needs redlock_queued_until="start": with "end" the place '
            "names a running copy, which cannot be replaced"
        )


def as_settings(options: TaskOptions) -> dict[str, Any]:
    """The ``redlock_*`` values that make ``options`` (task_options' inverse)."""
    return {name: getattr(options, BY_NAME[name].field) for name in TASK_OPTIONS}


def check_task_names(task_name: str, names: Iterable[str]) -> None:
    """Refuse an unknown ``redlock_*`` attribute on a task class."""
    unknown = sorted(n for n in names if n.startswith("redlock_") and n not in TASK_OPTIONS)
    if unknown:
        raise ConfigurationError(
            f"task {task_name}: unknown option {unknown[0]!r}; accepted: " + ", ".join(TASK_OPTIONS)
        )


class TaskAttribute:
    """A RedlockTask class attribute standing for one task option: it reads as
    ``None`` (the app-wide setting applies) until a task class sets the name."""

    def __init__(self, option: Option) -> None:
        self.option = option
        self.__doc__ = f"{option.doc} (default: the app setting {option.name})"

    def __get__(self, instance: object, owner: Optional[type] = None) -> None:
        return None


def _default_cell(option: Option) -> str:
    if option.default_doc is not None:
        return option.default_doc
    value = option.default
    if isinstance(value, str):
        shown = f'`"{value}"`'
    elif isinstance(value, float):
        shown = f"`{value:g}`"
    else:
        shown = f"`{value!r}`"
    return f"{shown} {option.unit}" if option.unit else shown


def configuration_table() -> str:
    """The configuration page's table (docs/guides/configuration.md), one row per option."""
    rows = ["| setting / task option | default | meaning |", "|---|---|---|"]
    for option in OPTIONS:
        scope = "" if option.scope == "task" else f" ({option.scope})"
        rows.append(f"| `{option.name}`{scope} | {_default_cell(option)} | {option.doc} |")
    return "\n".join(rows)
