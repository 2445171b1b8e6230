"""The shipped docker-compose.yml, run for real and judged from outside the containers.

    python -m tools.containers.compose_check [--duration 30]

(``tools/containers/compose-check.sh`` starts the Docker daemon and builds the base
images first.) Steps:

1. ``up -d --build`` the demo stack: 5 lock nodes, a broker, 2 workers, 2 beats
   (project ``celery-redlock-example``); wait until the nodes are healthy and both
   workers log "ready.".
2. From this machine, over the containers' addresses: drive
   :class:`example_project.workload.Workload` for ``--duration`` seconds while the
   beats send their ticks. Mid-run, ``docker kill`` one lock node and, while one of
   its task bodies is inside, one worker; a few seconds later start both again.
3. Stop the beats, wait for the tasks to finish, and print the demo's own summary
   (:func:`example_project.demo.summary`): the verdict of the independent observer,
   the broker's db 1, which no lock touches. Also required: every task finished but
   those the killed worker had taken, the tasks sent after the restarts included
   (the stack recovered); the lock node is healthy again; no container is
   restarting or was restarted by Docker.
4. ``down -v`` and check that no container, volume or network of the project is left.

The killed worker's bodies never report their exit: once its container has exited,
:func:`example_project.observer.forget_dead` counts them out (see there why only
then). The tasks it had taken (its log's "received" lines before the kill) stay
unfinished, as the example's tasks have no ``acks_late``: they are counted; every
other task must finish.

With ``docker compose`` (v2) the file runs as shipped; with Debian's
``docker-compose`` 1.29, which does not know the top-level ``name:`` key, it runs
with that one line left out and the same project name given by ``-p``.

Exit status: 0 when every check passed; 1 when one failed (the message says which);
2 when the stack did not come up.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

import redis

from example_project import demo, observer
from example_project.workload import Workload

CHECKOUT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = CHECKOUT / "docker-compose.yml"
PROJECT = "celery-redlock-example"
LOCK_NODES = [f"lock{i}" for i in range(1, 6)]
WORKERS = ["worker1", "worker2"]
BEATS = ["beat1", "beat2"]
#: The containers killed mid-run.
KILLED_NODE, KILLED_WORKER = "lock3", "worker2"
#: Seconds into the load: kill the node, then the worker (once a body of it is
#: inside, at most KILL_WAIT later), then start both again.
KILL_NODE_AT, KILL_WORKER_AT, RESTART_AT = 6.0, 9.0, 15.0
KILL_WAIT = 8.0
#: Seconds to wait for the stack, and for the tasks at the end.
UP_TIMEOUT = 240.0
READY_TIMEOUT = 90.0
DRAIN_TIMEOUT = 45.0


class CheckFailed(Exception):
    """A check failed: the message says which."""


class StackDown(Exception):
    """The stack did not come up."""


def say(text: str = "") -> None:
    print(text, flush=True)


def run(args: Sequence[str], timeout: float = 120.0, check: bool = True) -> str:
    done = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise CheckFailed(f"{' '.join(args)} exited {done.returncode}:\n{done.stderr.strip()}")
    return done.stdout


class Compose:
    """``docker compose`` / ``docker-compose`` on the shipped file, one project."""

    def __init__(self, workdir: Path) -> None:
        v2 = subprocess.run(
            ["docker", "compose", "version"], capture_output=True, check=False
        ).returncode
        if v2 == 0:
            self.base = ["docker", "compose", "-f", str(COMPOSE_FILE)]
        elif shutil.which("docker-compose"):
            # Compose 1.x refuses the top-level "name:" (a v2 key): the same file
            # without that line, and the project name it gives passed by -p.
            lines = COMPOSE_FILE.read_text().splitlines(keepends=True)
            kept = [line for line in lines if not line.startswith("name:")]
            stripped = workdir / "docker-compose.yml"
            stripped.write_text("".join(kept))
            self.base = [
                "docker-compose",
                "-f",
                str(stripped),
                "--project-directory",
                str(CHECKOUT),
            ]
        else:
            raise StackDown("neither `docker compose` nor `docker-compose` is installed")
        self.base += ["-p", PROJECT]

    def __call__(self, *args: str, timeout: float = 120.0, check: bool = True) -> str:
        return run([*self.base, *args], timeout=timeout, check=check)

    def container(self, service: str) -> str:
        found = self("ps", "-q", service).split()
        if not found:
            raise CheckFailed(f"no container for service {service}")
        return found[0]


def inspect(container: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = json.loads(run(["docker", "inspect", container]))
    return found[0]


def address(container: str) -> str:
    networks = inspect(container)["NetworkSettings"]["Networks"]
    return str(next(iter(networks.values()))["IPAddress"])


def logs(container: str) -> str:
    done = subprocess.run(
        ["docker", "logs", container], capture_output=True, text=True, timeout=60, check=False
    )
    return done.stdout + done.stderr


def wait_for(what: str, test: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not test():
        if time.monotonic() > deadline:
            raise StackDown(f"{what}: not after {timeout:g}s")
        time.sleep(0.5)


def healthy(container: str) -> bool:
    state = inspect(container)["State"]
    return bool(state.get("Health", {}).get("Status") == "healthy")


def ready_count(container: str) -> int:
    """How many times the worker in ``container`` logged "ready." (once per start)."""
    return sum(1 for line in logs(container).splitlines() if line.rstrip().endswith("ready."))


#: celery's "Task <name>[<id>] received" line, with its time.
RECEIVED = re.compile(
    r"^\[(?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): INFO/MainProcess\] "
    r"Task \S+\[(?P<id>[0-9a-f-]{36})\] received"
)


def taken_before(log: str, moment: datetime) -> set[str]:
    """Ids of the tasks a worker logged as received before ``moment`` (UTC, as the
    containers log)."""
    taken = set()
    for line in log.splitlines():
        match = RECEIVED.match(line)
        if match and datetime.strptime(match["at"], "%Y-%m-%d %H:%M:%S,%f") < moment:
            taken.add(match["id"])
    return taken


def project_leftovers() -> list[str]:
    label = f"label=com.docker.compose.project={PROJECT}"
    left = []
    for kind, listing in (
        ("container", ["docker", "ps", "-a", "-q", "--filter", label]),
        ("volume", ["docker", "volume", "ls", "-q", "--filter", label]),
        ("network", ["docker", "network", "ls", "-q", "--filter", label]),
    ):
        left += [f"{kind} {name}" for name in run(listing).split()]
    return left


def point_at_stack(compose: Compose) -> dict[str, str]:
    """This process's settings: the stack's broker, nodes and observer by address."""
    broker = address(compose.container("broker"))
    nodes = [address(compose.container(node)) for node in LOCK_NODES]
    env = {
        "BROKER_URL": f"redis://{broker}:6379/0",
        "RESULT_BACKEND": f"redis://{broker}:6379/0",
        "REDLOCK_NODES": ",".join(f"redis://{ip}:6379/0" for ip in nodes),
        "OBSERVER_URL": f"redis://{broker}:6379/1",
    }
    os.environ.update(env)
    return env


def check(duration: float, keep_logs: Optional[Path]) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="redlock-compose-"))
    try:
        compose = Compose(workdir)
    except StackDown:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    try:
        say(f"== up -d --build: {PROJECT} ({' '.join(compose.base[:2])})")
        started = time.monotonic()
        # A failed build must not leave its intermediate containers behind.
        compose("build", "--force-rm", timeout=UP_TIMEOUT)
        compose("up", "-d", "--build", timeout=UP_TIMEOUT)
        for node in [*LOCK_NODES, "broker"]:
            container = compose.container(node)
            wait_for(f"{node} healthy", lambda c=container: healthy(c), READY_TIMEOUT)
        workers = {name: compose.container(name) for name in WORKERS}
        for name, container in workers.items():
            wait_for(f"{name} ready", lambda c=container: ready_count(c) >= 1, READY_TIMEOUT)
        say(f"   up in {time.monotonic() - started:.1f}s")
        env = point_at_stack(compose)
        say(f"   observer: {env['OBSERVER_URL']} (the broker's db 1; no lock touches it)")
        client = observer.client_for(env["OBSERVER_URL"])
        _load(compose, client, duration)
    finally:
        if keep_logs is not None:
            keep_logs.mkdir(parents=True, exist_ok=True)
            for service in [*LOCK_NODES, "broker", *WORKERS, *BEATS]:
                found = compose("ps", "-q", service, check=False).split()
                if found:
                    (keep_logs / f"{service}.log").write_text(logs(found[0]))
            say(f"   container logs kept in {keep_logs}")
        say("== down -v")
        compose("down", "-v", "--remove-orphans", timeout=180, check=False)
        shutil.rmtree(workdir, ignore_errors=True)
    left = project_leftovers()
    if left:
        raise CheckFailed(f"left behind after down -v: {', '.join(left)}")
    say("   nothing of the project left (containers, volumes, networks)")


def _load(compose: Compose, client: redis.Redis, duration: float) -> None:
    node = compose.container(KILLED_NODE)
    worker = compose.container(KILLED_WORKER)
    worker_name = f"{KILLED_WORKER}@{inspect(worker)['Config']['Hostname']}"
    workload = Workload()
    say(f"== load for {duration:g}s (the example's workload, and the beats' ticks)")
    start = time.monotonic()
    node_killed = worker_killed = restarted = False
    killed_wait_from: Optional[float] = None
    killed_at: Optional[datetime] = None
    sent_before_restart: set[str] = set()
    while (elapsed := time.monotonic() - start) < duration or not restarted:
        if elapsed < duration:
            workload.run_due(elapsed)
        if not node_killed and elapsed >= KILL_NODE_AT:
            run(["docker", "kill", node])
            node_killed = True
            say(f"   [{elapsed:4.1f}s] docker kill {KILLED_NODE} (4 of 5 nodes left)")
        if node_killed and not worker_killed and elapsed >= KILL_WORKER_AT:
            killed_wait_from = killed_wait_from or elapsed
            snap = observer.read(client, beat=False)
            inside = [k for k, who in snap.holders.items() if who.split()[0] == worker_name]
            if inside or elapsed - killed_wait_from > KILL_WAIT:
                run(["docker", "kill", worker])
                run(["docker", "wait", worker], timeout=60)
                killed_at = datetime.now(timezone.utc).replace(tzinfo=None)
                gone = observer.forget_dead(client, worker_name)
                worker_killed = True
                keys = ", ".join(sorted(gone)) or "none"
                say(f"   [{elapsed:4.1f}s] docker kill {KILLED_WORKER}; bodies inside: {keys}")
        if worker_killed and not restarted and elapsed >= RESTART_AT:
            run(["docker", "start", node, worker])
            restarted = True
            sent_before_restart = set(workload.task_ids)
            say(f"   [{elapsed:4.1f}s] docker start {KILLED_NODE} {KILLED_WORKER}")
        time.sleep(0.05)
    after_restart = set(workload.task_ids) - sent_before_restart
    wait_for(f"{KILLED_NODE} healthy again", lambda: healthy(node), READY_TIMEOUT)
    wait_for(f"{KILLED_WORKER} ready again", lambda: ready_count(worker) >= 2, READY_TIMEOUT)
    say(f"   {KILLED_NODE} healthy and {KILLED_WORKER} ready again")

    # No container restarting, none restarted by Docker, every one running.
    states = {}
    for service in [*LOCK_NODES, "broker", *WORKERS, *BEATS]:
        state = inspect(compose.container(service))
        states[service] = state
        if state["State"]["Restarting"] or state["RestartCount"] or not state["State"]["Running"]:
            raise CheckFailed(
                f"{service}: running {state['State']['Running']}, restarting "
                f"{state['State']['Restarting']}, restarted by Docker {state['RestartCount']}x"
            )
    say(f"   {len(states)} containers running, none restarting or restarted by Docker")

    compose("stop", *BEATS, timeout=60)
    beats = {name: demo.beat_outcomes(logs(compose.container(name))) for name in BEATS}
    expected = set(workload.task_ids)
    assert killed_at is not None
    # What the killed worker had taken: without acks_late (the example's tasks have
    # none) nothing redelivers it; everything else must finish.
    lost = taken_before(logs(worker), killed_at)
    drain_started = time.monotonic()
    deadline = drain_started + DRAIN_TIMEOUT
    while True:
        snap = observer.read(client)
        waiting = snap.unfinished(expected) - lost
        if not waiting or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    client.close()
    say(f"   drained in {time.monotonic() - drain_started:.1f}s")
    options = demo.Options(
        duration, len(LOCK_NODES), len(WORKERS), 2, len(BEATS), False, False, False
    )
    ok = demo.summary(options, demo.Output(False), workload, snap, beats, None, expected)
    if not ok:
        raise CheckFailed("the observer's verdict failed (see the summary above)")
    taken = snap.unfinished(expected) & lost
    say(
        demo.label_line(
            "killed",
            f"{len(taken)} tasks unfinished, all taken by {KILLED_WORKER} before it was "
            "killed (no acks_late: not redelivered)",
        )
    )
    if waiting:
        received = sorted(f"{snap.seen[t]} {t}" for t in waiting if t in snap.seen)
        never = sorted(t for t in waiting if t not in snap.seen)
        raise CheckFailed(
            f"{len(waiting)} tasks not taken by the killed worker never finished "
            f"({len(waiting & after_restart)} of them sent after the restarts); received "
            f"by a worker: {received or '-'}; never received: {never or '-'}"
        )
    say(
        demo.label_line(
            "recovered",
            f"every other task finished, the {len(after_restart)} sent after the restarts included",
        )
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of load (30)")
    parser.add_argument(
        "--keep-logs", type=Path, metavar="DIR", help="write every container's log there"
    )
    args = parser.parse_args(argv)
    if args.duration <= RESTART_AT:
        parser.error(f"--duration must be more than {RESTART_AT:g} seconds (the drill)")
    try:
        check(args.duration, args.keep_logs)
    except StackDown as exc:
        say(f"compose check: the stack did not come up: {exc}")
        return 2
    except (CheckFailed, subprocess.TimeoutExpired) as exc:
        say(f"compose check FAILED: {exc}")
        return 1
    say("compose check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
