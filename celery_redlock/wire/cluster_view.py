"""A Redis Cluster node seen as one plain Redis, for inspection (CLI, ``Redlock.clear``).

The operators' commands read and write lock keys by the names the lock gives them,
through a handful of redis-py calls (SCAN, GET, MGET, EVAL, PUBLISH, a pipeline of
GET / PTTL / DEL / EVAL / PUBLISH). ``ClusterView`` answers those calls for a cluster
node: each name is tagged as the lock tags it (cluster.py), sent to the master
serving its slot (a plain client per master), and names read back are untagged. A
pipeline runs as one transaction per master, its replies put back in order. Lock
operations never come here: they go through rounds.

Imports cluster.py and script.py; must not import node_set.py, the lock or Celery.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Optional, Protocol, Union

import redis

from .cluster import COMPANION, tagged, untagged
from .script import PRELOADED

__all__ = ["ClusterView", "tagged_globs"]

Name = Union[bytes, str]


class _Server(Protocol):
    def client(self) -> redis.Redis: ...


class _Cluster(Protocol):
    """What the view needs of its node (cluster_node.ClusterNode)."""

    def masters(self) -> Sequence[_Server]: ...
    def master_of_name(self, name: str) -> _Server: ...


def _text(name: Name) -> str:
    return name.decode() if isinstance(name, bytes) else str(name)


def tagged_globs(match: str) -> list[str]:
    """The SCAN patterns of the tagged names whose untagged names ``match`` matches:
    the part before the first NUL (the lock key's) inside the tag; a pattern without
    a NUL that ends in ``*`` also reaches the keys' companions, as it does untagged."""
    head, sep, rest = match.partition(COMPANION)
    globs = [f"{{{head}}}{sep}{rest}"]
    if not sep and match.endswith("*"):
        globs.append(f"{{{head}}}{COMPANION}*")
    return globs


class ClusterView:
    """The redis-py calls the CLI makes, answered by a cluster's masters."""

    def __init__(self, node: _Cluster) -> None:
        self._node = node

    def _client(self, name: str) -> redis.Redis:
        return self._node.master_of_name(name).client()

    def scan_iter(self, match: str = "*", count: Optional[int] = None) -> Iterator[bytes]:
        for master in self._node.masters():
            for glob in tagged_globs(match):
                for name in master.client().scan_iter(match=glob, count=count):
                    yield untagged(_text(name)).encode()

    def get(self, name: Name) -> Any:
        stored = tagged(_text(name))
        return self._client(stored).get(stored)

    def mget(self, names: Sequence[Name]) -> list[Any]:
        return [self.get(name) for name in names]

    def eval(self, source: str, numkeys: int, *keys_and_args: Any) -> Any:
        keys, args = _renamed(source, numkeys, keys_and_args)
        return self._client(keys[0]).eval(source, numkeys, *keys, *args)

    def publish(self, channel: Name, message: Any) -> Any:
        stored = tagged(_text(channel))
        return self._client(stored).publish(stored, message)

    def pipeline(self, transaction: bool = True) -> _Pipeline:
        return _Pipeline(self, transaction)


def _renamed(
    source: str, numkeys: int, keys_and_args: Sequence[Any]
) -> tuple[list[str], list[Any]]:
    """A script call's keys tagged, and its arguments that name keys (``Script.names``)."""
    keys = [tagged(_text(k)) for k in keys_and_args[:numkeys]]
    args = list(keys_and_args[numkeys:])
    script = next((s for s in PRELOADED if s.source == source), None)
    for position in script.names if script is not None else ():
        args[position - 1] = tagged(_text(args[position - 1]))
    return keys, args


class _Pipeline:
    """Calls queued in order, run as one pipeline per master, replies in order."""

    def __init__(self, view: ClusterView, transaction: bool) -> None:
        self._view = view
        self._transaction = transaction
        self._calls: list[tuple[str, str, tuple[Any, ...]]] = []  # (method, name, args)

    def _queue(self, method: str, name: str, *args: Any) -> _Pipeline:
        self._calls.append((method, name, args))
        return self

    def get(self, name: Name) -> _Pipeline:
        stored = tagged(_text(name))
        return self._queue("get", stored, stored)

    def pttl(self, name: Name) -> _Pipeline:
        stored = tagged(_text(name))
        return self._queue("pttl", stored, stored)

    def delete(self, name: Name) -> _Pipeline:
        stored = tagged(_text(name))
        return self._queue("delete", stored, stored)

    def publish(self, channel: Name, message: Any) -> _Pipeline:
        stored = tagged(_text(channel))
        return self._queue("publish", stored, stored, message)

    def eval(self, source: str, numkeys: int, *keys_and_args: Any) -> _Pipeline:
        keys, args = _renamed(source, numkeys, keys_and_args)
        return self._queue("eval", keys[0], source, numkeys, *keys, *args)

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        by_master: dict[int, tuple[Any, list[int]]] = {}
        for index, (method, name, args) in enumerate(self._calls):
            client = self._view._client(name)
            pipe, indexes = by_master.setdefault(
                id(client), (client.pipeline(transaction=self._transaction), [])
            )
            getattr(pipe, method)(*args)
            indexes.append(index)
        replies: list[Any] = [None] * len(self._calls)
        for pipe, indexes in by_master.values():
            for index, reply in zip(indexes, pipe.execute(raise_on_error=raise_on_error)):
                replies[index] = reply
        self._calls.clear()
        return replies
