"""Settings: app-wide ``redlock_*`` keys and per-task options, validated once.

App-wide defaults live in ``app.conf`` as lowercase ``redlock_*`` keys; a task overrides
any per-task option with a class attribute of the same name (``@app.task(base=RedlockTask,
redlock_ttl=60)``). Both are read once, validated with errors that name the setting and
what it accepts, and cached: the app's on the app (as celery-redbeat does), a task's on
the task. Each option's default and unit is in ``DEFAULTS`` and documented in README.

Imports redlock.py and errors.py; never talks to Redis itself.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, fields
from datetime import timedelta
from typing import Any, Callable, Optional, Union

from .errors import ConfigurationError
from .redlock import Redlock

__all__ = ["DEFAULTS", "TASK_OPTIONS", "AppConfig", "TaskOptions", "app_config", "reset"]

ON_CONTENDED = ("retry", "skip", "fail")
ON_EXHAUSTED = ("fail", "skip")
ON_QUEUED = ("return", "raise")

#: Every option with its default. Durations are seconds.
DEFAULTS: dict[str, Any] = {
    "redlock_nodes": None,  # list of Redis URLs; None: the broker URL if it is Redis
    "redlock_key_prefix": "redlock",
    "redlock_key_max_bytes": 1 << 20,  # largest canonical form of a call's arguments
    "redlock_node_timeout": 0.05,  # s, one round to all nodes
    "redlock_drift_factor": 0.01,
    "redlock_fencing": False,
    "redlock_key": None,  # None | "template:{arg}" | ["arg", ...] | callable
    "redlock_ttl": 30.0,  # s; the watchdog renews at ttl/3
    "redlock_on_contended": "retry",  # "retry" | "skip" | "fail"
    "redlock_retry_backoff": 1.0,  # s, first retry's backoff ceiling (doubles each time)
    "redlock_retry_backoff_max": 60.0,  # s, cap on one retry's countdown
    "redlock_max_retries": 20,  # lock retries, independent of the task's max_retries
    "redlock_on_retries_exhausted": "fail",  # "fail" | "skip"
    "redlock_auto_extend": True,
    "redlock_max_hold": 3600.0,  # s, the watchdog stops extending after this
    "redlock_dedupe_queued": False,  # at most one queued copy per lock key
    "redlock_queued_ttl": 3600.0,  # s, a lost message frees its queue slot after this
    "redlock_on_queued": "return",  # duplicate enqueue: "return" its AsyncResult | "raise"
    # beat (validated by beat.py)
    "redlock_beat_clock_skew": 1.0,  # s, how far beat clocks may disagree
    "redlock_beat_claim_timeout": 1.0,  # s, retrying a split vote before a tick is given up
}

#: Options a task may override with a class attribute.
TASK_OPTIONS = (
    "redlock_key",
    "redlock_ttl",
    "redlock_on_contended",
    "redlock_retry_backoff",
    "redlock_retry_backoff_max",
    "redlock_max_retries",
    "redlock_on_retries_exhausted",
    "redlock_auto_extend",
    "redlock_max_hold",
    "redlock_fencing",
    "redlock_node_timeout",
    "redlock_dedupe_queued",
    "redlock_queued_ttl",
    "redlock_on_queued",
)


def _duration(name: str, value: object, *, positive: bool = True) -> float:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigurationError(
            f"{name} must be a finite number of seconds (int, float or timedelta), "
            f"got {type(value).__name__}: {value!r}"
        )
    if positive and value <= 0:
        raise ConfigurationError(f"{name} must be > 0 seconds, got {value!r}")
    if value < 0:
        raise ConfigurationError(f"{name} must be >= 0 seconds, got {value!r}")
    return float(value)


def _choice(name: str, value: object, accepted: tuple[str, ...]) -> str:
    if value not in accepted:
        raise ConfigurationError(
            f"{name} must be one of {', '.join(repr(a) for a in accepted)}, got {value!r}"
        )
    return str(value)


def _flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ConfigurationError(f"{name} must be True or False, got {value!r}")
    return value


def _nodes(conf: Any) -> tuple[str, ...]:
    nodes = conf.get("redlock_nodes")
    if nodes is None:
        broker = conf.get("broker_url") or ""
        if isinstance(broker, (list, tuple)):
            broker = broker[0] if broker else ""
        broker = str(broker).split(";")[0].strip()
        if broker.startswith(("redis://", "rediss://", "unix://")):
            return (broker,)
        shown = broker.split("://")[0] + "://..." if "://" in broker else repr(broker)
        raise ConfigurationError(
            "redlock_nodes is not set and the broker is not Redis "
            f"({shown}); set app.conf.redlock_nodes to a list of Redis URLs, "
            'e.g. ["redis://lock1:6379/0", "redis://lock2:6379/0", "redis://lock3:6379/0"]'
        )
    if isinstance(nodes, str):
        nodes = [part.strip() for part in nodes.split(",") if part.strip()]
    if not isinstance(nodes, (list, tuple)) or not nodes:
        raise ConfigurationError(
            "redlock_nodes must be a non-empty list of Redis URLs (or a comma-separated "
            f"string of them), got {nodes!r}"
        )
    for i, url in enumerate(nodes):
        if not isinstance(url, str):
            raise ConfigurationError(
                f"redlock_nodes[{i}] must be a Redis URL string, got {type(url).__name__}"
            )
    return tuple(nodes)


@dataclass(frozen=True)
class TaskOptions:
    """One task's validated lock options (app defaults, overridden by the task)."""

    key: Union[str, tuple[str, ...], Callable[..., str], None]
    ttl: float
    on_contended: str
    retry_backoff: float
    retry_backoff_max: float
    max_retries: int
    on_retries_exhausted: str
    auto_extend: bool
    max_hold: float
    fencing: bool
    node_timeout: float
    dedupe_queued: bool
    queued_ttl: float
    on_queued: str


def validate_options(values: dict[str, Any]) -> TaskOptions:
    """Turn raw ``redlock_*`` values into TaskOptions, or raise naming the bad one."""
    key = values["redlock_key"]
    if isinstance(key, list):
        key = tuple(key)
    if not (key is None or isinstance(key, (str, tuple)) or callable(key)):
        raise ConfigurationError(
            "redlock_key must be None (all arguments), a template str such as "
            '"import:{customer_id}", a list of argument names, or a callable '
            f"returning a str; got {type(key).__name__}: {key!r}"
        )
    if isinstance(key, str) and not key:
        raise ConfigurationError("redlock_key must not be an empty string")
    max_retries = values["redlock_max_retries"]
    if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
        raise ConfigurationError(f"redlock_max_retries must be an int >= 0, got {max_retries!r}")
    options = TaskOptions(
        key=key,
        ttl=_duration("redlock_ttl", values["redlock_ttl"]),
        on_contended=_choice("redlock_on_contended", values["redlock_on_contended"], ON_CONTENDED),
        retry_backoff=_duration("redlock_retry_backoff", values["redlock_retry_backoff"]),
        retry_backoff_max=_duration(
            "redlock_retry_backoff_max", values["redlock_retry_backoff_max"]
        ),
        max_retries=max_retries,
        on_retries_exhausted=_choice(
            "redlock_on_retries_exhausted", values["redlock_on_retries_exhausted"], ON_EXHAUSTED
        ),
        auto_extend=_flag("redlock_auto_extend", values["redlock_auto_extend"]),
        max_hold=_duration("redlock_max_hold", values["redlock_max_hold"]),
        fencing=_flag("redlock_fencing", values["redlock_fencing"]),
        node_timeout=_duration("redlock_node_timeout", values["redlock_node_timeout"]),
        dedupe_queued=_flag("redlock_dedupe_queued", values["redlock_dedupe_queued"]),
        queued_ttl=_duration("redlock_queued_ttl", values["redlock_queued_ttl"]),
        on_queued=_choice("redlock_on_queued", values["redlock_on_queued"], ON_QUEUED),
    )
    if options.node_timeout >= options.ttl:
        raise ConfigurationError(
            f"redlock_node_timeout ({options.node_timeout}s) must be smaller than "
            f"redlock_ttl ({options.ttl}s)"
        )
    if options.retry_backoff_max < options.retry_backoff:
        raise ConfigurationError(
            f"redlock_retry_backoff_max ({options.retry_backoff_max}s) must be >= "
            f"redlock_retry_backoff ({options.retry_backoff}s)"
        )
    return options


class AppConfig:
    """The app-wide settings, validated, and the Redlock instances built from them."""

    def __init__(self, conf: Any) -> None:
        unknown = sorted(k for k in _keys(conf) if k.startswith("redlock_") and k not in DEFAULTS)
        if unknown:
            raise ConfigurationError(
                f"unknown setting {unknown[0]!r}; accepted redlock settings: "
                + ", ".join(sorted(DEFAULTS))
            )
        values = {name: conf.get(name, default) for name, default in DEFAULTS.items()}
        # Settings may be None to mean "default" (e.g. from an env-driven config).
        values = {k: (DEFAULTS[k] if v is None else v) for k, v in values.items()}
        self.nodes = _nodes(conf)
        prefix = values["redlock_key_prefix"]
        if not isinstance(prefix, str) or not prefix or any(c.isspace() for c in prefix):
            raise ConfigurationError(
                f"redlock_key_prefix must be a non-empty str without whitespace, got {prefix!r}"
            )
        self.key_prefix = prefix
        max_bytes = values["redlock_key_max_bytes"]
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise ConfigurationError(
                f"redlock_key_max_bytes must be a positive int (bytes), got {max_bytes!r}"
            )
        self.key_max_bytes = max_bytes
        drift = values["redlock_drift_factor"]
        if isinstance(drift, bool) or not isinstance(drift, (int, float)) or not 0 <= drift < 1:
            raise ConfigurationError(f"redlock_drift_factor must be in [0, 1), got {drift!r}")
        self.drift_factor = float(drift)
        self.task_defaults = validate_options(values)
        self._redlocks: dict[tuple[float, bool], Redlock] = {}
        self._lock = threading.Lock()

    def redlock(self, node_timeout: float, fencing: bool) -> Redlock:
        """The Redlock for these round settings (one per process and combination)."""
        wanted = (node_timeout, fencing)
        with self._lock:
            redlock = self._redlocks.get(wanted)
            if redlock is None:
                redlock = Redlock(
                    list(self.nodes),
                    ttl=max(self.task_defaults.ttl, node_timeout * 2),
                    node_timeout=node_timeout,
                    drift_factor=self.drift_factor,
                    fencing=fencing,
                )
                self._redlocks[wanted] = redlock
            return redlock

    def options_for(self, declared: dict[str, Any]) -> TaskOptions:
        """A task's options: its declared ``redlock_*`` values (None: app default)."""
        overrides = {name: value for name, value in declared.items() if value is not None}
        if not overrides:
            return self.task_defaults
        return validate_options({**_as_settings(self.task_defaults), **overrides})


def _keys(conf: Any) -> list[str]:
    try:
        return [k for k in conf if isinstance(k, str)]
    except TypeError:
        return []


def _as_settings(options: TaskOptions) -> dict[str, Any]:
    return {f"redlock_{f.name}": getattr(options, f.name) for f in fields(TaskOptions)}


_config_lock = threading.Lock()


def app_config(app: Any) -> AppConfig:
    """The app's validated settings, built on first use and cached on the app."""
    config: Optional[AppConfig] = getattr(app, "_redlock_config", None)
    if config is None:
        with _config_lock:
            config = getattr(app, "_redlock_config", None)
            if config is None:
                config = AppConfig(app.conf)
                app._redlock_config = config
    return config


def reset(app: Any) -> None:
    """Forget the cached settings (after changing ``app.conf`` in tests)."""
    app.__dict__.pop("_redlock_config", None)
