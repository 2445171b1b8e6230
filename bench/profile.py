"""Where our acquire+release spends its time: ``python -m bench profile``.

Two views, on 5 fresh local redis-server masters:

1. CPU per operation (``getrusage``: user and system µs, and context switches) of our
   Redlock on 5 and 1 nodes next to the bare-socket floors doing the same syscalls.
   User CPU above the floor is Python work in celery_redlock; it does not depend on
   how busy the machine is, unlike wall-clock latency.
2. cProfile of our 5-node acquire+release, top functions by own time (cProfile
   inflates pure-Python code several times over: read the ranking, not the µs).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import pstats
import resource
import time
from typing import Optional

from celery_redlock.testing import RedisNodes

from .contenders import OurRedlock
from .locks import pick_redis_server
from .resp import FloorCycle, FloorQuorum
from .stats import Op

__all__ = ["cpu_per_op", "main"]


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


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench profile", description=__doc__)
    parser.add_argument("--operations", type=int, default=10000)
    parser.add_argument("--top", type=int, default=25, help="functions shown by cProfile")
    parser.add_argument("--redis-server", default=None)
    args = parser.parse_args(argv)
    binary = args.redis_server or pick_redis_server()
    with RedisNodes(5, binary=binary) as cluster:
        addresses = [(server.host, server.port) for server in cluster]
        ours5 = OurRedlock(cluster.urls, ttl=10.0, node_timeout=0.05)
        ours1 = OurRedlock(cluster.urls[:1], ttl=10.0, node_timeout=0.05)
        value = b"x" * 27 + b"|host:1"
        floor5 = FloorQuorum(addresses, "profile:floor5", value, 10000)
        floor1 = FloorCycle(*addresses[0], "profile:floor1", value, 10000)
        ops: dict[str, Op] = {
            "celery-redlock, 5 nodes": ours5.op("profile:ours5"),
            "floor, 5 nodes (quorum of 3)": floor5,
            "celery-redlock, 1 node": ours1.op("profile:ours1"),
            "floor, 1 node": floor1,
        }
        try:
            print(f"CPU per acquire+release ({args.operations} operations each)\n")
            print(f"{'':32} {'wall µs':>8} {'user µs':>8} {'sys µs':>8} {'vol sw':>7} {'invol':>6}")
            for name, op in ops.items():
                cpu = cpu_per_op(op, args.operations)
                print(
                    f"{name:32} {cpu['wall_us']:8.1f} {cpu['user_us']:8.1f} "
                    f"{cpu['system_us']:8.1f} {cpu['voluntary_switches']:7.2f} "
                    f"{cpu['involuntary_switches']:6.2f}"
                )
            profiler = cProfile.Profile()
            op = ops["celery-redlock, 5 nodes"]
            gc.collect()
            profiler.enable()
            for _ in range(args.operations):
                op()
            profiler.disable()
            out = io.StringIO()
            stats = pstats.Stats(profiler, stream=out)
            stats.sort_stats("tottime").print_stats(args.top)
            print(f"\ncProfile, celery-redlock 5 nodes, {args.operations} operations\n")
            print(out.getvalue().split("\n\n", 1)[-1].rstrip())
        finally:
            floor5.close()
            floor1.close()
            ours5.close()
            ours1.close()
    return 0
