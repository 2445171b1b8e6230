"""``doctor --textfile PATH``: the verdicts of a doctor run as Prometheus gauges, in the
text format node_exporter's textfile collector reads (``*.prom`` files in its
``--collector.textfile.directory``).

    write_textfile(run_doctor(config, timeout=2.0), "/var/lib/node_exporter/redlock.prom")

Run doctor from cron or a systemd timer: Prometheus then sees what only doctor can
see (lock keys without a TTL, a node that became a replica, a quorum out of reach)
and the alert rules in ``monitoring/prometheus/`` can page on it. The file is
replaced in one rename, so the collector never reads half of it.

Imports checks.py (the statuses), and prometheus_client (the ``prometheus`` extra)
to write.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any, Optional

from .checks import RANK

STATUS = "celery_redlock_doctor_status"
CHECK_STATUS = "celery_redlock_doctor_check_status"
KEYS_WITHOUT_TTL = "celery_redlock_doctor_keys_without_ttl"
LAST_RUN = "celery_redlock_doctor_last_run_timestamp_seconds"

#: The gauges a doctor textfile holds, each with its HELP line.
METRICS = {
    STATUS: "The worst verdict of the last 'redlock doctor' run: 0 OK, 1 WARNING, 2 ERROR.",
    CHECK_STATUS: "Each doctor check's verdict: 0 OK, 1 WARNING, 2 ERROR; node is empty "
    "for the checks across nodes (quorum, node-count, distinct-servers, limits).",
    KEYS_WITHOUT_TTL: "Lock keys without a TTL (never freed) that doctor found on a "
    "reachable node.",
    LAST_RUN: "Unix time of the last 'redlock doctor' run that wrote this file.",
}

Sample = tuple[str, dict[str, str], float]


def doctor_samples(document: dict[str, Any], now: Optional[float] = None) -> list[Sample]:
    """The samples of a doctor document (``run_doctor``): name, labels, value.

    A check named twice for one node (``distinct-servers`` per duplicated server)
    is one sample, its worst verdict: a series may appear once in a scrape.
    """
    checks: dict[tuple[str, str], int] = {}
    keys: list[Sample] = []
    for node in document["nodes"]:
        _add_checks(checks, node["node"], node["checks"])
        if node["reachable"]:
            keys.append((KEYS_WITHOUT_TTL, {"node": node["node"]}, node["keys_without_ttl_count"]))
    _add_checks(checks, "", document["checks"])
    return [
        (STATUS, {}, RANK[document["status"]]),
        *((CHECK_STATUS, {"node": n, "check": c}, v) for (n, c), v in checks.items()),
        *keys,
        (LAST_RUN, {}, time.time() if now is None else now),
    ]


def _add_checks(into: dict[tuple[str, str], int], node: str, checks: Iterable[Any]) -> None:
    for check in checks:
        where = (node, check["check"])
        into[where] = max(into.get(where, 0), RANK[check["status"]])


def write_textfile(document: dict[str, Any], path: str) -> None:
    """Write ``document``'s samples to ``path`` with prometheus_client's
    ``write_to_textfile``, which replaces the file in one rename (a collector reading
    meanwhile sees the old file or the new, never a part)."""
    try:
        from prometheus_client import write_to_textfile
    except ImportError as exc:
        raise ImportError(
            "doctor --textfile needs prometheus-client: pip install 'celery-redlock[prometheus]'"
        ) from exc
    write_to_textfile(path, registry_of(doctor_samples(document)))


def registry_of(samples: Sequence[Sample]) -> Any:
    """A prometheus_client registry holding ``samples`` as gauges (every gauge of
    :data:`METRICS`, an empty one too)."""
    from prometheus_client import CollectorRegistry, Gauge

    registry = CollectorRegistry()
    for name, help_text in METRICS.items():
        mine = [(labels, value) for sample, labels, value in samples if sample == name]
        names = sorted({label for labels, _ in mine for label in labels})
        gauge = Gauge(name, help_text, names, registry=registry)
        for labels, value in mine:
            (gauge.labels(**labels) if names else gauge).set(value)
    return registry
