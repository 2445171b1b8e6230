"""A workload with real contention: duplicates sent on purpose, on a timetable.

Seconds after the start (the beats add their own sends on top):

- every 2 s (from 1 s): 3 copies of ``report`` at once: one runs, the others skip;
- every 1 s: 2 copies of ``import_customer`` for the next of 3 customers: the second
  waits (retries) until the first is done;
- at 0 s and 2 s, then every 10 s: ``long_job("nightly")``: the second waits for the
  first (5 s), takes the next fence and writes on;
- every 1.5 s: 4 ``refresh_cache.delay("prices")`` calls: queue once publishes one
  (more only once that one has started running).

The demo runs it; on its own (e.g. against docker-compose) it sends for a while::

    python -m example_project.workload --duration 30

Imports the tasks (and so reads the settings from the environment) on first use.
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from celery.utils import uuid

__all__ = ["CUSTOMERS", "Workload"]

CUSTOMERS = ("acme", "globex", "initech")

REPORT_EVERY, REPORT_FIRST, REPORT_COPIES = 2.0, 1.0, 3
IMPORT_EVERY, IMPORT_COPIES = 1.0, 2
LONG_AT, LONG_EVERY = (0.0, 2.0), 10.0
CACHE_EVERY, CACHE_CALLS = 1.5, 4


@dataclass
class Workload:
    """Sends the timetable above; :meth:`run_due` sends whatever is due by ``elapsed``."""

    customers: Sequence[str] = CUSTOMERS
    #: short task name -> messages published.
    published: Counter[str] = field(default_factory=Counter)
    #: Ids of every message published.
    task_ids: set[str] = field(default_factory=set)
    #: ``refresh_cache.delay()`` calls, and how many of them were answered with the
    #: already-queued copy (nothing published).
    cache_calls: int = 0
    cache_deduplicated: int = 0
    _next: dict[str, float] = field(default_factory=dict)
    _long_at: list[float] = field(default_factory=lambda: list(LONG_AT))
    _customer: Any = None

    def __post_init__(self) -> None:
        self._next = {"report": REPORT_FIRST, "import": 0.0, "cache": 0.0}
        self._customer = itertools.cycle(self.customers)

    @property
    def sent(self) -> int:
        return sum(self.published.values())

    def run_due(self, elapsed: float) -> None:
        from . import tasks  # here: the settings are read from the environment now

        if elapsed >= self._next["report"]:
            self._next["report"] += REPORT_EVERY
            for _ in range(REPORT_COPIES):
                self._send(tasks.report, "report", ())
        if elapsed >= self._next["import"]:
            self._next["import"] += IMPORT_EVERY
            customer = next(self._customer)
            for _ in range(IMPORT_COPIES):
                self._send(tasks.import_customer, "import_customer", (customer,))
        if self._long_at and elapsed >= self._long_at[0]:
            self._long_at.pop(0)
            if not self._long_at:
                self._long_at.append(elapsed + LONG_EVERY)
            self._send(tasks.long_job, "long_job", ("nightly",))
        if elapsed >= self._next["cache"]:
            self._next["cache"] += CACHE_EVERY
            for _ in range(CACHE_CALLS):
                self.cache_calls += 1
                if not self._send(tasks.refresh_cache, "refresh_cache", ("prices",)):
                    self.cache_deduplicated += 1

    def send(self, task: Any, name: str, args: tuple[Any, ...]) -> bool:
        """Send one message outside the timetable (same bookkeeping)."""
        return self._send(task, name, args)

    def _send(self, task: Any, name: str, args: tuple[Any, ...]) -> bool:
        """True when a message was published (False: queue once handed back the
        queued copy instead)."""
        task_id = uuid()
        # ignore_result: outcomes are counted by the observer; without it the Redis
        # result backend would subscribe this process to every task's result channel.
        result = task.apply_async(args, task_id=task_id, ignore_result=True)
        if result.id != task_id:
            return False
        self.published[name] += 1
        self.task_ids.add(task_id)
        return True


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=30.0, help="seconds (default 30)")
    args = parser.parse_args(argv)
    workload = Workload()
    started = time.monotonic()
    while (elapsed := time.monotonic() - started) < args.duration:
        workload.run_due(elapsed)
        time.sleep(0.1)
    print(
        f"published {workload.sent} messages ({dict(workload.published)}); queue once "
        f"answered {workload.cache_deduplicated} of {workload.cache_calls} "
        "refresh_cache calls with the queued copy"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
