"""tools/containers/compose_check.py without Docker: what it reads from a worker's log.

The check itself runs the compose stack (CI: tools/containers/compose-check.sh).
"""

from __future__ import annotations

from datetime import datetime

from tools.containers.compose_check import taken_before

A, B, C = (
    "a4984f16-ea85-4f05-a495-2a5271fe1c43",
    "0ec39c9b-8511-42d6-8742-063c0cc5e238",
    "7f6294e5-0227-4a3c-aeb1-cebacf17a701",
)
#: A worker's log as `docker logs` gives it: received A and B, killed, started again, C.
LOG = "\n".join(
    [
        "[2026-11-28 10:11:28,836: INFO/MainProcess] worker2@c2 ready.",
        f"[2026-11-28 10:11:44,685: INFO/MainProcess] Task example_project.import[{A}] received",
        f"[2026-11-28 10:11:45,103: INFO/ForkPoolWorker-1] example_project.import[{A}]: import",
        f"[2026-11-28 10:11:45,900: INFO/MainProcess] Task example_project.report[{B}] received",
        "[2026-11-28 10:11:54,307: INFO/MainProcess] worker2@c2 ready.",
        f"[2026-11-28 10:11:55,002: INFO/MainProcess] Task example_project.report[{C}] received",
    ]
)


def test_the_tasks_taken_before_the_kill_are_those_received_before_it() -> None:
    killed = datetime(2026, 11, 28, 10, 11, 46)
    assert taken_before(LOG, killed) == {A, B}
    assert taken_before(LOG, datetime(2026, 11, 28, 10, 11, 44)) == set()
