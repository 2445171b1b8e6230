"""The evidence the oracle judges: what each holder records, and reading it back.

- :class:`OracleLog`: one process's append-only JSON-lines log of its attempts,
  leases, extensions, losses, releases and store writes, stamped with
  ``time.monotonic_ns()`` (:func:`now_ns`; CLOCK_MONOTONIC is one clock for every
  process on this machine); :func:`read_events` reads a run's logs back;
- :class:`RecordingClock`: the lock's clock, remembering its last reading, so a
  lease is judged by when the lock judged it valid;
- the naive fenced store (:func:`store_write`, :func:`read_store`): a Redis list that
  accepts every write in arrival order, as an unfenced database would;
- :func:`pick_seed`: the seed of a randomized run (``$REDLOCK_FAULT_SEED`` fixes it).

The holders (:mod:`.holders`) write it; :mod:`.oracle` judges it. Imports no
celery_redlock code and nothing of the judgement: the holders load only this.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import redis

__all__ = [
    "NS",
    "SEED_ENV",
    "OracleLog",
    "RecordingClock",
    "StoreWrite",
    "now_ns",
    "pick_seed",
    "read_events",
    "read_store",
    "store_write",
]

#: Environment variable that fixes the seed of a randomized run.
SEED_ENV = "REDLOCK_FAULT_SEED"

NS = 1_000_000_000


def pick_seed() -> int:
    """``$REDLOCK_FAULT_SEED`` when set, else a fresh random seed (to be printed)."""
    fixed = os.environ.get(SEED_ENV)
    if fixed:
        return int(fixed)
    return random.SystemRandom().randrange(1, 2**31)


def now_ns() -> int:
    return time.monotonic_ns()


class RecordingClock:
    """time.monotonic for ``Redlock(clock=...)`` that remembers, per thread, its last
    reading: right after acquire() returns, :meth:`last_ns` is the lock's own last
    look at the clock -- when it judged the lease valid. Judging a lease by that
    reading, not by a reading the caller takes later, keeps a caller descheduled
    between the two from looking like a lock that returned a dead lease."""

    def __init__(self) -> None:
        self._local = threading.local()

    def __call__(self) -> float:
        reading = time.monotonic_ns()
        self._local.last = reading
        return reading / NS

    def last_ns(self) -> Optional[int]:
        last: Optional[int] = getattr(self._local, "last", None)
        return last


# -- the log ------------------------------------------------------------------------------


class OracleLog:
    """One process's append-only event log (JSON lines, flushed per line).

    A line is in the kernel once ``write`` returns, so a holder killed with SIGKILL
    leaves everything it logged. Thread-safe: the watchdog thread logs extensions.
    """

    def __init__(self, path: Union[str, os.PathLike[str]], label: str) -> None:
        self.path = Path(path)
        self.label = label
        self._lock = threading.Lock()
        self._file = open(self.path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115

    def event(self, kind: str, **fields: Any) -> None:
        line = json.dumps({"ev": kind, "label": self.label, "pid": os.getpid(), **fields})
        with self._lock:
            self._file.write(line + "\n")

    def start(self, **fields: Any) -> None:
        """Who we are, with both clocks read together (a faked wall clock shows here)."""
        self.event("start", wall=time.time(), mono_ns=now_ns(), **fields)

    def attempt(self, key: str, start_ns: int, end_ns: int, outcome: str) -> None:
        self.event("attempt", key=key, start_ns=start_ns, end_ns=end_ns, outcome=outcome)

    def acquired(
        self,
        key: str,
        token: str,
        fence: Optional[int],
        call_ns: int,
        acquired_ns: int,
        deadline: float,
        ttl: float,
        single: bool = True,
        checked_ns: Optional[int] = None,
    ) -> None:
        """``deadline``: the lease's end of validity in seconds on time.monotonic().
        ``single``: the call made one attempt (non-blocking), so its round started
        after ``call_ns``. ``checked_ns``: the lock's last clock reading inside the
        call (RecordingClock.last_ns), if recorded."""
        self.event(
            "acquire",
            key=key,
            token=token,
            fence=fence,
            call_ns=call_ns,
            acquired_ns=acquired_ns,
            deadline_ns=round(deadline * NS),
            ttl_ns=round(ttl * NS),
            single=single,
            checked_ns=checked_ns,
        )

    def extended(self, key: str, token: str, deadline: float) -> None:
        self.event("extend", key=key, token=token, ns=now_ns(), deadline_ns=round(deadline * NS))

    def lost(self, key: str, token: str, reason: Optional[str]) -> None:
        self.event("lost", key=key, token=token, ns=now_ns(), reason=reason)

    def released(self, key: str, token: str, released_ns: int) -> None:
        self.event("release", key=key, token=token, released_ns=released_ns)

    def wrote(self, key: str, token: str, fence: int, seq: int, sent_ns: int, done_ns: int) -> None:
        """A store write of ``seq``: sent at ``sent_ns``, acknowledged at ``done_ns``
        (it landed in between)."""
        self.event(
            "write", key=key, token=token, fence=fence, seq=seq, sent_ns=sent_ns, done_ns=done_ns
        )

    def close(self) -> None:
        with self._lock:
            self._file.close()


def read_events(where: Union[str, os.PathLike[str], Iterable[Path]]) -> list[dict[str, Any]]:
    """Every event in a directory's ``*.jsonl`` files (or the given files).

    A line cut short by a SIGKILL mid-write is skipped.
    """
    if isinstance(where, (str, os.PathLike)):
        paths: Iterable[Path] = sorted(Path(where).glob("*.jsonl"))
    else:
        paths = where
    events: list[dict[str, Any]] = []
    for path in paths:
        with open(path, encoding="utf-8") as stream:
            for line in stream:
                try:
                    events.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    return events


# -- the naive store (for stale writes) -------------------------------------------------


@dataclass(frozen=True)
class StoreWrite:
    """One write as the store accepted it: ``seq`` is its place in arrival order."""

    key: str
    seq: int
    fence: int
    token: str
    label: str


def _store_list(key: str) -> str:
    return f"oracle:writes:{key}"


def store_write(client: redis.Redis, key: str, fence: int, token: str, label: str) -> int:
    """Append a fenced write to the store; its position (1-based) in arrival order.

    The store accepts everything (RPUSH is atomic, so the list order is the order of
    acceptance): refusing stale writers is fencing's job, finding them is ours.
    """
    entry = json.dumps({"fence": fence, "token": token, "label": label})
    return int(client.rpush(_store_list(key), entry))


def read_store(client: redis.Redis, keys: Iterable[str]) -> dict[str, list[StoreWrite]]:
    """Every write the store accepted, per key, in acceptance order."""
    found: dict[str, list[StoreWrite]] = {}
    for key in keys:
        entries = client.lrange(_store_list(key), 0, -1)
        found[key] = [
            StoreWrite(key, i + 1, int(item["fence"]), str(item["token"]), str(item["label"]))
            for i, item in enumerate(json.loads(raw) for raw in entries)
        ]
    return found
