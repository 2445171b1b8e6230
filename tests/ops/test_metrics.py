"""celery_redlock.metrics against real parts: an embedded worker (threads pool) with a
real Redis broker and 5 real lock nodes, a real ``celery worker`` with the prefork pool
in prometheus_client's multiprocess mode, and scrapes over HTTP from loopback.

Values are read from an isolated CollectorRegistry per test, or parsed from what the
HTTP endpoint serves -- never from the receivers' own bookkeeping.
"""

from __future__ import annotations

import gc
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker
from celery.result import AsyncResult
from prometheus_client import CollectorRegistry
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.parser import text_string_to_metric_families

from celery_redlock import RedlockTask, is_skipped, metrics, signals
from celery_redlock.testing import RedisNodes, RedisServer

CHECKOUT = Path(__file__).resolve().parents[2]
NAMES = (
    "celery_redlock_acquire_seconds",
    "celery_redlock_contended_total",
    "celery_redlock_extended_total",
    "celery_redlock_lost_total",
    "celery_redlock_hold_seconds",
    "celery_redlock_held",
)
#: How long a gated task body waits for its gate before giving up (a test that
#: never opens it fails on the body's result, not by hanging).
GATE_BOUND = 30.0


# -- fixtures (the pattern of test_task.py) ------------------------------------------------


@pytest.fixture
def app(broker: RedisServer, redis_nodes: RedisNodes) -> Iterator[Celery]:
    app = Celery("redlock_metrics", broker=broker.url, backend=broker.url, set_as_current=False)
    app.conf.task_create_missing_queues = True
    app.conf.redlock_nodes = redis_nodes.urls
    app.conf.redlock_retry_backoff = 0.1
    app.conf.redlock_retry_backoff_max = 0.3
    app.conf.broker_connection_retry_on_startup = True
    yield app
    # A lock retry published from the embedded worker subscribes this app's result
    # consumer to the retry's id; collect such results while the broker still runs,
    # or their unsubscribe retries for 20 s against a stopped server.
    gc.collect()
    app.close()


@pytest.fixture
def registry() -> Iterator[CollectorRegistry]:
    registry = CollectorRegistry()
    metrics.install(registry)
    yield registry
    metrics.uninstall(registry)


@pytest.fixture
def gates() -> dict[str, threading.Event]:
    """Events a task body waits on (its ``gate=`` argument) before it returns: the
    test opens one once it has seen what it needs while the lock is held."""
    return {}


def _define(app: Celery, gates: dict[str, threading.Event]) -> dict[str, Any]:
    # app.task(...)(function), not a decorator: Celery's decorators are untyped.
    def hold(seconds: float, tag: str, gate: Optional[str] = None) -> str:
        time.sleep(seconds)
        if gate is not None and not gates[gate].wait(GATE_BOUND):
            return "the gate never opened"
        return "ran"

    def long_job(tag: str, gate: str) -> bool:
        return gates[gate].wait(GATE_BOUND)

    common: dict[str, Any] = {"shared": False, "base": RedlockTask, "redlock_key": ["tag"]}
    return {
        "hold": app.task(name="m.hold", redlock_ttl=5, **common)(hold),
        "skip": app.task(name="m.skip", redlock_ttl=5, redlock_on_contended="skip", **common)(hold),
        "long": app.task(name="m.long", redlock_ttl=LONG_TTL, **common)(long_job),
        "limited": app.task(name="m.limited", redlock_ttl=5, redlock_limit=2, **common)(hold),
        "rated": app.task(name="m.rated", redlock_limit="unlimited", redlock_rate="1/m", **common)(
            hold
        ),
        "cooled": app.task(
            name="m.cooled", redlock_cooldown=60, redlock_on_contended="skip", **common
        )(hold),
    }


#: TTL of ``m.long``: renewed every LONG_TTL / 3 s, each renewal a round to five local
#: nodes that takes milliseconds, so a loaded machine still renews it in time.
LONG_TTL = 3.0


@pytest.fixture
def tasks(app: Celery, gates: dict[str, threading.Event]) -> dict[str, Any]:
    return _define(app, gates)


class SignalSeen:
    """``seen(signal, task)``: an Event set when ``signal`` is sent for ``task``.

    Its receivers are connected after the metrics' (the fixture needs ``registry``)
    and a signal calls its receivers in the order they were connected: once an Event
    is set, the metrics have counted that signal too.
    """

    def __init__(self) -> None:
        self._connected: list[tuple[Any, Callable[..., None]]] = []

    def __call__(self, lock_signal: Any, task: str) -> threading.Event:
        event = threading.Event()

        def receiver(sender: Any = None, **_: Any) -> None:
            if getattr(sender, "name", None) == task:
                event.set()

        lock_signal.connect(receiver, weak=False)
        self._connected.append((lock_signal, receiver))
        return event

    def disconnect(self) -> None:
        for lock_signal, receiver in self._connected:
            lock_signal.disconnect(receiver)


@pytest.fixture
def seen(registry: CollectorRegistry) -> Iterator[SignalSeen]:
    watcher = SignalSeen()
    yield watcher
    watcher.disconnect()


@pytest.fixture
def worker(app: Celery, tasks: dict[str, Any]) -> Iterator[Any]:
    with start_worker(app, pool="threads", concurrency=4, perform_ping_check=False) as w:
        yield w


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    """A sample's value; 0 for a label set never seen (as Prometheus would show it)."""
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def _eventually(check: Callable[[], Any], timeout: float = 30, what: str = "condition") -> None:
    """The result is stored before after_return runs: give the hooks a moment (the
    timeout is a hang guard)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what} never became true"
        time.sleep(0.02)


def _wait(result: AsyncResult, timeout: float = 15) -> Any:
    return result.get(timeout=timeout, propagate=False)


# -- what the worker counts ------------------------------------------------------------


def test_a_run_is_timed_and_counted_as_held_only_while_it_runs(
    worker: Any,
    tasks: dict[str, Any],
    registry: CollectorRegistry,
    gates: dict[str, threading.Event],
) -> None:
    gates["a"] = threading.Event()
    sent = time.monotonic()
    result = tasks["hold"].delay(0.6, tag="a", gate="a")  # runs >= 0.6 s, and until seen held
    _eventually(lambda: _value(registry, "celery_redlock_held", task="m.hold") == 1, what="held")
    gates["a"].set()
    assert _wait(result) == "ran"
    _eventually(lambda: _value(registry, "celery_redlock_hold_seconds_count", task="m.hold") == 1)
    released_within = time.monotonic() - sent
    assert _value(registry, "celery_redlock_held", task="m.hold") == 0
    assert _value(registry, "celery_redlock_acquire_seconds_count", task="m.hold") == 1
    # Its renewal and loss series exist from its first lease, at 0 (an alert's
    # increase() then sees a first loss).
    assert registry.get_sample_value("celery_redlock_lost_total", {"task": "m.hold"}) == 0
    assert registry.get_sample_value("celery_redlock_extended_total", {"task": "m.hold"}) == 0
    acquired_in = _value(registry, "celery_redlock_acquire_seconds_sum", task="m.hold")
    held_for = _value(registry, "celery_redlock_hold_seconds_sum", task="m.hold")
    # Both after the send and before the release was seen, one after the other.
    assert acquired_in > 0
    assert 0.6 <= held_for <= released_within - acquired_in
    # Bucket boundaries as documented: ms-scale for acquiring, up to hours for holding.
    assert _value(registry, "celery_redlock_acquire_seconds_bucket", task="m.hold", le="1.0") == (
        1 if acquired_in <= 1.0 else 0  # milliseconds unless the machine stalled
    )
    assert _value(registry, "celery_redlock_hold_seconds_bucket", task="m.hold", le="0.5") == 0
    assert _value(registry, "celery_redlock_hold_seconds_bucket", task="m.hold", le="5.0") == (
        1 if held_for <= 5.0 else 0  # the gate opens within milliseconds unless stalled
    )
    assert registry.get_sample_value("celery_redlock_hold_seconds_bucket", {
        "task": "m.hold", "le": "21600.0"
    }) == 1  # fmt: skip
    # The key is not a label: every sample is labelled by task (and action) only.
    for family in registry.collect():
        for sample in family.samples:
            assert set(sample.labels) <= {"task", "action", "le"}, sample


def test_contended_duplicates_are_counted_by_task_and_action(
    worker: Any,
    tasks: dict[str, Any],
    registry: CollectorRegistry,
    gates: dict[str, threading.Event],
    seen: SignalSeen,
) -> None:
    acquired = {name: seen(signals.lock_acquired, name) for name in ("m.hold", "m.skip")}
    contended = {name: seen(signals.lock_contended, name) for name in ("m.hold", "m.skip")}
    gates["held"] = threading.Event()
    # The first copies hold their locks until both duplicates have met them.
    first = tasks["hold"].delay(0, tag="r", gate="held")
    first_skip = tasks["skip"].delay(0, tag="s", gate="held")
    for name, event in acquired.items():
        assert event.wait(15), f"{name} never acquired"
    retried = tasks["hold"].delay(0.01, tag="r")
    # No result kept for the skipped copy: a pending result the test never collects
    # would try to unsubscribe after the broker is gone.
    tasks["skip"].apply_async((0.01,), {"tag": "s"}, ignore_result=True)
    for name, event in contended.items():
        assert event.wait(15), f"no {name} duplicate met the lock"
    gates["held"].set()
    for result in (first, retried, first_skip):
        assert _wait(result) == "ran"
    _eventually(
        lambda: (
            _value(registry, "celery_redlock_contended_total", task="m.skip", action="skip") == 1
        ),
        what="skipped",
    )

    assert _value(registry, "celery_redlock_contended_total", task="m.hold", action="retry") >= 1
    assert _value(registry, "celery_redlock_contended_total", task="m.skip", action="skip") == 1
    assert _value(registry, "celery_redlock_contended_total", task="m.hold", action="skip") == 0
    # The retried copy won in the end; the skipped one never held the lock.
    assert _value(registry, "celery_redlock_acquire_seconds_count", task="m.hold") == 2
    assert _value(registry, "celery_redlock_acquire_seconds_count", task="m.skip") == 1
    _eventually(
        lambda: (
            _value(registry, "celery_redlock_hold_seconds_count", task="m.hold") == 2
            and _value(registry, "celery_redlock_hold_seconds_count", task="m.skip") == 1
        ),
        what="all released",
    )
    assert _value(registry, "celery_redlock_held", task="m.hold") == 0
    assert _value(registry, "celery_redlock_held", task="m.skip") == 0


def test_a_lost_lease_is_counted_once_and_is_not_subtracted_again_on_release(
    worker: Any,
    tasks: dict[str, Any],
    registry: CollectorRegistry,
    redis_nodes: RedisNodes,
    gates: dict[str, threading.Event],
    seen: SignalSeen,
) -> None:
    acquired = seen(signals.lock_acquired, "m.long")
    extended = seen(signals.lock_extended, "m.long")
    lost = seen(signals.lock_lost, "m.long")
    gates["lost"] = threading.Event()
    result = tasks["long"].delay(tag="lost", gate="lost")  # runs until the test has seen
    assert acquired.wait(15), "never acquired"
    # The first renewal is due LONG_TTL / 3 after acquiring; by LONG_TTL it is late.
    assert extended.wait(LONG_TTL), "never renewed"
    assert _value(registry, "celery_redlock_extended_total", task="m.long") >= 1
    assert _value(registry, "celery_redlock_held", task="m.long") == 1
    servers = list(redis_nodes)[:3]
    for server in servers:
        server.pause()
    try:
        # The next renewal fails and marks the lease lost by the end of its validity,
        # at most LONG_TTL after the pause; the second LONG_TTL is for a loaded machine.
        assert lost.wait(2 * LONG_TTL), "never lost"
        assert _value(registry, "celery_redlock_lost_total", task="m.long") == 1
        assert _value(registry, "celery_redlock_held", task="m.long") == 0  # at once
    finally:
        for server in servers:
            server.resume()
        gates["lost"].set()
    assert _wait(result) is True  # the body ran on, without the guarantee
    _eventually(lambda: _value(registry, "celery_redlock_hold_seconds_count", task="m.long") == 1)
    assert _value(registry, "celery_redlock_held", task="m.long") == 0  # not -1
    assert _value(registry, "celery_redlock_lost_total", task="m.long") == 1


def test_install_is_idempotent_and_uninstall_stops_counting(
    app: Celery, tasks: dict[str, Any]
) -> None:
    registry = CollectorRegistry()
    first = metrics.install(registry)
    try:
        assert metrics.install(registry) is first
        tasks["hold"].apply(args=(0.01,), kwargs={"tag": "i"}).get()
        assert _value(registry, "celery_redlock_acquire_seconds_count", task="m.hold") == 1
        assert _value(registry, "celery_redlock_hold_seconds_count", task="m.hold") == 1
        assert _value(registry, "celery_redlock_held", task="m.hold") == 0
    finally:
        assert metrics.uninstall(registry) is True
    assert metrics.uninstall(registry) is False
    tasks["hold"].apply(args=(0.01,), kwargs={"tag": "i"}).get()
    assert (
        registry.get_sample_value("celery_redlock_acquire_seconds_count", {"task": "m.hold"})
        is None
    )
    # Installing again starts afresh, in the same registry, without a duplicate error.
    again = metrics.install(registry)
    try:
        assert again is not first
        tasks["hold"].apply(args=(0.01,), kwargs={"tag": "i"}).get()
        assert _value(registry, "celery_redlock_acquire_seconds_count", task="m.hold") == 1
    finally:
        metrics.uninstall(registry)


# -- exposure ------------------------------------------------------------------------------


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        body: bytes = response.read()
    return body.decode()


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _sample(text: str, name: str, **labels: str) -> float:
    return _samples(text).get((name, frozenset(labels.items())), 0.0)


def test_the_metrics_are_served_over_http(
    app: Celery, tasks: dict[str, Any], registry: CollectorRegistry
) -> None:
    tasks["hold"].apply(args=(0.01,), kwargs={"tag": "http"}).get()
    server, thread = metrics.serve(0, addr="127.0.0.1", registry=registry)
    try:
        text = _scrape(server.server_port)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    for name in ("celery_redlock_acquire_seconds", "celery_redlock_hold_seconds"):
        assert f"# TYPE {name} histogram" in text
    for name in ("contended", "extended", "lost"):
        assert f"# TYPE celery_redlock_{name}_total counter" in text
    assert "# TYPE celery_redlock_held gauge" in text
    assert _sample(text, "celery_redlock_acquire_seconds_count", task="m.hold") == 1
    assert _sample(text, "celery_redlock_hold_seconds_count", task="m.hold") == 1
    assert ("celery_redlock_held", frozenset({("task", "m.hold")})) in _samples(text)


PREFORK_APP = textwrap.dedent(
    '''
    """Worker app of test_metrics: the prefork recipe of celery_redlock.metrics."""
    import os
    import time

    import redis
    from celery import Celery
    from celery.signals import worker_init, worker_process_shutdown
    from prometheus_client import multiprocess

    from celery_redlock import RedlockTask, metrics

    app = Celery("metricsapp", broker=os.environ["BROKER_URL"], backend=os.environ["BROKER_URL"])
    app.conf.broker_connection_retry_on_startup = True
    app.conf.redlock_nodes = os.environ["REDLOCK_NODES"].split(",")
    metrics.install()
    observer = redis.Redis.from_url(os.environ["BROKER_URL"])


    @worker_init.connect
    def serve_metrics(**_):
        server, _thread = metrics.serve(0, addr="127.0.0.1")
        with open(os.environ["METRICS_PORT_FILE"] + ".tmp", "w") as f:
            f.write(str(server.server_port))
        os.rename(os.environ["METRICS_PORT_FILE"] + ".tmp", os.environ["METRICS_PORT_FILE"])


    @worker_process_shutdown.connect
    def forget_child(pid, **_):
        multiprocess.mark_process_dead(pid)


    @app.task(base=RedlockTask, redlock_key=["tag"], redlock_ttl=5, name="p.hold")
    def hold(seconds, tag, gate=None):
        """Runs `seconds`, then, given a gate, until the test sets that key (60 s at most)."""
        observer.rpush("pids:" + tag, os.getpid())
        time.sleep(seconds)
        deadline = time.monotonic() + 60
        while gate is not None and not observer.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.02)
        return os.getpid()
    '''
)


def test_a_scrape_skips_the_file_a_starting_process_has_not_sized_yet(tmp_path: Path) -> None:
    """A child creates its value file empty and sizes it a moment later; a scrape in
    between used to fail whole (prometheus_client cannot read an empty file)."""
    written: Any = MmapedDict(str(tmp_path / "counter_101.db"))  # type: ignore[no-untyped-call]
    key = mmap_key("celery_redlock_lost", "celery_redlock_lost_total", ["task"], ["t"], "h")
    written.write_value(key, 3.0, 0.0)
    written.close()
    # Files as they are between open() and truncate(): a counter and a live gauge of
    # a process that exists (this one), so neither is removed as a dead process's.
    (tmp_path / "counter_102.db").touch()
    (tmp_path / f"gauge_livesum_{os.getpid()}.db").touch()
    registry = metrics.multiprocess_registry(str(tmp_path))
    assert registry.get_sample_value("celery_redlock_lost_total", {"task": "t"}) == 3.0
    assert (tmp_path / f"gauge_livesum_{os.getpid()}.db").exists()


def _gauge_files(directory: Path) -> set[str]:
    return {path.name for path in directory.glob("gauge_live*_*.db")}


def test_prefork_children_are_added_up_in_multiprocess_mode(
    broker: RedisServer, redis_nodes: RedisNodes, tmp_path: Path
) -> None:
    """The documented prefork recipe, for real: ``PROMETHEUS_MULTIPROC_DIR``,
    ``metrics.serve`` in ``worker_init`` and ``mark_process_dead`` in
    ``worker_process_shutdown``; a SIGKILLed child stops counting as held too."""
    (tmp_path / "metricsapp.py").write_text(PREFORK_APP)
    multiproc_dir = tmp_path / "prom"
    multiproc_dir.mkdir()
    port_file = tmp_path / "port"
    log_path = tmp_path / "worker.log"
    env = dict(os.environ)
    env.update(
        BROKER_URL=broker.url,
        REDLOCK_NODES=",".join(redis_nodes.urls),
        METRICS_PORT_FILE=str(port_file),
        PROMETHEUS_MULTIPROC_DIR=str(multiproc_dir),
        PYTHONPATH=os.pathsep.join(
            [str(tmp_path), str(CHECKOUT), *filter(None, [os.environ.get("PYTHONPATH")])]
        ),
        PYTHONUNBUFFERED="1",
    )
    client = Celery("metrics_client", broker=broker.url, set_as_current=False)  # no results
    client.conf.broker_connection_retry_on_startup = True
    observer = broker.client()
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [
                sys.executable, "-m", "celery", "-A", "metricsapp", "worker",
                "--pool", "prefork", "-c", "2", "-n", "metrics@%h", "--loglevel", "INFO",
                "--without-gossip", "--without-mingle", "--without-heartbeat",
            ],
            cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        _eventually(
            lambda: port_file.exists() and re.search(r" ready\.\s*$", log_path.read_text(), re.M),
            timeout=30,
            what=f"worker ready; log:\n{log_path.read_text()}",
        )
        port = int(port_file.read_text())

        def held() -> float:
            return _sample(_scrape(port), "celery_redlock_held", task="p.hold")

        # Two tasks at once, one per child, each held >= 1 s and until the test has
        # seen both held: the main process adds both up.
        sent = time.monotonic()
        for tag in ("a", "b"):
            client.send_task("p.hold", args=(1.0, tag), kwargs={"gate": "both-seen"})
        # A body records its pid after its lock is counted held: wait for both.
        _eventually(
            lambda: held() == 2 and all(observer.llen(f"pids:{tag}") for tag in ("a", "b")),
            timeout=30,
            what="held == 2",
        )
        observer.set("both-seen", 1)
        pids = {int(pid) for tag in ("a", "b") for pid in observer.lrange(f"pids:{tag}", 0, -1)}
        assert len(pids) == 2, pids  # really two processes
        _eventually(
            lambda: _sample(_scrape(port), "celery_redlock_hold_seconds_count", task="p.hold") == 2,
            timeout=10,
            what="both released",
        )
        both_within = time.monotonic() - sent
        text = _scrape(port)
        assert _sample(text, "celery_redlock_held", task="p.hold") == 0
        assert _sample(text, "celery_redlock_acquire_seconds_count", task="p.hold") == 2
        hold_sum = _sample(text, "celery_redlock_hold_seconds_sum", task="p.hold")
        assert 2 <= hold_sum <= 2 * both_within  # each child's >= 1 s hold, added up

        # A child SIGKILLed mid-task (as by a hard time limit) sends no shutdown
        # signal; the scrape forgets its held gauge because the process is gone.
        client.send_task("p.hold", args=(0, "k"), kwargs={"gate": "never"})
        _eventually(lambda: held() == 1 and observer.llen("pids:k"), timeout=30, what="held == 1")
        victim = int(observer.lrange("pids:k", 0, -1)[0])
        os.kill(victim, signal.SIGKILL)
        _eventually(lambda: held() == 0, timeout=10, what="dead child forgotten")
        # Counters of dead children still count: nothing was lost from the totals.
        assert _sample(_scrape(port), "celery_redlock_acquire_seconds_count", task="p.hold") == 3

        # Warm shutdown: each child's worker_process_shutdown -> mark_process_dead.
        assert _gauge_files(multiproc_dir), "children wrote held gauges"
        process.send_signal(signal.SIGTERM)
        process.wait(20)
        assert _gauge_files(multiproc_dir) == set()
        assert list(multiproc_dir.glob("histogram_*.db"))  # the totals stay
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
        client.close()
        print(f"--- worker log ---\n{log_path.read_text()}")


# -- packaging -------------------------------------------------------------------------


def _python(code: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(CHECKOUT), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    env.pop(metrics.MULTIPROC_DIR_ENV, None)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_without_prometheus_client_the_error_names_the_extra() -> None:
    done = _python(
        """
        import sys
        sys.modules["prometheus_client"] = None  # as if it were not installed
        try:
            import celery_redlock.metrics
        except ImportError as exc:
            print(exc)
        else:
            print("imported")
        """
    )
    assert done.returncode == 0, done.stderr
    assert "pip install 'celery-redlock[prometheus]'" in done.stdout


def test_the_rest_of_the_package_never_imports_metrics() -> None:
    done = _python(
        """
        import importlib, pkgutil, sys
        sys.modules["prometheus_client"] = None
        import celery_redlock
        for module in pkgutil.iter_modules(celery_redlock.__path__):
            if module.name != "metrics":
                importlib.import_module("celery_redlock." + module.name)
        print(sorted(m for m in sys.modules if m.startswith(("celery_redlock.metrics", "prom"))))
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['prometheus_client']"  # only our blocker


def test_copies_turned_away_by_a_limit_a_rate_or_a_cooldown_are_counted_by_kind(
    worker: Any,
    tasks: dict[str, Any],
    registry: CollectorRegistry,
    gates: dict[str, threading.Event],
    seen: SignalSeen,
) -> None:
    gates["full"] = threading.Event()
    contended = seen(signals.lock_contended, "m.limited")
    # Two copies hold both permits until a third has met them.
    holders = [tasks["limited"].delay(0, tag="l", gate="full") for _ in range(2)]
    _eventually(lambda: _value(registry, "celery_redlock_held", task="m.limited") == 2)
    third = tasks["limited"].delay(0.01, tag="l")
    assert contended.wait(15), "the third copy never met the limit"
    gates["full"].set()
    for result in (*holders, third):
        assert _wait(result) == "ran"
    assert _value(registry, "celery_redlock_limited_total", task="m.limited", kind="limit") >= 1
    # A rate of 1 a minute: the first copy starts, the second comes back later.
    waited = seen(signals.lock_contended, "m.rated")
    assert _wait(tasks["rated"].delay(0, tag="r")) == "ran"
    later = tasks["rated"].apply_async((0,), {"tag": "r"}, ignore_result=True)
    assert waited.wait(15), "the second copy never met the rate"
    later.revoke()
    assert _value(registry, "celery_redlock_limited_total", task="m.rated", kind="rate") == 1
    assert _value(registry, "celery_redlock_contended_total", task="m.rated", action="wait") == 1
    # A cooldown of a minute: the first copy starts, the second is skipped.
    assert _wait(tasks["cooled"].delay(0, tag="c")) == "ran"
    assert is_skipped(_wait(tasks["cooled"].delay(0, tag="c")))
    assert _value(registry, "celery_redlock_limited_total", task="m.cooled", kind="cooldown") == 1
    assert _value(registry, "celery_redlock_contended_total", task="m.cooled", action="skip") == 1
