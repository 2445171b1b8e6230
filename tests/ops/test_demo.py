"""The example project, its one-command demo and docker-compose.yml.

- The demo runs for real (a few seconds of load on 5 lock nodes, 2 workers, 2 beats)
  and must exit 0 with one holder per key, and leave no process behind, also when
  interrupted with Ctrl-C.
- docker-compose.yml runs for real only where Docker does (CI:
  tools/containers/compose-check.sh); here it is read with :func:`read_compose` (PyYAML
  is not a dependency), a reader for the small YAML subset the file is written in
  (block mappings whose values are JSON), and checked for consistency: services,
  commands, node URLs, persistence flags. The reader
  refuses anything outside its subset rather than guess, and is compared with PyYAML
  where that happens to be installed.
- The long job's fenced SQLite write refuses a stale fence.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import pytest

from celery_redlock.beat import RedlockScheduler
from celery_redlock.testing import RedisServer
from example_project import demo, observer, store
from example_project.workload import Workload

CHECKOUT = Path(__file__).resolve().parents[2]
COMPOSE = CHECKOUT / "docker-compose.yml"
LOCK_NODES = [f"lock{i}" for i in range(1, 6)]
WORKERS = ["worker1", "worker2"]
BEATS = ["beat1", "beat2"]
PERSISTENCE = ["--appendonly", "yes", "--appendfsync", "always", "--maxmemory-policy", "noeviction"]


# -- the YAML subset -----------------------------------------------------------------------


class NotInSubset(ValueError):
    pass


_KEY_LINE = re.compile(r"(?P<key>[A-Za-z0-9_.-]+):(?: (?P<value>.*))?")


def read_compose(text: str) -> dict[str, Any]:
    """Parse the YAML subset docker-compose.yml is written in.

    Each line is a comment, blank, or ``key:`` / ``key: value`` indented by spaces;
    ``key:`` alone opens a nested mapping (the following lines, indented deeper) or,
    with none, means null. A value is JSON: a double-quoted string, a number, or a
    ``[...]`` / ``{...}`` of those -- JSON is valid YAML with the same meaning, so
    nothing here can read differently from what Docker reads. Anything else
    (anchors, block sequences, plain strings such as ``yes`` that YAML 1.1 turns into
    booleans, tabs, duplicate keys, odd indentation) raises NotInSubset.
    """
    root: dict[str, Any] = {}
    # (indent of the mapping's keys, the mapping); the root's keys are at column 0.
    stack: list[tuple[int, dict[str, Any]]] = [(0, root)]
    pending: Optional[tuple[dict[str, Any], str]] = None  # a "key:" awaiting its block
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if "\t" in line:
            raise NotInSubset(f"line {number}: tab")
        indent = len(line) - len(line.lstrip(" "))
        match = _KEY_LINE.fullmatch(stripped)
        if match is None:
            raise NotInSubset(f"line {number}: not 'key:' or 'key: value': {stripped!r}")
        if pending is not None:
            mapping, key = pending
            pending = None
            if indent > stack[-1][0]:
                child: dict[str, Any] = {}
                mapping[key] = child
                stack.append((indent, child))
        while stack[-1][0] > indent:
            stack.pop()
        if stack[-1][0] != indent:
            raise NotInSubset(f"line {number}: indentation {indent} matches no open mapping")
        mapping = stack[-1][1]
        key, value = match["key"], match["value"]
        if key in mapping:
            raise NotInSubset(f"line {number}: duplicate key {key!r}")
        if value is None or not value.strip():
            mapping[key] = None
            pending = (mapping, key)
            continue
        if not value.startswith(('"', "[", "{")) and not re.fullmatch(r"-?\d+", value):
            raise NotInSubset(f"line {number}: {value!r} is not JSON (quote strings)")
        try:
            mapping[key] = json.loads(value)
        except json.JSONDecodeError as exc:
            raise NotInSubset(f"line {number}: {value!r}: {exc}") from None
    return root


def test_the_compose_reader_reads_its_subset() -> None:
    text = (
        "# comment\n"
        "a:\n"
        '  b: "x # not a comment"\n'
        "  c: 15\n"
        "  d:\n"
        '    e: ["CMD", "redis-cli", "ping"]\n'
        "  f:\n"
        'g: {"h": [1, 2]}\n'
    )
    assert read_compose(text) == {
        "a": {
            "b": "x # not a comment",
            "c": 15,
            "d": {"e": ["CMD", "redis-cli", "ping"]},
            "f": None,
        },
        "g": {"h": [1, 2]},
    }


@pytest.mark.parametrize(
    "text",
    [
        "a: yes\n",  # a YAML 1.1 boolean, not the string "yes"
        "a: 22:22\n",  # a YAML 1.1 base-60 integer (1342), unquoted
        "a: &x 1\n",
        "a:\n  - 1\n",
        "a:\n\tb: 1\n",
        "a: 1\na: 2\n",
        "a:\n    b: 1\n  c: 2\n",
        'a: ["unclosed"\n',
    ],
)
def test_the_compose_reader_refuses_what_is_outside_its_subset(text: str) -> None:
    with pytest.raises(NotInSubset):
        read_compose(text)


def test_the_compose_reader_agrees_with_pyyaml() -> None:
    yaml = importlib.import_module("yaml")  # the test extra's; untyped here on purpose
    assert read_compose(COMPOSE.read_text()) == yaml.safe_load(COMPOSE.read_text())


# -- docker-compose.yml -------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return read_compose(COMPOSE.read_text())


def test_compose_has_five_lock_nodes_a_broker_two_workers_two_beats_and_optional_flower(
    compose: dict[str, Any],
) -> None:
    services = compose["services"]
    assert set(services) == {*LOCK_NODES, "broker", *WORKERS, *BEATS, "flower"}
    assert services["flower"]["profiles"] == ["flower"]
    assert all("profiles" not in services[name] for name in services if name != "flower")
    for name in [*LOCK_NODES, "broker"]:
        assert services[name]["image"] == "redis:7"


def test_every_lock_node_persists_every_write_and_never_evicts(compose: dict[str, Any]) -> None:
    for name in LOCK_NODES:
        command = compose["services"][name]["command"]
        assert command[0] == "redis-server"
        options = dict(zip(command[1::2], command[2::2]))
        assert options == dict(zip(PERSISTENCE[::2], PERSISTENCE[1::2])), name
        # Its own volume: the AOF outlives the container.
        assert compose["services"][name]["volumes"] == [f"{name}-data:/data"]
        assert f"{name}-data" in compose["volumes"]


def _env(compose: dict[str, Any], name: str) -> dict[str, str]:
    env: dict[str, str] = compose["services"][name]["environment"]
    return env


def test_workers_and_beats_use_every_lock_node_by_its_service_name(
    compose: dict[str, Any],
) -> None:
    services = compose["services"]
    expected = [f"redis://{node}:6379/0" for node in LOCK_NODES]
    for name in [*WORKERS, *BEATS]:
        env = _env(compose, name)
        assert env["REDLOCK_NODES"].split(",") == expected, name
        assert env == _env(compose, WORKERS[0]), f"{name}'s settings differ from worker1's"
        # Every URL names a service of this file, on Redis's port.
        for url in [*env["REDLOCK_NODES"].split(","), env["BROKER_URL"], env["OBSERVER_URL"]]:
            match = re.fullmatch(r"redis://([^:/]+):(\d+)/\d+", url)
            assert match is not None and match[1] in services and match[2] == "6379", url
        assert not {env["BROKER_URL"], env["OBSERVER_URL"]} & set(expected)
        # Started after the nodes and the broker answer.
        assert set(services[name]["depends_on"]) == {*LOCK_NODES, "broker"}
    # The workers share the long job's SQLite file.
    assert all(services[w]["volumes"] == ["demo-data:/data"] for w in WORKERS)
    assert _env(compose, WORKERS[0])["DEMO_DB"].startswith("/data/")


def test_worker_and_beat_commands_run_the_example_app_and_the_redlock_scheduler(
    compose: dict[str, Any],
) -> None:
    from celery.utils.imports import load_extension_class_names, symbol_by_name

    services = compose["services"]
    for name in [*WORKERS, *BEATS]:
        command = services[name]["command"]
        assert command[:3] == ["celery", "-A", "example_project"], name
        assert command[3] == ("worker" if name in WORKERS else "beat"), name
        build = services[name]["build"]
        assert (CHECKOUT / build["context"] / build["dockerfile"]).is_file()
    for name in BEATS:
        command = services[name]["command"]
        scheduler = command[command.index("-S") + 1]
        aliases = dict(load_extension_class_names("celery.beat_schedulers"))
        assert symbol_by_name(scheduler, aliases=aliases) is RedlockScheduler
    names = [services[w]["command"][services[w]["command"].index("-n") + 1] for w in WORKERS]
    assert len(set(names)) == len(names), "two workers with one node name"


def test_the_app_named_in_the_commands_is_importable_with_its_tasks_and_schedule() -> None:
    # In a subprocess: `celery -A example_project` resolves the app this way, and the
    # test process must not pick up the example's app and tasks.
    script = (
        "import json; from celery.app.utils import find_app\n"
        "app = find_app('example_project'); app.loader.import_default_modules()\n"
        "print(json.dumps({'main': app.main, 'tasks': sorted(app.tasks),\n"
        "  'beat': sorted(e['task'] for e in app.conf.beat_schedule.values())}))\n"
    )
    found = subprocess.run(
        [sys.executable, "-c", script],
        cwd=CHECKOUT,
        env={**os.environ, "PYTHONPATH": str(CHECKOUT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    app = json.loads(found.stdout.splitlines()[-1])
    assert app["main"] == "example_project"
    ours = {name for name in app["tasks"] if name.startswith("example_project.")}
    assert ours == {
        "example_project.report",
        "example_project.import_customer",
        "example_project.long_job",
        "example_project.refresh_cache",
    }
    assert set(app["beat"]) <= ours


# -- the fenced write ----------------------------------------------------------------------


def test_the_long_jobs_fenced_write_refuses_a_stale_fence(tmp_path: Path) -> None:
    connection = store.connect(str(tmp_path / "jobs.sqlite3"))
    store.ensure_job(connection, "nightly")
    assert store.write_progress(connection, "nightly", "step 1 by A", fence=5)
    assert store.write_progress(connection, "nightly", "step 2 by A", fence=5)  # same holder
    assert store.write_progress(connection, "nightly", "step 1 by B", fence=6)  # successor
    assert not store.write_progress(connection, "nightly", "step 3 by A", fence=5)  # stale
    assert store.read_job(connection, "nightly") == ("step 1 by B", 6)
    store.ensure_job(connection, "nightly")  # creating it again keeps the fence
    assert store.read_job(connection, "nightly") == ("step 1 by B", 6)


# -- the observer -------------------------------------------------------------------------


def test_the_observer_sees_two_bodies_inside_at_once_and_the_demo_then_fails(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The witness can see what it is there to catch, and the verdict follows it."""
    monkeypatch.setenv("OBSERVER_URL", redis_server.url)
    monkeypatch.setattr(observer, "_client", None)
    key = "redlock:import:acme"
    with (
        observer.holding(key, "w1@host", "t1") as first,
        observer.holding(key, "w2", "t2") as second,
    ):
        inside = observer.read(observer.client_for(redis_server.url))
    assert (first, second) == (1, 2)
    assert inside.holders == {key: f"w2 {os.getpid()} t2"}
    snap = observer.read(observer.client_for(redis_server.url))
    assert snap.max_holders == {key: 2} and snap.holders == {}

    options = demo.parse(["--quiet"])
    assert not demo.summary(options, demo.Output(quiet=True), Workload(), snap, {}, None, set())
    assert "max simultaneous holders: 2 (VIOLATED)" in capsys.readouterr().out


def test_a_dead_workers_bodies_are_counted_out_and_its_successor_is_judged_alone(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker killed with a body inside never reports its exit: forget_dead counts it
    out, and only its bodies (tools/containers/compose_check.py, after docker kill)."""
    monkeypatch.setenv("OBSERVER_URL", redis_server.url)
    monkeypatch.setattr(observer, "_client", None)
    client = observer.client_for(redis_server.url)
    key, other = "redlock:import:acme", "redlock:import:globex"
    killed = observer.holding(key, "worker2@c2", "t1")
    assert killed.__enter__() == 1  # and never left: its container was killed
    with observer.holding(other, "worker1@c1", "t2"):
        assert observer.forget_dead(client, "worker2@c2") == {key: "t1"}
        with observer.holding(key, "worker1@c1", "t3") as successor:
            assert successor == 1
        assert observer.read(client).holders == {other: f"worker1@c1 {os.getpid()} t2"}
    snap = observer.read(client)
    assert snap.max_holders == {key: 1, other: 1} and snap.holders == {}


# -- the demo itself -----------------------------------------------------------------------


def _left_behind(marker: Path) -> list[str]:
    """Processes whose command line names ``marker`` (every server and celery
    process of a demo run does: their directories, pid and schedule files are there)."""
    if shutil.which("pgrep"):
        found = subprocess.run(["pgrep", "-af", str(marker)], capture_output=True, text=True)
        return found.stdout.splitlines()
    left = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if str(marker) in cmdline:
                left.append(f"{entry.name} {cmdline}")
    return left


def _demo(tmp_path: Path, *args: str, **popen: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "example_project.demo", *args],
        cwd=CHECKOUT,
        # Every temporary directory of the run is made under tmp_path.
        env={**os.environ, "TMPDIR": str(tmp_path), "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **popen,
    )


@pytest.mark.slow
def test_the_demo_runs_with_one_holder_per_key_and_leaves_no_process(tmp_path: Path) -> None:
    started = time.monotonic()
    demo = _demo(tmp_path, "--duration", "6")
    try:
        output, _ = demo.communicate(timeout=300)
    finally:
        demo.kill()
    took = time.monotonic() - started
    print(output)
    assert demo.returncode == 0, output
    assert re.search(r"\[\s*\d+s\] published\s+\d+ · ran\s+\d+ · skipped", output), "no progress"
    for label in ("tasks", "outcomes", "exclusivity", "beat", "lock latency", "fencing"):
        assert re.search(rf"^{label}\s", output, re.MULTILINE), f"no {label!r} line"
    # The independent observer saw one body per key at a time, on every key that ran.
    keys = re.search(r"max simultaneous holders: 1 on each of (\d+) keys \(OK\)", output)
    assert keys is not None and int(keys[1]) >= 4, output
    assert " 0 ticks delivered twice" in output
    assert re.search(r"p50 [\d.]+ ms · p99 [\d.]+ ms", output)
    assert "(strictly increasing)" in output
    # The drill: a holder paused past its lease was refused by the database.
    assert re.search(r"its fenced writes were refused [1-9]\d* time", output), output
    assert re.search(r"^shutdown\s+\d+ process groups stopped, none left$", output, re.MULTILINE)
    assert _left_behind(tmp_path) == []
    assert list(tmp_path.iterdir()) == [], "the run directory was not removed"
    print(f"[demo --duration 6] {took:.1f}s end to end")


def _sigint_default() -> None:
    # A process started in the background by a non-interactive shell (a CI script's
    # `cmd &`) inherits SIGINT ignored, and Python then never raises KeyboardInterrupt:
    # the demo gets Ctrl-C's default, whoever started pytest.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
def test_ctrl_c_stops_the_demo_and_every_process_it_started(tmp_path: Path) -> None:
    demo = _demo(tmp_path, "--duration", "120", preexec_fn=_sigint_default)
    lines: list[str] = []
    try:
        assert demo.stdout is not None
        deadline = time.monotonic() + 120
        for line in demo.stdout:  # until the load is running
            lines.append(line)
            if re.search(r"\[\s*\d+s\] published", line) or time.monotonic() > deadline:
                break
        assert _left_behind(tmp_path), "nothing was running"
        demo.send_signal(signal.SIGINT)
        rest, _ = demo.communicate(timeout=120)
    finally:
        demo.kill()
    output = "".join(lines) + rest
    assert demo.returncode == 130, output
    assert "interrupted: stopping every process" in output
    assert re.search(r"^shutdown\s+\d+ process groups stopped, none left$", output, re.MULTILINE)
    assert _left_behind(tmp_path) == []
    assert list(tmp_path.iterdir()) == []
