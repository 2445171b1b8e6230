"""The options every command takes (``--json``, ``--timeout``) and loading the app's
``redlock_*`` settings, with their exit code when they are invalid.

Imports click, Celery's command classes and config.py; never the commands.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

import click
from celery.bin.base import CeleryOption
from celery.exceptions import CeleryCommandException

from ..errors import ConfigurationError
from ..lock import validate
from ..lock.redlock import Redlock
from ..tasks.config import AppConfig, app_config

#: Exit code for invalid ``redlock_*`` settings (sysexits.h EX_CONFIG).
EX_CONFIG = getattr(os, "EX_CONFIG", 78)
#: Seconds each node gets to answer (the default of ``--timeout``).
DEFAULT_TIMEOUT = 2.0


def json_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--json``: one JSON document instead of a table (passed as ``as_json``)."""
    return click.option(
        "--json",
        "as_json",
        cls=CeleryOption,
        is_flag=True,
        help_group="Output Options",
        help="Print one JSON document instead of a table.",
    )(f)


class Seconds(click.FloatRange):
    """A finite number of seconds (FloatRange lets nan and inf through)."""

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Any) -> Any:
        seconds = super().convert(value, param, ctx)
        try:
            name = f"--{param.name}" if param else "seconds"
            return validate.seconds(name, seconds, minimum=None)
        except ConfigurationError as exc:
            self.fail(str(exc), param, ctx)


def timeout_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--timeout S``: how long each node gets to answer."""
    return click.option(
        "--timeout",
        cls=CeleryOption,
        type=Seconds(min=0.001),
        default=DEFAULT_TIMEOUT,
        show_default=True,
        help_group="Connection Options",
        help="Seconds each node gets to answer (hung nodes are reported, not waited on).",
    )(f)


def load_config(ctx: click.Context) -> AppConfig:
    """The app's settings; invalid ones end the command with EX_CONFIG."""
    try:
        return app_config(ctx.obj.app)
    except ConfigurationError as exc:
        raise CeleryCommandException(message=str(exc), exit_code=EX_CONFIG) from None


def open_redlock(config: AppConfig, timeout: float) -> Redlock:
    """The app's Redlock with ``timeout`` per node; invalid settings end with EX_CONFIG."""
    try:
        return config.redlock(timeout, False)
    except ConfigurationError as exc:
        raise CeleryCommandException(message=str(exc), exit_code=EX_CONFIG) from None
