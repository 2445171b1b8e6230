"""Commands per node per lock operation, counted by the servers themselves.

For K operations of one kind (K acquires, then the K matching releases) on warm
connections: ``CONFIG RESETSTAT`` on every node, MONITOR on every node, the K
operations, then ``INFO commandstats``. Redis 7 counts the commands a Lua script runs
in commandstats too, so commandstats alone cannot tell ``EVALSHA`` (one command on the
wire) from the ``GET``/``DEL`` it runs inside; MONITOR can: script commands are shown
with the source ``lua``. Both are reported, and they must add up.

The bench's own control connection (RESETSTAT, the end marker, INFO) is left out by
its address, and ``config``/``echo``/``info``/``monitor`` by name in commandstats.
"""

from __future__ import annotations

import secrets
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from .resp import RespConnection

__all__ = ["CommandCount", "count_commands", "count_keys"]

_CONTROL_COMMANDS = ("config", "echo", "info", "monitor")


@dataclass
class CommandCount:
    """Calls per node per operation, averaged over the nodes the operation uses."""

    operations: int
    nodes: int
    #: Commands the client sent (MONITOR, source ip:port), by name.
    top_level: dict[str, float] = field(default_factory=dict)
    #: Commands run inside Lua scripts (MONITOR, source ``lua``), by name.
    in_script: dict[str, float] = field(default_factory=dict)
    #: ``INFO commandstats`` calls, by name (top-level and in-script together).
    commandstats: dict[str, float] = field(default_factory=dict)
    #: Top-level commands per operation on the busiest node.
    top_level_max_node: float = 0.0
    #: Operations that failed (a free lock not won); they are counted as operations.
    failed: int = 0

    @property
    def top_level_total(self) -> float:
        return sum(self.top_level.values())

    @property
    def in_script_total(self) -> float:
        return sum(self.in_script.values())

    @property
    def consistent(self) -> bool:
        """MONITOR's top-level + in-script counts equal commandstats, command by command."""
        names = set(self.top_level) | set(self.in_script) | set(self.commandstats)
        return all(
            abs(self.top_level.get(n, 0) + self.in_script.get(n, 0) - self.commandstats.get(n, 0))
            < 1e-9
            for n in names
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "operations": self.operations,
            "nodes": self.nodes,
            "top_level_per_node": _rounded(self.top_level),
            "in_script_per_node": _rounded(self.in_script),
            "commandstats_per_node": _rounded(self.commandstats),
            "top_level_total_per_node": round(self.top_level_total, 4),
            "top_level_max_node": round(self.top_level_max_node, 4),
            "in_script_total_per_node": round(self.in_script_total, 4),
            "monitor_matches_commandstats": self.consistent,
            "failed": self.failed,
        }


def _rounded(counts: dict[str, float]) -> dict[str, float]:
    return {name: round(value, 4) for name, value in sorted(counts.items())}


def _parse_monitor_line(line: bytes) -> tuple[str, str]:
    """``+1700000000.1 [0 127.0.0.1:5000] "SET" "k"`` -> (``127.0.0.1:5000``, ``set``)."""
    start = line.index(b"[")
    end = line.index(b"]", start)
    source = line[start + 1 : end].split(b" ", 1)[1].decode()
    command = line[end + 1 :].split(b'"', 2)[1].decode().lower()
    return source, command


def _parse_commandstats(text: bytes) -> dict[str, int]:
    calls: dict[str, int] = {}
    for line in text.decode().splitlines():
        if not line.startswith("cmdstat_"):
            continue
        name, _, stats = line[len("cmdstat_") :].partition(":")
        fields = dict(item.split("=", 1) for item in stats.split(","))
        calls[name] = int(fields["calls"])
    return calls


def count_commands(
    addresses: list[tuple[str, int]], run: Callable[[], None], operations: int
) -> CommandCount:
    """Run ``run`` (which performs ``operations`` lock operations on the nodes at
    ``addresses``) and count what each node executed for them."""
    controls = [RespConnection(host, port) for host, port in addresses]
    monitors = [RespConnection(host, port) for host, port in addresses]
    marker = "bench-end-" + secrets.token_hex(8)
    try:
        for monitor in monitors:
            monitor.call("MONITOR")
        for control in controls:
            control.call("CONFIG", "RESETSTAT")
        run()
        # Replies a lock stopped waiting for (a quorum had answered) may still be in
        # flight toward slower nodes: let them land before the marker.
        time.sleep(0.05)
        for control in controls:
            control.call("ECHO", marker)
        top = Counter[str]()
        script = Counter[str]()
        busiest = 0
        for control, monitor in zip(controls, monitors):
            node_top = 0
            while True:
                source, command = _parse_monitor_line(monitor.read_line())
                if source == control.local_address:
                    if command == "echo":
                        break
                    continue
                if source == "lua":
                    script[command] += 1
                else:
                    top[command] += 1
                    node_top += 1
            busiest = max(busiest, node_top)
        stats = Counter[str]()
        for control in controls:
            info = control.call("INFO", "commandstats")
            assert isinstance(info, bytes)
            for name, calls in _parse_commandstats(info).items():
                command = name.split("|", 1)[0]  # "client|setinfo": MONITOR says "client"
                if command not in _CONTROL_COMMANDS:
                    stats[command] += calls
    finally:
        for conn in (*monitors, *controls):
            conn.close()
    scale = 1.0 / (max(1, operations) * len(addresses))
    return CommandCount(
        operations=operations,
        nodes=len(addresses),
        top_level={name: calls * scale for name, calls in top.items()},
        in_script={name: calls * scale for name, calls in script.items()},
        commandstats={name: calls * scale for name, calls in stats.items()},
        top_level_max_node=busiest / max(1, operations),
    )


def count_keys(
    addresses: list[tuple[str, int]], pattern: str, skip: tuple[str, ...] = ()
) -> list[int]:
    """How many keys match ``pattern`` (SCAN MATCH) on each node, leaving out those
    containing any of ``skip`` (python-redis-lock's short-lived ``lock-signal:`` lists;
    celery-redlock's fence counters and release tombstones, marked by a NUL)."""
    counts = []
    for host, port in addresses:
        found = 0
        with RespConnection(host, port) as conn:
            cursor = b"0"
            while True:
                reply = conn.call("SCAN", cursor, "MATCH", pattern, "COUNT", 1000)
                assert isinstance(reply, list) and isinstance(reply[0], bytes)
                cursor, names = reply[0], reply[1]
                assert isinstance(names, list)
                found += sum(
                    1
                    for name in names
                    if not (isinstance(name, bytes) and any(s.encode() in name for s in skip))
                )
                if cursor == b"0":
                    break
        counts.append(found)
    return counts
