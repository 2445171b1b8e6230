"""A Celery-level fault soak: real workers in three pools, real lock nodes, faults.

    python -m tools.celery_soak --minutes 3 --seed 7

One level above tools/soak.py (which soaks the lock alone): 5 lock redis-servers
(AOF, ``appendfsync always``), a broker/result-backend Redis, an observer Redis the
lock never sees, and three ``celery worker`` subprocesses (prefork -c 2, threads
-c 4, gevent -c 10) running :mod:`tools.celery_soak.soakapp`. Jobs in the three
contention modes (``retry``, ``skip``, ``fail``) are sent steadily on ~12 keys while
faults are injected at random (seeded): a pool child SIGKILLed (idle, or inside a
body), a whole worker SIGKILLed and restarted, a worker SIGSTOPped for 1.5x the
largest TTL, lock nodes SIGSTOPped for a few seconds, a lock node SIGKILLed and
restarted from its AOF once the largest TTL has passed.

Then every job is accounted for from its result (SUCCESS, skipped, FAILURE, or LOST:
not ready after the drain) and the observer's record of the bodies (overlaps per key,
redeliveries, fenced writes refused).

Modules, by concern: :mod:`.launch` (servers and workers), :mod:`.faults`,
:mod:`.jobs` (sending, draining, what the observer saw), :mod:`.report`
(accounting and the summary), :mod:`.run` (one soak), ``__main__`` (the command).
"""
