"""Benchmarks of celery-redlock against its peers, every contender in one run on the
same local redis-server processes.

Run from the repository root (the bench starts and stops its own servers)::

    python -m bench locks            # full run, ~1 minute; writes bench/results/locks.{json,md}
    python -m bench locks --quick    # smoke run with few iterations (results not saved)
    python -m bench profile          # CPU per acquire+release by layer (floor, wire, lock, full)
    python -m bench renewals         # watchdog CPU vs leases held, leases lost far away
    python -m bench scale            # scale tables and figure (nodes, threads, leases, hot key)
    python -m bench wake             # a blocked acquire woken by the release, vs peers
    python -m bench async            # AsyncRedlock vs pottery's AIORedlock, aioredlock, a floor
    python -m bench limits           # limits and rates: overhead, precision under contention,
                                     # a task backlog under a rate, vs INCR-counter limiters
    python -m bench cluster          # ops/s from client processes: a plain master vs a
                                     # Redis Cluster lock node of 1, 3 and 6 shards

Layout: ``resp`` (a bare RESP socket: the physical floor and the bench's own control
connection), ``stats`` (timed loops and percentiles), ``contenders`` (one adapter per
lock library), ``commands`` (commands per node per operation, from MONITOR and
``INFO commandstats``), ``locks`` (the run: scenarios, ratios, report), ``profile``,
``renewals`` (the watchdog at scale), ``scale`` (the scale tables; with ``scale_tasks``,
the hot key in real workers, ``scale_handoff``, library hand-off latency, and
``scale_report``, tables and figure), ``wake`` (hand-off latency across processes),
``limits`` (limits and rates; with ``limiters``, the INCR contenders and the observer,
``limits_overhead``, ``limits_precision``, ``limits_contention``, ``limits_tasks`` and
``limits_report``), ``cluster`` (a Redis Cluster as one lock node: ops/s from client
processes, scale-out over shards), ``machine`` (the machine's description in every
report, the redis-server to run, the results' writer).

Nothing in celery_redlock imports this package.
"""
