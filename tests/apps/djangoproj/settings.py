"""Settings from the environment: ``DJANGO_DB_PATH`` (the SQLite file),
``BROKER_URL``, ``REDLOCK_NODES`` (comma-separated), ``OBSERVER_URL``."""

from __future__ import annotations

import os

SECRET_KEY = "test-only"
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["django_celery_beat", "djangoproj.ticks"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("DJANGO_DB_PATH", ":memory:"),
        # Two beats write the same file: wait for the other's write lock.
        "OPTIONS": {"timeout": 30},
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"

CELERY_BROKER_URL = os.environ.get("BROKER_URL", "redis://127.0.0.1:6379/0")
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_IGNORE_RESULT = True
CELERY_REDLOCK_NODES = [
    url for url in os.environ.get("REDLOCK_NODES", CELERY_BROKER_URL).split(",") if url
]
# A loaded 2-core machine runs two beats, a worker and seven redis-servers.
CELERY_REDLOCK_NODE_TIMEOUT = 0.25
OBSERVER_URL = os.environ.get("OBSERVER_URL", CELERY_BROKER_URL)
