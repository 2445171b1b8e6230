"""Holder processes for the fault scenarios: they run the lock -- they are the
workload -- and log what they did for the oracle to judge::

    python -m tools.faultlab.holders stream CONFIG.json   # a holder loop, see StreamConfig
    python -m tools.faultlab.holders probe CONFIG.json    # one acquire per "acquire KEY"

celery_redlock is imported inside the runners, so the parent importing the configs
does not load it. The checkout must be on PYTHONPATH (``lab.holder_env``).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import select
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional, Union

import redis

from .evidence import NS, OracleLog, RecordingClock, now_ns, store_write

__all__ = ["ProbeConfig", "StreamConfig", "run_probe", "run_stream", "select_sleep"]


@dataclass
class StreamConfig:
    """A holder loop: pick a key, try to win it, hold it a random while, release.

    The process prints ``ready``, waits for a ``go UNTIL_NS`` line on stdin, then
    loops until ``UNTIL_NS`` (monotonic) or until ``stop_path`` exists.

    Durations in seconds. ``wait``: acquire timeout range (0: one non-blocking try).
    ``abandon``: chance to keep a lease until its validity ran out, then release it
    late (the next holder gets in through expiry; the late release must leave the
    successor alone). ``auto_extend``: chance of a hold of 1-2 ttl under the
    watchdog. ``observer_url``: where fenced writes go (needs ``fencing``).
    ``select_sleep``: sleep with select() instead of time.sleep, for a process under
    libfaketime with FAKETIME_DONT_FAKE_MONOTONIC=1, where time.sleep fails with
    EINVAL (libfaketime 0.9.10 mishandles clock_nanosleep on the real monotonic clock).
    """

    label: str
    urls: list[str]
    keys: list[str]
    log_path: str
    seed: int
    ttl: float
    stop_path: Optional[str] = None
    node_timeout: float = 0.05
    drift_factor: float = 0.01
    fencing: bool = False
    observer_url: Optional[str] = None
    hold: tuple[float, float] = (0.0, 0.02)
    abandon: float = 0.0
    auto_extend: float = 0.0
    wait: tuple[float, float] = (0.0, 0.3)
    idle: tuple[float, float] = (0.0, 0.005)
    retry_delay: float = 0.05
    select_sleep: bool = False

    def dump(self, path: Path) -> Path:
        path.write_text(json.dumps(asdict(self)))
        return path

    @classmethod
    def load(cls, path: Union[str, os.PathLike[str]]) -> StreamConfig:
        data = json.loads(Path(path).read_text())
        for name in ("hold", "wait", "idle"):
            data[name] = tuple(data[name])
        return cls(**data)


@dataclass
class ProbeConfig:
    """One acquire per ``acquire KEY`` line on stdin (for a parent that SIGSTOPs us
    mid-round): prints ``starting`` just before the call, then one JSON result line."""

    label: str
    urls: list[str]
    log_path: str
    ttl: float
    node_timeout: float
    drift_factor: float = 0.01

    def dump(self, path: Path) -> Path:
        path.write_text(json.dumps(asdict(self)))
        return path

    @classmethod
    def load(cls, path: Union[str, os.PathLike[str]]) -> ProbeConfig:
        return cls(**json.loads(Path(path).read_text()))


def select_sleep(seconds: float) -> None:
    """time.sleep by select(): libfaketime leaves its relative timeout alone."""
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        select.select([], [], [], left)


def _uniform(rng: random.Random, bounds: tuple[float, float]) -> float:
    return rng.uniform(bounds[0], bounds[1])


def _outcome(error: BaseException) -> str:
    from celery_redlock import QuorumUnavailable

    return "unavailable" if isinstance(error, QuorumUnavailable) else "error"


def run_stream(config: StreamConfig) -> None:
    """The holder loop of one process (see StreamConfig); prints ``ready`` when set up."""
    from celery_redlock import Lease, Redlock
    from celery_redlock.lock.watchdog import get_watchdog

    rng = random.Random(config.seed)
    log = OracleLog(config.log_path, config.label)
    log.start(seed=config.seed)
    sleep = select_sleep if config.select_sleep else time.sleep
    clock = RecordingClock()
    redlock = Redlock(
        config.urls,
        ttl=config.ttl,
        node_timeout=config.node_timeout,
        drift_factor=config.drift_factor,
        retry_delay=config.retry_delay,
        fencing=config.fencing,
        clock=clock,
        sleep=sleep,
    )
    observer = redis.Redis.from_url(config.observer_url) if config.observer_url else None
    print("ready", flush=True)
    go = sys.stdin.readline().split()
    if len(go) != 2 or go[0] != "go":
        return
    until_ns = int(go[1])
    stop_path = config.stop_path

    def write(lease: Lease) -> None:
        # Only while the lease says it is ours, with most of its validity left. A
        # write a slow scheduler still delays past the deadline is the writer's
        # fault, not the lock's: the oracle tells them apart by when it completed.
        if observer is None or lease.fence is None or lease.validity < config.ttl / 2:
            return
        sent_ns = now_ns()
        seq = store_write(observer, lease.key, lease.fence, lease.token, config.label)
        log.wrote(lease.key, lease.token, lease.fence, seq, sent_ns, now_ns())

    while now_ns() < until_ns and not (stop_path and os.path.exists(stop_path)):
        key = rng.choice(config.keys)
        wait = _uniform(rng, config.wait)
        call_ns = now_ns()
        lease: Optional[Lease] = None
        outcome = "contended"
        try:
            lease = redlock.acquire(key, blocking=wait > 0, timeout=wait if wait > 0 else None)
        except Exception as error:
            outcome = _outcome(error)
        checked_ns = clock.last_ns()
        end_ns = now_ns()
        if lease is not None:
            outcome = "granted"
            log.acquired(
                key,
                lease.token,
                lease.fence,
                call_ns,
                end_ns,
                lease.deadline,
                lease.ttl,
                wait <= 0,
                checked_ns=checked_ns,
            )
        log.attempt(key, call_ns, end_ns, outcome)
        if lease is not None:
            write(lease)
            roll = rng.random()
            if roll < config.abandon:
                # Keep it until validity runs out, then release late.
                sleep(max(0.0, lease.deadline - time.monotonic()) + rng.uniform(0, 0.02))
            elif roll < config.abandon + config.auto_extend:
                lease.on_extended(lambda gone: log.extended(gone.key, gone.token, gone.deadline))
                lease.on_lost(lambda gone: log.lost(gone.key, gone.token, gone.lost_reason))
                watchdog = get_watchdog()
                watchdog.watch(lease)
                stop = time.monotonic() + config.ttl * rng.uniform(1.0, 2.0)
                while time.monotonic() < stop and lease.held:
                    sleep(0.01)
                write(lease)
                watchdog.unwatch(lease)
            else:
                sleep(_uniform(rng, config.hold))
                write(lease)
            released_ns = now_ns()
            log.released(key, lease.token, released_ns)
            with contextlib.suppress(Exception):  # a failed release leaves the key to expire
                lease.release()
        sleep(_uniform(rng, config.idle))
    log.event("end", mono_ns=now_ns())
    log.close()
    print("done", flush=True)


def run_probe(config: ProbeConfig) -> None:
    """Serve ``acquire KEY`` lines from stdin (see ProbeConfig)."""
    from celery_redlock import Redlock

    log = OracleLog(config.log_path, config.label)
    log.start()
    clock = RecordingClock()
    redlock = Redlock(
        config.urls,
        ttl=config.ttl,
        node_timeout=config.node_timeout,
        drift_factor=config.drift_factor,
        clock=clock,
    )
    print("ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        key = words[1]
        print("starting", flush=True)
        call_ns = now_ns()
        outcome = "contended"
        lease = None
        try:
            lease = redlock.acquire(key, blocking=False)
        except Exception as error:
            outcome = _outcome(error)
        checked_ns = clock.last_ns()
        end_ns = now_ns()
        if lease is not None:
            outcome = "granted"
            log.acquired(
                key,
                lease.token,
                None,
                call_ns,
                end_ns,
                lease.deadline,
                lease.ttl,
                checked_ns=checked_ns,
            )
        log.attempt(key, call_ns, end_ns, outcome)
        result = {"outcome": outcome, "elapsed": (end_ns - call_ns) / NS, "call_ns": call_ns}
        if lease is not None:
            result["validity_at_return"] = lease.deadline - end_ns / NS
            released_ns = now_ns()
            log.released(key, lease.token, released_ns)
            lease.release()
        print(json.dumps(result), flush=True)
    log.close()


def main(argv: Sequence[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("stream", "probe"):
        print("usage: python -m tools.faultlab.holders stream|probe CONFIG.json", file=sys.stderr)
        return 2
    if argv[0] == "stream":
        run_stream(StreamConfig.load(argv[1]))
    else:
        run_probe(ProbeConfig.load(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
