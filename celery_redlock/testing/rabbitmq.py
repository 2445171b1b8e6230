"""A private RabbitMQ node for tests whose broker is AMQP, not Redis.

:class:`RabbitMQNode` runs the distribution's ``rabbitmq-server`` (Debian:
``apt-get install rabbitmq-server``) as the current user, not as a service: its own
node name, AMQP port (loopback only), Erlang distribution port and epmd port, its
database, logs, config and Erlang cookie in a temporary directory, no plugins. So it
neither needs root nor meets a system node::

    node = RabbitMQNode.start()        # ready: it accepts AMQP connections
    try:
        app.conf.broker_url = node.url  # amqp://guest:guest@127.0.0.1:PORT//
    finally:
        node.stop()                     # the node, then its epmd

Standard library only; nothing from the rest of celery_redlock.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional

from .children import die_with_parent
from .ports import LOOPBACK, claim_free_port, release_port

__all__ = ["RABBITMQ_SERVER_ENV", "RabbitMQNode", "find_rabbitmq_server"]

#: Names the ``rabbitmq-server`` script to run, overriding the lookup.
RABBITMQ_SERVER_ENV = "REDLOCK_RABBITMQ_SERVER"
#: The unwrapped script: Debian's /usr/sbin/rabbitmq-server switches to the
#: ``rabbitmq`` user, which a private node must not.
_CANDIDATES = ("/usr/lib/rabbitmq/bin/rabbitmq-server", "rabbitmq-server")
#: Seconds a node gets to accept connections (Erlang boots slowly under load).
START_TIMEOUT = 90.0
STOP_TIMEOUT = 20.0


def find_rabbitmq_server() -> Optional[str]:
    """``$REDLOCK_RABBITMQ_SERVER``, else Debian's script, else ``rabbitmq-server``
    on PATH; None when there is none."""
    for candidate in (os.environ.get(RABBITMQ_SERVER_ENV), *_CANDIDATES):
        if candidate:
            found = shutil.which(candidate)
            if found:
                return found
    return None


class RabbitMQNode:
    """One ``rabbitmq-server`` process group, listening on ``LOOPBACK:port``."""

    def __init__(self, binary: str, directory: Path) -> None:
        self.directory = directory
        self.port = claim_free_port()
        self.dist_port = claim_free_port()
        self.epmd_port = claim_free_port()
        self.log_path = directory / "node.log"
        self.environment = self._environment(directory)
        (directory / "enabled_plugins").write_text("[].\n")
        with open(self.log_path, "ab") as log:
            self.popen = subprocess.Popen(
                [binary],
                cwd=directory,
                env=self.environment,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent(),
            )

    def _environment(self, directory: Path) -> dict[str, str]:
        return {
            **os.environ,
            "HOME": str(directory),  # the Erlang cookie is written there
            "RABBITMQ_NODENAME": f"redlock{self.port}@localhost",
            "RABBITMQ_NODE_IP_ADDRESS": LOOPBACK,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "RABBITMQ_MNESIA_BASE": str(directory / "mnesia"),
            "RABBITMQ_LOG_BASE": str(directory / "log"),
            "RABBITMQ_LOGS": "-",  # to stdout, which is node.log
            "RABBITMQ_PID_FILE": str(directory / "node.pid"),
            "RABBITMQ_CONFIG_FILE": str(directory / "rabbitmq"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(directory / "enabled_plugins"),
        }

    @classmethod
    def start(cls, timeout: float = START_TIMEOUT) -> RabbitMQNode:
        """Start a node in a new temporary directory and wait until it accepts AMQP
        connections; raises RuntimeError (with the log's tail) if it does not."""
        binary = find_rabbitmq_server()
        if binary is None:
            raise RuntimeError("rabbitmq-server not found (apt-get install rabbitmq-server)")
        node = cls(binary, Path(tempfile.mkdtemp(prefix="redlock-rabbitmq-")))
        try:
            node.wait_ready(timeout)
        except BaseException:
            node.stop()
            raise
        return node

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{LOOPBACK}:{self.port}//"

    def tail(self, lines: int = 30) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def wait_ready(self, timeout: float) -> None:
        # "Server startup complete" comes after the listeners, so the port answers.
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(f"rabbitmq-server exited:\n{self.tail()}")
            if "Server startup complete" in self.log_path.read_text(errors="replace"):
                with socket.create_connection((LOOPBACK, self.port), timeout=2):
                    return
            time.sleep(0.2)
        raise RuntimeError(f"rabbitmq-server not ready in {timeout:g}s:\n{self.tail()}")

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """SIGTERM the node's group (SIGKILL if it lingers), stop its epmd, remove
        its directory."""
        if self.popen.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self.popen.wait(timeout)
        # epmd daemonizes out of the group: ask it to go.
        epmd = shutil.which("epmd")
        if epmd is not None:
            subprocess.run(
                [epmd, "-kill"],
                env=self.environment,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=10,
                check=False,
            )
        for port in (self.port, self.dist_port, self.epmd_port):
            release_port(port)
        shutil.rmtree(self.directory, ignore_errors=True)

    def _signal_group(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signum)
