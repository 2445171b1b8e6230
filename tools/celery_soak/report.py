"""Accounting for every job, overlaps per key, and the JSON summary.

A job ends one of four ways: ``success``, ``skipped`` (SUCCESS whose value is the
skipped marker), ``failed`` (FAILURE, with the error's type), or ``lost`` (not ready
after the drain: PENDING, RETRY, STARTED...). An overlap is two bodies of one key
whose spans on the observer intersect; a body that never reported its exit is taken
to have ended when a fault SIGKILLed its process. An overlap is ``paused_holder``
(allowed: the fence refuses the stale holder's write) when the earlier body's worker
was SIGSTOPped while it ran and before the later one entered; any other is a
violation.

A lost job that no worker ever logged receiving, whose body never began, and that
was sent less than :data:`TRANSPORT_WINDOW_NS` before a whole worker was SIGKILLed is
counted apart as ``lost_in_transport``: kombu's Redis transport pops a message (BRPOP)
and only then records it as unacked (ZADD + HSET, from the worker), so a worker killed
between the two takes the message with it -- below Celery, and outside what a lock
can see. It is reported, with its evidence, but is not a violation. The same holds
for a job that ran nothing and whose last copy a worker published again (a lock retry,
a wait for an earlier delivery) and logged ``ignored``, no worker logging that copy
received, when a whole worker was SIGKILLed between that publish and
:data:`TRANSPORT_WINDOW_NS` after it: the worker log's wall-clock time is put on the
faults' clock (both are read on this machine).
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from celery_redlock import is_skipped
from tests.support.observed import Interval, overlaps

from .faults import Fault
from .jobs import Job, Seen

#: How soon after a job was sent a whole-worker SIGKILL may have taken it in transit.
TRANSPORT_WINDOW_NS = 1_000_000_000
#: A worker log line's time: ``[2026-11-28 06:11:35,743: ...`` (local time, ms).
LOG_TIME = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}):")


def outcome(job: Job) -> str:
    if job.state == "SUCCESS":
        return "skipped" if is_skipped(job.result) else "success"
    if job.state == "FAILURE":
        return "failed"
    return "lost"


@dataclass(frozen=True)
class Overlap:
    tag: str
    earlier: Interval
    later: Interval
    earlier_worker: Optional[str]
    later_worker: Optional[str]
    earlier_killed: bool  # the earlier body never reported its exit
    paused_holder: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "tag": self.tag,
            "earlier": _span(self.earlier, self.earlier_worker),
            "later": _span(self.later, self.later_worker),
            "overlap_ms": round((self.earlier.end - self.later.start) / 1e6, 1),
            "earlier_killed": self.earlier_killed,
            "paused_holder": self.paused_holder,
        }


def _span(span: Interval, worker: Optional[str]) -> dict[str, Any]:
    return {
        "task_id": span.task_id,
        "pid": span.pid,
        "worker": worker,
        "start_ns": span.start,
        "end_ns": span.end,
    }


def _killed_at(pid: int, start: int, faults: Sequence[Fault]) -> Optional[int]:
    """When a SIGKILL fault ended ``pid`` after ``start`` (None: no fault did)."""
    for fault in faults:
        killing = fault.kind in ("child_kill", "body_kill", "worker_kill")
        if killing and fault.start >= start and pid in fault.pids:
            return fault.start
    return None


def spans(tag: str, seen: Seen, faults: Sequence[Fault]) -> tuple[list[Interval], int]:
    """Every body of ``tag`` with its span (killed ones end at their kill), and the
    count of bodies that neither finished nor were killed by a fault."""
    finished = seen.intervals[tag]
    done = {(s.task_id, s.pid, s.start) for s in finished}
    found = list(finished)
    unaccounted = 0
    for task_id, pid, start in seen.starts[tag]:
        if (task_id, pid, start) in done:
            continue
        killed = _killed_at(pid, start, faults)
        if killed is None:
            unaccounted += 1
        else:
            found.append(Interval(task_id, pid, start, killed))
    return found, unaccounted


def _paused_across(
    worker: Optional[str], earlier: Interval, later: Interval, faults: Sequence[Fault]
) -> bool:
    for fault in faults:
        if fault.kind != "worker_pause" or fault.target != worker:
            continue
        if earlier.start <= fault.start < min(earlier.end, later.start):
            return True
    return False


def find_overlaps(
    tags: Sequence[str], seen: Seen, faults: Sequence[Fault]
) -> tuple[list[Overlap], int]:
    found: list[Overlap] = []
    unaccounted = 0
    for tag in tags:
        bodies, missing = spans(tag, seen, faults)
        unaccounted += missing
        finished = set(seen.intervals[tag])
        for earlier, later in overlaps(bodies):
            worker = seen.worker_of(earlier.pid)
            found.append(
                Overlap(
                    tag,
                    earlier,
                    later,
                    worker,
                    seen.worker_of(later.pid),
                    earlier not in finished,
                    _paused_across(worker, earlier, later, faults),
                )
            )
    return found, unaccounted


def _killers(job: Job, seen: Seen, faults: Sequence[Fault]) -> list[str]:
    """The faults that SIGKILLed a body of ``job`` (kind and target)."""
    found: list[str] = []
    done = {(s.task_id, s.pid, s.start) for s in seen.intervals.get(job.tag, [])}
    for task_id, pid, start in seen.starts.get(job.tag, []):
        if task_id != job.task_id or (task_id, pid, start) in done:
            continue
        killed = _killed_at(pid, start, faults)
        if killed is not None:
            found.extend(f"{f.kind} {f.target} pid {pid}" for f in faults if f.start == killed)
    return found


def log_lines(task_id: str, log_paths: dict[str, str], limit: int = 40) -> list[str]:
    """The worker log lines that mention ``task_id`` (each prefixed by its worker)."""
    found: list[str] = []
    for name, path in log_paths.items():
        try:
            text = Path(path).read_text(errors="replace")
        except OSError:
            continue
        found.extend(f"[{name}] {line}" for line in text.splitlines() if task_id in line)
    return found[:limit]


def _error_name(job: Job) -> str:
    error = job.result
    return type(error).__name__ if isinstance(error, BaseException) else repr(error)[:80]


def account(
    jobs: Sequence[Job],
    seen: Seen,
    faults: Sequence[Fault],
    tags: Sequence[str],
    log_paths: dict[str, str],
) -> dict[str, Any]:
    """The counts, and every lost job and overlap in detail."""
    outcomes = Counter(outcome(job) for job in jobs)
    per_mode = {
        mode: dict(Counter(outcome(j) for j in jobs if j.mode == mode))
        for mode in sorted({job.mode for job in jobs})
    }
    errors = Counter(_error_name(job) for job in jobs if job.state == "FAILURE")
    redelivered = {tid: n for tid, n in seen.runs.items() if n > 1}
    found, unaccounted = find_overlaps(tags, seen, faults)
    lost: list[dict[str, Any]] = [
        {
            "task_id": job.task_id,
            "mode": job.mode,
            "tag": job.tag,
            "state": job.state,
            "bodies_begun": seen.runs.get(job.task_id, 0),
            "bodies_killed_by": _killers(job, seen, faults),
            "sent_ns": job.sent,
            "faults_within_15s_after_send": [
                f"{f.kind} {f.target} +{(f.start - job.sent) / 1e9:.2f}s"
                for f in faults
                if 0 <= f.start - job.sent <= 15_000_000_000
            ],
            "log": log_lines(job.task_id, log_paths),
        }
        for job in jobs
        if outcome(job) == "lost"
    ]
    wall_minus_monotonic = time.time_ns() - time.monotonic_ns()
    in_transport = [
        job["task_id"]
        for job in lost
        if not job["bodies_begun"]
        and (
            (not job["log"] and _killed_in_transit(job["sent_ns"], faults))
            or _republished_in_transit(job["log"], faults, wall_minus_monotonic)
        )
    ]
    stale = [r for r in seen.refused]
    return {
        "jobs": len(jobs),
        "outcomes": {k: outcomes.get(k, 0) for k in ("success", "skipped", "failed", "lost")},
        "per_mode": per_mode,
        "failure_errors": dict(errors),
        "redeliveries": len(redelivered),
        "extra_executions": sum(n - 1 for n in redelivered.values()),
        "bodies": sum(seen.runs.values()),
        "bodies_unaccounted": unaccounted,
        "max_occupancy_counter": seen.max_occupancy,
        "overlaps": len(found),
        "overlaps_paused_holder": sum(o.paused_holder for o in found),
        "overlaps_violating": sum(not o.paused_holder for o in found),
        "fenced_writes_refused": len(stale),
        "overlap_details": [o.as_dict() for o in found],
        "refused_details": stale,
        "lost_details": lost,
        "lost_in_transport": in_transport,
        "redelivered_task_ids": redelivered,
    }


def _killed_in_transit(sent: int, faults: Sequence[Fault]) -> bool:
    return any(
        f.kind == "worker_kill" and 0 <= f.start - sent <= TRANSPORT_WINDOW_NS for f in faults
    )


def _republished_in_transit(
    log: Sequence[str], faults: Sequence[Fault], wall_minus_monotonic: int
) -> bool:
    """The job's log ends with a copy published again (a ``->`` line, logged just
    before the publish, then ``ignored``, just after) that no worker logged received,
    and a whole worker was SIGKILLed from that publish to the window after it."""
    if len(log) < 2 or "ignored" not in log[-1] or "->" not in log[-2]:
        return False
    before, after = _log_time_ns(log[-2]), _log_time_ns(log[-1])
    if before is None or after is None:
        return False
    earliest = before - wall_minus_monotonic - 1_000_000  # the log keeps whole ms
    latest = after - wall_minus_monotonic + 1_000_000 + TRANSPORT_WINDOW_NS
    return any(f.kind == "worker_kill" and earliest <= f.start <= latest for f in faults)


def _log_time_ns(line: str) -> Optional[int]:
    match = LOG_TIME.search(line)
    if match is None:
        return None
    seconds = time.mktime(time.strptime(match.group(1), "%Y-%m-%d %H:%M:%S"))
    return int(seconds) * 1_000_000_000 + int(match.group(2)) * 1_000_000


def crashes(log_paths: dict[str, str]) -> list[str]:
    """Tracebacks and worker-lost lines in the logs, other than the faults' own."""
    pattern = re.compile(r"Traceback|CRITICAL|Unrecoverable|WorkerLostError")
    found: list[str] = []
    for name, path in log_paths.items():
        try:
            lines = Path(path).read_text(errors="replace").splitlines()
        except OSError:
            continue
        found.extend(f"[{name}] {line}" for line in lines if pattern.search(line))
    return found


def violations(summary: dict[str, Any]) -> list[str]:
    """What makes the soak fail: lost jobs, overlaps outside the paused-holder case,
    a fault kind that never fired, a fault or send that errored."""
    problems = []
    result = summary["result"]
    lost = result["outcomes"]["lost"] - len(result["lost_in_transport"])
    if lost:
        problems.append(f"{lost} jobs lost")
    if result["overlaps_violating"]:
        problems.append(f"{result['overlaps_violating']} overlaps outside a paused holder")
    missing = [kind for kind, n in summary["faults"].items() if not n]
    if missing:
        problems.append(f"fault kinds that never fired: {missing}")
    if summary["fault_errors"] or summary["send_errors"]:
        problems.append("faults or sends raised errors")
    return problems
