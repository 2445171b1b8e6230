"""Limits and rates as operators see them: a key's permit slots read from every node,
which of them a quorum holds, and the terms the nodes record. The library under the
permit lines of ``ls`` and ``show``, and under ``release`` of a permit.

On each node a limited key ``K`` keeps its slots ``K\\0limit\\0<i>`` (ordinary lock
values, ``token|holder``, i from 0 to N - 1) and its terms record ``K\\0limit``
(``"N"``); a rated key its slots ``K\\0rate\\0<i>`` (one start each, held for the
period, never released) and ``K\\0rate`` (``"R/<period>ms"``). A slot counts as held
when a quorum of nodes hold one value in it: the rule of a mutex key. The other names
behind the NUL -- tombstones, fence counters, a name left there by hand -- are never
listed.

No click here; imports common.py, holders.py and the lock's own modules (stored).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ..lock.redlock import Redlock
from ..lock.stored import (
    INTERNAL,
    LIMIT,
    RATE,
    HolderInfo,
    NodeHolding,
    permit_grant_prefix,
    permit_of,
    permit_slot,
    permit_terms_record,
)
from ..tasks.cooldown import cooldown_key
from ..tasks.queue_once import QUEUED_SUFFIX
from ..wire.node_set import Node
from .common import configured_nodes, error_text, glob_literal, on_each_node, text
from .holders import holder_document, read_holdings

#: The two kinds of permits, in the order they are shown.
KINDS = (LIMIT, RATE)
#: Holders named on one ``ls`` line; the others are counted.
HOLDERS_SHOWN = 5

#: A permit name read: (key, kind, slot number), the slot None for the terms record.
PermitName = tuple[str, str, Optional[int]]


def permit_name(name: str) -> Optional[PermitName]:
    """``(key, kind, slot)`` for one of a key's permit slots, ``(key, kind, None)`` for
    its terms record; None for any other name (lock keys, tombstones, fence counters,
    a name left by hand)."""
    key, sep, kind = name.partition(INTERNAL)
    if not key or not sep:
        return None
    if kind in KINDS:
        return key, kind, None
    # Only a name the lock itself writes: not K\0limit\0007, nor K\0limit\0² (stored.py).
    return permit_of(name)


def describe_name(name: str) -> str:
    """A permit name as printable text (``K limit slot 3``); other names as they are."""
    permit = permit_name(name)
    if permit is None:
        return name.replace(INTERNAL, "\\0")
    key, kind, slot = permit
    return f"{key} {kind} terms" if slot is None else f"{key} {kind} slot {slot}"


def key_match(key: str) -> str:
    """A SCAN MATCH glob for every name the lock keeps behind ``key``'s NUL."""
    return f"{glob_literal(key)}{INTERNAL}*"


#: The permits found of one key and kind, and the slot numbers seen on any node.
Found = dict[tuple[str, str], set[int]]


def group_permits(names: Iterable[str], keep: Callable[[str], bool]) -> Found:
    """The permits named among ``names`` (scanned from the nodes), for the keys that
    ``keep`` accepts: a key with only a terms record is there with no slots."""
    found: Found = {}
    for name in names:
        permit = permit_name(name)
        if permit is None or not keep(permit[0]):
            continue
        key, kind, slot = permit
        slots = found.setdefault((key, kind), set())
        if slot is not None:
            slots.add(slot)
    return found


def names_to_read(found: Found) -> list[str]:
    """Every name to read for ``found``: each terms record, then each slot seen."""
    names = []
    for (key, kind), slots in sorted(found.items()):
        names.append(permit_terms_record(key, kind))
        names.extend(permit_slot(key, kind, slot) for slot in sorted(slots))
    return names


# -- the terms recorded ----------------------------------------------------------------------

_RATE_RECORD = re.compile(r"([0-9]+)/([0-9]+)ms")


def read_terms(kind: str, record: Optional[str]) -> tuple[Optional[int], Optional[float]]:
    """``(N or R, period in seconds)`` from a terms record; None for what it lacks or
    does not say the lock's way (a record written by hand)."""
    if record is None:
        return None, None
    if kind == LIMIT:
        return (int(record), None) if re.fullmatch(r"[0-9]+", record) else (None, None)
    match = _RATE_RECORD.fullmatch(record)
    if match is None:
        return None, None
    return int(match.group(1)), int(match.group(2)) / 1000.0


def period_text(seconds: float) -> str:
    """A period in the largest unit it is a whole number of: ``1m``, ``10s``, ``1.5s``."""
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0), ("s", 1.0)):
        if seconds >= size and (seconds / size).is_integer():
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s" if seconds >= 1 else f"{seconds * 1000:g}ms"


# -- one key's permits of one kind -----------------------------------------------------------


@dataclass(frozen=True)
class Permits:
    """One key's permits of one kind (a limit or a rate), as the nodes hold them."""

    key: str
    kind: str
    quorum: int
    #: Each node's terms record; its text is the holding's ``token`` (it has no ``|``).
    records: tuple[NodeHolding, ...]
    #: Every slot some node holds a value in, by slot number.
    slots: tuple[tuple[int, HolderInfo], ...]

    @property
    def record(self) -> Optional[str]:
        """The terms most nodes record, as written; None when no node records any."""
        recorded = Counter(r.token for r in self.records if r.token)
        return recorded.most_common(1)[0][0] if recorded else None

    @property
    def recorded_on(self) -> int:
        return sum(1 for r in self.records if r.token and r.token == self.record)

    @property
    def count(self) -> Optional[int]:
        """N (a limit) or R (a rate), as recorded; None when unknown."""
        return read_terms(self.kind, self.record)[0]

    @property
    def period(self) -> Optional[float]:
        """A rate's period in seconds, as recorded."""
        return read_terms(self.kind, self.record)[1]

    @property
    def held(self) -> list[tuple[int, HolderInfo]]:
        """The slots a quorum of nodes hold one value in."""
        return [(slot, info) for slot, info in self.slots if info.holder is not None]

    @property
    def unagreed(self) -> list[int]:
        """Slots some node holds a value in, with no quorum on one value."""
        return [
            slot
            for slot, info in self.slots
            if info.holder is None and any(n.token for n in info.nodes)
        ]

    @property
    def next_frees(self) -> Optional[float]:
        """Seconds until the first held slot is no longer held by a quorum."""
        ttls = [info.ttl for _, info in self.held if info.ttl is not None]
        return min(ttls) if ttls else None

    def terms_text(self) -> str:
        """``limit 5`` or ``rate 100 per 1m``; what is not recorded as ``?``."""
        count = "?" if self.count is None else str(self.count)
        if self.kind == LIMIT:
            return f"limit {count}"
        period = "?" if self.period is None else period_text(self.period)
        return f"rate {count} per {period}"

    def summary(self) -> str:
        """One line for ``ls``: how many are held, and by whom or until when."""
        count = "?" if self.count is None else str(self.count)
        held = self.held
        if self.kind == LIMIT:
            line = f"limit {len(held)}/{count} held"
            if held:
                names = [info.holder or "?" for _, info in held[:HOLDERS_SHOWN]]
                more = len(held) - HOLDERS_SHOWN
                line += f" (holders: {', '.join(names)}{f' and {more} more' if more > 0 else ''})"
        else:
            period = "?" if self.period is None else period_text(self.period)
            line = f"rate {len(held)}/{count} per {period} in the window"
            if self.next_frees is not None:
                line += f" (next frees in {self.next_frees:.1f}s)"
        if self.unagreed:
            line += f"; {len(self.unagreed)} slot(s) without a quorum"
        if self.record is None:
            line += "; terms not recorded"
        elif self.count is None:
            line += f"; terms recorded as {self.record!r}"
        return line


def build_permits(found: Found, read: Mapping[str, HolderInfo], quorum: int) -> list[Permits]:
    """``Permits`` of every key and kind in ``found``, from each name's holdings."""
    permits = []
    for (key, kind), slots in sorted(found.items()):
        records = read[permit_terms_record(key, kind)].nodes
        infos = tuple((slot, read[permit_slot(key, kind, slot)]) for slot in sorted(slots))
        permits.append(Permits(key, kind, quorum, records, infos))
    return permits


# -- reading one key's permits (show) --------------------------------------------------------


def scan_key_permits(client: Any, key: str, grants: bool = False) -> list[str]:
    """The names of ``key``'s permit slots and terms records on one node; with
    ``grants``, the nodes' notes of which slot each token was given too."""
    names = [text(raw) or "" for raw in client.scan_iter(match=key_match(key), count=1000)]
    prefixes = tuple(permit_grant_prefix(key, kind) for kind in KINDS) if grants else ()
    return [
        name
        for name in names
        if (permit_name(name) or ("",))[0] == key or (prefixes and name.startswith(prefixes))
    ]


def read_key_permits(
    nodes: Sequence[Node],
    key: str,
    earlier: Sequence[Optional[BaseException]],
    quorum: int,
    timeout: float,
) -> list[Permits]:
    """``key``'s permits of each kind, scanned and read on every node at once (one
    pass per node). A node whose entry in ``earlier`` is an error is not asked: it
    has already cost its timeout, and its error stands for each of its holdings."""

    def scan_and_read(node: Node) -> dict[str, NodeHolding]:
        names = scan_key_permits(node.client(), key)
        return dict(zip(names, read_holdings(node, names))) if names else {}

    asked = [n for n, e in zip(nodes, earlier) if e is None]
    answers = dict(zip(asked, on_each_node(asked, scan_and_read, timeout)))
    per_node: list[Any] = [answers.get(n, e) for n, e in zip(nodes, earlier)]
    found = group_permits(
        (name for answer in per_node if isinstance(answer, dict) for name in answer),
        lambda base: base == key,
    )
    read = {}
    for name in names_to_read(found):
        holdings = []
        for node, answer in zip(nodes, per_node):
            if isinstance(answer, BaseException):
                holdings.append(NodeHolding(node.address, error=answer))
            else:
                holdings.append(answer.get(name, NodeHolding(node.address)))
        read[name] = HolderInfo(name, tuple(holdings), quorum)
    return build_permits(found, read, quorum)


# -- documents (--json) ----------------------------------------------------------------------


def _slot_document(key: str, slot: int, info: HolderInfo, per_node: bool) -> dict[str, Any]:
    document = holder_document(info)
    document["key"] = key
    if not per_node:
        del document["nodes"]
    return {"slot": slot, **document}


def _holder_entry(slot: int, info: HolderInfo) -> dict[str, Any]:
    document = holder_document(info)
    fields = ("holder", "task_id", "worker", "pid", "token", "ttl")
    return {"slot": slot, **{name: document[name] for name in fields}}


def permits_document(permits: Permits, per_node: bool = False) -> dict[str, Any]:
    """One key's permits of one kind, as ``ls --json`` (and, ``per_node``, ``show
    --json``) prints them: the terms, how many are held and by whom."""
    document: dict[str, Any] = {
        "key": permits.key,
        "kind": permits.kind,
        "terms": permits.record,
        "count": permits.count,
        "period": permits.period,
        "held": len(permits.held),
        "holders": [_holder_entry(slot, info) for slot, info in permits.held],
        "next_frees": permits.next_frees,
        "unagreed_slots": permits.unagreed,
        "quorum": permits.quorum,
        "nodes_total": len(permits.records),
        "summary": permits.summary(),
    }
    if per_node:
        document["terms_per_node"] = [
            {
                "node": r.node,
                "terms": r.token,
                "ttl": r.ttl,
                "error": None if r.error is None else error_text(r.error),
            }
            for r in permits.records
        ]
        document["slots"] = [
            _slot_document(permits.key, slot, info, per_node) for slot, info in permits.slots
        ]
    return document


def read_key(lock: Redlock, key: str, timeout: float) -> tuple[HolderInfo, list[Permits]]:
    """Who holds ``key`` itself (one ``Redlock.holder`` round) and its permits (one
    pass over the nodes that answered the round): what ``show`` prints."""
    info = lock.holder(key)
    nodes, earlier = _after(lock, info)
    return info, read_key_permits(nodes, key, earlier, lock.quorum, timeout)


def _after(lock: Redlock, info: HolderInfo) -> tuple[list[Node], list[Optional[BaseException]]]:
    """The lock's nodes, and each one's error in the round that read ``info`` (None
    where it answered): a node that failed there has cost its timeout already."""
    errors = {n.node: n.error for n in info.nodes}
    nodes = configured_nodes(lock)
    return nodes, [errors.get(node.address) for node in nodes]


def read_queued_and_cooldown(
    lock: Redlock, prefix: str, info: HolderInfo, timeout: float
) -> tuple[HolderInfo, Optional[Permits]]:
    """The queue-once place of the key ``info`` was read for (who is queued) and its
    cooldown (the one start counted, and when it frees), read from the nodes that
    answered ``info``'s round: a hung node has cost its timeout already."""
    nodes, earlier = _after(lock, info)
    place = info.key + QUEUED_SUFFIX
    asked = [n for n, e in zip(nodes, earlier) if e is None]
    answers = dict(zip(asked, on_each_node(asked, lambda n: read_holdings(n, [place])[0], timeout)))
    holdings = []
    for node, error in zip(nodes, earlier):
        answer = answers.get(node, error)
        holdings.append(
            answer if isinstance(answer, NodeHolding) else NodeHolding(node.address, error=answer)
        )
    cooling = read_key_permits(nodes, cooldown_key(prefix, info.key), earlier, lock.quorum, timeout)
    return HolderInfo(place, tuple(holdings), lock.quorum), next(iter(cooling), None)
