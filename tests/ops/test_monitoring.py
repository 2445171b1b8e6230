"""The monitoring kit (monitoring/): every query in the alert rules and the Grafana
dashboard names only metrics the code exports, and promtool accepts the rules and
passes their unit tests.

The metric names come from the code: ``celery_redlock.metrics`` registered in a
registry of our own, and the doctor textfile's gauges (``cli/textfile.py``). Names
are read out of PromQL with a small lexer (``metric_names``): strings, label
matchers, ranges and grouping lists are dropped, and what is left that is neither a
function call, a keyword nor a number is a series name.

promtool (Debian's ``prometheus`` package; tools/monitoring/promtool-checks.sh
installs it) runs when it is on PATH; without it those tests skip, unless
``REDLOCK_PROMTOOL_REQUIRED=1`` makes its absence a failure.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from celery_redlock.cli import textfile
from celery_redlock.metrics import RedlockMetrics

MONITORING = Path(__file__).resolve().parents[2] / "monitoring"
RULES = MONITORING / "prometheus" / "celery-redlock.rules.yml"
RULES_TESTS = MONITORING / "prometheus" / "celery-redlock.rules.test.yml"
DASHBOARD = MONITORING / "grafana" / "celery-redlock.json"

#: The series each metric type exposes, by suffix.
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
#: Series Prometheus makes itself, for every target it scrapes.
PROMETHEUS_OWN = frozenset({"up"})
#: What PromQL spells like a name but is not a series.
KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool"}
    | {"and", "or", "unless", "inf", "nan"}
)
#: What Grafana puts in a query before sending it (a rule has no variables).
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__range": "1h", "$task": ".*"}

yaml: Any = importlib.import_module("yaml")  # the test extra's; untyped here on purpose


def exported_names() -> set[str]:
    """Every series name the worker metrics and the doctor textfile expose."""
    registry = CollectorRegistry()
    RedlockMetrics(registry)  # registers every metric; connects to no signal
    names = {
        family.name + suffix for family in registry.collect() for suffix in SUFFIXES[family.type]
    }
    return names | set(textfile.METRICS)


def metric_names(promql: str) -> set[str]:
    """The series names a PromQL expression reads (see the module docstring)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', promql)  # strings
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges and subqueries
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w:.$])[A-Za-z_:][\w:]*", text):
        name = match.group()
        if name.lower() in KEYWORDS or re.match(r"\s*\(", text[match.end() :]):
            continue  # a keyword or a function call
        names.add(name)
    return names


def rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def alerts() -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for rule in rules() if "alert" in rule}


def dashboard_panels() -> Iterator[dict[str, Any]]:
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        yield panel
        yield from panel.get("panels", [])


def dashboard_queries() -> list[str]:
    return [t["expr"] for p in dashboard_panels() for t in p.get("targets", [])]


def as_sent(query: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        query = query.replace(variable, value)
    return query


# -- names ------------------------------------------------------------------------------


def test_the_lexer_finds_series_names_and_nothing_else() -> None:
    query = (
        'histogram_quantile(0.99, sum by (task, le) (rate(a_bucket{task=~"x|y"}[5m]))) > 0.1 '
        "and on (job) (b offset 10m == 1) or time() - c:recorded_5m / ignoring(le) d"
    )
    assert metric_names(query) == {"a_bucket", "b", "c:recorded_5m", "d"}


def test_every_rule_reads_only_series_the_code_exports_or_the_rules_record() -> None:
    recorded = {rule["record"] for rule in rules() if "record" in rule}
    known = exported_names() | recorded | PROMETHEUS_OWN
    for rule in rules():
        used = metric_names(rule["expr"])
        assert used, rule["expr"]
        assert used <= known, (rule.get("alert") or rule.get("record"), used - known)


def test_every_dashboard_query_reads_only_series_the_code_exports() -> None:
    known = exported_names()
    queries = dashboard_queries()
    templating = json.loads(DASHBOARD.read_text())["templating"]["list"]
    # A variable's label_values(metric, label): the metric is the series it reads.
    queries += [re.sub(r"label_values\((.*),\s*\w+\)", r"\1", v["definition"]) for v in templating]
    for query in queries:
        used = metric_names(as_sent(query))
        assert used, query
        assert used <= known, (query, used - known)


def test_the_dashboard_shows_every_worker_metric() -> None:
    registry = CollectorRegistry()
    RedlockMetrics(registry)
    used = {name for query in dashboard_queries() for name in metric_names(as_sent(query))}
    for family in registry.collect():
        assert any(family.name + suffix in used for suffix in SUFFIXES[family.type]), family.name


def test_the_dashboard_asks_for_its_prometheus_on_import() -> None:
    document = json.loads(DASHBOARD.read_text())
    (source,) = document["__inputs"]
    assert (source["name"], source["pluginId"]) == ("DS_PROMETHEUS", "prometheus")
    for panel in dashboard_panels():
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
            assert all(t["datasource"]["uid"] == "${DS_PROMETHEUS}" for t in panel["targets"])


def test_every_alert_waits_has_a_severity_and_says_what_to_do() -> None:
    for name, rule in alerts().items():
        assert "for" in rule, name
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name


def test_every_alert_has_a_unit_test_that_fires_it_and_one_that_does_not() -> None:
    cases = yaml.safe_load(RULES_TESTS.read_text())["tests"]
    checks = [c for case in cases for c in case.get("alert_rule_test", [])]
    for name in alerts():
        outcomes = {bool(c["exp_alerts"]) for c in checks if c["alertname"] == name}
        assert outcomes == {True, False}, name


# -- promtool -----------------------------------------------------------------------------


@pytest.fixture
def promtool() -> str:
    found = shutil.which("promtool")
    if found is not None:
        return found
    reason = (
        "promtool is not on PATH "
        "(apt-get install prometheus, or tools/monitoring/promtool-checks.sh)"
    )
    if os.environ.get("REDLOCK_PROMTOOL_REQUIRED") == "1":
        pytest.fail(f"{reason}, and REDLOCK_PROMTOOL_REQUIRED=1")
    pytest.skip(reason)


def run(*command: str, cwd: Path = MONITORING) -> str:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    return output


def test_promtool_checks_the_rules(promtool: str) -> None:
    output = run(promtool, "check", "rules", str(RULES))
    assert f"SUCCESS: {len(rules())} rules found" in output


def test_promtool_unit_tests_of_the_rules_pass(promtool: str) -> None:
    output = run(promtool, "test", "rules", RULES_TESTS.name, cwd=RULES_TESTS.parent)
    assert "SUCCESS" in output


def test_promtool_parses_every_dashboard_query(promtool: str, tmp_path: Path) -> None:
    # A rules file is what promtool parses offline: each query becomes a recording rule.
    queries = [as_sent(q) for q in dashboard_queries()]
    group = {
        "name": "dashboard",
        "rules": [{"record": f"dashboard:query_{i}", "expr": q} for i, q in enumerate(queries)],
    }
    path = tmp_path / "dashboard.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [group]}))
    output = run(promtool, "check", "rules", str(path))
    assert f"SUCCESS: {len(queries)} rules found" in output
