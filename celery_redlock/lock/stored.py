"""What is stored under a lock key, and how to read it.

A lock key holds ``<token>|<holder>``: 20 random url-safe bytes (never a ``|``), then
who took it (``task-id@worker:pid``, by default ``hostname:pid``), so contention can
say who holds the lock. Beside each lock key, under the same prefix, live the lock's
own keys: a release's tombstone, the key's fence counter and a reentrant lease's
holds, told apart from lock keys by a NUL that lock keys may not contain.
``NodeHolding`` and ``HolderInfo`` say what the nodes hold for a key, and whether a
quorum agrees.

Plain data and string handling: must not import the round, nodes, redlock.py or
Celery.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
from collections import Counter
from dataclasses import dataclass
from typing import Optional, Union

__all__ = [
    "DROPPED",
    "FENCE",
    "FIRST_HOLD",
    "INTERNAL",
    "LIMIT",
    "RATE",
    "RELEASED",
    "TOMBSTONE",
    "WAKE_SUFFIX",
    "HolderInfo",
    "NodeHolding",
    "default_holder",
    "fence_counter",
    "hold_tombstone",
    "is_lock_key",
    "lua_text",
    "new_value",
    "permit_full",
    "permit_grant",
    "permit_grant_prefix",
    "permit_of",
    "permit_slot",
    "permit_slot_prefix",
    "permit_terms_record",
    "permit_tombstone",
    "permit_turns",
    "publish_wake",
    "read_holding",
    "reentry_holds",
    "split_value",
    "tombstone",
    "wake_channel",
]

#: Separates a lock key from the lock's own keys kept beside it. Lock keys may not
#: contain it, so no lock key can ever be another key's fence counter or tombstone
#: (with ":fence", the lock for "job:fence" *was* the fence counter of "job"). They
#: stay under the lock key's prefix, so one ACL key pattern covers all of them.
INTERNAL = "\x00"
#: Marks a release's tombstone: ``<key>\0released\0<token>`` (see scripts.RELEASE).
TOMBSTONE = INTERNAL + "released" + INTERNAL
#: Suffix of a key's fence counter, ``<key>\0fence``.
FENCE = INTERNAL + "fence"
#: What a key's wake channel adds to the key: a release PUBLISHes there, a blocked
#: acquire SUBSCRIBEs (wake.py). Behind a NUL, which lock keys may not contain.
WAKE_SUFFIX = INTERNAL + "wake"
#: The wake events of ``publish_wake`` (Lua expressions): a release deleting our
#: value (ARGV[1] of every release script), and the undo or clean-up of a permit
#: round deleting it (DROP_PERMITS; the same value is released later).
RELEASED = "'r' .. ARGV[1]"
DROPPED = "'d' .. ARGV[1]"
#: A fence counter expires this long (seconds) after the last fence recorded on it:
#: one key per distinct lock key ever fenced must not fill a ``noeviction`` node.
#: Fences stay rising while clients' clocks are within half of it of the true time
#: (SAFETY.md, property 4): a week.
FENCE_COUNTER_TTL = 7 * 24 * 3600.0


def lua_text(text: str) -> str:
    """``text`` as it goes inside a quoted Lua string: control characters (the NUL
    of the lock's own keys) as decimal escapes."""
    return "".join(f"\\{ord(c)}" if c < " " else c for c in text)


def publish_wake(key: str, event: Optional[str] = None) -> str:
    """The Lua that tells ``key``'s waiters it was freed (``key``: a Lua expression).

    ``event`` (a Lua expression, the same on every node for one release and unique
    to it: a tag and the released value) is published as its SHA-1, never the
    value itself (a lease's token): a process whose waiters hear one release from
    several nodes wakes one of them for it (wake.py, ``Releases``). None publishes
    an empty message, which wakes every waiter (an operator's deletion).

    ``redis.pcall``, its outcome ignored: a user whose ACL denies PUBLISH or the
    channel (Redis 7's default ``acl-pubsub-default resetchannels``) still releases;
    its waiters fall back to polling. No subscriber: a hash lookup on the node."""
    message = "''" if event is None else f"redis.sha1hex({event})"
    return f"redis.pcall('publish', {key} .. '{lua_text(WAKE_SUFFIX)}', {message})"


def wake_channel(key: Union[str, bytes]) -> bytes:
    """The channel a deletion of ``key`` is published on (``publish_wake`` in Lua)."""
    return (key.encode() if isinstance(key, str) else key) + WAKE_SUFFIX.encode()


def tombstone(key: str, value: str) -> str:
    """The tombstone key a release of ``value`` leaves where ``key`` was absent."""
    return f"{key}{TOMBSTONE}{value.partition('|')[0]}"


#: The hold a plain acquire took, named when its lease is first re-acquired.
FIRST_HOLD = "0"
#: Marks the set of a reentrant lease's holds: ``<key>\0holds\0<token>``.
HOLDS = INTERNAL + "holds" + INTERNAL


def hold_tombstone(key: str, value: str, hold: str) -> str:
    """The tombstone a release of one ``hold`` of ``value`` leaves: that hold's
    REENTER, should it land later, adds nothing (see scripts.RELEASE_HOLD)."""
    return f"{tombstone(key, value)}{INTERNAL}{hold}"


def reentry_holds(key: str, value: str) -> str:
    """Where the nodes count the holds of ``value`` on ``key`` (reentrancy): one set
    per value, so a stale set can never count for the next holder."""
    return f"{key}{HOLDS}{value.partition('|')[0]}"


# -- the permits of a limit or a rate (permits.py): slots ``<key>\0limit\0<i>`` or
# ``<key>\0rate\0<i>``, each an ordinary lock key; the terms every caller of the key
# agrees on, ``<key>\0limit`` / ``<key>\0rate``; one tombstone per token for all slots.

#: A limit's permits (N holders at once).
LIMIT = "limit"
#: A rate's permits (R starts per period).
RATE = "rate"


#: A slot's number as the scripts write it: decimal, no sign, no leading zero.
_SLOT = re.compile(r"0|[1-9][0-9]*", re.ASCII)


def permit_slot_prefix(key: str, kind: str) -> str:
    """Slot i of ``key``'s permits of ``kind`` is this prefix followed by ``str(i)``."""
    return f"{key}{INTERNAL}{kind}{INTERNAL}"


def permit_slot(key: str, kind: str, slot: int) -> str:
    return f"{permit_slot_prefix(key, kind)}{slot}"


def permit_of(name: str) -> Optional[tuple[str, str, int]]:
    """``(key, kind, slot)`` for a permit slot's name; None for anything else."""
    key, sep, rest = name.partition(INTERNAL)
    kind, sep2, slot = rest.partition(INTERNAL)
    if not sep or not sep2 or kind not in (LIMIT, RATE) or not _SLOT.fullmatch(slot):
        return None
    return key, kind, int(slot)


def permit_terms_record(key: str, kind: str) -> str:
    """Where the nodes record the terms (N, or R/period) of ``key``'s permits."""
    return f"{key}{INTERNAL}{kind}"


def permit_turns(key: str) -> str:
    """Where the nodes keep when a rate's next reserved turn is (a hint for pacing
    the callers that come back, never part of what a start needs)."""
    return f"{key}{INTERNAL}{RATE}-turns"


def permit_full(key: str, kind: str) -> str:
    """Where a node notes that every slot of ``key``'s permits of ``kind`` is taken,
    until the first of them expires (permit_scripts.py): a refusal reads it, not N
    slots. It only ever refuses, and every deletion of a slot deletes it."""
    return f"{key}{INTERNAL}{kind}-full"


def permit_grant_prefix(key: str, kind: str) -> str:
    """Every grant of ``key``'s permits of ``kind`` is named this, then a token."""
    return f"{permit_slot_prefix(key, kind)}granted{INTERNAL}"


def permit_grant(key: str, kind: str, value: str) -> str:
    """Where a node notes which of ``key``'s slots it gave ``value``'s token, for as
    long as that slot was set to live (permit_scripts.py)."""
    return f"{permit_grant_prefix(key, kind)}{value.partition('|')[0]}"


def permit_tombstone(key: str, kind: str, value: str) -> str:
    """The tombstone a permit release of ``value`` leaves: it covers every slot."""
    return f"{permit_slot_prefix(key, kind)}released{INTERNAL}{value.partition('|')[0]}"


def fence_counter(key: str) -> str:
    """Where the nodes keep the highest fence granted for ``key``."""
    return key + FENCE


def is_lock_key(name: str) -> bool:
    """A lock key, not a fence counter or tombstone kept beside one."""
    return INTERNAL not in name


_holder: Optional[str] = None


def default_holder() -> str:
    """Who we are, as stored beside the token: ``hostname:pid`` (cached per process)."""
    global _holder
    if _holder is None:
        _holder = f"{socket.gethostname()}:{os.getpid()}"
    return _holder


def _forget_holder() -> None:
    global _holder
    _holder = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_holder)


def new_value(holder: str) -> str:
    """A value for ``holder`` to store: ``token|holder`` with a fresh random token
    (url-safe base64: never a '|'); :func:`split_value` reads it."""
    return f"{secrets.token_urlsafe(20)}|{holder}"


def split_value(value: object) -> tuple[Optional[str], Optional[str]]:
    """Stored value -> (token, holder). The token is url-safe base64: never a '|'.

    Takes the raw bytes of a round's reply, or text from a client that decodes replies.
    """
    if isinstance(value, bytes):
        text = value.decode("utf-8", "replace")
    elif isinstance(value, str):
        text = value
    else:
        return None, None
    token, _, holder = text.partition("|")
    return token, holder or None


@dataclass(frozen=True)
class NodeHolding:
    """What one node says about a key."""

    node: str
    token: Optional[str] = None
    holder: Optional[str] = None
    ttl: Optional[float] = None  # seconds left; None: no key (or no expiry)
    error: Optional[BaseException] = None


@dataclass(frozen=True)
class HolderInfo:
    """Who holds a key, node by node, and whether a quorum agrees."""

    key: str
    nodes: tuple[NodeHolding, ...]
    quorum: int

    @property
    def holder(self) -> Optional[str]:
        """The holder a quorum of nodes agrees on, else ``None``."""
        tokens = Counter(n.token for n in self.nodes if n.token)
        for token, count in tokens.most_common(1):
            if count >= self.quorum:
                return next(n.holder or token for n in self.nodes if n.token == token)
        return None

    @property
    def ttl(self) -> Optional[float]:
        """Seconds until the quorum holder's lock frees (its quorum-th longest TTL)."""
        held = self.holder
        if held is None:
            return None
        ttls = sorted(
            (n.ttl for n in self.nodes if (n.holder or n.token) == held and n.ttl is not None),
            reverse=True,
        )
        return ttls[self.quorum - 1] if len(ttls) >= self.quorum else None


def read_holding(node: str, value: object, pttl: object) -> NodeHolding:
    """A node's value and PTTL of a key (as its HOLDER script or GET + PTTL return
    them) read as a ``NodeHolding``."""
    token, holder = split_value(value)
    ttl = pttl / 1000.0 if isinstance(pttl, int) and pttl >= 0 else None
    return NodeHolding(node, token, holder, ttl)
