"""The example project's settings, from environment variables with demo defaults.

=================  ==========================================  ===========================
variable           default                                     what
=================  ==========================================  ===========================
BROKER_URL         ``redis://127.0.0.1:6379/0``                Celery broker
RESULT_BACKEND     BROKER_URL                                  result backend (skipped
                                                               copies' markers there)
REDLOCK_NODES      unset: the broker (one node)                lock nodes, comma-separated
                                                               Redis URLs
REDLOCK_NODE_TIMEOUT  ``0.2`` (seconds)                        one round to all nodes
OBSERVER_URL       BROKER_URL                                  the witness's Redis; set it
                                                               to ``""`` to turn it off
DEMO_DB            ``example_project.sqlite3`` in the temp dir  SQLite file of the long job
=================  ==========================================  ===========================

The node timeout is 0.2 s rather than the library's 0.05 s: the demo runs a dozen
processes on one laptop, where a round now and then waits for a busy CPU, not for a
node. On dedicated lock nodes keep the default.

Imports only the standard library.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional

__all__ = ["KEY_PREFIX", "Settings"]

DEFAULT_BROKER = "redis://127.0.0.1:6379/0"
#: Every lock key of this app starts with it (``redlock:import:acme``...).
KEY_PREFIX = "redlock"
DEFAULT_NODE_TIMEOUT = 0.2


def _urls(value: str) -> tuple[str, ...]:
    return tuple(url.strip() for url in value.split(",") if url.strip())


@dataclass(frozen=True)
class Settings:
    broker_url: str
    result_backend: str
    #: None: celery-redlock's default, the broker as the only lock node.
    redlock_nodes: Optional[tuple[str, ...]]
    node_timeout: float
    #: None: no observer (the tasks run without reporting anywhere).
    observer_url: Optional[str]
    database: str

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Settings:
        broker = environ.get("BROKER_URL") or DEFAULT_BROKER
        nodes = _urls(environ.get("REDLOCK_NODES", ""))
        observer = environ.get("OBSERVER_URL", broker)
        return cls(
            broker_url=broker,
            result_backend=environ.get("RESULT_BACKEND") or broker,
            redlock_nodes=nodes or None,
            node_timeout=float(environ.get("REDLOCK_NODE_TIMEOUT") or DEFAULT_NODE_TIMEOUT),
            observer_url=observer or None,
            database=environ.get("DEMO_DB")
            or os.path.join(tempfile.gettempdir(), "example_project.sqlite3"),
        )
