"""A Lua script and its SHA1, as the lock sends it (EVALSHA; EVAL when the node
forgot it). The scripts themselves are scripts.py's (one-key locks, batches,
hand-off) and multi_scripts.py's (several keys taken together).

This module imports nothing from the rest of the package.
"""

from __future__ import annotations

import hashlib

__all__ = ["WAKE_SUFFIX", "Script", "publish_wake"]

#: What a key's wake channel adds to the key: a release PUBLISHes there, a blocked
#: acquire SUBSCRIBEs (wake.py). Behind a NUL, which lock keys may not contain.
WAKE_SUFFIX = "\0wake"


def publish_wake(key: str) -> str:
    """The Lua that tells ``key``'s waiters it was freed (``key``: a Lua expression).

    ``redis.pcall``, its outcome ignored: a user whose ACL denies PUBLISH or the
    channel (Redis 7's default ``acl-pubsub-default resetchannels``) still releases;
    its waiters fall back to polling. No subscriber: a hash lookup on the node."""
    suffix = "".join(f"\\{ord(c)}" if c < " " else c for c in WAKE_SUFFIX)
    return f"redis.pcall('publish', {key} .. '{suffix}', '')"


class Script:
    """A Lua script with its SHA1, as sent with EVALSHA (EVAL when the node forgot it)."""

    __slots__ = ("sha", "source")

    def __init__(self, source: str) -> None:
        self.source = source.strip() + "\n"
        self.sha = hashlib.sha1(self.source.encode()).hexdigest()

    def __repr__(self) -> str:
        return f"<Script {self.sha[:8]}>"
