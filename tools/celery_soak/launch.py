"""The soak's servers and workers: 5 lock nodes (AOF, ``appendfsync always``), a
broker/result backend, an observer, and three ``celery worker`` subprocesses.

Everything is started by :class:`Stack` and stopped by :meth:`Stack.close`, whatever
happened in between (use it as a context manager). Worker logs go to ``log_dir``;
a restarted worker appends to its own file.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Callable, Optional

import redis
from celery import Celery

from celery_redlock.testing import CeleryProcess, RedisNodes, RedisServer, wait_all_ready

CHECKOUT = Path(__file__).resolve().parents[2]
APP = "tools.celery_soak.soakapp"
#: Seconds a worker gets to log "ready." (a loaded 2-core machine is slow to fork).
READY_TIMEOUT = 90.0


@dataclass(frozen=True)
class WorkerSpec:
    name: str
    pool: str
    concurrency: int


WORKERS = (
    WorkerSpec("prefork", "prefork", 2),
    WorkerSpec("threads", "threads", 4),
    WorkerSpec("gevent", "gevent", 10),
)


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (a prefork worker's pool processes)."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as listing:
                found.extend(int(word) for word in listing.read().split())
    return found


def parent_of(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            # The command name may hold spaces: the fields after its ")" are fixed.
            return int(stat.read().rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return None


class Stack:
    """The servers and workers of one soak."""

    def __init__(self, log_dir: Path, node_count: int = 5) -> None:
        self.log_dir = log_dir
        self.broker = RedisServer()
        self.observer_server = RedisServer()
        self.nodes = RedisNodes(node_count, appendonly=True)
        self.workers: dict[str, CeleryProcess] = {}
        self.specs = {spec.name: spec for spec in WORKERS}
        self._client: Optional[Celery] = None
        self._observer: Optional[redis.Redis] = None

    # --- starting -------------------------------------------------------------------

    def start(self) -> None:
        self.broker.start()
        self.observer_server.start()
        self.nodes.start()
        started = [self._spawn(spec) for spec in WORKERS]
        wait_all_ready(started, READY_TIMEOUT)

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            BROKER_URL=self.broker.url,
            REDLOCK_NODES=",".join(self.nodes.urls),
            OBSERVER_URL=self.observer_server.url,
        )
        return env

    def _spawn(self, spec: WorkerSpec) -> CeleryProcess:
        worker = CeleryProcess.worker(
            APP,
            log_path=self.log_dir / f"{spec.name}.log",
            name=spec.name,
            pool=spec.pool,
            concurrency=spec.concurrency,
            cwd=CHECKOUT,
            env=self._env(),
            pythonpath=[CHECKOUT],
        )
        self.workers[spec.name] = worker
        return worker

    def restart_worker(self, name: str) -> None:
        """Start ``name`` again (after it was killed) and wait until it is ready."""
        self.workers[name].kill()
        self._spawn(self.specs[name]).wait_ready(READY_TIMEOUT)

    def ensure_up(self) -> list[str]:
        """Restart any worker that is not alive; returns their names."""
        dead = [name for name, worker in self.workers.items() if not worker.alive]
        for name in dead:
            self.restart_worker(name)
        return dead

    # --- what runs --------------------------------------------------------------------

    @property
    def client(self) -> Celery:
        """An app that sends to the workers and reads their results."""
        if self._client is None:
            app = Celery("celery_soak_client", broker=self.broker.url, backend=self.broker.url)
            app.conf.broker_connection_retry_on_startup = True
            self._client = app
        return self._client

    @property
    def observer(self) -> redis.Redis:
        if self._observer is None:
            self._observer = self.observer_server.client(decode_responses=True)
        return self._observer

    def group_pids(self, name: str) -> list[int]:
        """A worker's main pid and its children's."""
        main = self.workers[name].pid
        return [main, *children(main)]

    def worker_of_pid(self, pid: int) -> Optional[str]:
        """The worker whose process ``pid`` is (its main process or a child)."""
        for name, worker in self.workers.items():
            if pid == worker.pid or parent_of(pid) == worker.pid:
                return name
        return None

    def pause_worker(self, name: str) -> None:
        self.workers[name].signal_group(signal.SIGSTOP)

    def resume_worker(self, name: str) -> None:
        self.workers[name].signal_group(signal.SIGCONT)

    def log_paths(self) -> dict[str, str]:
        return {spec.name: str(self.log_dir / f"{spec.name}.log") for spec in WORKERS}

    # --- stopping ---------------------------------------------------------------------

    def close(self) -> None:
        """SIGCONT and SIGKILL every worker's group, then stop every server."""
        for worker in self.workers.values():
            worker.signal_group(signal.SIGCONT)
            worker.kill()
        if self._client is not None:
            self._client.close()
        for server in (*self.nodes, self.broker, self.observer_server):
            with contextlib.suppress(Exception):
                if server.paused:
                    server.resume()
        self.nodes.close()
        self.broker.close()
        self.observer_server.close()

    def __enter__(self) -> Stack:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        self.close()


def wait_until(check: Callable[[], bool], timeout: float, step: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(step)
    return True
