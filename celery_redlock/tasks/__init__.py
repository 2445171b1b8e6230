"""The Celery glue: a task takes its lock through ``celery_redlock.lock``.

- ``task``: ``RedlockTask`` / ``redlock_task`` -- acquire before the body, release
  after, retry / skip / fail when contended.
- ``options``: the option table (every ``redlock_*`` setting and task option, once);
  ``call_options``: one call's options; ``config``: the app's settings, read once.
- ``keys``, ``canonical``: lock keys from a task call (arguments bound to the
  signature, canonical JSON, BLAKE2b).
- ``contention``: "someone holds it" told apart from "the vote split", and a
  contended copy's verdict.
- ``queue_once``: at most one queued copy per key; ``handoff``: the Celery side of
  hand-off to waiting duplicates; ``headers``: message header names; ``ticks``: beat
  tick numbering (``celery_redlock.beat`` sends them).
- ``green_sweep``: a worker without an event loop (gevent, eventlet) sweeps its Redis
  broker's unacked messages back, as kombu's event loop would; imported here so that
  importing the package connects it.

May import: ``celery_redlock.lock`` (and, through it, ``wire``), ``errors``,
``signals``, ``skipped``. Nothing below imports this folder
(``tests/ops/test_layout.py`` enforces it).
"""

from . import green_sweep  # noqa: F401 -- connects worker_init
