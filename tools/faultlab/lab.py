"""What every fault scenario needs: a Lab (servers, clusters, proxies, a scratch
directory), a RowResult (the oracle's report and the row's own expectations), and a
Fleet of holder processes (``python -m tools.faultlab.holders stream``).

Used by tests/lock/test_faults.py (the Lab's factories are the pytest fixtures) and by
``python -m tools.soak`` (``Lab.standalone()``).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

from celery_redlock.testing import (
    FaultProxy,
    FaultProxyFactory,
    RedisNodes,
    RedisNodesFactory,
    RedisServer,
    RedisServerFactory,
)

from .evidence import NS, SEED_ENV, now_ns, read_events
from .holders import StreamConfig
from .oracle import Report, check

#: Where ``tools`` lives: on the holders' PYTHONPATH, so ``-m tools.faultlab.holders``
#: and this checkout's celery_redlock import without an install.
CHECKOUT = Path(__file__).resolve().parents[2]
NODE_TIMEOUT = 0.05
#: How long a row waits for what it needs to have seen (grants in a phase, a lease
#: lost, a contender in): a bound for a stuck run, never part of what is asserted.
PATIENCE = 60.0


def holder_command(mode: str, config_path: Path) -> list[str]:
    """The command line of a holder process (``stream`` or ``probe``, see .holders)."""
    return [sys.executable, "-m", "tools.faultlab.holders", mode, str(config_path)]


def holder_env(extra: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """This environment with ``extra`` and the checkout first on PYTHONPATH."""
    env = {**os.environ, **(extra or {})}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(CHECKOUT), env.get("PYTHONPATH")]))
    return env


# -- what a row needs and what it returns ----------------------------------------------------


@dataclass
class Lab:
    """Where a scenario gets its servers, clusters and proxies, and a scratch dir.

    In pytest the factories are the celery_redlock.testing fixtures; ``standalone``
    makes its own (for tools/soak.py) and closes them on exit.
    """

    workdir: Path
    make_cluster: RedisNodesFactory
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
        things: list[Union[RedisServer, RedisNodes, FaultProxy]] = []

        def make_cluster(n: int, **kwargs: Any) -> RedisNodes:
            cluster = RedisNodes(n, **kwargs)
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


def expect_safe(result: RowResult) -> None:
    """Everything the oracle counts as unsafe is a problem of the row."""
    report = result.report
    result.expect(not report.overlaps, f"{len(report.overlaps)} overlapping windows")
    result.expect(not report.stale_writes, f"{len(report.stale_writes)} stale writes accepted")
    result.expect(not report.fence_regressions, "fences did not rise from holder to holder")
    result.expect(not report.born_dead, f"{len(report.born_dead)} leases returned already dead")
    result.expect(not report.overclaims, f"{len(report.overclaims)} leases claimed over ttl")


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- holder processes --------------------------------------------------------------------------


class Fleet:
    """Holder processes running ``holders stream``: their logs, a common start
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
                [*prefix, *holder_command("stream", path)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errors,
                text=True,
                env=holder_env(env),
                start_new_session=True,  # its own group: faketime forks the interpreter
            )
        self.procs.append(proc)
        self.labels.append(config.label)

    def go(self, seconds: float, timeout: float = 60.0) -> int:
        """Wait until every holder is ready, then start them all; the start time."""
        for proc, label in zip(self.procs, self.labels):
            line = read_line(proc, timeout)
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

    def wait_for(self, enough: Callable[[Report], bool], timeout: float = PATIENCE) -> bool:
        """Poll the holders' logs until ``enough(check(events))``; False after ``timeout``.

        Rows run until they have seen what they count (so many grants in a phase),
        not for a fixed time a loaded machine may not fill."""
        deadline = time.monotonic() + timeout
        while not enough(check(self.events())):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

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


def read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        return "<no answer>"
    return proc.stdout.readline().strip()


def stream_config(fleet: Fleet, label: str, rng: random.Random, **settings: Any) -> StreamConfig:
    return StreamConfig(
        label=label,
        log_path=str(fleet.directory / f"{label}.jsonl"),
        seed=rng.randrange(2**31),
        **settings,
    )


def key_text(name: object) -> str:
    return name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)


def seconds_since(start_ns: int, ns: int) -> float:
    return round((ns - start_ns) / NS, 3)
