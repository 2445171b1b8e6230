"""``doctor --textfile PATH``: the verdicts of a doctor run as Prometheus gauges, in the
text format node_exporter's textfile collector reads (``*.prom`` files in its
``--collector.textfile.directory``).

    write_textfile(run_doctor(config, timeout=2.0), "/var/lib/node_exporter/redlock.prom")

Run doctor from cron or a systemd timer: Prometheus then sees what only doctor can
see (lock keys without a TTL, a node that became a replica, a quorum out of reach)
and the alert rules in ``monitoring/prometheus/`` can page on it. The file is
replaced in one rename, so the collector never reads half of it.

Pure apart from the write; imports checks.py (the statuses) only.
"""

from __future__ import annotations

import os
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


def render(samples: Sequence[Sample]) -> str:
    """The text exposition format: each metric's HELP and TYPE, then its samples."""
    lines = []
    for name, help_text in METRICS.items():
        lines += [f"# HELP {name} {_escape_help(help_text)}", f"# TYPE {name} gauge"]
        for sample_name, labels, value in samples:
            if sample_name == name:
                lines.append(f"{name}{_labels(labels)} {_number(value)}")
    return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    # repr keeps every digit of a Unix time; whole numbers print without ".0".
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    pairs = ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels.items())
    return "{" + pairs + "}"


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_label(value: str) -> str:
    return _escape_help(value).replace('"', '\\"')


def write_textfile(document: dict[str, Any], path: str) -> None:
    """Write ``document``'s samples to ``path``, replacing it in one rename (a
    collector reading meanwhile sees the old file or the new, never a part)."""
    text = render(doctor_samples(document))
    partial = f"{path}.{os.getpid()}.tmp"  # same directory: the rename stays atomic
    try:
        with open(partial, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(partial, path)
    except BaseException:
        if os.path.exists(partial):
            os.remove(partial)
        raise
