"""An independent oracle for the fault-injection suite: the checker that judges a run.

The lock's own word is not evidence. Every process that takes a lock writes what it
did to its own append-only JSON-lines file, stamped with ``time.monotonic_ns()``
(CLOCK_MONOTONIC: one clock for every process on this machine) -- the log, the
recording clock and the store are in :mod:`.evidence` -- and :func:`check` reads
those files after the run:

- an **overlap** is two different tokens of one key whose windows intersect, where a
  window is ``[acquired, min(released, deadline)]``: ``acquired`` is the holder's
  last reading of the clock inside ``acquire()`` when it recorded one (its
  RecordingClock: the moment the lock decided the lease was valid; a holder
  descheduled before it logs cannot move its window later), else when ``acquire()``
  returned; ``released`` is taken just before ``release()`` was called, and
  ``deadline`` is the end of validity the lease promised (``Lease.deadline``, on the
  same monotonic clock, moved on by each successful extension);
- a **stale write** is a fenced write the store accepted with a fence lower than one
  it had already accepted, while its writer's lease was still valid (the write
  completed before the writer's deadline). The store here is deliberately naive -- a
  Redis list on a separate server that appends every write in arrival order, as an
  unfenced database would -- so any write the lock lets through out of order shows
  up. A write that may have landed after its own writer's deadline (a writer
  descheduled between its validity check and the store) is the writer's lateness,
  which fencing exists to refuse, not the lock's: it is counted apart
  (``late_writes``). Nothing is lost by that: two holders valid at once are an
  overlap, and a successor with a lower fence a fence regression;
- a **fence regression**: a holder whose fence is not above its predecessor's;
- a lease **born dead** (validity already gone at the lock's own last clock reading
  before it returned -- the lock knew; without a recording, when acquire() returned)
  or one that
  **overclaims** (acquire() promised a deadline more than ``ttl`` after its winning
  round began -- for a one-attempt call, after the call; extensions may move it on).

This module, :mod:`.evidence` and :mod:`.scanner` (keys left without a TTL) import
no celery_redlock code: they judge the lock, so they must not lean on it (the store
and the scanner talk to Redis through plain redis-py clients). The holders that run
the lock -- the workload -- are :mod:`.holders`, started as processes::

    python -m tools.faultlab.holders stream CONFIG.json   # a holder loop, see StreamConfig
    python -m tools.faultlab.holders probe CONFIG.json    # one acquire per "acquire KEY"

Runs are randomized through ``random.Random(seed)``; a test prints its seed, and
``REDLOCK_FAULT_SEED=<seed>`` re-runs it with the same choices.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

# The evidence's names, for callers that import everything from the oracle.
from .evidence import (
    NS,
    SEED_ENV,
    OracleLog,
    RecordingClock,
    StoreWrite,
    now_ns,
    pick_seed,
    read_events,
    read_store,
    store_write,
)

__all__ = [
    "NS",
    "SEED_ENV",
    "Attempt",
    "OracleLog",
    "Overlap",
    "RecordingClock",
    "Report",
    "StaleWrite",
    "StoreWrite",
    "Window",
    "check",
    "now_ns",
    "pick_seed",
    "read_events",
    "read_store",
    "store_write",
]


# -- the checker --------------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """One holder's exclusive window for a key, as its own log tells it."""

    key: str
    token: str
    label: str
    fence: Optional[int]
    call_ns: int
    start_ns: int  # the lock's last clock reading in acquire(), else when it returned
    deadline_ns: int  # the last validity deadline promised (acquire or extension)
    first_deadline_ns: int  # the one acquire() promised
    single: bool  # won in one attempt (its round started after call_ns)
    released_ns: Optional[int]  # release() was called (None: never, e.g. killed)
    lost_ns: Optional[int]
    ttl_ns: int

    @property
    def end_ns(self) -> int:
        if self.released_ns is None:
            return self.deadline_ns
        return min(self.released_ns, self.deadline_ns)

    def brief(self, origin: int = 0) -> str:
        def ms(ns: Optional[int]) -> str:
            return "-" if ns is None else f"{(ns - origin) / 1e6:.3f}ms"

        fence = "" if self.fence is None else f" fence={self.fence}"
        return (
            f"{self.label} token={self.token[:8]}{fence} [{ms(self.start_ns)}, {ms(self.end_ns)}]"
            f" (deadline {ms(self.deadline_ns)}, released {ms(self.released_ns)})"
        )


@dataclass(frozen=True)
class Overlap:
    key: str
    first: Window
    second: Window

    @property
    def overlap_ns(self) -> int:
        return min(self.first.end_ns, self.second.end_ns) - self.second.start_ns


@dataclass(frozen=True)
class StaleWrite:
    write: StoreWrite
    highest_before: int  # the highest fence the store had accepted before it


@dataclass(frozen=True)
class Attempt:
    label: str
    key: str
    start_ns: int
    end_ns: int
    outcome: str  # granted | contended | unavailable | error

    @property
    def elapsed(self) -> float:
        return (self.end_ns - self.start_ns) / NS


@dataclass
class Report:
    """What the checker found. ``violations`` counts everything that breaks safety."""

    windows: list[Window] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    overlaps: list[Overlap] = field(default_factory=list)
    stale_writes: list[StaleWrite] = field(default_factory=list)
    fence_regressions: list[tuple[Window, Window]] = field(default_factory=list)
    born_dead: list[Window] = field(default_factory=list)
    overclaims: list[Window] = field(default_factory=list)
    #: Out-of-order writes that may have landed after their writer's deadline: the
    #: writer's lateness (what fencing refuses), not a lock violation.
    late_writes: list[StaleWrite] = field(default_factory=list)
    writes: int = 0
    starts: list[dict[str, Any]] = field(default_factory=list)

    @property
    def acquisitions(self) -> int:
        return len(self.windows)

    @property
    def violations(self) -> int:
        return (
            len(self.overlaps)
            + len(self.stale_writes)
            + len(self.fence_regressions)
            + len(self.born_dead)
            + len(self.overclaims)
        )

    def granted_between(self, start_ns: int, end_ns: int) -> list[Window]:
        """Leases whose acquire() returned inside ``[start_ns, end_ns)``."""
        return [w for w in self.windows if start_ns <= w.start_ns < end_ns]

    def summary(self) -> dict[str, int]:
        return {
            "acquisitions": self.acquisitions,
            "attempts": len(self.attempts),
            "writes": self.writes,
            "overlaps": len(self.overlaps),
            "stale_writes": len(self.stale_writes),
            "fence_regressions": len(self.fence_regressions),
            "born_dead": len(self.born_dead),
            "overclaims": len(self.overclaims),
            "late_writes": len(self.late_writes),
        }

    def describe(self, limit: int = 5) -> str:
        """The summary and the first few counterexamples, for an assertion message."""
        origin = min((w.start_ns for w in self.windows), default=0)
        lines = [json.dumps(self.summary())]
        for overlap in self.overlaps[:limit]:
            lines.append(
                f"OVERLAP {overlap.key} by {overlap.overlap_ns / 1e6:.3f} ms:"
                f"\n    {overlap.first.brief(origin)}\n    {overlap.second.brief(origin)}"
            )
        for stale in self.stale_writes[:limit]:
            w = stale.write
            lines.append(
                f"STALE WRITE {w.key} #{w.seq} fence={w.fence} by {w.label} after fence "
                f"{stale.highest_before} was accepted"
            )
        for before, after in self.fence_regressions[:limit]:
            lines.append(
                f"FENCE REGRESSION {after.key}: {after.brief(origin)}"
                f" follows {before.brief(origin)}"
            )
        for window in self.born_dead[:limit]:
            lines.append(f"BORN DEAD {window.key}: {window.brief(origin)}")
        for window in self.overclaims[:limit]:
            lines.append(f"OVERCLAIM {window.key}: {window.brief(origin)}")
        return "\n".join(lines)


def _windows(events: Sequence[Mapping[str, Any]]) -> list[Window]:
    acquired: dict[tuple[str, str], Mapping[str, Any]] = {}
    deadlines: dict[tuple[str, str], int] = {}
    released: dict[tuple[str, str], int] = {}
    lost: dict[tuple[str, str], int] = {}
    for event in events:
        kind = event.get("ev")
        if kind not in ("acquire", "extend", "release", "lost"):
            continue
        ident = (str(event["key"]), str(event["token"]))
        if kind == "acquire":
            acquired[ident] = event
            deadlines.setdefault(ident, int(event["deadline_ns"]))
        elif kind == "extend":
            # An extension moves the deadline; the latest promise counts.
            deadlines[ident] = max(deadlines.get(ident, 0), int(event["deadline_ns"]))
        elif kind == "release":
            at = int(event["released_ns"])
            released[ident] = min(released.get(ident, at), at)
        else:
            lost.setdefault(ident, int(event["ns"]))
    windows = []
    for ident, event in acquired.items():
        returned = int(event["acquired_ns"])
        checked = event.get("checked_ns")
        windows.append(
            Window(
                key=ident[0],
                token=ident[1],
                label=str(event.get("label", "?")),
                fence=None if event.get("fence") is None else int(event["fence"]),
                call_ns=int(event["call_ns"]),
                start_ns=returned if checked is None else min(returned, int(checked)),
                deadline_ns=max(deadlines[ident], int(event["deadline_ns"])),
                first_deadline_ns=int(event["deadline_ns"]),
                single=bool(event.get("single", True)),
                released_ns=released.get(ident),
                lost_ns=lost.get(ident),
                ttl_ns=int(event["ttl_ns"]),
            )
        )
    windows.sort(key=lambda w: (w.key, w.start_ns))
    return windows


def _overlaps(windows: Sequence[Window]) -> list[Overlap]:
    found: list[Overlap] = []
    by_key: dict[str, list[Window]] = defaultdict(list)
    for window in windows:
        if window.end_ns > window.start_ns:  # an empty window holds nothing
            by_key[window.key].append(window)
    for key, group in by_key.items():
        group.sort(key=lambda w: w.start_ns)
        active: list[Window] = []
        for window in group:
            active = [w for w in active if w.end_ns > window.start_ns]
            found.extend(Overlap(key, w, window) for w in active if w.token != window.token)
            active.append(window)
    return found


def _fence_regressions(windows: Sequence[Window]) -> list[tuple[Window, Window]]:
    found: list[tuple[Window, Window]] = []
    by_key: dict[str, list[Window]] = defaultdict(list)
    for window in windows:
        if window.fence is not None:
            by_key[window.key].append(window)
    for group in by_key.values():
        group.sort(key=lambda w: w.start_ns)
        highest: Optional[Window] = None
        for window in group:
            assert window.fence is not None
            if highest is not None and highest.fence is not None and window.fence <= highest.fence:
                found.append((highest, window))
            if highest is None or (highest.fence or 0) < window.fence:
                highest = window
    return found


def _stale_writes(writes: Mapping[str, Sequence[StoreWrite]]) -> list[StaleWrite]:
    found: list[StaleWrite] = []
    for entries in writes.values():
        highest: Optional[int] = None
        for write in sorted(entries, key=lambda w: w.seq):
            if highest is not None and write.fence < highest:
                found.append(StaleWrite(write, highest))
            highest = write.fence if highest is None else max(highest, write.fence)
    return found


def _landed_late(
    stale: StaleWrite,
    done: Mapping[tuple[str, int], int],
    deadlines: Mapping[tuple[str, str], int],
) -> bool:
    """The write may have landed after its writer's deadline: it was acknowledged
    after it. Without the writer's log of it (or of its lease), it counts against
    the lock."""
    write = stale.write
    acknowledged = done.get((write.key, write.seq))
    deadline = deadlines.get((write.key, write.token))
    return acknowledged is not None and deadline is not None and acknowledged > deadline


def _since(window: Window) -> int:
    # Validity counts from the winning round's start: after call_ns for one attempt;
    # for a blocking call (several rounds) the oracle knows only that it was before
    # acquire() returned.
    return window.call_ns if window.single else window.start_ns


def check(
    events: Sequence[Mapping[str, Any]],
    writes: Optional[Mapping[str, Sequence[StoreWrite]]] = None,
) -> Report:
    """Judge a run from its logs (and the store's accepted writes, when fenced)."""
    windows = _windows(events)
    report = Report(windows=windows)
    report.attempts = sorted(
        (
            Attempt(
                str(e.get("label", "?")),
                str(e["key"]),
                int(e["start_ns"]),
                int(e["end_ns"]),
                str(e["outcome"]),
            )
            for e in events
            if e.get("ev") == "attempt"
        ),
        key=lambda a: a.start_ns,
    )
    report.starts = [dict(e) for e in events if e.get("ev") == "start"]
    report.overlaps = _overlaps(windows)
    report.fence_regressions = _fence_regressions(windows)
    report.born_dead = [w for w in windows if w.deadline_ns <= w.start_ns]
    report.overclaims = [w for w in windows if w.first_deadline_ns - _since(w) > w.ttl_ns]
    if writes:
        done = {
            (str(e["key"]), int(e["seq"])): int(e["done_ns"])
            for e in events
            if e.get("ev") == "write" and e.get("done_ns") is not None
        }
        deadlines = {(w.key, w.token): w.deadline_ns for w in windows}
        for stale in _stale_writes(writes):
            late = _landed_late(stale, done, deadlines)
            (report.late_writes if late else report.stale_writes).append(stale)
        report.writes = sum(len(entries) for entries in writes.values())
    return report
