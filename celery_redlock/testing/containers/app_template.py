"""The app module of every worker and beat container (``/app/app.py``).

pytest-celery's :class:`~pytest_celery.vendors.worker.volume.WorkerInitialContent`
copies this source and replaces three lines: ``imports = None`` with the task
modules' imports, the ``app = Celery(...)`` line with the app's name, and
``config = None`` with the test app's settings as a dict literal. Those settings are
applied with ``conf.update``, as the test app has them: at once, above the defaults
and the ``CELERY_*`` environment. (pytest-celery's own template makes the dict the
app's config source with ``config_from_object``, read lazily on first use.)
"""

from __future__ import annotations

from celery import Celery

imports = None

app = Celery("celery_test_app")
config = None

if config:
    app.conf.update(config)


if __name__ == "__main__":
    app.start()
