"""django-celery-beat's database scheduler with the Redlock mixin: several beats read
one schedule from the database and each due entry is sent once per tick::

    celery -A proj beat -S celery_redlock.contrib.django_celery_beat:RedlockDatabaseScheduler

Importable only where django-celery-beat is installed (and, like its own scheduler,
once Django is set up: ``celery -A proj`` of a Django project does that). What the
mixin does per tick is in beat.py; this module adds nothing else.
"""

from __future__ import annotations

from django_celery_beat.schedulers import DatabaseScheduler

from ..beat import RedlockSchedulerMixin

__all__ = ["RedlockDatabaseScheduler"]


class RedlockDatabaseScheduler(RedlockSchedulerMixin, DatabaseScheduler):  # type: ignore[misc]
    """``DatabaseScheduler`` sending each due entry once per tick across beats."""
