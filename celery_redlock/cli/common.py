"""What every command of the CLI shares below click: the configured nodes, working on
all of them at once under one deadline, and reading keys and stored values.

No click here (the doctor library and the lock readers use it without a command
line); it imports only redis and the lock's own modules (nodes, redlock).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Sequence
from typing import Any, Callable, Optional, TypeVar, Union

import redis

from ..lock.redlock import Redlock, is_lock_key
from ..wire.node_set import Node

_T = TypeVar("_T")


def configured_nodes(lock: Redlock) -> list[Node]:
    """The lock's nodes, in configured order."""
    return list(lock.node_set.nodes)


def on_each_node(
    nodes: Sequence[Node], work: Callable[[Node], _T], timeout: float
) -> list[Union[_T, BaseException]]:
    """``work(node)`` for every node at once, in threads, under one shared deadline.

    One entry per node: what ``work`` returned, the exception it raised, or a
    ``redis.TimeoutError`` when it was still running at the deadline (the thread
    is a daemon and is left behind: a hung node must not hang the command).
    """
    pending = object()
    results: list[Any] = [pending] * len(nodes)

    def run(index: int, node: Node) -> None:
        try:
            results[index] = work(node)
        except BaseException as exc:
            results[index] = exc

    threads = [
        threading.Thread(target=run, args=(i, node), daemon=True, name=f"redlock-cli-{i}")
        for i, node in enumerate(nodes)
    ]
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return [
        redis.TimeoutError(f"{node.address}: no reply within {timeout:g} s")
        if result is pending
        else result
        for node, result in zip(nodes, results)
    ]


def text(value: object) -> Optional[str]:
    """A reply as text: bytes decoded, numbers as written."""
    # redis-py's INFO parser turns number-looking values into int/float, and a
    # client given by the app may decode replies itself.
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def error_text(error: BaseException) -> str:
    """An exception as one line of text."""
    message = str(error) or type(error).__name__
    return message.replace("\n", " ")


def full_key(key: str, prefix: str) -> str:
    """``KEY`` as given on the command line -> the key in Redis.

    A key already under ``<prefix>:`` is taken as is; any other is relative to it.
    """
    if key.startswith(prefix + ":"):
        return key
    return f"{prefix}:{key}"


def glob_literal(text: str) -> str:
    """``text`` as a SCAN MATCH glob that matches only itself."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def prefix_match(prefix: str, pattern: str = "*") -> str:
    """A SCAN MATCH glob for ``pattern`` under ``<prefix>:`` (the prefix taken literally)."""
    return f"{glob_literal(prefix)}:{pattern}"


def glob_match(pattern: str, name: str) -> bool:
    """Whether ``name`` matches the SCAN MATCH glob ``pattern``, exactly as Redis
    decides it (util.c ``stringmatchlen``, byte for byte, its quirks included: an
    unclosed ``[`` takes the rest of the pattern as its set)."""
    return _glob(pattern.encode(), 0, name.encode(), 0, [False])


def _glob(pattern: bytes, p: int, name: bytes, n: int, gave_up: list[bool]) -> bool:
    while p < len(pattern) and n < len(name):
        char = pattern[p]
        if char == ord("*"):
            while p + 1 < len(pattern) and pattern[p + 1] == ord("*"):
                p += 1
            if p + 1 == len(pattern):
                return True
            for start in range(n, len(name)):
                if _glob(pattern, p + 1, name, start, gave_up):
                    return True
                if gave_up[0]:  # a longer match of this star cannot succeed either
                    return False
            gave_up[0] = True
            return False
        if char == ord("["):
            p, matched = _glob_set(pattern, p + 1, name[n])
            if not matched:
                return False
        elif char != ord("?"):
            if char == ord("\\") and p + 1 < len(pattern):
                p += 1
            if pattern[p] != name[n]:
                return False
        n += 1
        p += 1
        if n == len(name):
            while p < len(pattern) and pattern[p] == ord("*"):
                p += 1
    return p == len(pattern) and n == len(name)


def _glob_set(pattern: bytes, p: int, char: int) -> tuple[int, bool]:
    """A ``[...]`` set from just after its ``[``: where it ends, and whether ``char``
    is in it."""
    negated = p < len(pattern) and pattern[p] == ord("^")
    if negated:
        p += 1
    matched = False
    while True:
        if pattern[p : p + 1] == b"\\" and p + 1 < len(pattern):
            p += 1
            matched = matched or pattern[p] == char
        elif pattern[p : p + 1] == b"]":
            break
        elif p >= len(pattern):  # unclosed: the set ends with the pattern
            p -= 1
            break
        elif p + 2 < len(pattern) and pattern[p + 1] == ord("-"):
            low, high = sorted((pattern[p], pattern[p + 2]))
            p += 2
            matched = matched or low <= char <= high
        else:
            matched = matched or pattern[p] == char
        p += 1
    return p, matched != negated


def lock_keys(names: Sequence[str]) -> list[str]:
    """Lock keys, not the fence counters or release tombstones kept beside them."""
    return [name for name in names if is_lock_key(name)]
