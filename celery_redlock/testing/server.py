"""One redis-server process on a free loopback port, in a private directory.

:class:`RedisServer` starts, stops, SIGKILLs, SIGSTOPs/SIGCONTs and restarts one
real server, with or without its data. Servers not closed by their owner are killed
at interpreter exit. Imports redis-py and the standard library, nothing from the
rest of celery_redlock.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Callable, Optional, Union

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .binary import find_redis_server
from .children import die_with_parent, wait_for_state
from .ports import LOOPBACK, claim_free_port, redis_url, release_port

__all__ = ["START_TIMEOUT", "STOP_TIMEOUT", "RedisServer", "RedisServerFactory"]

#: Seconds a server gets to answer PING after it is spawned.
START_TIMEOUT = 10.0

#: Seconds a server gets to exit after SIGTERM or SHUTDOWN before it is SIGKILLed.
STOP_TIMEOUT = 5.0

# How often a server start is retried on a new port when another process took the
# free port between our probe and redis-server's bind.
_PORT_ATTEMPTS = 5

# Files of ours in a server's directory that survive restart(keep_data=False).
_LOG_NAME = "redis.log"
_OUTPUT_NAME = "redis.out"  # stdout/stderr: config errors are printed before the log opens


# Servers started and not yet closed, killed at interpreter exit if a test forgot
# them (or a fixture's teardown never ran).
_registry_lock = threading.Lock()
_live_servers: set[RedisServer] = set()


def _kill_forgotten_servers() -> None:
    with _registry_lock:
        forgotten = list(_live_servers)
    for server in forgotten:
        server._abandon()


def _forget_parents_servers() -> None:
    # A forked child (a prefork worker, say) does not own its parent's servers.
    global _registry_lock
    _registry_lock = threading.Lock()
    _live_servers.clear()


atexit.register(_kill_forgotten_servers)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_parents_servers)


def _no_retry() -> Retry:
    return Retry(NoBackoff(), 0)


class _StartFailed(Exception):
    def __init__(self, message: str, port_taken: bool) -> None:
        super().__init__(message)
        self.port_taken = port_taken


class RedisServer:
    """One redis-server process on a free loopback port, in a private directory.

    ``port``: fixed port (default: a free one, re-chosen if another process takes it
    first). ``appendonly``: keep an AOF with ``appendfsync always``, so even SIGKILL
    loses nothing. ``extra_args``: more command-line options, e.g.
    ``["--maxmemory-policy", "allkeys-lru"]``. ``binary``: default
    :func:`find_redis_server`. ``password``: ``requirepass``, also carried in
    :attr:`url`. ``workdir``: where the private directory is made (default: the
    system temp dir); when given, the directory is left there after :meth:`close`
    for inspection.

    No RDB snapshots (``--save ""``) unless :meth:`restart` is asked to keep data.
    The process runs in its own session (a Ctrl-C aimed at pytest does not kill it
    behind the cleanup's back), is SIGKILLed by Linux if this process dies, and is
    killed at interpreter exit if nobody closed it::

        with RedisServer(appendonly=True) as server:
            server.client().set("k", "v")
            server.kill()
            server.restart(keep_data=True)   # the AOF brings "k" back
    """

    def __init__(
        self,
        *,
        port: Optional[int] = None,
        appendonly: bool = False,
        extra_args: Sequence[str] = (),
        binary: Optional[str] = None,
        password: Optional[str] = None,
        workdir: Optional[Union[str, os.PathLike[str]]] = None,
    ) -> None:
        self._fixed_port = port is not None
        self._port = port if port is not None else claim_free_port()
        self.appendonly = appendonly
        self.extra_args = tuple(extra_args)
        self.binary = binary or find_redis_server()
        self.password = password
        self._workdir = None if workdir is None else Path(workdir)
        self._directory: Optional[Path] = None
        self._process: Optional[subprocess.Popen[bytes]] = None
        self._paused = False
        self._closed = False
        self._ended_by_us = False  # stop/kill/restart: an exit we asked for
        self._log_offset = 0
        self._output_offset = 0
        self._control: Optional[redis.Redis] = None
        self._clients: list[redis.Redis] = []

    # --- what it is ---------------------------------------------------------------

    @property
    def host(self) -> str:
        return LOOPBACK

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``, with the password when there is one."""
        return redis_url(self._port, self.password)

    @property
    def pid(self) -> Optional[int]:
        """The process id while the process exists (paused included), else None."""
        if self._process is None or self._process.poll() is not None:
            return None
        return self._process.pid

    @property
    def running(self) -> bool:
        """Alive and not paused: it answers commands."""
        return self.pid is not None and not self._paused

    @property
    def paused(self) -> bool:
        return self.pid is not None and self._paused

    @property
    def directory(self) -> Path:
        """The server's private directory (``--dir``), made on first use."""
        if self._directory is None:
            parent = None if self._workdir is None else str(self._workdir)
            self._directory = Path(tempfile.mkdtemp(prefix="redlock-redis-", dir=parent))
        return self._directory

    @property
    def log_path(self) -> Path:
        return self.directory / _LOG_NAME

    def __repr__(self) -> str:
        if self.running:
            state = f"pid={self.pid}"
        elif self.paused:
            state = f"pid={self.pid} paused"
        else:
            state = "closed" if self._closed else "down"
        return f"<RedisServer {LOOPBACK}:{self._port} {state}>"

    # --- life cycle ---------------------------------------------------------------

    def start(self) -> None:
        """Spawn the process and wait until it answers PING (up to START_TIMEOUT).

        Does nothing if it is already up. Raises RuntimeError with the tail of the
        server's log when it does not come up.
        """
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")
        if self.pid is not None:
            return
        self._spawn()
        try:
            self._await_ready(may_change_port=not self._fixed_port)
        except BaseException:
            self._ended_by_us = True  # its exit is the error raised here
            raise

    def stop(self) -> None:
        """Graceful stop: ``SHUTDOWN NOSAVE`` (after SIGCONT if paused), SIGTERM if
        that is refused, SIGKILL if it has not exited after STOP_TIMEOUT.

        No RDB is written; an AOF is flushed. Does nothing if it is not running.
        """
        process = self._process
        if process is not None and process.poll() is None:
            self._ended_by_us = True
            self._signal(signal.SIGCONT)
            # SHUTDOWN acts at once; SIGTERM waits for the next serverCron tick (100 ms).
            try:
                with self._short_client() as client:
                    client.shutdown(nosave=True)
            except redis.RedisError:
                self._signal(signal.SIGTERM)
            try:
                process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._paused = False

    def kill(self) -> None:
        """SIGKILL, as a crash: no RDB, an AOF only as far as it was fsynced."""
        process = self._process
        if process is not None and process.poll() is None:
            self._ended_by_us = True
            process.kill()
            process.wait()
        self._paused = False

    def pause(self) -> None:
        """SIGSTOP: the node hangs. Connections are still accepted by the kernel, but
        nothing is answered until :meth:`resume`."""
        pid = self._require_alive("pause")
        self._signal(signal.SIGSTOP)
        self._paused = True
        wait_for_state(pid, stopped=True)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`; replies to what arrived meanwhile go out now."""
        pid = self._require_alive("resume")
        self._signal(signal.SIGCONT)
        self._paused = False
        wait_for_state(pid, stopped=False)

    def restart(self, keep_data: bool = False) -> None:
        """Start again on the same port and directory.

        ``keep_data=True``: a live server is shut down with ``SHUTDOWN SAVE`` so an
        RDB holds everything; a killed one comes back with whatever was on disk (its
        AOF when ``appendonly``, else nothing since the last save) — that is what a
        crashed Redlock node does. ``keep_data=False``: the data files are wiped and
        it starts empty. A paused server is resumed first.
        """
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")
        if keep_data:
            self._shutdown_saving()
        else:
            self.kill()
            self._wipe_data()
        self._spawn()
        self._await_ready(may_change_port=False)

    def close(self) -> None:
        """Stop the process and remove its directory (unless ``workdir`` was given).

        Idempotent; safe on a paused or killed server.
        """
        if self._closed:
            return
        self._closed = True
        self._warn_if_it_died()
        try:
            self.stop()
        finally:
            for client in [*self._clients, *([self._control] if self._control else [])]:
                client.close()
            self._clients.clear()
            self._control = None
            if self._directory is not None and self._workdir is None:
                shutil.rmtree(self._directory, ignore_errors=True)
            release_port(self._port)
            with _registry_lock:
                _live_servers.discard(self)

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        self.close()

    # --- talking to it --------------------------------------------------------------

    def client(self, **kwargs: Any) -> redis.Redis:
        """A redis-py client for this server, closed with it.

        Defaults: ``decode_responses=False``, ``socket_timeout=5`` and no retries —
        a fault a test injects shows up at once as ConnectionError or TimeoutError
        instead of being retried away. Any keyword overrides them.
        """
        options: dict[str, Any] = {
            "host": LOOPBACK,
            "port": self._port,
            "db": 0,
            "password": self.password,
            "socket_timeout": 5.0,
            "socket_connect_timeout": 5.0,
            "decode_responses": False,
            "retry": _no_retry(),
        }
        options.update(kwargs)
        client = redis.Redis(**options)
        self._clients.append(client)
        return client

    def info(self, section: str = "server") -> dict[str, Any]:
        """``INFO section`` as a dict (``run_id``, ``process_id``, ``role``...)."""
        reply: dict[str, Any] = self._control_client().info(section)
        return reply

    # --- the machinery ------------------------------------------------------------

    def _control_client(self) -> redis.Redis:
        if self._control is None:
            self._control = redis.Redis(
                host=LOOPBACK,
                port=self._port,
                password=self.password,
                socket_timeout=5.0,
                socket_connect_timeout=5.0,
                retry=_no_retry(),
            )
        return self._control

    def _short_client(self) -> redis.Redis:
        # For start-up probes and shutdown: a server that does not answer at once
        # is asked again (or signalled), not waited on.
        return redis.Redis(
            host=LOOPBACK,
            port=self._port,
            password=self.password,
            socket_timeout=0.25,
            socket_connect_timeout=0.25,
            retry=_no_retry(),
        )

    def _spawn(self) -> None:
        directory = self.directory
        log, output = directory / _LOG_NAME, directory / _OUTPUT_NAME
        # Earlier runs' lines stay in the files; failures report only this run's.
        self._log_offset = log.stat().st_size if log.exists() else 0
        self._output_offset = output.stat().st_size if output.exists() else 0
        args = [
            self.binary,
            *self._leading_args(),
            "--bind", LOOPBACK,
            "--port", str(self._port),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            *(["--appendfsync", "always"] if self.appendonly else []),
            "--dir", str(directory),
            "--daemonize", "no",
            "--loglevel", "warning",
            "--logfile", str(log),
            *(["--requirepass", self.password] if self.password else []),
            *self.extra_args,
        ]  # fmt: skip
        with open(output, "ab") as sink:
            self._process = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                cwd=directory,
                start_new_session=True,
                preexec_fn=die_with_parent(),
            )
        self._paused = False
        self._ended_by_us = False
        with _registry_lock:
            _live_servers.add(self)

    def _leading_args(self) -> list[str]:
        """Arguments before the options: a config file must come first (a Sentinel's)."""
        return []

    def _await_ready(self, may_change_port: bool) -> None:
        attempt = 1
        while True:
            try:
                self._wait_until_answering()
                return
            except _StartFailed as failure:
                if failure.port_taken and may_change_port and attempt < _PORT_ATTEMPTS:
                    attempt += 1
                    release_port(self._port)
                    self._port = claim_free_port()
                    if self._control is not None:
                        self._control.close()
                        self._control = None
                    self._spawn()
                    continue
                raise RuntimeError(
                    f"redis-server {self.binary} on port {self._port} did not start: "
                    f"{failure}\n--- its log ({self.directory}) ---\n{self._log_tail()}"
                ) from None

    def _wait_until_answering(self) -> None:
        process = self._process
        assert process is not None
        # Our pid in INFO proves the answer is ours, not from whoever else holds the port.
        probe = self._short_client()
        deadline = time.monotonic() + START_TIMEOUT
        pause = 0.002
        last_error: Optional[BaseException] = None
        try:
            while True:
                code = process.poll()
                if code is not None:
                    taken = "Address already in use" in self._log_tail()
                    raise _StartFailed(f"it exited with code {code}", port_taken=taken)
                try:
                    # BusyLoadingError (a ConnectionError) while it loads its data.
                    if probe.info("server")["process_id"] == process.pid and probe.ping():
                        return
                except redis.RedisError as error:
                    last_error = error
                if time.monotonic() > deadline:
                    process.kill()
                    process.wait()
                    raise _StartFailed(
                        f"no answer within {START_TIMEOUT:.0f}s (last error: {last_error})",
                        port_taken=False,
                    )
                time.sleep(pause)
                pause = min(pause * 2, 0.05)
        finally:
            probe.close()

    def _shutdown_saving(self) -> None:
        process = self._process
        if process is None or process.poll() is not None:
            return
        if self._paused:
            self.resume()
        self._ended_by_us = True
        try:
            self._control_client().shutdown(save=True)
        except redis.RedisError as error:
            raise RuntimeError(
                f"{self!r}: SHUTDOWN SAVE failed ({error}); the data could not be kept\n"
                f"{self._log_tail()}"
            ) from error
        try:
            process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{self!r} did not exit after SHUTDOWN SAVE") from None

    def _wipe_data(self) -> None:
        for entry in self.directory.iterdir():
            if entry.name in (_LOG_NAME, _OUTPUT_NAME):
                continue
            if entry.is_dir():
                shutil.rmtree(entry)  # Redis 7's appendonlydir
            else:
                entry.unlink()

    def _log_tail(self, lines: int = 20) -> str:
        text = ""
        for path, offset in (
            (self.directory / _OUTPUT_NAME, self._output_offset),
            (self.directory / _LOG_NAME, self._log_offset),
        ):
            try:
                with open(path, "rb") as stream:
                    stream.seek(offset)
                    text += stream.read().decode(errors="replace")
            except OSError:
                continue
        return "\n".join(text.strip().splitlines()[-lines:])

    def _warn_if_it_died(self) -> None:
        # A server that exited without being told to (OOM killer, its spawning thread
        # gone, a crash) explains a test's lost connections: say so, with its log.
        process = self._process
        if process is None or self._ended_by_us or process.poll() is None:
            return
        warnings.warn(
            f"{self!r} exited on its own (exit code {process.returncode}) before it was "
            f"closed; its log:\n{self._log_tail()}",
            RuntimeWarning,
            stacklevel=3,
        )

    def _signal(self, signum: signal.Signals) -> None:
        if self._process is not None and self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._process.send_signal(signum)

    def _require_alive(self, action: str) -> int:
        pid = self.pid
        if pid is None:
            raise RuntimeError(f"cannot {action} {self!r}: it is not running")
        return pid

    def _abandon(self) -> None:
        # At interpreter exit: no waiting on a graceful shutdown.
        if self._process is not None and self._process.poll() is None:
            self._process.kill()  # SIGKILL stops a SIGSTOPped process too
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(STOP_TIMEOUT)
        if self._directory is not None and self._workdir is None:
            shutil.rmtree(self._directory, ignore_errors=True)
        self._closed = True


#: ``make(**RedisServer kwargs) -> RedisServer``, started (the fixture's type).
RedisServerFactory = Callable[..., RedisServer]
