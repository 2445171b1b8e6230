"""Rows 1-4 of the fault matrix: the contention baseline, then lock nodes killed,
restarted empty (at once: the negative control the checker must catch; or after the
TTL) and stopped (quorum loss). See tests/lock/test_faults.py for the matrix."""

from __future__ import annotations

import random
import time
from collections import Counter
from typing import Optional

from celery_redlock import Lease, QuorumUnavailable, Redlock

from .evidence import NS, OracleLog, now_ns, read_events, read_store
from .lab import (
    NODE_TIMEOUT,
    PATIENCE,
    Fleet,
    Lab,
    RowResult,
    expect_safe,
    key_text,
    percentile,
    seconds_since,
    stream_config,
)
from .oracle import Report, check
from .scanner import TtlScanner, leftover_keys

# -- row 1: contention baseline ---------------------------------------------------------------


def contention(
    lab: Lab, seed: int, seconds: float = 8.0, processes: int = 6, keys: int = 3
) -> RowResult:
    """Processes fight over a few keys with random holds, expiries, late releases and
    watchdog renewals; a scanner checks that every lock key and tombstone has a TTL.

    Runs ``seconds``, then on until every key was won and there were 20 grants per
    key (a loaded machine takes longer to get there; the row does not count on it)."""
    rng = random.Random(seed)
    cluster = lab.make_cluster(5)
    observer = lab.make_server()
    fleet = Fleet(lab.scratch("contention"))
    names = [f"hot:{i}" for i in range(keys)]
    ttl = 0.5
    for i in range(processes):
        blocking = i % 2 == 0
        fleet.spawn(
            stream_config(
                fleet,
                f"p{i}",
                rng,
                urls=cluster.urls,
                keys=names,
                ttl=ttl,
                fencing=True,
                observer_url=observer.url,
                hold=(0.0, 0.03),
                abandon=0.05,
                auto_extend=0.05,
                wait=(0.05, 0.6) if blocking else (0.0, 0.0),
                idle=(0.0, 0.005) if blocking else (0.001, 0.01),
            )
        )
    scanner = TtlScanner(cluster.urls).start()
    wanted = 20 * keys
    try:
        start = fleet.go(seconds + PATIENCE)
        time.sleep(seconds)
        fleet.wait_for(
            lambda seen: seen.acquisitions >= wanted and len({w.key for w in seen.windows}) == keys
        )
        fleet.stop()
        problems = fleet.join(timeout=30)
    finally:
        scanner.stop()
        fleet.close()
    report = check(fleet.events(), read_store(observer.client(), names))
    result = RowResult("1-contention", seed, report, problems)
    expect_safe(result)
    per_key = Counter(w.key for w in report.windows)
    outcomes = Counter(a.outcome for a in report.attempts)
    result.metrics.update(
        seconds=seconds_since(start, now_ns()),
        per_key=dict(per_key),
        outcomes=dict(outcomes),
        extensions=sum(1 for e in fleet.events() if e.get("ev") == "extend"),
        lost=sum(1 for w in report.windows if w.lost_ns is not None),
        keys_seen={kind: len(found) for kind, found in scanner.seen.items()},
        keys_without_ttl=[(i, k.decode()) for i, k in scanner.without_ttl[:10]],
        scanner_sweeps=scanner.sweeps,
    )
    result.expect(
        report.acquisitions >= wanted,
        f"only {report.acquisitions} acquisitions in {PATIENCE + seconds:g}s (starved?)",
    )
    result.expect(len(per_key) == keys, f"some key was never won: {dict(per_key)}")
    result.expect(not scanner.without_ttl, f"keys without a TTL: {scanner.without_ttl[:10]}")
    result.expect(bool(scanner.seen["lock"]), "the scanner never saw a lock key")
    result.expect(report.writes > 0, "no fenced write reached the store")
    return result


# -- row 2: minority crash with a delayed restart -------------------------------------------


def minority_crash(lab: Lab, seed: int, phase: float = 1.5) -> RowResult:
    """SIGKILL 2 of 5 nodes during a stream; restart them empty once more than a TTL
    has passed. No overlaps, and grants before, during and after: each phase lasts
    about ``phase`` seconds and then until it has seen 3 grants."""
    rng = random.Random(seed)
    cluster = lab.make_cluster(5)
    observer = lab.make_server()
    fleet = Fleet(lab.scratch("minority-crash"))
    names = ["crash:a", "crash:b"]
    ttl = 0.5
    for i in range(4):
        fleet.spawn(
            stream_config(
                fleet,
                f"p{i}",
                rng,
                urls=cluster.urls,
                keys=names,
                ttl=ttl,
                fencing=True,
                observer_url=observer.url,
                hold=(0.0, 0.05),
                abandon=0.15,
                wait=(0.05, 0.4),
                idle=(0.0, 0.01),
            )
        )
    victims = sorted(rng.sample(range(5), 2))
    down_for = ttl * rng.uniform(2.0, 3.0)
    wanted = 3

    def enough_since(since: int) -> bool:
        return fleet.wait_for(lambda seen: len(seen.granted_between(since, now_ns())) >= wanted)

    try:
        start = fleet.go(phase * 3 + down_for + PATIENCE * 3)
        time.sleep(phase * rng.uniform(0.8, 1.2))
        enough_since(start)
        killed = now_ns()
        for index in victims:
            cluster[index].kill()
        killed_all = now_ns()
        time.sleep(max(0.0, killed / NS + down_for - time.monotonic()))
        enough_since(killed_all)  # 3 of 5 are enough
        restarting = now_ns()
        for index in victims:
            cluster[index].restart(keep_data=False)
        restarted = now_ns()
        time.sleep(phase)
        enough_since(restarted)
        stopped = now_ns()
        fleet.stop()
        problems = fleet.join()
    finally:
        fleet.close()
    report = check(fleet.events(), read_store(observer.client(), names))
    result = RowResult("2-minority-crash", seed, report, problems)
    expect_safe(result)
    phases = {
        "before": len(report.granted_between(start, killed)),
        "down": len(report.granted_between(killed_all, restarting)),
        "after": len(report.granted_between(restarted, stopped)),
    }
    result.metrics.update(
        victims=victims,
        down_s=round((restarting - killed) / NS, 3),
        restart_s=round((restarted - restarting) / NS, 3),
        grants_per_phase=phases,
        outcomes=dict(Counter(a.outcome for a in report.attempts)),
    )
    result.expect(restarting - killed > ttl * NS, "the restart was not delayed past the TTL")
    for name, count in phases.items():
        result.expect(count >= wanted, f"only {count} grants in phase {name!r}")
    return result


# -- row 3: the negative control ----------------------------------------------------------------


def restart_control(lab: Lab, seed: int, delayed: bool) -> RowResult:
    """Two clients steered to quorums that share one node, which crashes and comes back
    empty: at once (unsafe -- the checker must see the overlap) or after > TTL (safe).

    A reaches {shared, a1, a2}; B reaches {shared, b1, b2}. A tries until it wins (up
    to PATIENCE); then B tries until it wins: in
    the immediate case for as long as A is valid (A's lease is 30 s, so however long
    the restart takes on a loaded machine, B's win falls inside it: the overlap is
    there by construction); in the delayed case until PATIENCE after the restart.
    """
    rng = random.Random(seed)
    ttl = 1.5
    ttl_a = ttl if delayed else 30.0
    cluster = lab.make_cluster(5)
    order = list(range(5))
    rng.shuffle(order)
    shared, only_a, only_b = order[0], order[1:3], order[3:5]
    proxies_a = [lab.make_proxy(server) for server in cluster]
    proxies_b = [lab.make_proxy(server) for server in cluster]
    for index in only_b:
        proxies_a[index].blackhole()
    for index in only_a:
        proxies_b[index].blackhole()
    client_a = Redlock([p.url for p in proxies_a], ttl=ttl_a, node_timeout=NODE_TIMEOUT)
    client_b = Redlock([p.url for p in proxies_b], ttl=ttl, node_timeout=NODE_TIMEOUT)
    directory = lab.scratch("control-delayed" if delayed else "control-immediate")
    log_a = OracleLog(directory / "A.jsonl", "A")
    log_b = OracleLog(directory / "B.jsonl", "B")
    key = "control"
    result = RowResult("3-control-delayed" if delayed else "3-control-immediate", seed, Report())

    def attempt(client: Redlock, log: OracleLog) -> Optional[Lease]:
        call = now_ns()
        try:
            lease = client.acquire(key, blocking=False)
        except QuorumUnavailable:
            log.attempt(key, call, now_ns(), "unavailable")
            return None
        end = now_ns()
        log.attempt(key, call, end, "granted" if lease else "contended")
        if lease is not None:
            log.acquired(key, lease.token, None, call, end, lease.deadline, lease.ttl)
        return lease

    # A tries until it wins (each try one round, logged for the checker): a round
    # stalled past its 50 ms deadline on a busy machine is not what this row tests.
    lease_a = attempt(client_a, log_a)
    give_up_a = time.monotonic() + PATIENCE
    while lease_a is None and time.monotonic() < give_up_a:
        time.sleep(0.02)
        lease_a = attempt(client_a, log_a)
    result.expect(lease_a is not None, "A did not win through {shared, a1, a2}")
    killed = now_ns()
    cluster[shared].kill()
    if not delayed:
        cluster[shared].restart(keep_data=False)
    restarted: Optional[int] = now_ns() if not delayed else None
    lease_b: Optional[Lease] = None
    restart_at = killed / NS + ttl * rng.uniform(1.2, 1.5)
    if delayed:
        give_up = restart_at + PATIENCE
    else:
        give_up = lease_a.deadline if lease_a is not None else time.monotonic()
    while lease_b is None and time.monotonic() < give_up:
        if restarted is None and time.monotonic() >= restart_at:
            cluster[shared].restart(keep_data=False)
            restarted = now_ns()
            give_up = restarted / NS + PATIENCE
        lease_b = attempt(client_b, log_b)
        if lease_b is None:
            time.sleep(0.02)
    # A never lets go: it is mid-work for its whole validity (its keys expire). B works
    # a little, then releases.
    if lease_b is not None:
        time.sleep(0.2)
        log_b.released(key, lease_b.token, now_ns())
        lease_b.release()
    log_a.close()
    log_b.close()
    client_a.close()
    client_b.close()
    for proxy in (*proxies_a, *proxies_b):
        proxy.heal()
    result.report = check(read_events(directory))
    overlaps = result.report.overlaps
    result.metrics.update(
        shared=shared,
        only_a=only_a,
        only_b=only_b,
        restart_after_s=None if restarted is None else round((restarted - killed) / NS, 3),
        b_won=lease_b is not None,
    )
    if lease_a is not None and lease_b is not None:
        window_a = next(w for w in result.report.windows if w.token == lease_a.token)
        window_b = next(w for w in result.report.windows if w.token == lease_b.token)
        result.metrics["b_won_after_a_deadline_s"] = round(
            (window_b.start_ns - window_a.deadline_ns) / NS, 3
        )
    result.expect(lease_b is not None, "B never won the lock")
    if delayed:
        expect_safe(result)
    else:
        # The control: the unsafe restart MUST show up as an overlap of A and B.
        result.metrics["overlap_ms"] = [round(o.overlap_ns / 1e6, 1) for o in overlaps]
        result.expect(
            len(overlaps) == 1
            and {overlaps[0].first.label, overlaps[0].second.label} == {"A", "B"},
            f"the checker did not catch the unsafe restart: {len(overlaps)} overlaps",
        )
    return result


# -- row 4: quorum loss ------------------------------------------------------------


def quorum_loss(lab: Lab, seed: int, phase: float = 1.0) -> RowResult:
    """SIGSTOP 3 of 5 during a stream: no grants while they are stopped, each attempt
    ends after one node_timeout, not several (the median under 2 x node_timeout), and once they
    continue, the SETs they had queued are cleaned up or expire: nothing is left a TTL
    after the stream.

    node_timeout is 0.5 s here, so a loaded machine's scheduling delays stay small
    beside it; the stall lasts 8-12 node timeouts, so each holder makes several
    attempts inside it."""
    rng = random.Random(seed)
    cluster = lab.make_cluster(5)
    fleet = Fleet(lab.scratch("quorum-loss"))
    names = ["stall:a", "stall:b"]
    ttl = 1.0
    node_timeout = 0.5
    for i in range(3):
        fleet.spawn(
            stream_config(
                fleet,
                f"p{i}",
                rng,
                urls=cluster.urls,
                keys=names,
                ttl=ttl,
                node_timeout=node_timeout,
                hold=(0.0, 0.02),
                wait=(0.0, 0.0),
                idle=(0.005, 0.02),
            )
        )
    victims = sorted(rng.sample(range(5), 3))
    stall = node_timeout * rng.uniform(8, 12)
    scanner = TtlScanner(cluster.urls).start()
    try:
        start = fleet.go(phase * 2 + stall + PATIENCE * 2)
        time.sleep(phase)
        for index in victims:
            cluster[index].pause()
        paused = now_ns()
        time.sleep(stall)
        resuming = now_ns()
        for index in victims:
            cluster[index].resume()
        time.sleep(0.1)
        # What the stalled nodes ran once they continued (SETs then clean-ups, in order).
        after_resume = {
            index: [key_text(k) for k in cluster[index].client().keys("*")] for index in victims
        }
        time.sleep(phase)
        fleet.wait_for(lambda seen: bool(seen.granted_between(resuming, now_ns())))
        stopped = now_ns()
        fleet.stop()
        problems = fleet.join()
        # Every holder has exited: their last SETs expire within a TTL of now.
        time.sleep(ttl + 0.2)
        left = leftover_keys(cluster.urls)
    finally:
        scanner.stop()
        fleet.close()
    report = check(fleet.events())
    result = RowResult("4-quorum-loss", seed, report, problems)
    expect_safe(result)
    during = [a for a in report.attempts if a.start_ns >= paused and a.end_ns <= resuming]
    granted = [w for w in report.windows if w.call_ns >= paused and w.start_ns < resuming]
    elapsed = [a.elapsed for a in during]
    result.metrics.update(
        victims=victims,
        stall_s=round(stall, 3),
        attempts_during=len(during),
        outcomes_during=dict(Counter(a.outcome for a in during)),
        elapsed_ms={
            "p50": round(percentile(elapsed, 0.5) * 1000, 1),
            "p99": round(percentile(elapsed, 0.99) * 1000, 1),
            "max": round(max(elapsed, default=0) * 1000, 1),
        },
        keys_on_stalled_nodes_after_resume=after_resume,
        grants_before=len(report.granted_between(start, paused)),
        grants_after=len(report.granted_between(resuming, stopped)),
        keys_without_ttl=[(i, k.decode()) for i, k in scanner.without_ttl[:10]],
    )
    result.expect(len(during) >= 5, f"only {len(during)} attempts while 3 nodes were stopped")
    result.expect(not granted, f"{len(granted)} grants while 3 of 5 nodes were stopped")
    result.expect(
        all(a.outcome == "unavailable" for a in during),
        f"attempts during the stall that did not report QuorumUnavailable: "
        f"{dict(Counter(a.outcome for a in during))}",
    )
    # Each attempt is one round (non-blocking), which ends at node_timeout: one
    # attempt descheduled past 2 x node_timeout says nothing of the lock, but rounds
    # that waited for the stopped nodes (several timeouts) would make most attempts
    # that long. (An attempt that waited until they continued is not in ``during``,
    # and ``during`` must hold at least 5.)
    typical = percentile(elapsed, 0.5)
    result.expect(
        typical < 2 * node_timeout,
        f"the median attempt took {typical:.3f} s, 2 x node_timeout or more: {elapsed[:5]}",
    )
    result.expect(result.metrics["grants_after"] > 0, "no grant after the stopped nodes continued")
    result.expect(not left, f"keys left a TTL after the stream: {left}")
    result.expect(not scanner.without_ttl, f"keys without a TTL: {scanner.without_ttl[:10]}")
    return result
