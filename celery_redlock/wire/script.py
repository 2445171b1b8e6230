"""A Lua script and its SHA1, as the lock sends it (EVALSHA; EVAL when the node
forgot it), and the scripts every new connection loads ahead of its first command.

The scripts themselves are the lock's (lock/scripts.py, lock/multi_scripts.py): the
wire knows the type, not the scripts; the lock names the ones to preload
(``preload``). Imports nothing from the rest of the package.
"""

from __future__ import annotations

import hashlib

__all__ = ["PRELOADED", "Script", "preload"]


class Script:
    """A Lua script with its SHA1, as sent with EVALSHA (EVAL when the node forgot it)."""

    __slots__ = ("names", "sha", "source")

    def __init__(self, source: str, names: tuple[int, ...] = ()) -> None:
        self.source = source.strip() + "\n"
        self.sha = hashlib.sha1(self.source.encode()).hexdigest()
        #: The ``ARGV`` positions (1-based) that hold a key name or the start of one
        #: (a prefix the script completes): renamed with the keys on a cluster node.
        self.names = names

    def __repr__(self) -> str:
        return f"<Script {self.sha[:8]}>"


#: What a new connection sends ``SCRIPT LOAD`` for in its handshake (connection.py),
#: so the first EVALSHA of each finds its script. Filled by the lock's script rooms.
PRELOADED: list[Script] = []


def preload(*scripts: Script) -> None:
    """Have every connection opened from now on load ``scripts`` in its handshake."""
    PRELOADED.extend(s for s in scripts if s not in PRELOADED)
