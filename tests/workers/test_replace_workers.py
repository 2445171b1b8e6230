"""``redlock_on_queued="replace"`` with real ``celery worker`` subprocesses and callers
in 4 processes, with faults: a lock node SIGSTOPped mid-run, a body SIGKILLed.

100 enqueues of one key from 4 processes in about 2 s, each with its own arguments
(a version) and the same countdown (a debounce), while the workers run. Judged by the
observer (the bodies report their task id and version), never by the lock's word:
every task ends SUCCESS; a copy whose result is the ``Replaced`` marker never ran its
body and its marker names a copy that was sent; every copy not replaced ran; and the
copy whose enqueue returned last ran, with its arguments.
"""

from __future__ import annotations

import multiprocessing
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from celery.result import AsyncResult

from celery_redlock import is_replaced
from tests.apps import limitsapp
from tests.support.observed import runs
from tests.support.workers import Launch, Stack, wait_all
from tests.workers.test_limits_workers import Pool, fault

pytestmark = pytest.mark.slow

#: The debounce: every call's countdown (seconds).
DEBOUNCE = 0.5


def _callers(
    broker_url: str, nodes: list[str], process: int, count: int, seconds: float, out: Any
) -> None:
    try:
        task = limitsapp.replacing_client(broker_url, nodes)

        def call(i: int) -> tuple[str, int, int]:
            version = process * 1000 + i
            time.sleep(0.08 * i)  # 25 calls over 2 s
            result = task.apply_async(
                kwargs={"tag": "r", "version": version, "seconds": seconds, "counter": "repl"},
                countdown=DEBOUNCE,
            )
            return result.id, version, time.monotonic_ns()

        with ThreadPoolExecutor(4) as pool:
            out.put(list(pool.map(call, range(count))))
    except BaseException as exc:  # report it: a silent child would hang the test
        out.put(repr(exc))
        raise


@pytest.mark.parametrize(
    ("pool", "kind"),
    [
        (Pool("prefork", 2, 4), "none"),
        (Pool("prefork", 2, 4), "node-stopped"),
        (Pool("prefork", 2, 4), "holder-killed"),
        (Pool("gevent", 2, 10), "none"),
    ],
    ids=["prefork-none", "prefork-node-stopped", "prefork-holder-killed", "gevent-none"],
)
def test_100_replacing_enqueues_from_4_processes_run_only_copies_nobody_replaced(
    stack: Stack, launch: Launch, pool: Pool, kind: str
) -> None:
    launch("limitsapp", pool.workers, pool=pool.name, concurrency=pool.concurrency)
    seconds = 1.0 if kind == "holder-killed" else 0.05  # a body there is to kill
    ctx = multiprocessing.get_context("fork")
    out: Any = ctx.Queue()
    procs = [
        ctx.Process(
            target=_callers,
            args=(stack.broker.url, stack.nodes.urls, p, 25, seconds, out),
        )
        for p in range(4)
    ]
    for proc in procs:
        proc.start()
    with fault(stack, launch, pool, kind, "repl", after=1 if kind != "none" else 4):
        reports = [out.get(timeout=120) for _ in procs]
        for proc in procs:
            proc.join(10)
        assert [r for r in reports if isinstance(r, str)] == []  # no caller failed
        sent = {task_id: (version, done) for report in reports for task_id, version, done in report}
        assert len(sent) == 100
        results = [AsyncResult(task_id, app=stack.client) for task_id in sent]
        wait_all(results, timeout=120)
    states = {r.id: r.state for r in results}
    assert [s for s in states.values() if s != "SUCCESS"] == [], states
    replaced = {r.id: r.result["by"] for r in results if is_replaced(r.result)}
    assert set(replaced.values()) <= set(sent)  # each names a copy that was sent
    ran = runs(stack.observer, "repl")
    assert set(ran) == set(sent) - set(replaced)  # no replaced copy ran; every other did
    versions = {str(k): int(v) for k, v in stack.observer.hgetall("versions:repl").items()}
    last = max(sent, key=lambda task_id: sent[task_id][1])
    assert last in ran and versions[last] == sent[last][0]
    reruns = sum(n - 1 for n in ran.values())
    assert reruns == 0 or kind == "holder-killed"
    print(
        f"replace, {pool.name} {pool.workers}x-c{pool.concurrency}, fault {kind}: 100 tasks "
        f"SUCCESS, {len(replaced)} replaced, {len(ran)} ran ({reruns} again after a kill)"
    )
