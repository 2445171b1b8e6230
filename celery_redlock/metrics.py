"""Prometheus metrics for RedlockTask, fed by the lock signals (optional extra).

Needs ``pip install 'celery-redlock[prometheus]'`` (prometheus-client). Nothing else
in celery_redlock imports this module: the lock works the same without it.

Enable -- in the module that defines the Celery app, so every worker process runs it::

    from celery_redlock import metrics

    metrics.install()     # connects receivers to the lock signals; idempotent

What you get (prefix ``celery_redlock_``; label ``task`` is the task name)::

    acquire_seconds{task}           histogram  time to win the lock (0.5 ms .. 1 s buckets)
    contended_total{task,action}    counter    duplicates that met a held lock;
                                               action = retry | skip | fail | wait |
                                               replaced (a queued copy replaced by a
                                               newer one, counted where it arrives)
    limited_total{task,kind}        counter    copies turned away by a limit, rate or
                                               cooldown: kind = limit | rate | cooldown
    extended_total{task}            counter    watchdog renewals
    lost_total{task}                counter    leases lost while the task ran
    hold_seconds{task}              histogram  acquire to release (0.1 s .. 6 h buckets)
    held{task}                      gauge      leases held right now in this process

The lock *key* is deliberately not a label: keys carry task arguments (a customer
id, a date...), so their number is unbounded, and every label value is a time series
Prometheus keeps. Find a key in the worker log line or with ``celery redlock ls``.
``contended_total`` also counts duplicates that found the lock nodes unavailable (the
same retry / skip / fail follows; the log line tells them apart). ``held`` counts a
lease from ``lock_acquired`` until ``lock_released`` or ``lock_lost``, whichever
comes first, so a lost lease that is released later is not subtracted twice.

Expose -- threads or solo pool (one process): serve the default registry from the
worker's main process::

    from celery.signals import worker_init

    @worker_init.connect
    def serve_metrics(**_):
        metrics.serve(9808)       # prometheus_client.start_http_server(9808)

Expose -- prefork pool: the tasks, and so the metrics, live in the pool's child
processes, which cannot each listen on the port. prometheus-client's multiprocess
mode lets every process write its values to files in one directory and the main
process add them up when scraped:

1. Start every worker with ``PROMETHEUS_MULTIPROC_DIR`` set to an empty directory of
   its own (one per ``celery worker`` process; make it empty at each start, e.g.
   ``rm -rf "$D" && mkdir -p "$D"`` before launching). It must be in the environment
   before prometheus_client is first imported, which is why it is set outside Python.
2. Serve from the main process in ``worker_init`` (never in ``worker_process_init``:
   the children would fight over the port) -- ``metrics.serve(9808)`` does so with
   :func:`multiprocess_registry`, which aggregates the directory.
3. Tell prometheus_client when a child exits, so its ``held`` gauge stops counting
   (counters and histograms of dead children rightly keep counting)::

       from celery.signals import worker_process_shutdown
       from prometheus_client import multiprocess

       @worker_process_shutdown.connect
       def forget_child(pid, **_):
           multiprocess.mark_process_dead(pid)

   That signal is sent by a child that exits on its own (shutdown,
   ``worker_max_tasks_per_child``). A child SIGKILLed by a hard time limit or the
   OOM killer sends nothing; :func:`multiprocess_registry` therefore also drops, at
   each scrape, the ``held`` values of processes that no longer exist.

Serving it yourself instead of :func:`serve`::

    from prometheus_client import start_http_server

    # Not prometheus_client.REGISTRY: it holds only the main process's values.
    start_http_server(9808, registry=metrics.multiprocess_registry())

Prefer that registry to a bare ``prometheus_client.multiprocess.MultiProcessCollector``:
a child that is starting creates its file empty and sizes it a moment later, and the
bare collector fails the whole scrape (HTTP 500) when it reads the file in between.

Receivers run in the thread that sent the signal (the watchdog thread for
``lock_extended`` / ``lock_lost``); each one only updates in-memory (or mmapped)
values.
"""

from __future__ import annotations

import glob
import os
import threading
import weakref
from collections.abc import Iterable
from typing import Any, Callable, Optional

try:
    from prometheus_client import (
        REGISTRY,
        CollectorRegistry,
        Counter,
        Gauge,
        Histogram,
        start_http_server,
    )
    from prometheus_client import multiprocess as _multiprocess
    from prometheus_client.metrics_core import Metric
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    if exc.name is not None and exc.name.split(".")[0] != "prometheus_client":
        raise  # prometheus_client is there but broken: show the real error
    raise ImportError(
        "celery_redlock.metrics needs prometheus-client: pip install 'celery-redlock[prometheus]'"
    ) from exc

from . import signals

# prometheus_client.multiprocess has no annotations: typed handles for mypy --strict.
_merge: Callable[..., Iterable[Metric]] = _multiprocess.MultiProcessCollector.merge
_mark_process_dead: Callable[..., None] = _multiprocess.mark_process_dead

__all__ = [
    "ACQUIRE_BUCKETS",
    "HOLD_BUCKETS",
    "MULTIPROC_DIR_ENV",
    "RedlockMetrics",
    "install",
    "multiprocess_registry",
    "serve",
    "uninstall",
]

#: Histogram buckets of ``celery_redlock_acquire_seconds``: a won lock usually takes
#: one round to the lock nodes, about a millisecond on a LAN (each round is bounded by
#: ``redlock_node_timeout``; a split vote adds a few short rounds).
ACQUIRE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
#: Histogram buckets of ``celery_redlock_hold_seconds``: from quick tasks to imports
#: that run for hours.
HOLD_BUCKETS = (0.1, 0.5, 1.0, 5.0, 15.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 21600.0)
#: The environment variable that switches prometheus_client to multiprocess mode.
MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"

_UNKNOWN_TASK = "unknown"


def _task_name(sender: Any) -> str:
    return str(getattr(sender, "name", None) or _UNKNOWN_TASK)


class RedlockMetrics:
    """The lock metrics registered in one registry, and the receivers that feed them.

    Made by :func:`install`; the metric objects are attributes, for tests and for
    anyone who wants to read or extend them.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.acquire_seconds = Histogram(
            "celery_redlock_acquire_seconds",
            "Seconds a task took to win its lock (lock_acquired.elapsed).",
            ["task"],
            buckets=ACQUIRE_BUCKETS,
            registry=registry,
        )
        self.contended_total = Counter(
            "celery_redlock_contended",
            "Task executions that found their lock held (or the lock nodes unavailable), "
            "by what happened next.",
            ["task", "action"],
            registry=registry,
        )
        self.limited_total = Counter(
            "celery_redlock_limited",
            "Task executions turned away because every permit of their key was taken "
            "(kind=limit), its rate was reached (kind=rate; they come back later) or its "
            "cooldown had not passed (kind=cooldown).",
            ["task", "kind"],
            registry=registry,
        )
        self.extended_total = Counter(
            "celery_redlock_extended",
            "Lease renewals by the watchdog.",
            ["task"],
            registry=registry,
        )
        self.lost_total = Counter(
            "celery_redlock_lost",
            "Leases lost while their task ran (renewal failed or max_hold reached).",
            ["task"],
            registry=registry,
        )
        self.hold_seconds = Histogram(
            "celery_redlock_hold_seconds",
            "Seconds from acquiring a lock to releasing it (lock_released.held_for).",
            ["task"],
            buckets=HOLD_BUCKETS,
            registry=registry,
        )
        self.held = Gauge(
            "celery_redlock_held",
            "Leases currently held (acquired, neither released nor lost) by this process.",
            ["task"],
            registry=registry,
            # Multiprocess mode: add up the live processes; a dead child's value goes.
            multiprocess_mode="livesum",
        )
        # Leases counted in ``held``, by id() -> task name. A lease leaves on release,
        # on loss, or when it is garbage-collected uncounted (its release raised, so
        # no lock_released came): ``held`` never stays up for a lease nobody has.
        self._counted: dict[int, str] = {}
        # Reentrant: a garbage collection inside a locked block may run _uncount.
        self._counted_lock = threading.RLock()
        self._receivers: list[tuple[Any, Callable[..., None]]] = [
            (signals.lock_acquired, self._on_acquired),
            (signals.lock_contended, self._on_contended),
            (signals.lock_extended, self._on_extended),
            (signals.lock_lost, self._on_lost),
            (signals.lock_released, self._on_released),
        ]
        self.connected = False

    def connect(self) -> None:
        """Connect the receivers to the lock signals (no-op when connected)."""
        if self.connected:
            return
        for signal, receiver in self._receivers:
            signal.connect(receiver, weak=False)
        self.connected = True

    def disconnect(self) -> None:
        """Stop counting: disconnect the receivers (the metrics stay registered)."""
        for signal, receiver in self._receivers:
            signal.disconnect(receiver)
        self.connected = False

    # -- receivers ----------------------------------------------------------------------

    def _on_acquired(self, sender: Any = None, lease: Any = None, **kwargs: Any) -> None:
        task = _task_name(sender)
        elapsed = kwargs.get("elapsed")
        if elapsed is not None:
            self.acquire_seconds.labels(task).observe(elapsed)
        if lease is None:
            return
        # This task's renewal and loss series exist from its first lease on, at 0: a
        # first loss is then a rise an alert's increase() sees, not a new series.
        self.extended_total.labels(task)
        self.lost_total.labels(task)
        lease_id = id(lease)
        with self._counted_lock:
            if lease_id in self._counted:
                return
            self._counted[lease_id] = task
        self.held.labels(task).inc()
        finalizer = weakref.finalize(lease, self._uncount, lease_id)
        finalizer.atexit = False

    def _on_contended(
        self, sender: Any = None, action: Any = None, limit: Any = None, **_: Any
    ) -> None:
        task = _task_name(sender)
        self.contended_total.labels(task, str(action)).inc()
        if limit:  # "limit 5/5", "rate 100/m", "cooldown of 3s": the first word is the kind
            self.limited_total.labels(task, str(limit).split()[0]).inc()

    def _on_extended(self, sender: Any = None, **_: Any) -> None:
        self.extended_total.labels(_task_name(sender)).inc()

    def _on_lost(self, sender: Any = None, lease: Any = None, **_: Any) -> None:
        self.lost_total.labels(_task_name(sender)).inc()
        if lease is not None:
            self._uncount(id(lease))

    def _on_released(self, sender: Any = None, lease: Any = None, **kwargs: Any) -> None:
        held_for = kwargs.get("held_for")
        if held_for is not None:
            self.hold_seconds.labels(_task_name(sender)).observe(held_for)
        if lease is not None:
            self._uncount(id(lease))

    def _uncount(self, lease_id: int) -> None:
        with self._counted_lock:
            task = self._counted.pop(lease_id, None)
        if task is not None:
            self.held.labels(task).dec()


_installed: dict[int, RedlockMetrics] = {}  # id(registry) -> its metrics (holds it alive)
_installed_lock = threading.Lock()


def install(registry: Optional[CollectorRegistry] = None) -> RedlockMetrics:
    """Register the lock metrics in ``registry`` (default: ``prometheus_client.REGISTRY``)
    and connect them to the lock signals. Idempotent: calling it again with the same
    registry returns the same :class:`RedlockMetrics` and counts nothing twice.

    Call it in every worker process: at import of the app module is simplest (prefork
    children inherit it). A registry that already has these metric names raises
    prometheus_client's ``ValueError: Duplicated timeseries``.
    """
    target = REGISTRY if registry is None else registry
    with _installed_lock:
        metrics = _installed.get(id(target))
        if metrics is None:
            metrics = RedlockMetrics(target)
            _installed[id(target)] = metrics
        metrics.connect()
        return metrics


def uninstall(registry: Optional[CollectorRegistry] = None) -> bool:
    """Disconnect and unregister the metrics that :func:`install` put in ``registry``.

    Returns False when there were none.
    """
    target = REGISTRY if registry is None else registry
    with _installed_lock:
        metrics = _installed.pop(id(target), None)
    if metrics is None:
        return False
    metrics.disconnect()
    for metric in (
        metrics.acquire_seconds,
        metrics.contended_total,
        metrics.limited_total,
        metrics.extended_total,
        metrics.lost_total,
        metrics.hold_seconds,
        metrics.held,
    ):
        target.unregister(metric)
    return True


class _LiveProcessesCollector:
    """prometheus_client's MultiProcessCollector that first forgets the live gauges
    (``held``) of processes that died without ``mark_process_dead`` (SIGKILL), and
    skips the files of processes that are creating them."""

    def __init__(self, path: str) -> None:
        self.path = path

    def collect(self) -> Iterable[Metric]:
        _forget_dead_processes(self.path)
        return _merge(_readable_files(self.path), accumulate=True)


#: prometheus_client's files start with 4 bytes saying how much of the file is used,
#: then 4 of padding.
_FILE_HEADER_BYTES = 8


def _readable_files(path: str) -> list[str]:
    """The value files in ``path`` that have their header.

    A process makes its file in two steps, open (0 bytes) then truncate to the full
    size, and prometheus_client's reader fails on the 0-byte state. A file that is
    still empty holds no values yet, and a file never shrinks, so skipping the ones
    seen empty loses nothing and what is kept stays readable.
    """
    readable = []
    for filename in glob.glob(os.path.join(path, "*.db")):
        try:
            size = os.stat(filename).st_size
        except FileNotFoundError:  # a live gauge of a process marked dead meanwhile
            continue
        if size >= _FILE_HEADER_BYTES:
            readable.append(filename)
    return readable


def _forget_dead_processes(path: str) -> None:
    for filename in glob.glob(os.path.join(path, "gauge_live*_*.db")):
        try:
            pid = int(os.path.basename(filename)[: -len(".db")].rsplit("_", 1)[1])
        except ValueError:
            continue
        if not _alive(pid):
            _mark_process_dead(pid, path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process now has that pid
        return True
    return True


def multiprocess_registry(path: Optional[str] = None) -> CollectorRegistry:
    """A registry that adds up every process's metrics in ``path`` (default:
    ``$PROMETHEUS_MULTIPROC_DIR``), for the prefork pool's main process to serve.

    At each scrape it also forgets the ``held`` gauge of processes that no longer
    exist, which ``mark_process_dead`` never heard of (SIGKILLed children).
    """
    directory = path or os.environ.get(MULTIPROC_DIR_ENV)
    if not directory:
        raise ValueError(
            f"multiprocess_registry needs a directory: set ${MULTIPROC_DIR_ENV} before "
            "the worker starts, or pass path="
        )
    if not os.path.isdir(directory):
        raise ValueError(f"${MULTIPROC_DIR_ENV}={directory!r} is not a directory")
    registry = CollectorRegistry()
    registry.register(_LiveProcessesCollector(directory))
    return registry


def serve(port: int, addr: str = "0.0.0.0", registry: Optional[CollectorRegistry] = None) -> Any:
    """Serve the metrics over HTTP (``/metrics``) from a daemon thread of this process.

    ``registry``: what to serve; default, :func:`multiprocess_registry` when
    ``$PROMETHEUS_MULTIPROC_DIR`` is set (prefork), else ``prometheus_client.REGISTRY``.
    Call it once, in the worker's main process (``worker_init``). Returns what
    ``prometheus_client.start_http_server`` returns: ``(server, thread)`` on
    prometheus-client >= 0.20 (``server.shutdown()`` stops it).
    """
    if registry is None:
        registry = multiprocess_registry() if os.environ.get(MULTIPROC_DIR_ENV) else REGISTRY
    return start_http_server(port, addr=addr, registry=registry)
