"""A Celery app for the CLI tests, configured from the environment.

``celery -A cliapp redlock ...`` runs in a subprocess; the test points it at its
redis-server nodes with ``REDLOCK_CLI_NODES`` (comma-separated URLs) and may change
the key prefix with ``REDLOCK_CLI_PREFIX``. The broker is never contacted.
"""

from __future__ import annotations

import os

from celery import Celery

app = Celery("cliapp", broker="memory://", set_as_current=False)
app.conf.redlock_nodes = os.environ.get("REDLOCK_CLI_NODES") or None
app.conf.redlock_key_prefix = os.environ.get("REDLOCK_CLI_PREFIX") or None
