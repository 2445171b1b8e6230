"""example_project: a real Celery app that uses every feature of celery-redlock.

The app lives in :mod:`example_project.celery` (Celery's usual ``proj/celery.py``
layout), so ``celery -A example_project worker`` and ``celery -A example_project beat
-S redlock`` find it. It reads its settings from the environment when that module is
first imported (see :mod:`example_project.settings`); nothing is imported here, so
``python -m example_project.demo`` can start its servers and set the environment first.

Rooms:

- ``settings.py``  environment variables and their defaults;
- ``celery.py``    the app, its ``redlock_*`` settings and the beat schedule;
- ``tasks.py``     the tasks: a singleton report, per-customer imports, a long fenced
                   job, a queue-once cache refresh;
- ``store.py``     the SQLite table the long job writes through fenced updates;
- ``observer.py``  the independent witness: counters on a separate Redis;
- ``workload.py``  sends the tasks with real contention (also runs on its own);
- ``demo.py``      the one-command demo: servers, workers, beats, load, summary.
"""
