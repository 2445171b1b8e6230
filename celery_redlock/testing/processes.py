"""Real ``celery worker`` and ``celery beat`` subprocesses for tests and tools.

Crash, kill, time-limit and multi-worker behaviour needs real processes: an embedded
worker shares the test's process and cannot be SIGKILLed. :class:`CeleryProcess`
runs ``python -m celery -A APP ...`` in its own process group, logs its stdout and
stderr to a file, and is SIGKILLed by Linux if the process that started it dies
(:func:`~.children.die_with_parent`)::

    from celery_redlock.testing import CeleryProcess, wait_all_ready

    def test_two_workers_run_each_import_once(redis_nodes, tmp_path):
        env = {**os.environ, "REDLOCK_NODES": ",".join(redis_nodes.urls)}
        workers = [
            CeleryProcess.worker("proj", name=name, log_path=tmp_path / f"{name}.log", env=env)
            for name in ("w1", "w2")
        ]
        try:
            wait_all_ready(workers)            # each logged "ready." (60 s at most)
            ...                                # send tasks, check an independent observer
            assert not workers[0].lines(r"lock lost")
        finally:
            for worker in workers:
                worker.kill()                  # cold: SIGKILL the group; stop() is warm

Readiness is read from the log: a worker's ``<hostname> ready.`` line, a beat's
``beat: Starting...`` line (both at ``--loglevel INFO``). Standard library only:
Celery runs in the child, not here.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Callable, Optional, TypeVar, Union

from .children import die_with_parent

__all__ = [
    "BEAT_READY",
    "READY_TIMEOUT",
    "STOP_TIMEOUT",
    "WORKER_READY",
    "CeleryProcess",
    "ProcessNotReady",
    "wait_all_ready",
]

#: Seconds a process gets to become ready (a loaded 2-core machine is slow to fork).
READY_TIMEOUT = 60.0
#: Seconds a warm stop waits for the process to exit before the group is SIGKILLed.
STOP_TIMEOUT = 15.0
#: The line a worker logs once it consumes (``celery@host ready.``).
WORKER_READY = re.compile(r" ready\.\s*$", re.MULTILINE)
#: The line a beat logs once its scheduler runs.
BEAT_READY = re.compile(r"beat: Starting\.\.\.")

_StrPath = Union[str, "os.PathLike[str]"]
_Process = TypeVar("_Process", bound="CeleryProcess")


class ProcessNotReady(RuntimeError):
    """A process exited, or did not get ready in time; the message ends with its log."""

    def __init__(self, process: CeleryProcess, problem: str) -> None:
        super().__init__(f"{process.name} {problem} (log: {process.log_path}):\n{process.tail()}")
        self.process = process


class CeleryProcess:
    """One ``python -m celery -A app *args`` subprocess, leading its own process group
    (a prefork worker's pool children are in it), logging to ``log_path``.

    ``env``: the environment (default: this process's), to which ``pythonpath`` is
    prepended as ``PYTHONPATH`` and ``PYTHONUNBUFFERED=1`` added so lines reach the
    log as they are written. ``ready``: the log line (a regular expression) that says
    it is ready; None means "running". Most callers use :meth:`worker` or :meth:`beat`.
    """

    def __init__(
        self,
        app: str,
        args: Sequence[str],
        *,
        log_path: _StrPath,
        name: Optional[str] = None,
        cwd: Optional[_StrPath] = None,
        env: Optional[Mapping[str, str]] = None,
        pythonpath: Sequence[_StrPath] = (),
        ready: Optional[re.Pattern[str]] = None,
    ) -> None:
        self.app = app
        self.args = tuple(args)
        self.name = name or (self.args[0] if self.args else app)
        self.log_path = Path(log_path)
        self.ready_pattern = ready
        environment = dict(os.environ if env is None else env)
        inherited = environment.get("PYTHONPATH")
        paths = [*(str(path) for path in pythonpath), *([inherited] if inherited else [])]
        if paths:
            environment["PYTHONPATH"] = os.pathsep.join(paths)
        environment["PYTHONUNBUFFERED"] = "1"
        with open(self.log_path, "ab") as log:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", app, *self.args],
                cwd=cwd,
                env=environment,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C aimed at the parent does not reach it
                preexec_fn=die_with_parent(),
            )

    @classmethod
    def worker(
        cls: type[_Process],
        app: str,
        *,
        log_path: _StrPath,
        name: str = "w1",
        pool: str = "prefork",
        concurrency: int = 2,
        queues: Sequence[str] = (),
        loglevel: str = "INFO",
        hostname: Optional[str] = None,
        pidfile: Optional[_StrPath] = None,
        isolated: bool = True,
        extra_args: Sequence[str] = (),
        cwd: Optional[_StrPath] = None,
        env: Optional[Mapping[str, str]] = None,
        pythonpath: Sequence[_StrPath] = (),
    ) -> _Process:
        """Start ``celery -A app worker --pool pool -c concurrency -n name@%h``.

        ``queues``: ``-Q``; ``pidfile``: ``--pidfile``; ``isolated``:
        ``--without-gossip --without-mingle --without-heartbeat`` (it starts at once
        and hears nothing of its siblings). ``cwd``, ``env``, ``pythonpath``: as for
        the class. Returns at once: call :meth:`wait_ready` (readiness needs
        ``loglevel`` INFO or DEBUG).
        """
        args = [
            "worker", "--pool", pool, "-c", str(concurrency),
            "-n", hostname or f"{name}@%h", "--loglevel", loglevel,
            *(["-Q", ",".join(queues)] if queues else []),
            *(["--pidfile", str(pidfile)] if pidfile is not None else []),
            *(["--without-gossip", "--without-mingle", "--without-heartbeat"] if isolated else []),
            *extra_args,
        ]  # fmt: skip
        return cls(
            app, args, log_path=log_path, name=name, cwd=cwd, env=env, pythonpath=pythonpath,
            ready=WORKER_READY,
        )  # fmt: skip

    @classmethod
    def beat(
        cls: type[_Process],
        app: str,
        *,
        log_path: _StrPath,
        name: str = "beat",
        scheduler: str = "redlock",
        schedule: Optional[_StrPath] = None,
        pidfile: Optional[_StrPath] = None,
        loglevel: str = "INFO",
        extra_args: Sequence[str] = (),
        cwd: Optional[_StrPath] = None,
        env: Optional[Mapping[str, str]] = None,
        pythonpath: Sequence[_StrPath] = (),
    ) -> _Process:
        """Start ``celery -A app beat -S scheduler``; ``schedule`` and ``pidfile``
        give each of several beats its own files. Returns at once (see :meth:`worker`)."""
        args = [
            "beat", "-S", scheduler, "--loglevel", loglevel,
            *(["--schedule", str(schedule)] if schedule is not None else []),
            *(["--pidfile", str(pidfile)] if pidfile is not None else []),
            *extra_args,
        ]  # fmt: skip
        return cls(
            app, args, log_path=log_path, name=name, cwd=cwd, env=env, pythonpath=pythonpath,
            ready=BEAT_READY,
        )  # fmt: skip

    # --- what it is -----------------------------------------------------------------

    @property
    def pid(self) -> int:
        """The main process's pid, also its process group's id."""
        return self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def returncode(self) -> Optional[int]:
        """The exit status once it has exited (``-signum`` if a signal ended it)."""
        return self.popen.poll()

    def __repr__(self) -> str:
        state = "running" if self.alive else f"exited {self.returncode}"
        return f"<CeleryProcess {self.name} pid={self.pid} {state}>"

    # --- its log --------------------------------------------------------------------

    def log(self) -> str:
        """Everything it has written so far ("" if the file is gone)."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def lines(self, pattern: str) -> list[str]:
        """Log lines matching the regular expression ``pattern``."""
        return [line for line in self.log().splitlines() if re.search(pattern, line)]

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    # --- waiting ----------------------------------------------------------------------

    def is_ready(self) -> bool:
        """Its ready line is in the log (alive, for a process without one)."""
        if self.ready_pattern is None:
            return self.alive
        return self.ready_pattern.search(self.log()) is not None

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        """Wait for the ready line; raises :class:`ProcessNotReady` if it exits first
        or ``timeout`` seconds pass."""
        wait_all_ready([self], timeout)

    def wait_for(
        self, check: Callable[[], Any], timeout: float = READY_TIMEOUT, what: str = "ready"
    ) -> Any:
        """Poll ``check()`` until it is true and return it, as :meth:`wait_ready` does
        for the ready line (e.g. a beat's first claimed tick)."""
        deadline = time.monotonic() + timeout
        while True:
            found = check()
            if found:
                return found
            if not self.alive:
                raise ProcessNotReady(self, f"exited with code {self.returncode} before {what}")
            if time.monotonic() > deadline:
                raise ProcessNotReady(self, f"not {what} within {timeout:g}s")
            time.sleep(0.05)

    # --- stopping ---------------------------------------------------------------------

    def send_signal(self, signum: int) -> None:
        """Signal the main process only."""
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signum)

    def signal_group(self, signum: int) -> None:
        """Signal every process of its group (a prefork worker's children too)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signum)

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Warm: SIGTERM to the main process, then SIGKILL to the group once it has
        exited or after ``timeout`` seconds (no child outlives it).

        A worker finishes the tasks it runs, a beat syncs its schedule and logs its
        summary. The SIGTERM goes to the main process only: prefork children reset
        SIGTERM to its default, so a SIGTERM to the group would end their tasks at
        once -- a cold shutdown in disguise.
        """
        self.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout)
        self.kill()

    def kill(self, timeout: float = STOP_TIMEOUT) -> None:
        """Cold: SIGKILL the whole group (pool children included) and reap the main
        process. Idempotent."""
        self.signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout)

    def __enter__(self: _Process) -> _Process:
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        self.kill()


def wait_all_ready(processes: Sequence[CeleryProcess], timeout: float = READY_TIMEOUT) -> None:
    """Wait until every process is ready, within one deadline for them all.

    Raises :class:`ProcessNotReady` (with that process's log) as soon as any of
    them exits, or when ``timeout`` seconds have passed.
    """
    deadline = time.monotonic() + timeout
    waiting = list(processes)
    while True:
        for process in processes:
            if not process.alive:
                raise ProcessNotReady(
                    process, f"exited with code {process.returncode} before all were ready"
                )
        waiting = [process for process in waiting if not process.is_ready()]
        if not waiting:
            return
        if time.monotonic() > deadline:
            raise ProcessNotReady(waiting[0], f"not ready within {timeout:g}s")
        time.sleep(0.05)
