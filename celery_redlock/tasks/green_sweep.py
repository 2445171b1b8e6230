"""A message whose gevent/eventlet worker died comes back: the unacked sweep, on a timer.

kombu's Redis transport keeps every delivered message in its ``unacked`` index until
the ack. A message whose worker died before acking (``acks_late`` and a SIGKILL, an
OOM kill, a lost machine) is handed out again by a sweep, ``restore_visible``, once
it has been unacked for ``visibility_timeout``. kombu runs that sweep on the worker's
event loop timer, every ``unacked_restore_interval`` (10 s). Green pools (gevent,
eventlet) have no event loop: Celery runs its blocking loop there, which sweeps only
when a poll of the broker comes back empty -- and the transport's BRPOP, answering
every second with "nothing", always comes back first. A gevent or eventlet worker
never sweeps (celery/celery#4976), so the dead worker's message is never run, however
many workers live on. A timeline, two gevent workers, ``acks_late``, a 60 s
``visibility_timeout``::

    t0    w1 takes X (X in unacked)            t1  w1 SIGKILLed with X inside
    t61   X's visibility timeout has passed    w2 polls; BRPOP says "nothing" each
                                               second, w2 never sweeps: X PENDING for ever

:class:`UnackedSweep` is a consumer bootstep that runs the transport's own sweep
(``maybe_restore_messages``, what the event loop's timer calls) from the worker's
timer at the interval the event loop would use, on a worker that has no event loop
and a Redis-family broker (Redis, Sentinel). Every other worker is left as it is.
The sweep takes kombu's own mutex in Redis: workers sweeping at once restore a
message once. A RedlockTask copy that comes back this way meets its dead run's lease
and waits it out (``redelivery.py``).

Added to every app's consumer blueprint when a worker starts (``worker_init``), so
importing ``celery_redlock`` is all it takes. Imports Celery only (kombu is reached
through the consumer's connection).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

from celery import bootsteps
from celery.signals import worker_init

__all__ = ["UnackedSweep", "sweep_interval"]

logger = logging.getLogger("celery_redlock.worker")

#: kombu's default seconds between sweeps (``Channel.unacked_restore_interval``).
DEFAULT_SWEEP_INTERVAL = 10.0


def _sweeper(connection: Any) -> Optional[Callable[[], Any]]:
    """The transport's own sweep of unacked messages, or None when it has none."""
    cycle = getattr(connection.transport, "cycle", None)
    sweep: Optional[Callable[[], Any]] = getattr(cycle, "maybe_restore_messages", None)
    return sweep


def sweep_interval(connection: Any) -> float:
    """Seconds between sweeps: what kombu's event loop would use for ``connection``
    (the ``unacked_restore_interval`` transport option, else the transport's default)."""
    channel = getattr(connection.transport, "Channel", None)
    default = getattr(channel, "unacked_restore_interval", DEFAULT_SWEEP_INTERVAL)
    interval = (connection.transport_options or {}).get("unacked_restore_interval", default)
    try:
        seconds = float(interval)
    except (TypeError, ValueError):
        logger.warning(
            "broker_transport_options unacked_restore_interval must be a number of seconds "
            "(got %r); sweeping every %gs",
            interval, float(default),
        )  # fmt: skip
        seconds = 0.0
    return seconds if seconds > 0 else float(default)  # kombu's rule for <= 0


class UnackedSweep(bootsteps.StartStopStep):  # type: ignore[misc]
    """Sweeps the broker's unacked messages from the worker's timer where no event loop
    does (green pools on a Redis-family broker); does nothing anywhere else."""

    requires = ("celery.worker.consumer.tasks:Tasks",)
    label = "redlock unacked sweep"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        self.tref: Any = None
        super().__init__(parent, **kwargs)

    def start(self, parent: Any) -> None:
        if parent.hub is not None or parent.connection is None:
            return  # the event loop's timer sweeps (kombu's own way)
        if _sweeper(parent.connection) is None:
            return  # not a Redis-family broker: nothing is kept unacked in Redis
        interval = sweep_interval(parent.connection)
        self.tref = parent.timer.call_repeatedly(interval, self._sweep, (parent,))
        logger.info(
            "no event loop in this worker: its broker's unacked messages are swept every "
            "%gs here (a message whose worker died comes back after visibility_timeout)",
            interval,
        )

    def _sweep(self, parent: Any) -> None:
        connection = parent.connection  # the current one: a reconnect replaces it
        sweep = _sweeper(connection) if connection is not None else None
        if sweep is None:
            return
        try:
            sweep()
        except Exception:  # never let the timer die: the next sweep tries again
            logger.warning("sweeping unacked messages failed; trying again", exc_info=True)

    def stop(self, parent: Any) -> None:
        if self.tref is not None:
            self.tref.cancel()
            self.tref = None

    shutdown = stop


def _add_step(sender: Any = None, **_: Any) -> None:
    """Add the step to the starting worker's app (``worker_init`` comes before the
    consumer reads its blueprint's steps)."""
    app = getattr(sender, "app", None)
    if app is not None:
        app.steps["consumer"].add(UnackedSweep)


worker_init.connect(_add_step, weak=False)
