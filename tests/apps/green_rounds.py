"""Lock rounds under a busy gevent or eventlet hub, in a process of their own.

    python tests/apps/green_rounds.py gevent|eventlet URL[,URL...] [count] [cooperative] \
        [node_timeout=S]
    python tests/apps/green_rounds.py gevent|eventlet URL[,URL...] lost

Monkey-patches the whole process first (as ``celery worker -P gevent|eventlet``
does), then starts one greenlet that computes for about 2 s in slices of two node_timeouts
(100 ms by default) and yields in between (CPU-heavy but cooperative work), and ``count``
greenlets (default 50) that each try once to acquire a key of their own on the given
nodes, with the default node_timeout (or ``node_timeout=S``; the slices stay two of
it). Prints one JSON line: ``won``, ``unavailable``
(QuorumUnavailable while every node is healthy: a false outage), ``errors`` (any other
exception, as text), ``slowest_s`` (the slowest acquire, from its call to its return)
and ``mean_s``. By default rounds use unpatched sockets and never yield, so an
acquire's time is also how long it blocked the hub. ``cooperative`` measures the
alternative: rounds on the patched (cooperative) sockets and poll, gevent only
(eventlet's patching removes ``select.poll``).

``lost``: a lease the watchdog renews (ttl 1 s) while a greenlet computes without
yielding, its key deleted from every node meanwhile. Prints ``held_false_after_s``
(when, counted from the deletion, the computing greenlet saw ``lease.held`` turn
False: the renewal thread marked it), ``callback_before_yield`` (whether its
``on_lost`` callback ran before the greenlet yielded: it must not, it belongs to the
hub), ``callback_thread_is_hub`` (it ran on the hub's OS thread).
"""

from __future__ import annotations

import sys

HUB = sys.argv[1] if __name__ == "__main__" else ""
if HUB == "gevent":
    from gevent import monkey

    monkey.patch_all()
elif HUB == "eventlet":
    import eventlet

    eventlet.monkey_patch()

import contextlib  # noqa: E402 (after the monkey-patching, as in a worker)
import functools  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from typing import Any, Callable  # noqa: E402

from celery_redlock import LockLost, QuorumUnavailable, Redlock  # noqa: E402
from celery_redlock.wire import unpatched  # noqa: E402

#: ``node_timeout=S`` (after ``count``): the rounds' node_timeout, the default unless given.
NODE_TIMEOUT = float(
    next((a.split("=", 1)[1] for a in sys.argv[4:] if a.startswith("node_timeout=")), 0.05)
)
#: Seconds each slice of the busy greenlet computes before it yields (two node_timeouts),
#: and how many (about 2 s of work).
SLICE = 2 * NODE_TIMEOUT
SLICES = max(2, round(2.0 / SLICE))
#: Seconds ``lost`` waits for each event before it reports it missing: a hang guard.
GUARD = 30.0


def _spawn_and_wait(functions: list[Callable[[], None]]) -> None:
    if HUB == "gevent":
        import gevent

        gevent.joinall([gevent.spawn(f) for f in functions])
    else:
        import eventlet

        pool = eventlet.GreenPool(len(functions))
        for f in functions:
            pool.spawn(f)
        pool.waitall()


def main(urls: list[str], count: int) -> dict[str, Any]:
    lock = Redlock(urls, ttl=10, node_timeout=NODE_TIMEOUT)
    report: dict[str, Any] = {"won": 0, "unavailable": 0, "errors": [], "slowest_s": 0.0}
    took: list[float] = []
    prefix = f"green-rounds:{time.time_ns()}"

    def busy() -> None:
        for _ in range(SLICES):
            deadline = time.monotonic() + SLICE
            while time.monotonic() < deadline:
                pass
            time.sleep(0)  # patched: yields to the hub

    def acquire(index: int) -> None:
        began = time.monotonic()
        try:
            lease = lock.acquire(f"{prefix}:{index}", blocking=False)
            report["won"] += lease is not None
        except QuorumUnavailable:
            report["unavailable"] += 1
        except Exception as exc:
            report["errors"].append(f"{type(exc).__name__}: {exc}")
        finally:
            took.append(time.monotonic() - began)

    herd: list[Callable[[], None]] = [functools.partial(acquire, i) for i in range(count)]
    _spawn_and_wait([busy, *herd])
    report["slowest_s"] = max(took)
    report["mean_s"] = sum(took) / len(took)
    return report


def lost(urls: list[str]) -> dict[str, Any]:
    import redis

    lock = Redlock(urls, ttl=1)
    hub_thread = unpatched.get_ident()
    seen: dict[str, Any] = {"yielded": False}

    def on_lost(_lease: object) -> None:
        seen["callback_before_yield"] = not seen["yielded"]
        seen["callback_thread_is_hub"] = unpatched.get_ident() == hub_thread

    # Leaving the block raises LockLost: the loss is what this run provokes.
    with (
        contextlib.suppress(LockLost),
        lock.lock(f"green-lost:{time.time_ns()}", auto_extend=True) as lease,
    ):
        lease.on_lost(on_lost)
        for url in urls:
            redis.Redis.from_url(url).delete(lease.key)
        deleted = time.monotonic()
        while lease.held and time.monotonic() < deleted + GUARD:
            pass  # computes without yielding: only an OS thread can mark it lost
        seen["held_false_after_s"] = None if lease.held else time.monotonic() - deleted
        seen["yielded"] = True
        # Patched sleeps yield: the hub runs the callback once the renewal thread has
        # handed it over (it may find the loss after the validity ran out).
        give_up = time.monotonic() + GUARD
        while "callback_thread_is_hub" not in seen and time.monotonic() < give_up:
            time.sleep(0.01)
    seen.pop("yielded")
    seen.setdefault("callback_before_yield", None)  # None: never called within the guard
    seen.setdefault("callback_thread_is_hub", None)
    return seen


if __name__ == "__main__" and sys.argv[3:4] == ["lost"]:
    print(json.dumps(lost(sys.argv[2].split(","))))
elif __name__ == "__main__":
    unpatched.USE_ORIGINALS = "cooperative" not in sys.argv[4:]
    result = main(sys.argv[2].split(","), int(sys.argv[3]) if len(sys.argv) > 3 else 50)
    print(json.dumps(result))
