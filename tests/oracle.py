"""An independent oracle for the fault-injection suite: holder logs, a checker, probes.

The lock's own word is not evidence. Every process that takes a lock writes what it
did to its own append-only JSON-lines file, stamped with ``time.monotonic_ns()``
(CLOCK_MONOTONIC: one clock for every process on this machine), and the checker reads
those files after the run:

- an **overlap** is two different tokens of one key whose windows intersect, where a
  window is ``[acquired, min(released, deadline)]``: ``acquired`` is taken when
  ``acquire()`` returned, ``released`` just before ``release()`` was called, and
  ``deadline`` is the end of validity the lease promised (``Lease.deadline``, on the
  same monotonic clock, moved on by each successful extension);
- a **stale write** is a fenced write the store accepted with a fence lower than one
  it had already accepted. The store here is deliberately naive -- a Redis list on a
  separate server that appends every write in arrival order, as an unfenced database
  would -- so any write the lock lets through out of order shows up;
- a **fence regression**: a holder whose fence is not above its predecessor's;
- a lease **born dead** (returned with its validity already gone) or one that
  **overclaims** (acquire() promised a deadline more than ``ttl`` after its winning
  round began -- for a one-attempt call, after the call; extensions may move it on).

The checker half (everything up to "Holder processes") imports no celery_redlock
code: it judges the lock, so it must not lean on it (the store and the TTL scanner
talk to Redis through plain redis-py clients).
The holder half runs the lock -- it is the workload -- and is started as a script::

    python tests/oracle.py stream CONFIG.json    # a holder loop, see StreamConfig
    python tests/oracle.py probe CONFIG.json     # one acquire per "acquire KEY" line

Runs are randomized through ``random.Random(seed)``; a test prints its seed, and
``REDLOCK_FAULT_SEED=<seed>`` re-runs it with the same choices.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import select
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import redis

__all__ = [
    "NS",
    "SEED_ENV",
    "Attempt",
    "OracleLog",
    "Overlap",
    "ProbeConfig",
    "Report",
    "StaleWrite",
    "StoreWrite",
    "StreamConfig",
    "TtlScanner",
    "Window",
    "check",
    "classify",
    "leftover_keys",
    "now_ns",
    "pick_seed",
    "read_events",
    "read_store",
    "run_probe",
    "run_stream",
    "select_sleep",
    "store_write",
]

#: Environment variable that fixes the seed of a randomized run.
SEED_ENV = "REDLOCK_FAULT_SEED"

# Key shapes the lock leaves on a node, spelled out here rather than imported: a
# release's tombstone ``<key>\\0released\\0<token>`` (must expire) and a fence counter
# ``<key>\\0fence`` (never expires, by design). Anything else is a lock key.
TOMBSTONE_MARK = "\x00released\x00"
FENCE_SUFFIX = "\x00fence"

NS = 1_000_000_000


def pick_seed() -> int:
    """``$REDLOCK_FAULT_SEED`` when set, else a fresh random seed (to be printed)."""
    fixed = os.environ.get(SEED_ENV)
    if fixed:
        return int(fixed)
    return random.SystemRandom().randrange(1, 2**31)


def now_ns() -> int:
    return time.monotonic_ns()


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
    ) -> None:
        """``deadline``: the lease's end of validity in seconds on time.monotonic().
        ``single``: the call made one attempt (non-blocking), so its round started
        after ``call_ns``."""
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
        )

    def extended(self, key: str, token: str, deadline: float) -> None:
        self.event("extend", key=key, token=token, ns=now_ns(), deadline_ns=round(deadline * NS))

    def lost(self, key: str, token: str, reason: Optional[str]) -> None:
        self.event("lost", key=key, token=token, ns=now_ns(), reason=reason)

    def released(self, key: str, token: str, released_ns: int) -> None:
        self.event("release", key=key, token=token, released_ns=released_ns)

    def wrote(self, key: str, token: str, fence: int, seq: int, sent_ns: int) -> None:
        self.event("write", key=key, token=token, fence=fence, seq=seq, sent_ns=sent_ns)

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


# -- the checker --------------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """One holder's exclusive window for a key, as its own log tells it."""

    key: str
    token: str
    label: str
    fence: Optional[int]
    call_ns: int
    start_ns: int  # acquire() returned
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
        windows.append(
            Window(
                key=ident[0],
                token=ident[1],
                label=str(event.get("label", "?")),
                fence=None if event.get("fence") is None else int(event["fence"]),
                call_ns=int(event["call_ns"]),
                start_ns=int(event["acquired_ns"]),
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
        report.stale_writes = _stale_writes(writes)
        report.writes = sum(len(entries) for entries in writes.values())
    return report


# -- keys without a TTL ---------------------------------------------------------------------


def classify(name: Union[bytes, str]) -> str:
    """``"lock"``, ``"tombstone"`` or ``"fence"`` (a counter, exempt from TTLs)."""
    text = name.decode("utf-8", "replace") if isinstance(name, bytes) else name
    if TOMBSTONE_MARK in text:
        return "tombstone"
    if text.endswith(FENCE_SUFFIX):
        return "fence"
    return "lock"


class TtlScanner:
    """A thread that SCANs the lock nodes over and over and records every key it sees
    without an expiry (PTTL -1), except fence counters, which never expire by design.

    ``start()`` / ``stop()``; ``seen`` counts distinct keys per class, ``without_ttl``
    lists the offenders as (node index, key). Nodes that are down or paused are
    skipped (short socket timeouts), not waited on.
    """

    def __init__(self, urls: Sequence[str], interval: float = 0.005) -> None:
        self._clients = [
            redis.Redis.from_url(url, socket_timeout=0.2, socket_connect_timeout=0.2)
            for url in urls
        ]
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ttl-scanner", daemon=True)
        self.seen: dict[str, set[bytes]] = {"lock": set(), "tombstone": set(), "fence": set()}
        self.without_ttl: list[tuple[int, bytes]] = []
        self.sweeps = 0

    def start(self) -> TtlScanner:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for client in self._clients:
            client.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            for index, client in enumerate(self._clients):
                try:
                    self._sweep(index, client)
                except redis.RedisError:
                    continue  # a node that is down or paused: nothing to see there now
            self.sweeps += 1
            self._stop.wait(self._interval)

    def _sweep(self, index: int, client: redis.Redis) -> None:
        names = list(client.scan_iter(count=1000))
        if not names:
            return
        pipe = client.pipeline(transaction=False)
        for name in names:
            pipe.pttl(name)
        for name, pttl in zip(names, pipe.execute()):
            if pttl == -2:
                continue  # gone between SCAN and PTTL
            kind = classify(name)
            self.seen[kind].add(name)
            if pttl == -1 and kind != "fence":
                self.without_ttl.append((index, name))


def leftover_keys(urls: Sequence[str]) -> dict[str, list[bytes]]:
    """Lock keys and tombstones still present on any reachable node (fence counters
    excluded), per URL."""
    found: dict[str, list[bytes]] = {}
    for url in urls:
        client = redis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)
        try:
            names = [n for n in client.scan_iter(count=1000) if classify(n) != "fence"]
        finally:
            client.close()
        if names:
            found[url] = sorted(names)
    return found


# -- holder processes (these run the lock) ----------------------------------------------


@dataclass
class StreamConfig:
    """A holder loop: pick a key, try to win it, hold it a random while, release.

    The process prints ``ready``, waits for a ``go UNTIL_NS`` line on stdin, then
    loops until ``UNTIL_NS`` (monotonic) or until ``stop_path`` exists.

    Durations in seconds. ``wait``: acquire timeout range (0: one non-blocking try).
    ``abandon``: chance to keep a lease until its validity ran out, then release it
    late (the next holder gets in through expiry; the late release must leave the
    successor alone). ``auto_extend``: chance of a hold of 1-2 ttl under the
    watchdog. ``observer_url``: where fenced writes go (needs ``fencing``).
    ``select_sleep``: sleep with select() instead of time.sleep, for a process under
    libfaketime with FAKETIME_DONT_FAKE_MONOTONIC=1, where time.sleep fails with
    EINVAL (libfaketime 0.9.10 mishandles clock_nanosleep on the real monotonic clock).
    """

    label: str
    urls: list[str]
    keys: list[str]
    log_path: str
    seed: int
    ttl: float
    stop_path: Optional[str] = None
    node_timeout: float = 0.05
    drift_factor: float = 0.01
    fencing: bool = False
    observer_url: Optional[str] = None
    hold: tuple[float, float] = (0.0, 0.02)
    abandon: float = 0.0
    auto_extend: float = 0.0
    wait: tuple[float, float] = (0.0, 0.3)
    idle: tuple[float, float] = (0.0, 0.005)
    retry_delay: float = 0.05
    select_sleep: bool = False

    def dump(self, path: Path) -> Path:
        path.write_text(json.dumps(asdict(self)))
        return path

    @classmethod
    def load(cls, path: Union[str, os.PathLike[str]]) -> StreamConfig:
        data = json.loads(Path(path).read_text())
        for name in ("hold", "wait", "idle"):
            data[name] = tuple(data[name])
        return cls(**data)


@dataclass
class ProbeConfig:
    """One acquire per ``acquire KEY`` line on stdin (for a parent that SIGSTOPs us
    mid-round): prints ``starting`` just before the call, then one JSON result line."""

    label: str
    urls: list[str]
    log_path: str
    ttl: float
    node_timeout: float
    drift_factor: float = 0.01

    def dump(self, path: Path) -> Path:
        path.write_text(json.dumps(asdict(self)))
        return path

    @classmethod
    def load(cls, path: Union[str, os.PathLike[str]]) -> ProbeConfig:
        return cls(**json.loads(Path(path).read_text()))


def select_sleep(seconds: float) -> None:
    """time.sleep by select(): libfaketime leaves its relative timeout alone."""
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        select.select([], [], [], left)


def _uniform(rng: random.Random, bounds: tuple[float, float]) -> float:
    return rng.uniform(bounds[0], bounds[1])


def _outcome(error: BaseException) -> str:
    from celery_redlock import QuorumUnavailable

    return "unavailable" if isinstance(error, QuorumUnavailable) else "error"


def run_stream(config: StreamConfig) -> None:
    """The holder loop of one process (see StreamConfig); prints ``ready`` when set up."""
    from celery_redlock import Lease, Redlock
    from celery_redlock.watchdog import get_watchdog

    rng = random.Random(config.seed)
    log = OracleLog(config.log_path, config.label)
    log.start(seed=config.seed)
    sleep = select_sleep if config.select_sleep else time.sleep
    redlock = Redlock(
        config.urls,
        ttl=config.ttl,
        node_timeout=config.node_timeout,
        drift_factor=config.drift_factor,
        retry_delay=config.retry_delay,
        fencing=config.fencing,
        sleep=sleep,
    )
    observer = redis.Redis.from_url(config.observer_url) if config.observer_url else None
    print("ready", flush=True)
    go = sys.stdin.readline().split()
    if len(go) != 2 or go[0] != "go":
        return
    until_ns = int(go[1])
    stop_path = config.stop_path

    def write(lease: Lease) -> None:
        # Only while the lease says it is ours, and with most of its validity left: a
        # write that a slow scheduler delays past the deadline would be the writer's
        # fault, not the lock's.
        if observer is None or lease.fence is None or lease.validity < config.ttl / 2:
            return
        sent_ns = now_ns()
        seq = store_write(observer, lease.key, lease.fence, lease.token, config.label)
        log.wrote(lease.key, lease.token, lease.fence, seq, sent_ns)

    while now_ns() < until_ns and not (stop_path and os.path.exists(stop_path)):
        key = rng.choice(config.keys)
        wait = _uniform(rng, config.wait)
        call_ns = now_ns()
        lease: Optional[Lease] = None
        outcome = "contended"
        try:
            lease = redlock.acquire(key, blocking=wait > 0, timeout=wait if wait > 0 else None)
        except Exception as error:
            outcome = _outcome(error)
        end_ns = now_ns()
        if lease is not None:
            outcome = "granted"
            log.acquired(
                key, lease.token, lease.fence, call_ns, end_ns, lease.deadline, lease.ttl, wait <= 0
            )
        log.attempt(key, call_ns, end_ns, outcome)
        if lease is not None:
            write(lease)
            roll = rng.random()
            if roll < config.abandon:
                # Keep it until validity runs out, then release late.
                sleep(max(0.0, lease.deadline - time.monotonic()) + rng.uniform(0, 0.02))
            elif roll < config.abandon + config.auto_extend:
                lease.on_extended(lambda gone: log.extended(gone.key, gone.token, gone.deadline))
                lease.on_lost(lambda gone: log.lost(gone.key, gone.token, gone.lost_reason))
                watchdog = get_watchdog()
                watchdog.watch(lease)
                stop = time.monotonic() + config.ttl * rng.uniform(1.0, 2.0)
                while time.monotonic() < stop and lease.held:
                    sleep(0.01)
                write(lease)
                watchdog.unwatch(lease)
            else:
                sleep(_uniform(rng, config.hold))
                write(lease)
            released_ns = now_ns()
            log.released(key, lease.token, released_ns)
            with contextlib.suppress(Exception):  # a failed release leaves the key to expire
                lease.release()
        sleep(_uniform(rng, config.idle))
    log.event("end", mono_ns=now_ns())
    log.close()
    print("done", flush=True)


def run_probe(config: ProbeConfig) -> None:
    """Serve ``acquire KEY`` lines from stdin (see ProbeConfig)."""
    from celery_redlock import Redlock

    log = OracleLog(config.log_path, config.label)
    log.start()
    redlock = Redlock(
        config.urls,
        ttl=config.ttl,
        node_timeout=config.node_timeout,
        drift_factor=config.drift_factor,
    )
    print("ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        key = words[1]
        print("starting", flush=True)
        call_ns = now_ns()
        outcome = "contended"
        lease = None
        try:
            lease = redlock.acquire(key, blocking=False)
        except Exception as error:
            outcome = _outcome(error)
        end_ns = now_ns()
        if lease is not None:
            outcome = "granted"
            log.acquired(key, lease.token, None, call_ns, end_ns, lease.deadline, lease.ttl)
        log.attempt(key, call_ns, end_ns, outcome)
        result = {"outcome": outcome, "elapsed": (end_ns - call_ns) / NS, "call_ns": call_ns}
        if lease is not None:
            result["validity_at_return"] = lease.deadline - end_ns / NS
            released_ns = now_ns()
            log.released(key, lease.token, released_ns)
            lease.release()
        print(json.dumps(result), flush=True)
    log.close()


def main(argv: Sequence[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("stream", "probe"):
        print("usage: oracle.py stream|probe CONFIG.json", file=sys.stderr)
        return 2
    # Started as a script: make this checkout's package importable without an install.
    checkout = str(Path(__file__).resolve().parents[1])
    if checkout not in sys.path:
        sys.path.insert(0, checkout)
    if argv[0] == "stream":
        run_stream(StreamConfig.load(argv[1]))
    else:
        run_probe(ProbeConfig.load(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
