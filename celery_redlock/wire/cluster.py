"""A Redis Cluster as one lock node: its URL, the names its keys get, and its slot map.

A node URL may name a Redis Cluster instead of one master, in the same shape as a
``sentinel://`` node (``;`` between the seeds, credentials and options on the first)::

    redis+cluster://[[user]:password@]host1:7000[;redis+cluster://host2:7001]
    rediss+cluster://...   (TLS; the ssl_* query options of a rediss:// URL)

The seeds are any of the cluster's servers; the slot map is asked of them. Such a URL
is *one* Redlock node: its vote on a key is the vote of the shard serving the key's
slot.

**Names.** A cluster refuses a script whose keys span slots, and every lock script
touches the lock key with its companions (fence counter, tombstones, holds,
hand-off records, permit slots), each named ``<key>`` + a NUL-led suffix. On a
cluster node the name sent is ``{<key>}<suffix>`` (``tagged``): the hash tag is the
whole lock key, so the companions of one key share its slot and different keys
spread over the shards. Plain, TLS, unix and Sentinel nodes keep the untagged names:
an upgrade never renames a key on a node that worked before (SAFETY.md). A
command's key names and the script arguments that name keys (``Script.names``) are
renamed; a command whose keys would land in different slots (a lock on several
keys) is refused with a ``ConfigurationError`` before anything is sent.

**Slot map.** ``CLUSTER SLOTS`` (Redis 6.2 and 7, Valkey) is asked of every seed at
once on the round's connections (TLS and AUTH included) under what is left of the
round's deadline, as Sentinel discovery is; the first full answer is the map.
node_set.py follows ``MOVED`` (the map updated) and ``ASK`` once per round within
the deadline, and drops the map when a shard cannot be reached.

Imports connection.py, resp.py, unpatched.py and errors.py; must not import
node_set.py, the lock or Celery.
"""

from __future__ import annotations

import math
import select
import time
from dataclasses import dataclass
from typing import Final, Optional, Sequence
from urllib.parse import parse_qsl, urlsplit

from redis import exceptions as rexc
from redis.crc import key_slot

from ..errors import ConfigurationError
from . import unpatched
from .connection import Connection
from .resp import Command, Plain

__all__ = [
    "ASKING",
    "CLUSTER_SLOTS",
    "COMPANION",
    "SCHEMES",
    "ClusterSpec",
    "SlotMap",
    "ask_slot_map",
    "is_cluster_url",
    "parse_cluster_url",
    "redirect_target",
    "renamed",
    "slot_of",
    "tagged",
    "untagged",
]

SCHEMES: Final = ("redis+cluster://", "rediss+cluster://")
#: What separates a lock key from its companions' suffixes: lock/stored.py's INTERNAL
#: (the wire may not import the lock; a test checks the two agree).
COMPANION: Final = "\x00"
#: Hash slots of every Redis Cluster.
SLOTS: Final = 16384

ACCEPTED: Final = (
    "accepted: redis+cluster://[[user]:password@]host:port[/0][;redis+cluster://host:port...] "
    "or rediss+cluster://... (TLS, with the ssl_* options of a rediss:// URL)"
)

_POLLIN: Final = unpatched.POLL_READ
_POLLOUT: Final = unpatched.POLL_WRITE

CLUSTER_SLOTS: Final = Plain(b"CLUSTER", b"SLOTS")
ASKING: Final = Plain(b"ASKING")


def is_cluster_url(spec: object) -> bool:
    return isinstance(spec, str) and spec.strip().lower().startswith(SCHEMES)


@dataclass(frozen=True)
class ClusterSpec:
    """Where a cluster's seeds are and how to greet its servers."""

    seeds: tuple[tuple[str, int], ...]
    tls: bool
    #: ``user:password@`` as written in the URL (quoted), or "".
    userinfo: str
    #: The query string of the first seed (TLS options), or "".
    query: str

    def server_url(self, host: str, port: int) -> str:
        """A ``redis://`` / ``rediss://`` URL for one of the cluster's servers."""
        scheme = "rediss" if self.tls else "redis"
        where = f"[{host}]" if ":" in host else host
        query = f"?{self.query}" if self.query else ""
        return f"{scheme}://{self.userinfo}{where}:{port}/0{query}"

    @property
    def address(self) -> str:
        """How errors and logs name the node: its seeds."""
        return "cluster:" + ",".join(f"{host}:{port}" for host, port in self.seeds)

    @property
    def identity(self) -> tuple[str, ...]:
        """What makes two entries the same cluster (the duplicate check)."""
        return ("cluster", *sorted(f"{host.lower()}:{port}" for host, port in self.seeds))


def parse_cluster_url(url: str, index: int = 0, shown: Optional[str] = None) -> ClusterSpec:
    """The ``ClusterSpec`` of ``nodes[index]``; ConfigurationError naming what is wrong.

    ``shown``: the URL as errors show it (passwords redacted)."""
    shown = url if shown is None else shown
    parts = [part.strip() for part in url.split(";") if part.strip()]
    seeds: list[tuple[str, int]] = []
    schemes = set()
    for part in parts:
        if not part.lower().startswith(SCHEMES):
            raise ConfigurationError(
                f"nodes[{index}]: {shown!r}: every part between ';' must be a "
                f"redis+cluster:// URL; {ACCEPTED}"
            )
        schemes.add(part.lower().split("://", 1)[0])
        try:
            split = urlsplit(part)
            port = split.port
        except ValueError as exc:
            raise ConfigurationError(f"nodes[{index}]: {shown!r}: {exc}; {ACCEPTED}") from None
        if not split.hostname or port is None:
            raise ConfigurationError(
                f"nodes[{index}]: {shown!r}: each seed needs a host and a port; {ACCEPTED}"
            )
        db = split.path.strip("/")
        if db not in ("", "0"):
            raise ConfigurationError(
                f"nodes[{index}]: {shown!r}: a Redis Cluster has only db 0, got {db!r}"
            )
        seeds.append((split.hostname, port))
    if len(schemes) > 1:
        raise ConfigurationError(
            f"nodes[{index}]: {shown!r}: mixes redis+cluster:// and rediss+cluster:// seeds; "
            "a cluster's servers all speak TLS or none do"
        )
    first = urlsplit(parts[0])
    for name, _ in parse_qsl(first.query, keep_blank_values=True):
        if not name.startswith("ssl_"):
            raise ConfigurationError(
                f"nodes[{index}]: {shown!r}: unknown option {name!r}; a redis+cluster:// URL "
                "accepts the ssl_* options of a rediss:// URL"
            )
    userinfo = first.netloc.rpartition("@")[0]
    return ClusterSpec(
        seeds=tuple(dict.fromkeys(seeds)),
        tls=schemes == {"rediss+cluster"},
        userinfo=f"{userinfo}@" if userinfo else "",
        query=first.query,
    )


# -- names ---------------------------------------------------------------------------


def tagged(name: str) -> str:
    """``name`` as a cluster node stores it: the lock key (before the first NUL) as
    the hash tag, so a key and its companions share one slot."""
    key, sep, rest = name.partition(COMPANION)
    if key.startswith("}"):
        raise ConfigurationError(
            f"key {key!r} cannot be locked on a Redis Cluster node: a key starting with "
            "'}' would leave its hash tag empty (its companions would land in other "
            "slots); choose a key that does not start with '}'"
        )
    return f"{{{key}}}{sep}{rest}"


def untagged(name: str) -> str:
    """The name a lock gave, from one read on a cluster node (``tagged`` undone)."""
    head, sep, rest = name.partition(COMPANION)
    if head.startswith("{") and head.endswith("}") and len(head) >= 2:
        return f"{head[1:-1]}{sep}{rest}"
    return name


def slot_of(name: str) -> int:
    return int(key_slot(name.encode()))


def renamed(command: Command) -> tuple[Command, Optional[int]]:
    """``command`` as a cluster node is sent it, and the slot it goes to (None for a
    command without keys). ConfigurationError when its keys span slots."""
    keys = command.keys
    if not keys:
        return command, None
    names = tuple(tagged(key) for key in keys)
    tags = {name.partition("}")[0] for name in names}
    if len(tags) > 1:
        shown = ", ".join(repr(k) for k in dict.fromkeys(k.partition(COMPANION)[0] for k in keys))
        raise ConfigurationError(
            f"a lock on several keys ({shown}) cannot use a Redis Cluster node: each key "
            "lives in its own slot and one script cannot touch several; lock them one by "
            "one, or use standalone masters"
        )
    return command.renamed(names, tagged), slot_of(names[0])


def redirect_target(reply: object) -> Optional[tuple[bool, int, str, int]]:
    """A ``MOVED``/``ASK`` reply as (asking, slot, host, port); None for any other."""
    if not isinstance(reply, rexc.ResponseError):
        return None
    parts = str(reply).split()
    if len(parts) != 3 or parts[0] not in ("MOVED", "ASK"):
        return None
    host, _, port = parts[2].rpartition(":")
    if not port.isdigit() or not parts[1].isdigit():
        return None
    return parts[0] == "ASK", int(parts[1]), host.strip("[]"), int(port)


# -- the slot map ----------------------------------------------------------------------


class SlotMap:
    """Which master serves each slot: one (host, port) per slot."""

    __slots__ = ("owners",)

    def __init__(self, owners: list[Optional[tuple[str, int]]]) -> None:
        self.owners = owners

    @classmethod
    def from_reply(cls, reply: object, asked: tuple[str, int]) -> Optional[SlotMap]:
        """The map a ``CLUSTER SLOTS`` reply gives; None when it is not one that
        covers every slot (a cluster still forming, or not a cluster)."""
        if not isinstance(reply, list):
            return None
        owners: list[Optional[tuple[str, int]]] = [None] * SLOTS
        for entry in reply:
            if not isinstance(entry, list) or len(entry) < 3 or not isinstance(entry[2], list):
                return None
            start, end, master = entry[0], entry[1], entry[2]
            raw_host = master[0] if master else b""
            host = raw_host.decode() if isinstance(raw_host, bytes) and raw_host else asked[0]
            owner = (host, int(master[1]))
            for slot in range(int(start), int(end) + 1):
                owners[slot] = owner
        if any(owner is None for owner in owners):
            return None
        return cls(owners)

    def owner(self, slot: int) -> tuple[str, int]:
        owner = self.owners[slot]
        assert owner is not None
        return owner

    @property
    def masters(self) -> list[tuple[str, int]]:
        return list(dict.fromkeys(o for o in self.owners if o is not None))


def ask_slot_map(
    asked: Sequence[tuple[tuple[str, int], Connection]], budget: float, address: str
) -> tuple[SlotMap, list[tuple[tuple[str, int], Connection]]]:
    """The slot map from the first of ``asked`` (each a server and a new or idle
    connection to it) to give a full one, within ``budget`` seconds; and the
    connections that are in step afterwards, with their servers (for the caller to
    keep). Raises
    ``redis.ConnectionError`` saying what each server answered."""
    deadline = time.monotonic() + budget
    errors: dict[str, str] = {}
    by_fd: dict[int, tuple[tuple[str, int], Connection]] = {}
    now = time.monotonic()
    poller = unpatched.poll()
    for where, conn in asked:
        try:
            conn.send(CLUSTER_SLOTS.payload, CLUSTER_SLOTS, now)
        except rexc.ConnectionError as exc:
            errors[f"{where[0]}:{where[1]}"] = str(exc)
            conn.close()
            continue
        by_fd[conn.fileno()] = (where, conn)
        poller.register(conn.fileno(), _POLLIN | (_POLLOUT if conn.wants_write else 0))
    found: Optional[SlotMap] = None
    done: list[tuple[tuple[str, int], Connection]] = []
    try:
        while by_fd and found is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            for fd, event in poller.poll(math.ceil(remaining * 1000)):
                where, conn = by_fd[fd]
                shown = f"{where[0]}:{where[1]}"
                try:
                    if event & select.POLLOUT:
                        conn.advance()
                    replies = conn.read()
                except (rexc.RedisError, OSError) as exc:
                    errors[shown] = str(exc)
                    poller.unregister(fd)
                    del by_fd[fd]
                    conn.close()
                    continue
                if replies:
                    poller.unregister(fd)
                    del by_fd[fd]
                    done.append((where, conn))
                    slot_map = SlotMap.from_reply(replies[0], where)
                    if slot_map is not None:
                        found = slot_map
                        break
                    reply = replies[0]
                    errors[shown] = (
                        str(reply)
                        if isinstance(reply, Exception)
                        else "its slot map does not cover every slot"
                    )
                else:
                    poller.modify(fd, _POLLIN | (_POLLOUT if conn.wants_write else 0))
    finally:
        for _, conn in by_fd.values():
            conn.close()  # still owes CLUSTER SLOTS: out of step for a round
    if found is None:
        for where, _ in by_fd.values():
            errors[f"{where[0]}:{where[1]}"] = f"no answer within {budget * 1000:.0f} ms"
        told = "; ".join(f"{where}: {why}" for where, why in errors.items()) or "no server"
        raise rexc.ConnectionError(f"{address}: no server gave the cluster's slot map ({told})")
    return found, done
