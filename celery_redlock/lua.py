"""A Lua script and its SHA1, as the lock sends it (EVALSHA; EVAL when the node
forgot it). The scripts themselves are scripts.py's (one-key locks, batches,
hand-off) and multi_scripts.py's (several keys taken together).

This module imports nothing from the rest of the package.
"""

from __future__ import annotations

import hashlib

__all__ = ["Script"]


class Script:
    """A Lua script with its SHA1, as sent with EVALSHA (EVAL when the node forgot it)."""

    __slots__ = ("sha", "source")

    def __init__(self, source: str) -> None:
        self.source = source.strip() + "\n"
        self.sha = hashlib.sha1(self.source.encode()).hexdigest()

    def __repr__(self) -> str:
        return f"<Script {self.sha[:8]}>"
