"""Settings: app-wide ``redlock_*`` keys and per-task options, validated once.

App-wide defaults live in ``app.conf`` as lowercase ``redlock_*`` keys (or namespaced,
``CELERY_REDLOCK_TTL``, under ``config_from_object(obj, namespace="CELERY")``, which
Celery resolves for us; the namespace serves only to name settings as the app writes
them: the unknown-name check, and errors about values); a task overrides
any per-task option with a class attribute of the same name (``@app.task(base=RedlockTask,
redlock_ttl=60)``). Both are read once, validated with errors that name the setting and
what it accepts, and cached: the app's on the app (as celery-redbeat does), a task's on
the task. Each option's default, unit and check is declared in options.py.

Imports options.py, redlock.py, sentinel.py (the default node of a Sentinel broker)
and errors.py; never talks to Redis itself.
"""

from __future__ import annotations

import re
import threading
from typing import Any, Iterable, Optional

from ..errors import ConfigurationError
from ..lock.redlock import Redlock
from ..wire.sentinel import default_url, is_sentinel_url
from .options import (
    DEFAULTS,
    TASK_OPTIONS,
    TaskOptions,
    as_settings,
    checked,
    task_options,
)

__all__ = ["DEFAULTS", "TASK_OPTIONS", "AppConfig", "TaskOptions", "app_config", "reset"]


def _nodes(conf: Any) -> tuple[str, ...]:
    nodes = conf.get("redlock_nodes")
    if nodes is not None:
        nodes_checked: tuple[str, ...] = checked("redlock_nodes", nodes)
        return nodes_checked
    # Celery's own property where there is one: it reads CELERY_BROKER_URL from the
    # environment first (a container's usual way to name the broker), then the
    # broker_url / legacy broker_host settings; a plain mapping has only the key.
    broker = getattr(conf, "broker_url", None) or conf.get("broker_url") or ""
    if isinstance(broker, (list, tuple)):
        broker = ";".join(str(url) for url in broker)
    broker = str(broker)
    if is_sentinel_url(broker):
        # kombu's Sentinel transport: every ';' part a Sentinel, the master's name in
        # broker_transport_options; the lock node is that master.
        options = conf.get("broker_transport_options") or {}
        return (default_url(broker, options),)
    broker = broker.split(";")[0].strip()  # failover alternates are not lock nodes
    if broker.startswith(("redis://", "rediss://", "unix://")):
        return (broker,)
    shown = broker.split("://")[0] + "://..." if "://" in broker else repr(broker)
    raise ConfigurationError(
        "redlock_nodes is not set and the broker is not Redis "
        f"({shown}); set app.conf.redlock_nodes to a list of Redis URLs, "
        'e.g. ["redis://lock1:6379/0", "redis://lock2:6379/0", "redis://lock3:6379/0"]'
    )


class AppConfig:
    """The app-wide settings, validated, and the Redlock instances built from them."""

    def __init__(self, conf: Any, namespace: Optional[str] = None) -> None:
        check_setting_names(_keys(conf), namespace)
        values = {name: conf.get(name, default) for name, default in DEFAULTS.items()}
        # Settings may be None to mean "default" (e.g. from an env-driven config).
        values = {k: (DEFAULTS[k] if v is None else v) for k, v in values.items()}
        try:
            self.nodes = _nodes(conf)
            self.key_prefix: str = checked("redlock_key_prefix", values["redlock_key_prefix"])
            self.key_max_bytes: int = checked(
                "redlock_key_max_bytes", values["redlock_key_max_bytes"]
            )
            self.drift_factor: float = checked(
                "redlock_drift_factor", values["redlock_drift_factor"]
            )
            self.task_defaults = task_options(values)
        except ConfigurationError as error:
            if not namespace:
                raise
            raise as_written(error, namespace) from None
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
        return task_options({**as_settings(self.task_defaults), **overrides})


def check_setting_names(names: Iterable[str], namespace: Optional[str] = None) -> None:
    """Refuse an unknown ``redlock_*`` app setting (a typo would be ignored silently).

    With a Celery namespace (``app.config_from_object(obj, namespace="CELERY")``, as
    Django projects do) Celery reads ``redlock_ttl`` from ``CELERY_REDLOCK_TTL``: the
    key is the namespace plus the name, in the namespace's case. A name that starts
    like that but is not one of ours (``CELERY_REDLOCK_TTLL``) is refused too.
    """
    prefix = namespace.rstrip("_") + "_" if namespace else ""
    namespaced = {setting_name(name, namespace): name for name in DEFAULTS}
    starts = (prefix + "redlock_").lower()
    for name in sorted(names):
        if name.startswith("redlock_") and name not in DEFAULTS:
            accepted = sorted(DEFAULTS)
        elif prefix and name.lower().startswith(starts) and name not in namespaced:
            accepted = sorted(namespaced)
        else:
            continue
        raise ConfigurationError(
            f"unknown setting {name!r}; accepted redlock settings: " + ", ".join(accepted)
        )


def setting_name(name: str, namespace: Optional[str] = None) -> str:
    """The key an app setting is read from: ``name`` (``redlock_ttl``), or under a
    Celery namespace the namespace plus the name in the namespace's case, as Celery
    looks namespaced keys up (``CELERY_REDLOCK_TTL``)."""
    if not namespace:
        return name
    prefix = namespace.rstrip("_") + "_"
    key = prefix + name
    return key.upper() if prefix.isupper() else key.lower()


def as_written(error: ConfigurationError, namespace: str) -> ConfigurationError:
    """``error`` about app settings with every setting it names as the app's
    configuration writes it under ``namespace`` (``CELERY_REDLOCK_LIMIT must be ...``
    under Django's)."""

    def written(found: re.Match[str]) -> str:
        name = found.group(0)
        return setting_name(name, namespace) if name in DEFAULTS else name

    return type(error)(_SETTING.sub(written, str(error)))


_SETTING = re.compile(r"\bredlock_[a-z_]+")


def _keys(conf: Any) -> list[str]:
    try:
        return [k for k in conf if isinstance(k, str)]
    except TypeError:
        return []


_config_lock = threading.Lock()


def app_config(app: Any) -> AppConfig:
    """The app's validated settings, built on first use and cached on the app."""
    config: Optional[AppConfig] = getattr(app, "_redlock_config", None)
    if config is None:
        with _config_lock:
            config = getattr(app, "_redlock_config", None)
            if config is None:
                # config_from_object(obj, namespace="CELERY"): CELERY_REDLOCK_TTL
                config = AppConfig(app.conf, getattr(app, "namespace", None))
                app._redlock_config = config
    return config


def reset(app: Any) -> None:
    """Forget the cached settings (after changing ``app.conf`` in tests)."""
    app.__dict__.pop("_redlock_config", None)
