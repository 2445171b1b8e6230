"""The Celery app: ``celery -A example_project worker`` / ``beat -S redlock``.

Settings come from the environment (:mod:`example_project.settings`). Two beat
entries run on every beat; with ``-S redlock`` each tick is sent by one beat only:

- ``report-every-2s``: the singleton report (duplicates are skipped);
- ``import-acme-every-3s``: the import of customer ``acme`` (waits its turn).
"""

from __future__ import annotations

from celery import Celery

from .settings import KEY_PREFIX, Settings

__all__ = ["BEAT_SCHEDULE", "KEY_PREFIX", "app", "settings"]

settings = Settings.from_env()

BEAT_SCHEDULE = {
    "report-every-2s": {"task": "example_project.report", "schedule": 2.0},
    "import-acme-every-3s": {
        "task": "example_project.import_customer",
        "schedule": 3.0,
        "args": ("acme",),
    },
}

app = Celery(
    "example_project",
    broker=settings.broker_url,
    backend=settings.result_backend,
    include=["example_project.tasks"],
)
app.conf.update(
    broker_connection_retry_on_startup=True,
    result_expires=3600,
    # One message at a time per child: contention is spread over every worker.
    worker_prefetch_multiplier=1,
    redlock_nodes=list(settings.redlock_nodes) if settings.redlock_nodes else None,
    redlock_key_prefix=KEY_PREFIX,
    redlock_node_timeout=settings.node_timeout,
    beat_schedule=BEAT_SCHEDULE,
)
