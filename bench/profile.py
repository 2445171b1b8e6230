"""Where one lock operation spends its CPU, layer by layer: ``python -m bench profile``.

One operation is a non-blocking acquire + release of an uncontended key (ttl 10 s,
node_timeout 50 ms), on 1 and on 5 local redis-server masters. Five rows per node
count, each as user, system and wall µs per operation (``getrusage(RUSAGE_SELF)``
around a timed loop, after a warm-up and a ``gc.collect()``: ``cpu_per_op``):

1. floor -- ``SET k v NX PX`` + ``DEL k`` on bare sockets (``bench.resp``: one
   blocking socket for 1 node, 5 multiplexed waiting for 3 replies): the kernel, the
   loopback and Redis, no client code.
2. lean Python -- the lock's own acquire and release scripts (``EVALSHA``, a fresh
   token per acquire) on the same kind of bare sockets, a quorum of replies
   (``bench.resp.LeanQuorum``): the least Python the operation needs, with none of
   the lock's rules, pools, deadlines, records or error handling. The full row over
   it is what client code costs.
3. wire -- our two rounds alone: ``node_set.round`` with the acquire command, then
   with the release command, both built once outside the loop. Replies are checked
   (granted, released), so a broken row cannot look fast.
4. lock layer -- the full ``acquire(key, blocking=False)`` + ``lease.release()`` on a
   ``Redlock`` whose rounds are answered in memory (its node set's ``round`` returns a
   yes from every node): everything but the wire. A CPU measurement only: nothing is
   sent, so its wall time is its CPU time.
5. full -- ``Redlock(urls, ttl=10, node_timeout=0.05)``: acquire + release on the
   real nodes.

Derived: each row's user µs over the floor's, the split of the full row's user CPU:
the wire's Python (wire - floor), the lock layer, and what neither explains (full -
wire - lock layer), and the full row's CPU and wall over the lean row's. Only the
client process's CPU is counted: the servers' is not. Linux splits a process's CPU
time between user and system by sampling at its clock tick, while their sum is the
exact run time: the tables show the sum too, and user alone wants long loops
(``--quick`` figures are coarse).

Rows 3-5 run in a worker subprocess (``python -m bench.profile --worker``), the
floor and the lean row in this one. Every row runs in turn, ``--rounds`` times
(default 3), and the report gives the median of the rounds for each figure (every
round is kept in the JSON), so drift on the machine hits all rows alike.

``--compiled`` adds a side: the working tree with its wire layer compiled by mypyc
(setup.py, ``CELERY_REDLOCK_COMPILE=1``, built in place in a temporary copy).

``--against REV`` (a git revision of this repository) also measures rows 3-5 with the
``celery_redlock`` package as of REV, on the same servers: ``git archive REV
celery_redlock`` into a temporary directory put first on the worker's PYTHONPATH, so
the worker imports REV's package and the working tree's ``bench``. The two sides'
workers alternate, round after round; the report adds a before/after table and
records REV's sha and ``git describe --always --dirty`` of the working tree.

A full run writes ``bench/results/profile.{json,md}``; ``--quick`` saves nothing
unless ``--out DIR`` is given. ``--cprofile`` prints instead the old view, cProfile
of the 5-node acquire + release by own time (it inflates pure-Python code several
times over: read the ranking, not the µs), and saves nothing::

    python -m bench profile                       # ~30 s; bench/results/profile.{json,md}
    python -m bench profile --against main        # the same, with a before/after table
    python -m bench profile --quick --out /tmp/p  # a few seconds
    python -m bench profile --cprofile --top 30

Defaults: 10,000 timed operations per row and round after 300 untimed, 3 rounds.
Nothing from celery_redlock is imported at module level, and the worker uses only
what rows 3-5 name (``Redlock``, ``lock.commands``, ``lock.acquire_replies``): a
revision that lacks one of them fails that row in the report, not the run.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional

from .stats import Op

__all__ = ["FULL", "QUICK", "Plan", "cpu_per_op", "main", "run"]

ROOT = Path(__file__).resolve().parent.parent
NODE_COUNTS = (1, 5)
#: The rows, in the order they run; the worker measures all but the floor.
ROWS = ("floor", "lean", "wire", "lock_layer", "full")
#: The rows this process measures (no celery_redlock of a side's in them); the worker
#: measures the rest.
MAIN_ROWS = ROWS[:2]
WORKER_ROWS = ROWS[2:]
ROW_NAMES = {
    "floor": "floor", "lean": "lean Python", "wire": "wire", "lock_layer": "lock layer",
    "full": "full",
}  # fmt: skip
TTL = 10.0
NODE_TIMEOUT = 0.05
#: Figures of a row whose medians the report gives (``cpu_us``: user + system).
FIGURES = (
    "user_us", "system_us", "cpu_us", "wall_us", "voluntary_switches", "involuntary_switches",
)  # fmt: skip
WORKING_TREE = "working_tree"
AGAINST = "against"
COMPILED = "compiled"
#: How the report names each side.
SIDE_NAMES = {WORKING_TREE: "working tree", AGAINST: "as of REV", COMPILED: "compiled"}
#: Every round's figures of one row.
Runs = list[dict[str, Any]]


@dataclass(frozen=True)
class Plan:
    """How much one run does."""

    #: Timed operations per row and round.
    operations: int = 10000
    #: Untimed operations before each row's timed loop.
    warmup: int = 300
    #: How many times every row runs; the report gives the median.
    rounds: int = 3
    ttl: float = TTL
    node_timeout: float = NODE_TIMEOUT


FULL = Plan()
QUICK = Plan(operations=1000, warmup=100, rounds=2)


def cpu_per_op(op: Op, operations: int, warmup: int = 300) -> dict[str, float]:
    """Wall, user and system µs per operation, and context switches per operation."""
    for _ in range(warmup):
        op()
    gc.collect()
    before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    for _ in range(operations):
        op()
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "wall_us": wall / operations * 1e6,
        "user_us": (after.ru_utime - before.ru_utime) / operations * 1e6,
        "system_us": (after.ru_stime - before.ru_stime) / operations * 1e6,
        "voluntary_switches": (after.ru_nvcsw - before.ru_nvcsw) / operations,
        "involuntary_switches": (after.ru_nivcsw - before.ru_nivcsw) / operations,
    }


def _checked_cpu(op: Op, failed: list[int], plan: Plan) -> dict[str, float]:
    """``cpu_per_op`` of an op that counts the operations that did not do their job in
    ``failed[0]``: more than 1 % of them is an error (a broken row must not look fast);
    fewer is a loaded machine missing node_timeout now and then, and is reported."""
    for _ in range(plan.warmup):
        op()
    failed[0] = 0
    cpu = cpu_per_op(op, plan.operations, warmup=0)
    if failed[0] > plan.operations // 100:
        raise RuntimeError(f"{failed[0]} of {plan.operations} operations failed")
    return {**cpu, "failed": failed[0]}


# -- the worker: rows 3-5 with whichever celery_redlock comes first on sys.path -------


def _wire_op(redlock: Any, key: str, failed: list[int]) -> Op:
    from celery_redlock.lock.acquire_replies import is_granted
    from celery_redlock.lock.commands import acquire_command, release_command

    nodes = len(redlock.nodes)
    need = nodes // 2 + 1
    value = f"{secrets.token_hex(10)}|bench:profile"
    acquire = acquire_command((key,), value, TTL, False)
    release = release_command((key,), value, TTL)
    round_ = redlock._nodes.round  # ``node_set`` today; older revisions lack the name

    def is_released(reply: object) -> bool:
        return reply == 1

    def op() -> None:
        granted = round_(acquire, NODE_TIMEOUT, is_granted, need, nodes - need + 1)
        released = round_(release, NODE_TIMEOUT, is_released, need, deliver=True)
        # Unfenced, a yes is the integer 1: list.count keeps the check off the figure.
        if granted.count(1) < need or released.count(1) < need:
            failed[0] += 1

    return op


def _lease_op(redlock: Any, key: str, failed: list[int]) -> Op:
    from celery_redlock import QuorumUnavailable

    acquire = redlock.acquire

    def op() -> None:
        try:
            lease = acquire(key, blocking=False)
            # ``is False``: an older revision's release() returned None.
            if lease is None or lease.release() is False:
                failed[0] += 1
        except QuorumUnavailable:  # a loaded machine missed node_timeout
            failed[0] += 1

    return op


class _Answering:
    """A node set whose rounds every node answers yes, in memory (``round``); the rest
    is the real node set's. Stands in for the lock's node set as a whole: a compiled
    node set's methods cannot be replaced on the instance."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self._yes = [1] * len(real.nodes)
        self.asked: Optional[list[object]] = []

    def round(self, command: object, *args: object, **kwargs: object) -> list[object]:
        if self.asked is not None:
            self.asked.append(command)
        return list(self._yes)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def _in_memory_op(redlock: Any, key: str, failed: list[int]) -> Op:
    """``_lease_op`` on ``redlock`` with every round answered yes by every node in
    memory: nothing is sent. Checked once first: an acquire + release that does not
    go through ``_nodes.round`` twice (another revision's) would measure something
    else."""
    answering = _Answering(redlock._nodes)
    redlock._nodes = answering
    op = _lease_op(redlock, key, failed)
    op()
    asked = answering.asked or []
    if len(asked) != 2 or failed[0]:
        raise RuntimeError(
            f"acquire + release asked {len(asked)} round(s) of _nodes.round, failed {failed[0]}"
        )
    answering.asked = None
    return op


def _rows_on(urls: list[str], plan: Plan, prefix: str) -> dict[str, dict[str, Any]]:
    """One round of rows 3-5 on the nodes ``urls``; a row that failed is
    ``{"error": ...}`` (a revision may lack what a row uses)."""
    from celery_redlock import Redlock

    n = len(urls)
    real = Redlock(urls, ttl=plan.ttl, node_timeout=plan.node_timeout)
    in_memory = Redlock(urls, ttl=plan.ttl, node_timeout=plan.node_timeout)
    makers: dict[str, Callable[[list[int]], Op]] = {
        "wire": lambda failed: _wire_op(real, f"{prefix}:wire:{n}", failed),
        "lock_layer": lambda failed: _in_memory_op(in_memory, f"{prefix}:lock:{n}", failed),
        "full": lambda failed: _lease_op(real, f"{prefix}:full:{n}", failed),
    }
    rows: dict[str, dict[str, Any]] = {}
    try:
        for row, make in makers.items():
            failed = [0]
            try:
                rows[row] = _checked_cpu(make(failed), failed, plan)
            except Exception as error:
                rows[row] = {"error": f"{type(error).__name__}: {error}"}
    finally:
        real.close()
        in_memory.close()
    return rows


def _worker(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile --worker")
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--urls", required=True, help="the 5 nodes, comma-separated")
    parser.add_argument("--operations", type=int, required=True)
    parser.add_argument("--warmup", type=int, required=True)
    args = parser.parse_args(argv)
    import celery_redlock

    plan = replace(FULL, operations=args.operations, warmup=args.warmup)
    urls, prefix = args.urls.split(","), f"bench:profile:{secrets.token_hex(4)}"
    rows = {str(n): _rows_on(urls[:n], plan, prefix) for n in NODE_COUNTS}
    from celery_redlock import wire

    compiled = bool(getattr(wire, "COMPILED", False))
    print(
        json.dumps({"celery_redlock": celery_redlock.__file__, "compiled": compiled, "rows": rows})
    )
    return 0


# -- the run --------------------------------------------------------------------------


@dataclass(frozen=True)
class Side:
    """One celery_redlock the worker runs: the directory that holds it."""

    name: str
    path: Path


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()


def _export(rev: str, into: Path) -> str:
    """``celery_redlock`` as of ``rev`` into ``into``; the commit's full sha."""
    sha = _git("rev-parse", "--verify", f"{rev}^{{commit}}")
    archive = into / "celery_redlock.tar"
    _git("archive", "--output", str(archive), sha, "celery_redlock")
    subprocess.run(["tar", "-x", "-f", str(archive), "-C", str(into)], check=True)
    archive.unlink()
    return sha


def _run_worker(side: Side, urls: list[str], plan: Plan) -> dict[str, Any]:
    """One round of rows 3-5 in a fresh interpreter whose ``celery_redlock`` is
    ``side``'s (its directory first on the path and the working directory, which
    ``-m`` puts first) and whose ``bench`` is the working tree's."""
    pythonpath = os.pathsep.join(dict.fromkeys([str(side.path), str(ROOT)]))
    command = [
        sys.executable, "-m", "bench.profile", "--worker", "--urls", ",".join(urls),
        "--operations", str(plan.operations), "--warmup", str(plan.warmup),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": pythonpath}
    done = subprocess.run(
        command, cwd=side.path, env=env, capture_output=True, text=True, timeout=900
    )
    if done.returncode != 0:
        raise RuntimeError(f"the {side.name} worker failed:\n{done.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    if not Path(result["celery_redlock"]).resolve().is_relative_to(side.path.resolve()):
        raise RuntimeError(f"the {side.name} worker imported {result['celery_redlock']}")
    if result.get("compiled", False) != (side.name == COMPILED):
        raise RuntimeError(f"the {side.name} worker's wire.COMPILED is {result.get('compiled')}")
    for n, rows in result["rows"].items():
        for row, figures in rows.items():
            if side.name == WORKING_TREE and "error" in figures:
                raise RuntimeError(f"{ROW_NAMES[row]}, {n} node(s): {figures['error']}")
    return result


def _compile(into: Path) -> Path:
    """The working tree's package with its wire layer compiled (setup.py,
    ``CELERY_REDLOCK_COMPILE=1``, built in place in a copy under ``into``)."""
    build = into / COMPILED
    build.mkdir()
    shutil.copytree(ROOT / "celery_redlock", build / "celery_redlock",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))  # fmt: skip
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, build / name)
    env = {**os.environ, "CELERY_REDLOCK_COMPILE": "1"}
    done = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
        cwd=build, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"the compiled build failed:\n{done.stderr[-4000:]}")
    return build


def _median(runs: Runs) -> dict[str, Any]:
    """A row's figures, each the median of its rounds; the rounds themselves under
    ``runs``."""
    errors = [run["error"] for run in runs if "error" in run]
    if errors:
        return {"error": errors[0], "runs": runs}
    runs = [{**run, "cpu_us": run["user_us"] + run["system_us"]} for run in runs]
    row: dict[str, Any] = {k: round(statistics.median(r[k] for r in runs), 2) for k in FIGURES}
    row["failed"] = sum(run.get("failed", 0) for run in runs)
    row["runs"] = [{k: round(v, 2) for k, v in run.items()} for run in runs]
    return row


def _split(rows: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Where the full row's user µs go: the floor, the wire's Python, the lock layer."""
    if any("error" in figures for figures in rows.values()):
        return {}
    user: dict[str, float] = {row: figures["user_us"] for row, figures in rows.items()}
    full, lean = rows["full"], rows["lean"]
    return {
        "floor_us": user["floor"],
        "wire_python_us": round(user["wire"] - user["floor"], 2),
        "lock_layer_us": user["lock_layer"],
        "full_us": user["full"],
        "unexplained_us": round(user["full"] - user["wire"] - user["lock_layer"], 2),
        "lean_us": user["lean"],
        "full_over_lean_cpu": round(full["cpu_us"] / lean["cpu_us"], 2),
        "full_over_lean_wall": round(full["wall_us"] / lean["wall_us"], 2),
    }


def _measure(
    sides: list[Side],
    urls: list[str],
    baselines: dict[str, dict[int, Op]],
    plan: Plan,
    log: Callable[[str], None],
) -> tuple[dict[str, dict[str, Runs]], dict[str, dict[str, dict[str, Runs]]]]:
    """Every row in turn, ``plan.rounds`` times: the runs of the rows measured here
    (``baselines``: the floor, lean Python) by row and node count, and each side's by
    node count and row."""
    base_runs: dict[str, dict[str, Runs]] = {
        row: {str(n): [] for n in NODE_COUNTS} for row in baselines
    }
    side_runs: dict[str, dict[str, dict[str, Runs]]] = {
        side.name: {str(n): {row: [] for row in WORKER_ROWS} for n in NODE_COUNTS} for side in sides
    }
    for round_ in range(plan.rounds):
        for row, ops in baselines.items():
            for n, op in ops.items():
                base_runs[row][str(n)].append(cpu_per_op(op, plan.operations, plan.warmup))
        for side in sides if round_ % 2 == 0 else sides[::-1]:
            result = _run_worker(side, urls, plan)
            for n, rows in result["rows"].items():
                for row, figures in rows.items():
                    side_runs[side.name][n][row].append(figures)
            log(f"  round {round_ + 1}: {side.name} done")
    return base_runs, side_runs


def run(
    plan: Plan,
    binary: str,
    against: Optional[str],
    log: Callable[[str], None],
    compiled: bool = False,
) -> tuple[dict[str, Any], str]:
    from celery_redlock.testing import RedisNodes

    from .machine import report_head
    from .resp import FloorCycle, FloorQuorum, LeanQuorum

    started = time.monotonic()
    report: dict[str, Any] = {
        **report_head("profile", binary, plan),
        "working_tree": {"describe": _git("describe", "--always", "--dirty")},
        "against": None,
    }
    with tempfile.TemporaryDirectory(prefix="bench-profile-") as tmp:
        sides = [Side(WORKING_TREE, ROOT)]
        if against is not None:
            sha = _export(against, Path(tmp))
            report["against"] = {"rev": against, "sha": sha}
            sides.append(Side(AGAINST, Path(tmp)))
        if compiled:
            log("building the compiled wire layer (mypyc) ...")
            sides.append(Side(COMPILED, _compile(Path(tmp))))
        report["compiled"] = compiled
        with RedisNodes(5, binary=binary) as cluster:
            addresses = [(server.host, server.port) for server in cluster]
            value = f"{secrets.token_hex(10)}|bench:profile".encode()
            ttl_ms = int(plan.ttl * 1000)
            floor1 = FloorCycle(*addresses[0], "bench:profile:floor:1", value, ttl_ms)
            floor5 = FloorQuorum(addresses, "bench:profile:floor:5", value, ttl_ms)
            lean = {n: LeanQuorum(addresses[:n], f"bench:profile:lean:{n}", plan.ttl)
                    for n in NODE_COUNTS}  # fmt: skip
            try:
                baselines: dict[str, dict[int, Op]] = {"floor": {1: floor1, 5: floor5}}
                baselines["lean"] = dict(lean)
                base_runs, side_runs = _measure(sides, cluster.urls, baselines, plan, log)
            finally:
                floor1.close()
                floor5.close()
                for each in lean.values():
                    each.close()
    report["sides"] = {}
    report["split"] = {}
    for name, by_nodes in side_runs.items():
        report["sides"][name], report["split"][name] = {}, {}
        for n, rows in by_nodes.items():
            medians = {row: _median(base_runs[row][n]) for row in MAIN_ROWS}
            medians.update({row: _median(runs) for row, runs in rows.items()})
            floor = medians["floor"]
            for figures in medians.values():
                for figure in ("user_us", "cpu_us"):
                    if figure in figures and floor[figure] > 0:
                        over = figures[figure] / floor[figure]
                        figures[figure.replace("_us", "_over_floor")] = round(over, 2)
            report["sides"][name][n] = medians
            report["split"][name][n] = _split(medians)
    report["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    report["duration_s"] = round(time.monotonic() - started, 1)
    return report, render_markdown(report)


# -- the report -----------------------------------------------------------------------


def _us(figures: dict[str, Any], key: str = "user_us") -> str:
    return "error" if "error" in figures else f"{figures[key]:,.1f}"


def _ratio(figures: dict[str, Any], key: str) -> str:
    return f"{figures[key]:.2f}" if key in figures else "n/a"


def render_markdown(report: dict[str, Any]) -> str:
    machine, plan = report["machine"], report["plan"]
    ours = report["sides"][WORKING_TREE]
    lines = [
        f"`python -m bench profile`, {report['started_at']}: {machine['cpu']}, "
        f"{machine['cpus']} CPUs, {machine['python']}, redis-server "
        f"{machine['redis_server']['version']} on loopback; celery-redlock "
        f"{report['working_tree']['describe']}. One operation: non-blocking acquire + "
        f"release of an uncontended key, ttl {plan['ttl']:g} s, node_timeout "
        f"{plan['node_timeout'] * 1000:g} ms. CPU of the client process only "
        f"(`getrusage`), µs per operation; {plan['operations']} operations per row after "
        f"{plan['warmup']} untimed, every row in turn, median of {plan['rounds']} rounds. "
        f"Load average {machine['loadavg_at_start'][0]} at the start, "
        f"{report['loadavg_at_end'][0]} at the end; took {report['duration_s']} s.",
        "",
        "| row | nodes | user µs | system µs | user + system µs | wall µs | user ÷ floor "
        "| user + system ÷ floor | failed |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for n, rows in ours.items():
        for row, figures in rows.items():
            lines.append(
                f"| {ROW_NAMES[row]} | {n} | {figures['user_us']:,.1f} | "
                f"{figures['system_us']:,.1f} | {figures['cpu_us']:,.1f} | "
                f"{figures['wall_us']:,.1f} | {_ratio(figures, 'user_over_floor')} | "
                f"{_ratio(figures, 'cpu_over_floor')} | {figures['failed']} |"
            )
    lines += [
        "",
        "The kernel splits a process's CPU time between user and system by sampling at "
        "its clock tick, while their sum is exact: on short loops the split is coarse "
        "(a row of the floor may show 0 user µs), user + system is not.",
    ]
    lines += [
        "",
        "Where the full row's user µs go: the floor, the wire's Python (wire - floor), the "
        "lock layer (rounds answered in memory), and what neither explains "
        "(full - wire - lock layer).",
        "",
        "| nodes | floor | wire's Python | lock layer | full | unexplained |",
        "|--:|--:|--:|--:|--:|--:|",
    ]
    for n, split in report["split"][WORKING_TREE].items():
        lines.append(
            f"| {n} | {split['floor_us']:,.1f} | {split['wire_python_us']:,.1f} | "
            f"{split['lock_layer_us']:,.1f} | {split['full_us']:,.1f} | "
            f"{split['unexplained_us']:,.1f} |"
        )
    lines += [
        "",
        "The lean row is the least Python the same operation needs (bench/resp.py, "
        "`LeanQuorum`): our acquire and release scripts with a fresh token, sent to every "
        "node at once, a quorum of replies, none of the lock's rules, pools, deadlines, "
        "records or error handling. What the full row costs beyond it is client code.",
        "",
        "| nodes | lean user µs | full user µs | full ÷ lean, user + system | full ÷ lean, wall |",
        "|--:|--:|--:|--:|--:|",
    ]
    for n, split in report["split"][WORKING_TREE].items():
        lines.append(
            f"| {n} | {split['lean_us']:,.1f} | {split['full_us']:,.1f} | "
            f"{split['full_over_lean_cpu']:.2f} | {split['full_over_lean_wall']:.2f} |"
        )
    others = [name for name in (AGAINST, COMPILED) if name in report["sides"]]
    if others:
        lines += _sides_table(report, others)
    return "\n".join(lines) + "\n"


def _sides_table(report: dict[str, Any], others: list[str]) -> list[str]:
    """CPU µs (user + system: their sum is exact, the split is sampled) of rows 3-5
    on each side, and each side over the first one: the revision ``--against`` names
    (before), else the working tree."""
    against = report["against"]
    names = dict(SIDE_NAMES)
    if against is not None:
        names[AGAINST] = f"`{against['rev']}`"
    order = [AGAINST, WORKING_TREE, COMPILED] if AGAINST in others else [WORKING_TREE, COMPILED]
    order = [name for name in order if name in report["sides"]]
    base = order[0]
    sides = ", ".join(names[name] for name in order)
    if against is not None:
        sides += f"; `{against['rev']}` is {against['sha'][:10]}"
    lines = [
        "",
        f"User + system µs by build ({sides}), each in its own worker process, alternating round "
        "after round on the same servers; compiled: the working tree with its wire layer "
        "compiled by mypyc (setup.py, `CELERY_REDLOCK_COMPILE=1`).",
        "",
        "| row | nodes | "
        + " | ".join(names[name] for name in order)
        + " | "
        + " | ".join(f"{names[name]} ÷ {names[base]}" for name in order[1:])
        + " |",
        "|---|--:|" + "--:|" * (2 * len(order) - 1),
    ]
    for n in report["sides"][WORKING_TREE]:
        for row in WORKER_ROWS:
            figures = [report["sides"][name][n][row] for name in order]
            first = figures[0]
            ratios = [
                f"{other['cpu_us'] / first['cpu_us']:.2f}"
                if "error" not in first and "error" not in other and first["cpu_us"] > 0
                else "n/a"
                for other in figures[1:]
            ]
            lines.append(
                f"| {ROW_NAMES[row]} | {n} | "
                + " | ".join(_us(f, "cpu_us") for f in figures)
                + " | "
                + " | ".join(ratios)
                + " |"
            )
    errors = [
        f"{names[name]}, {ROW_NAMES[row]}, {n} node(s): {figures['error']}"
        for name in order
        for n, rows in report["sides"][name].items()
        for row, figures in rows.items()
        if "error" in figures
    ]
    if errors:
        lines += ["", "Failed: " + "; ".join(errors) + "."]
    return lines


# -- cProfile -------------------------------------------------------------------------


def _cprofile(binary: str, operations: int, top: int) -> None:
    """Print cProfile of the working tree's 5-node acquire + release, by own time."""
    import cProfile
    import io
    import pstats

    from celery_redlock import Redlock
    from celery_redlock.testing import RedisNodes

    with RedisNodes(5, binary=binary) as cluster:
        redlock = Redlock(cluster.urls, ttl=TTL, node_timeout=NODE_TIMEOUT)
        failed = [0]
        op = _lease_op(redlock, "bench:profile:cprofile", failed)
        try:
            for _ in range(300):
                op()
            profiler = cProfile.Profile()
            gc.collect()
            profiler.enable()
            for _ in range(operations):
                op()
            profiler.disable()
        finally:
            redlock.close()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    print(f"cProfile, celery-redlock 5 nodes, {operations} operations ({failed[0]} failed)\n")
    print(out.getvalue().split("\n\n", 1)[-1].rstrip())


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--worker" in argv:
        return _worker(argv)
    from .machine import RESULTS_DIR, _write, pick_redis_server

    parser = argparse.ArgumentParser(
        prog="python -m bench profile", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument("--quick", action="store_true", help="short run; saves nothing")
    parser.add_argument("--operations", type=int, help="timed operations per row and round")
    parser.add_argument("--warmup", type=int, help="untimed operations before each row")
    parser.add_argument("--rounds", type=int, help="rounds of every row (median of them)")
    parser.add_argument("--against", metavar="REV", help="also measure celery_redlock at REV")
    parser.add_argument(
        "--compiled",
        action="store_true",
        help="also measure the working tree with its wire layer compiled (mypy, a C compiler)",
    )
    parser.add_argument("--out", type=Path, help="where profile.json and .md go")
    parser.add_argument(
        "--redis-server", default=None, help="redis-server binary (default: the newest)"
    )
    parser.add_argument(
        "--cprofile", action="store_true", help="print cProfile of the 5-node operation instead"
    )
    parser.add_argument("--top", type=int, default=25, help="functions shown by --cprofile")
    args = parser.parse_args(argv)
    given = {"operations": args.operations, "warmup": args.warmup, "rounds": args.rounds}
    plan = replace(QUICK if args.quick else FULL, **{k: v for k, v in given.items() if v})
    binary = args.redis_server or pick_redis_server()
    if args.cprofile:
        _cprofile(binary, plan.operations, args.top)
        return 0
    out = args.out if args.out is not None or args.quick else RESULTS_DIR

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    report, markdown = run(plan, binary, args.against, log, compiled=args.compiled)
    print(markdown)
    log(f"done in {report['duration_s']} s")
    if out is not None:
        _write(out / "profile.json", json.dumps(report, indent=2, ensure_ascii=False) + "\n")
        _write(out / "profile.md", markdown)
        log(f"saved {out / 'profile.json'} and {out / 'profile.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
