"""The faults: injected every few seconds at random (seeded), recorded with times.

Kinds (:data:`KINDS`), dealt from a shuffled deck so every kind comes up once per
round of six:

- ``child_kill``: SIGKILL of a prefork pool child (whatever it is doing);
- ``body_kill``: SIGKILL of a prefork pool child while it is inside a body (the body
  reported itself on the observer's ``inbody``);
- ``worker_kill``: SIGKILL of a whole worker's process group, restarted 1-3 s later;
- ``worker_pause``: SIGSTOP of a worker's group for 1.5x the largest TTL, then SIGCONT;
- ``node_pause``: SIGSTOP of 1-2 lock nodes for 1-6 s, then SIGCONT;
- ``node_kill``: SIGKILL of a lock node, restarted from its AOF only once the largest
  TTL has passed (the delayed-restart rule; with ``appendfsync always`` it would be
  safe sooner, the rule makes it safe either way).

No more than 2 of the 5 lock nodes are down or paused at once (a quorum stays up),
and a worker that is down or paused gets no second fault until it is back.
Times are ``time.monotonic_ns()``, the clock the bodies report in.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Callable, Optional

from .launch import Stack

KINDS = ("child_kill", "body_kill", "worker_kill", "worker_pause", "node_pause", "node_kill")
#: Lock nodes that may be down or paused at once (of 5: a quorum of 3 stays up).
MAX_NODES_OUT = 2


@dataclass
class Fault:
    """One injected fault: what, on which target, and when (monotonic ns)."""

    kind: str
    target: str  # worker name or lock node index
    start: int
    end: Optional[int] = None  # when it was undone (resumed, restarted); None: instant
    pids: list[int] = field(default_factory=list)  # processes SIGKILLed or SIGSTOPped
    detail: str = ""

    def as_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "target": self.target,
            "start_ns": self.start,
            "end_ns": self.end,
            "pids": self.pids,
            "detail": self.detail,
        }


@dataclass
class _Pending:
    due: float  # monotonic seconds
    action: Callable[[], None]


class Faults:
    """Injects faults into ``stack`` for :meth:`run`'s time; :meth:`heal` undoes
    whatever is still in effect."""

    def __init__(
        self,
        stack: Stack,
        rng: random.Random,
        max_ttl: float,
        every: tuple[float, float] = (5.0, 15.0),
        log: Callable[[str], None] = lambda line: None,
    ) -> None:
        self.stack = stack
        self.rng = rng
        self.max_ttl = max_ttl
        self.every = every
        self.log = log
        self.faults: list[Fault] = []
        self.errors: list[str] = []
        self._pending: list[_Pending] = []
        self._nodes_out: set[int] = set()
        self._workers_out: set[str] = set()
        self._deck: list[str] = []

    # --- the loop ---------------------------------------------------------------------

    def run(self, seconds: float) -> None:
        """Inject faults for ``seconds``, in the calling thread: a process started
        here (a restarted worker or node) dies with the thread that spawned it
        (``PR_SET_PDEATHSIG``), so it must be the main thread."""
        end = time.monotonic() + seconds
        next_at = time.monotonic() + self.rng.uniform(*self.every)
        while time.monotonic() < end:
            self._run_due(time.monotonic())
            if time.monotonic() >= next_at:
                self._inject_next()
                next_at = time.monotonic() + self.rng.uniform(*self.every)
            time.sleep(0.05)

    def _run_due(self, now: float) -> None:
        due = [p for p in self._pending if p.due <= now]
        self._pending = [p for p in self._pending if p.due > now]
        for pending in due:
            self._guarded(pending.action)

    def _guarded(self, action: Callable[[], None]) -> None:
        try:
            action()
        except Exception as error:  # a failed fault is reported, the soak goes on
            self.errors.append(f"{type(error).__name__}: {error}")
            self.log(f"fault error: {error!r}")

    def _inject_next(self) -> None:
        """Deal the next kind; one that cannot fire now goes back for later."""
        if not self._deck:
            self._deck = list(KINDS)
            self.rng.shuffle(self._deck)
        for index, kind in enumerate(self._deck):
            if self._try(kind):
                del self._deck[index]
                return

    def _try(self, kind: str) -> bool:
        try:
            return bool(getattr(self, f"_{kind}")())
        except Exception as error:  # a failed fault is reported, the soak goes on
            self.errors.append(f"{kind}: {type(error).__name__}: {error}")
            self.log(f"fault error: {kind}: {error!r}")
            return False

    def _record(self, fault: Fault) -> Fault:
        self.faults.append(fault)
        self.log(f"fault {fault.kind} on {fault.target} {fault.detail}".rstrip())
        return fault

    def _later(self, seconds: float, action: Callable[[], None]) -> None:
        self._pending.append(_Pending(time.monotonic() + seconds, action))

    def _up_workers(self) -> list[str]:
        return [name for name in self.stack.workers if name not in self._workers_out]

    # --- the kinds (each returns whether it fired) ------------------------------------

    def _kill_child(self, kind: str, pid: int, detail: str) -> bool:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        self._record(Fault(kind, "prefork", time.monotonic_ns(), pids=[pid], detail=detail))
        return True

    def _child_kill(self) -> bool:
        if "prefork" in self._workers_out:
            return False
        pool = self.stack.group_pids("prefork")[1:]
        return bool(pool) and self._kill_child("child_kill", self.rng.choice(pool), "")

    def _body_kill(self) -> bool:
        if "prefork" in self._workers_out:
            return False
        pool = set(self.stack.group_pids("prefork")[1:])
        inside = {
            int(pid): str(task_id)
            for pid, task_id in self.stack.observer.hgetall("inbody").items()
            if int(pid) in pool
        }
        if not inside:
            return False
        pid = self.rng.choice(sorted(inside))
        return self._kill_child("body_kill", pid, f"inside {inside[pid]}")

    def _worker_kill(self) -> bool:
        up = self._up_workers()
        if not up:
            return False
        name = self.rng.choice(up)
        pids = self.stack.group_pids(name)
        self.stack.workers[name].kill()
        fault = self._record(Fault("worker_kill", name, time.monotonic_ns(), pids=pids))
        self._workers_out.add(name)

        def restart() -> None:
            self.stack.restart_worker(name)
            fault.end = time.monotonic_ns()
            self._workers_out.discard(name)
            self.log(f"worker {name} restarted")

        self._later(self.rng.uniform(1.0, 3.0), restart)
        return True

    def _worker_pause(self) -> bool:
        up = self._up_workers()
        if not up:
            return False
        name = self.rng.choice(up)
        pids = self.stack.group_pids(name)
        self.stack.pause_worker(name)
        seconds = 1.5 * self.max_ttl
        fault = self._record(
            Fault("worker_pause", name, time.monotonic_ns(), pids=pids, detail=f"{seconds:g}s")
        )
        self._workers_out.add(name)

        def resume() -> None:
            self.stack.resume_worker(name)
            fault.end = time.monotonic_ns()
            self._workers_out.discard(name)

        self._later(seconds, resume)
        return True

    def _free_nodes(self) -> list[int]:
        return [i for i in range(len(self.stack.nodes)) if i not in self._nodes_out]

    def _node_pause(self) -> bool:
        room = MAX_NODES_OUT - len(self._nodes_out)
        if room < 1:
            return False
        chosen = self.rng.sample(self._free_nodes(), self.rng.randint(1, room))
        seconds = self.rng.uniform(1.0, 6.0)
        for index in chosen:
            node = self.stack.nodes[index]
            pid = node.pid
            node.pause()
            self._nodes_out.add(index)
            fault = self._record(
                Fault(
                    "node_pause",
                    str(index),
                    time.monotonic_ns(),
                    pids=[pid] if pid else [],
                    detail=f"{seconds:.1f}s",
                )
            )
            self._later(seconds, self._resumer(index, fault))
        return True

    def _resumer(self, index: int, fault: Fault) -> Callable[[], None]:
        def resume() -> None:
            self.stack.nodes[index].resume()
            fault.end = time.monotonic_ns()
            self._nodes_out.discard(index)

        return resume

    def _node_kill(self) -> bool:
        if len(self._nodes_out) >= MAX_NODES_OUT:
            return False
        index = self.rng.choice(self._free_nodes())
        node = self.stack.nodes[index]
        pid = node.pid
        node.kill()
        self._nodes_out.add(index)
        # The delayed-restart rule: down longer than the largest TTL (and its drift).
        seconds = self.max_ttl * 1.1 + self.rng.uniform(0.5, 2.0)
        fault = self._record(
            Fault(
                "node_kill",
                str(index),
                time.monotonic_ns(),
                pids=[pid] if pid else [],
                detail=f"restart after {seconds:.1f}s",
            )
        )

        def restart() -> None:
            node.restart(keep_data=True)
            fault.end = time.monotonic_ns()
            self._nodes_out.discard(index)

        self._later(seconds, restart)
        return True

    # --- after the send phase -----------------------------------------------------------

    def heal(self) -> None:
        """Undo every fault still in effect, each at its own time (a killed node is
        still restarted only once its delay has passed)."""
        for pending in sorted(self._pending, key=lambda p: p.due):
            time.sleep(max(0.0, pending.due - time.monotonic()))
            self._guarded(pending.action)
        self._pending = []

    def counts(self) -> dict[str, int]:
        return {kind: sum(f.kind == kind for f in self.faults) for kind in KINDS}

    def __iter__(self) -> Iterator[Fault]:
        return iter(self.faults)
