"""Waiting for what every node holds, in tests.

A lock round returns once a quorum has answered: the other nodes' copies arrive a
moment later (on a loaded machine, a scheduler tick or more). A test that reads every
node right after an acquire, extend or release therefore waits for the reading it
expects, and fails with the last reading it got. ``SETTLES_WITHIN`` is a hang guard,
not a speed claim: a correct run returns as soon as the nodes agree.
"""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")

SETTLES_WITHIN = 10.0


def settles(read: Callable[[], T], expected: T, what: str, within: float = SETTLES_WITHIN) -> T:
    """Poll ``read()`` until it equals ``expected``; fail naming ``what`` and the last reading."""
    give_up = time.monotonic() + within
    while True:
        reading = read()
        if reading == expected:
            return reading
        assert time.monotonic() < give_up, (
            f"{what}: still {reading!r} after {within} s, expected {expected!r}"
        )
        time.sleep(0.01)


def until(check: Callable[[], T], what: str, within: float = SETTLES_WITHIN) -> T:
    """Poll ``check()`` until it returns something true, and return that."""
    give_up = time.monotonic() + within
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < give_up, f"{what}: still not so after {within} s"
        time.sleep(0.01)
