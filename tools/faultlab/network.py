"""Rows 5 and 8 of the fault matrix, faults in the network (FaultProxy): replies
held past validity (also with the client itself paused mid-round), and a watchdog's
renewals cut off by blackholed nodes. See tests/lock/test_faults.py for the matrix."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Optional

from celery_redlock import Lease, LockLost, QuorumUnavailable, Redlock
from celery_redlock.lock.redlock import CLOCK_PRECISION
from celery_redlock.testing import FaultProxy

from .evidence import NS, OracleLog, RecordingClock, now_ns, read_events
from .holders import ProbeConfig
from .lab import (
    PATIENCE,
    Lab,
    RowResult,
    expect_safe,
    holder_command,
    holder_env,
    read_line,
)
from .oracle import check
from .scanner import leftover_keys

# -- row 5: late replies ------------------------------------------------------------


def late_replies(lab: Lab, seed: int, trials: int = 12) -> RowResult:
    """Replies from 3 of 5 nodes are held back by the proxy and let go: as soon as the
    SETs are seen on those nodes (early: the control, which must be granted), or a
    random delay after that sighting, past validity but before the round's deadline
    (late: the quorum is read, and must be refused), or past the deadline.

    ttl 1 s, drift_factor 0.1 (margin 102 ms), node_timeout 0.98 s: validity is gone
    at 0.898 s, the round ends at 0.98 s. The early band waits for an event, not a
    time, so a loaded machine leaves it most of the validity. Leases are judged by
    the lock's own last clock reading (RecordingClock), so a client descheduled after
    acquire() decided is not mistaken for one that returned a dead lease.
    """
    rng = random.Random(seed)
    ttl, drift, node_timeout = 1.0, 0.1, 0.98
    margin = ttl * drift + 0.002
    cluster = lab.make_cluster(5)
    proxies = [lab.make_proxy(server) for server in cluster]
    direct = [server.client() for server in cluster]
    clock = RecordingClock()
    client = Redlock(
        [p.url for p in proxies],
        ttl=ttl,
        node_timeout=node_timeout,
        drift_factor=drift,
        clock=clock,
    )
    warm = client.acquire("late:warm", blocking=False)  # connections set up, ready
    if warm is not None:
        warm.release()
    directory = lab.scratch("late-replies")
    log = OracleLog(directory / "client.jsonl", "client")
    bands: dict[str, Optional[tuple[float, float]]] = {
        "early": None,
        "late": (0.91, 0.96),
        "after": (1.0, 1.2),
    }
    outcomes: dict[str, Counter[str]] = {band: Counter() for band in bands}
    violations: list[str] = []
    for trial in range(trials):
        band = list(bands)[trial % len(bands)]
        window = bands[band]
        delay = None if window is None else rng.uniform(*window)
        held = sorted(rng.sample(range(5), 3))
        for index in held:
            proxies[index].hold_replies()
        key = f"late:{trial}"
        let_go: list[int] = []
        call = now_ns()

        def release_later(
            held: list[int] = held,
            delay: Optional[float] = delay,
            key: str = key,
            let_go: list[int] = let_go,
        ) -> None:
            # The SETs are seen on the held nodes only after the round began, so a
            # delay counted from that sighting is at least as long on the lock's own
            # clock: "late" is late by construction, however late this thread woke.
            give_up = time.monotonic() + PATIENCE
            while sum(direct[i].exists(key) for i in held) < len(held):
                if time.monotonic() > give_up:
                    break
                time.sleep(0.0005)
            if delay is not None:
                time.sleep(delay)
            let_go.append(now_ns())
            for index in held:
                proxies[index].release_replies()

        timer = threading.Thread(target=release_later)
        timer.start()
        outcome = "contended"
        lease = None
        try:
            lease = client.acquire(key, blocking=False)
        except QuorumUnavailable:
            outcome = "unavailable"
        checked = clock.last_ns()
        end = now_ns()
        timer.join()
        if lease is not None:
            outcome = "granted"
            log.acquired(
                key, lease.token, None, call, end, lease.deadline, lease.ttl, checked_ns=checked
            )
            if let_go[0] >= round(lease.deadline * NS):
                violations.append(
                    f"{key}: granted although no quorum could answer before its validity ended"
                )
            decided = end if checked is None else checked
            if decided - call >= ttl * NS:
                violations.append(f"{key}: granted {(decided - call) / NS:.3f}s after the call")
            log.released(key, lease.token, now_ns())
            lease.release()
        log.attempt(key, call, end, outcome)
        outcomes[band][outcome] += 1
        for index in held:
            proxies[index].heal()
    log.close()
    client.close()
    time.sleep(ttl + 0.1)
    left = leftover_keys(cluster.urls)
    report = check(read_events(directory))
    result = RowResult("5-late-replies", seed, report, violations)
    expect_safe(result)
    result.metrics.update(
        trials=trials,
        validity_gone_at_s=round(ttl - margin, 3),
        outcomes={band: dict(c) for band, c in outcomes.items()},
    )
    result.expect(
        not outcomes["late"]["granted"] and not outcomes["after"]["granted"],
        "a lease was granted from replies that came after its validity",
    )
    result.expect(outcomes["early"]["granted"] > 0, "no early release was granted (no control)")
    result.expect(not left, f"keys left after the TTL: {left}")
    return result


def late_replies_paused_client(lab: Lab, seed: int, trials: int = 2) -> RowResult:
    """The client itself is SIGSTOPped inside its acquire round while 3 replies are
    held; they arrive while it is stopped and it reads them only after more than a
    TTL: elapsed >= ttl, and the lock must refuse.

    The stop is sent once the client's SETs have reached a quorum of nodes (seen
    through direct connections), so its round has begun; a trial where the round
    still ended before the stop (the parent was too slow) is void and repeated."""
    rng = random.Random(seed)
    ttl, node_timeout = 0.5, 0.2
    cluster = lab.make_cluster(5)
    proxies = [lab.make_proxy(server) for server in cluster]
    directory = lab.scratch("late-paused")
    config = ProbeConfig(
        label="probe",
        urls=[p.url for p in proxies],
        log_path=str(directory / "probe.jsonl"),
        ttl=ttl,
        node_timeout=node_timeout,
    )
    path = config.dump(directory / "probe.json")
    proc = subprocess.Popen(
        holder_command("probe", path),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=holder_env(),
    )
    problems: list[str] = []
    results: list[dict[str, Any]] = []
    void = 0
    direct = [server.client() for server in cluster]
    assert proc.stdin is not None

    def say(line: str) -> None:
        assert proc.stdin is not None
        proc.stdin.write(line + "\n")
        proc.stdin.flush()

    try:
        if read_line(proc, 30) != "ready":
            raise RuntimeError("probe did not start")
        say("acquire paused:warm")
        read_line(proc, 5)
        read_line(proc, 5)
        for trial in range(trials * 3):
            if len(results) == trials:
                break
            key = f"paused:{trial}"
            held = rng.sample(proxies, 3)
            for proxy in held:
                proxy.hold_replies()
            say(f"acquire {key}")
            if read_line(proc, 5) != "starting":
                raise RuntimeError("probe did not start its acquire")
            give_up = time.monotonic() + 2
            while sum(1 for c in direct if c.exists(key)) < 3 and time.monotonic() < give_up:
                time.sleep(0.0005)  # its SETs are out: it waits on the held replies now
            stopped = now_ns()
            os.kill(proc.pid, signal.SIGSTOP)
            for proxy in held:
                proxy.release_replies()  # the replies reach a stopped client
            time.sleep(ttl + rng.uniform(0.05, 0.2))
            os.kill(proc.pid, signal.SIGCONT)
            answer = json.loads(read_line(proc, 10))
            answer["stopped_after_call_s"] = round((stopped - answer["call_ns"]) / NS, 4)
            for proxy in held:
                proxy.heal()
            if answer["elapsed"] < ttl:
                void += 1  # the round was over before the stop
                continue
            results.append(answer)
        say("quit")
        proc.wait(10)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
    time.sleep(ttl + 0.1)
    left = leftover_keys(cluster.urls)
    report = check(read_events(directory))
    result = RowResult("5-late-replies-paused-client", seed, report, problems)
    expect_safe(result)
    result.metrics.update(trials=len(results), void=void, answers=results)
    result.expect(bool(results), f"no trial paused the client inside its round ({void} void)")
    for answer in results:
        result.expect(answer["outcome"] != "granted", f"granted after validity ran out: {answer}")
    result.expect(not left, f"keys left after the TTL: {left}")
    return result


# -- row 8: extension failure under the watchdog -----------------------------------------------


@dataclass
class _RenewalSetup:
    ttl: float
    holder: Redlock  # through the proxies
    foreigner: Redlock  # direct, holds another key on the same nodes
    contender: Redlock  # direct, wants the holder's key
    proxies: list[FaultProxy]
    direct: list[Any]  # redis.Redis per node
    log_w: OracleLog
    log_c: OracleLog


def extension_failure(lab: Lab, seed: int, trials: int = 3) -> RowResult:
    """A watchdog-renewed lease loses 3 of its 5 nodes (blackholed) mid-hold: the loss
    is reported before the deadline; ``held`` is never True past the deadline; no
    renewal whose round started once the nodes were cut off succeeds; another client's
    key on the same nodes keeps its expiry; a contender gets the key only after the
    lost lease's deadline.

    ttl 3 s and node_timeout 0.3 s (renewals at ttl/3 = 1 s): a loaded machine's
    scheduling delays stay small beside both. Nothing is timed by a guess: the cut
    waits for a first renewal, is timed after the last blackhole() returned, a renewal
    counts as late only if its round started after that (its new deadline says when:
    ``deadline - ttl + margin``), the foreign key's expiry is bracketed by each
    reading's send and return times, and the contender is waited for until well past
    the lost lease's deadline."""
    rng = random.Random(seed)
    ttl, node_timeout = 3.0, 0.3
    cluster = lab.make_cluster(5)
    proxies = [lab.make_proxy(server) for server in cluster]
    directory = lab.scratch("extension-failure")
    setup = _RenewalSetup(
        ttl=ttl,
        holder=Redlock([p.url for p in proxies], ttl=ttl, node_timeout=node_timeout),
        foreigner=Redlock(cluster.urls, ttl=30, node_timeout=node_timeout),
        contender=Redlock(cluster.urls, ttl=ttl, node_timeout=node_timeout),
        proxies=proxies,
        direct=[server.client() for server in cluster],
        log_w=OracleLog(directory / "watched.jsonl", "watched"),
        log_c=OracleLog(directory / "contender.jsonl", "contender"),
    )
    problems: list[str] = []
    timings: list[dict[str, float]] = []
    for trial in range(trials):
        timings.append(_renewal_trial(setup, trial, rng, problems))
    setup.log_w.close()
    setup.log_c.close()
    for client in (setup.holder, setup.foreigner, setup.contender):
        client.close()
    report = check(read_events(directory))
    result = RowResult("8-extension-failure", seed, report, problems)
    expect_safe(result)
    contender_wins = sum(1 for w in report.windows if w.label == "contender")
    result.metrics.update(trials=trials, timings=timings, contender_wins=contender_wins)
    result.expect(contender_wins == trials, f"the contender won {contender_wins} of {trials}")
    return result


#: Redis keeps expiry in whole milliseconds; a bracketed expiry may be off by this.
EXPIRY_ROUNDING = 0.002


def _expiries(clients: list[Any], key: str) -> list[tuple[Any, float, float]]:
    """Per node: (value, earliest, latest) expiry of ``key`` on time.monotonic(), from
    a PTTL bracketed by the times the request was sent and the reply came back."""
    found = []
    for client in clients:
        pipe = client.pipeline(transaction=True)
        pipe.get(key)
        pipe.pttl(key)
        sent = time.monotonic()
        value, pttl = pipe.execute()
        back = time.monotonic()
        found.append((value, sent + pttl / 1000, back + pttl / 1000 + EXPIRY_ROUNDING))
    return found


def _renewal_trial(
    setup: _RenewalSetup, trial: int, rng: random.Random, problems: list[str]
) -> dict[str, float]:
    ttl, log_w, log_c = setup.ttl, setup.log_w, setup.log_c
    margin = ttl * setup.holder.drift_factor + CLOCK_PRECISION
    key, foreign_key = f"renewed:{trial}", f"foreign:{trial}"
    # Tried until won: the reference key is set-up, not what is tested; one round
    # stalled past its deadline on a busy machine must not end the trial.
    foreign = setup.foreigner.acquire(foreign_key, timeout=PATIENCE)
    assert foreign is not None, f"{foreign_key} not acquired in {PATIENCE} s"
    # acquire() returns once a quorum answered: the last SETs may still be on their
    # way. The reference reading waits until every node has the key.
    give_up = time.monotonic() + PATIENCE
    while not all(client.get(foreign_key) == foreign.value.encode() for client in setup.direct):
        assert time.monotonic() < give_up, f"{foreign_key} never reached every node"
        time.sleep(0.001)
    foreign_before = _expiries(setup.direct, foreign_key)
    extended: list[tuple[int, float]] = []
    lost: list[tuple[int, float, Optional[str]]] = []
    samples: list[tuple[float, bool, float]] = []
    stop = threading.Event()
    renewed_once = threading.Event()
    lost_once = threading.Event()

    def on_extended(lease: Lease) -> None:
        extended.append((now_ns(), lease.deadline))
        log_w.extended(lease.key, lease.token, lease.deadline)
        renewed_once.set()

    def on_lost(lease: Lease) -> None:
        # The deadline it had when the failed renewal marked it lost.
        lost.append((now_ns(), lease.deadline, lease.lost_reason))
        lost_once.set()

    def watch(lease: Lease) -> None:
        while not stop.is_set():
            before = time.monotonic()
            held = lease.held
            samples.append((before, held, lease.deadline))
            time.sleep(0.001)

    def contend() -> None:
        while not stop.is_set():
            start = now_ns()
            try:
                won = setup.contender.acquire(key, blocking=False)
            except QuorumUnavailable:
                won = None
            log_c.attempt(key, start, now_ns(), "contended" if won is None else "granted")
            if won is not None:
                log_c.acquired(key, won.token, None, start, now_ns(), won.deadline, won.ttl)
                log_c.released(key, won.token, now_ns())
                won.release()
                return
            time.sleep(0.01)

    call = now_ns()
    # The trial loses the lease on purpose: leaving the block says so (LockLost).
    with (
        contextlib.suppress(LockLost),
        setup.holder.lock(key, blocking=False, auto_extend=True) as lease,
    ):
        first_deadline = lease.deadline
        log_w.acquired(key, lease.token, None, call, now_ns(), lease.deadline, lease.ttl)
        lease.on_extended(on_extended)
        lease.on_lost(on_lost)
        watcher = threading.Thread(target=watch, args=(lease,))
        rival = threading.Thread(target=contend)
        watcher.start()
        rival.start()
        if not renewed_once.wait(PATIENCE):
            problems.append(f"trial {trial}: the watchdog never renewed the lease")
        time.sleep(rng.uniform(0.0, ttl / 3))  # anywhere in the renewal cycle
        cut = sorted(rng.sample(range(5), 3))
        for index in cut:
            setup.proxies[index].blackhole()
        cut_done = now_ns()  # every blackhole() has taken effect
        lost_once.wait(max(0.0, lease.deadline - time.monotonic()) + PATIENCE)
        # The contender gets in once the cut nodes' keys expire, by the last deadline.
        rival.join(max(0.0, lease.deadline - time.monotonic()) + ttl + PATIENCE)
        stop.set()
        watcher.join()
        rival.join()
        if lost:
            log_w.lost(key, lease.token, lost[0][2])
        log_w.released(key, lease.token, now_ns())
    foreign_after = _expiries(setup.direct, foreign_key)
    foreign.release()
    for index in cut:
        # The partition heals and its connections are reset (what was blackholed is
        # gone for good; see the note in the module docstring).
        setup.proxies[index].heal()
        setup.proxies[index].reset()
    promised = max([first_deadline] + [d for _, d in extended])
    past_deadline = [s for s in samples if s[1] and s[0] >= s[2]]
    # A renewal's round began at (its new deadline) - ttl + margin.
    late_renewals = [d for _, d in extended if d - ttl + margin > cut_done / NS]
    timing: dict[str, float] = {"cut_at_s": round((cut_done - call) / NS, 3)}
    if lost:
        lost_ns = lost[0][0]
        timing["noticed_after_cut_s"] = round((lost_ns - cut_done) / NS, 3)
        timing["noticed_before_deadline_s"] = round(promised - lost_ns / NS, 3)
        if lost_ns / NS >= promised:
            problems.append(f"trial {trial}: loss reported after the deadline ({timing})")
        if abs(lost[0][1] - promised) > 1e-6:
            problems.append(f"trial {trial}: lost lease's deadline is not the last one promised")
    else:
        problems.append(f"trial {trial}: the loss was never reported")
    if len(lost) > 1:
        problems.append(f"trial {trial}: on_lost ran {len(lost)} times")
    if past_deadline:
        problems.append(f"trial {trial}: lease.held was True past its deadline")
    if late_renewals:
        problems.append(f"trial {trial}: renewed by a round that began after the cut")
    for node, (before, after) in enumerate(zip(foreign_before, foreign_after)):
        value_ok = before[0] == after[0] == foreign.value.encode()
        # Its expiry never moved: the two brackets of it overlap.
        same_expiry = max(before[1], after[1]) <= min(before[2], after[2])
        if not value_ok or not same_expiry:
            problems.append(
                f"trial {trial}: foreign key on node {node} changed: {before} -> {after}"
            )
    timing["samples"] = len(samples)
    return timing
