"""What ``ls`` lists: every lock key under the prefix that matches the pattern, and
every key with permits (a limit or a rate, permits.py) listed once per kind, never
slot by slot.

Two passes over the nodes, each at once under one deadline: SCAN, then one
transaction per node reading every listed name (a node that failed the scan is not
asked again, so a hung node costs the timeout once).
No click here; imports common.py, holders.py, permits.py and the lock's own modules.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..lock.redlock import HolderInfo, Redlock
from ..lock.stored import INTERNAL
from ..wire.node_set import Node
from .common import (
    configured_nodes,
    error_text,
    glob_match,
    lock_keys,
    on_each_node,
    prefix_match,
    text,
)
from .holders import read_holders
from .permits import Permits, build_permits, group_permits, names_to_read


@dataclass
class Listing:
    """The lock keys and permits under a prefix and who holds each (what ``ls`` shows)."""

    match: str  # the SCAN MATCH glob
    nodes: list[Node]
    quorum: int
    holders: list[HolderInfo]  # the lock keys among the first ``limit`` entries, sorted
    more: int  # entries found beyond the limit
    errors: dict[str, str]  # node address -> why it could not be listed
    permits: list[Permits]  # the keys with permits among the first ``limit`` entries

    @property
    def entries(self) -> int:
        return len(self.holders) + len(self.permits)


def scan_matches(match: str) -> list[str]:
    """The SCAN MATCH globs that find every lock key matching ``match`` and every
    permit name of a key matching it: ``match`` alone when it ends with a star (the
    star takes the NUL and what follows), else also ``match`` + NUL + star."""
    stars = len(match) - len(match.rstrip("*"))
    head = match[: len(match) - stars]
    escaped = (len(head) - len(head.rstrip("\\"))) % 2 == 1  # "\\*" is a literal star
    # A "[" may leave the last star inside an unclosed set: scan for the permits too.
    if (stars > 1 or (stars == 1 and not escaped)) and "[" not in match:
        return [match]
    return [match, f"{match}{INTERNAL}*"]


def list_locks(lock: Redlock, prefix: str, pattern: str, limit: int, timeout: float) -> Listing:
    """Scan every node for lock keys and permits matching ``pattern`` under ``prefix``,
    then read the first ``limit`` entries (sorted by key): a lock key is one entry, a
    key's limit one and its rate one."""
    nodes = configured_nodes(lock)
    match = prefix_match(prefix, pattern)
    matches = scan_matches(match)

    def scan(node: Node) -> list[str]:
        client = node.client()
        return [
            text(raw) or "" for glob in matches for raw in client.scan_iter(match=glob, count=1000)
        ]

    scanned = on_each_node(nodes, scan, timeout)
    errors = {
        node.address: error_text(result)
        for node, result in zip(nodes, scanned)
        if isinstance(result, BaseException)
    }
    names: set[str] = set()
    for result in scanned:
        if not isinstance(result, BaseException):
            names.update(result)
    # The permits' names were found by their own glob: keep the keys that match.
    found = group_permits(names, lambda key: glob_match(match, key))
    entries = sorted([(key, "") for key in lock_keys(sorted(names))] + list(found))
    shown = entries[:limit]
    keys = [key for key, kind in shown if not kind]
    permits = {entry: found[entry] for entry in shown if entry[1]}
    read = read_holders(nodes, keys + names_to_read(permits), scanned, lock.quorum, timeout)
    by_name = {info.key: info for info in read}
    return Listing(
        match,
        nodes,
        lock.quorum,
        [by_name[key] for key in keys],
        len(entries) - len(shown),
        errors,
        build_permits(permits, by_name, lock.quorum),
    )
