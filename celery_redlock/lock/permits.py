"""Limits and rates: what a permit round sends, and what its replies mean.

A key with a limit of N has N *permit slots*, each an ordinary Redlock mutex; a
holder holds one slot on a quorum of nodes, so N slots admit at most N holders
(SAFETY.md "Limits (N at a time) and rates", tools/modelcheck/limits.py). One
round asks every node for its first free slot from the caller's random starting
slot (permit_scripts.ACQUIRE_PERMIT); the holder wins slot i when a quorum gave it
i. A won slot is a lease like any other: its key
is the slot (``lease.keys``), its name the key (``lease.key``), extended by the
watchdog as a mutex is; its release (``release_command``) publishes on the key's
wake channel, so a blocked acquirer of any of the key's permits wakes.

A rate of R per period is R slots that are never released: a start holds a slot
for the period (plus the round's slack), so any window of that length has at most
R starts -- sliding, on the nodes' clocks (their key expiry), never a worker's.

Pure: commands, the terms and the reading of replies (the names live in
stored.py); no sockets, no clock. Imports permit_scripts.py, stored.py,
commands.py, validate.py, wire/round.py and errors.py.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from ..errors import ConfigurationError
from ..wire.resp import Command
from ..wire.round import AWAITED
from . import validate
from .commands import ms
from .permit_scripts import ACQUIRE_PERMIT, DROP_PERMITS
from .stored import (
    LIMIT,
    RATE,
    permit_full,
    permit_grant,
    permit_of,
    permit_slot,
    permit_slot_prefix,
    permit_terms_record,
    permit_tombstone,
    permit_turns,
    split_value,
)

__all__ = [
    "LIMIT",
    "RATE",
    "PermitRound",
    "Terms",
    "acquire_permit_command",
    "drop_permits_command",
    "granted_slot",
    "is_full",
    "is_permit_granted",
    "permit_of",
    "permit_slot",
    "read_permit_round",
    "settled",
]


@dataclass(frozen=True)
class Terms:
    """What every caller of one key must agree on: N holders at once (``limit``),
    or R starts per ``period`` seconds (``rate``)."""

    kind: str
    count: int
    period: Optional[float] = None

    @classmethod
    def limit(cls, count: object, name: str = "limit") -> Terms:
        return cls(LIMIT, validate.permit_count(name, count))

    @classmethod
    def rate(cls, value: object, name: str = "rate") -> Terms:
        count, period = validate.rate(name, value)
        return cls(RATE, count, period)

    @property
    def record(self) -> str:
        """The terms as the nodes record them (callers that disagree are refused)."""
        if self.period is None:
            return str(self.count)
        return f"{self.count}/{ms(self.period)}ms"

    def __str__(self) -> str:
        if self.period is None:
            return f"limit {self.count}"
        return f"rate {self.count}/{_period_text(self.period)}"


def _period_text(period: float) -> str:
    for unit, seconds in (("d", 86400.0), ("h", 3600.0), ("m", 60.0), ("s", 1.0)):
        if period == seconds:
            return unit
    return f"{period:g}s"


def acquire_permit_command(
    key: str, terms: Terms, value: str, ttl: float, fenced: bool, start: int = 0,
    spacing: float = 0.0,
) -> Command:  # fmt: skip
    """Take the first free slot of ``key``'s permits from slot ``start`` on (in order,
    wrapping) for ``ttl`` s on each node. Callers pick ``start`` at random per round:
    every node scans from the same place for one caller, so they agree on its slot
    unless another caller took it meanwhile, and racing callers aim apart.
    ``spacing`` (a rate, seconds; 0: none): when every slot is taken, each node hands
    out the caller's turn, ``spacing`` after the last (permit_scripts.ACQUIRE_PERMIT)."""
    kind = terms.kind
    keys = [
        permit_terms_record(key, kind),
        permit_tombstone(key, kind, value),
        key if kind == LIMIT else permit_turns(key),  # a limit: held as a mutex?
        permit_full(key, kind),
        permit_grant(key, kind, value),
    ]
    turns = ms(spacing) if spacing > 0 and terms.kind == RATE else 0
    return Command(
        ACQUIRE_PERMIT,
        keys,
        [
            value, ms(ttl), terms.count, permit_slot_prefix(key, terms.kind),
            "1" if fenced else "0", terms.record, start % terms.count, turns,
            terms.kind,
        ],
    )  # fmt: skip


def drop_permits_command(
    key: str, terms: Terms, value: str, ttl: float, keep: Optional[int] = None
) -> Command:
    """Delete ``value`` from the slot each node gave it, unless that is ``keep``; with
    no ``keep`` (an undo) leave a tombstone for ``ttl`` s so a late acquire sets
    nothing."""
    kind = terms.kind
    return Command(
        DROP_PERMITS,
        [
            permit_tombstone(key, kind, value), permit_full(key, kind),
            permit_grant(key, kind, value),
        ],
        [value, ms(ttl), permit_slot_prefix(key, kind), -1 if keep is None else keep, key],
    )  # fmt: skip


# -- a round's replies --------------------------------------------------------------


def granted_slot(reply: object) -> Optional[int]:
    """The slot a node's reply gave us, or None."""
    if isinstance(reply, list) and len(reply) == 3 and reply[0] == 1:
        return int(reply[2])
    return None


def is_permit_granted(reply: object) -> bool:
    return granted_slot(reply) is not None


def settled(quorum: int) -> Callable[[list[object]], bool]:
    """When a permit round is decided (``Ask.settled``): one slot has a quorum of
    grants, or no slot can reach one with the nodes still awaited."""

    def decided(results: list[object]) -> bool:
        slots = Counter(s for s in map(granted_slot, results) if s is not None)
        top = max(slots.values(), default=0)
        return top >= quorum or top + sum(1 for r in results if r is AWAITED) < quorum

    return decided


def is_full(reply: object) -> bool:
    """A node's reply said every slot is taken."""
    return isinstance(reply, list) and len(reply) == 5 and reply[1] == -4


def _text(value: object) -> Optional[str]:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class PermitRound:
    """What one permit round says: the slot a quorum gave us (or None), and why not."""

    #: The slot a quorum of nodes gave us; None when nobody gave one to a quorum.
    slot: Optional[int]
    #: The fence counters of the nodes that gave us ``slot``.
    counters: tuple[int, ...] = ()
    #: Nodes that gave us another slot than ``slot``: clean up there.
    strays: bool = False
    #: Every slot is taken on a quorum of nodes (the limit or the rate is reached).
    full: bool = False
    #: Who holds the slot that frees first (the most named), and when a quorum frees one.
    holder: Optional[str] = None
    holder_ttl: Optional[float] = None
    #: Every node answered and none set anything: no undo is needed.
    clean: bool = False
    #: A rate's reserved turn: seconds until it comes (a quorum's word), or None.
    turn: Optional[float] = None


def read_permit_round(
    key: str, terms: Terms, results: Sequence[object], quorum: int
) -> PermitRound:
    """Read a permit round's per-node results (replies, errors, ``NOT_AWAITED``).
    Raises ``ConfigurationError`` when a node records other terms for ``key``."""
    for reply in results:
        if isinstance(reply, list) and len(reply) == 3 and reply[1] == -3:
            raise ConfigurationError(
                f"{terms} for key {key!r} disagrees with the {_recorded(reply[2])} "
                "another caller of the same key uses: every caller of one key must "
                "give it the same limit and rate (change them together, or use "
                "another key)"
            )
    slots = Counter(s for s in map(granted_slot, results) if s is not None)
    fulls = [r for r in results if is_full(r)]
    answered = sum(1 for r in results if isinstance(r, list))
    clean = answered == len(results) and not slots
    if slots:
        slot, votes = slots.most_common(1)[0]
        if votes >= quorum:
            counters = tuple(
                int(r[1]) for r in results if granted_slot(r) == slot and isinstance(r, list)
            )
            return PermitRound(slot, counters, strays=len(slots) > 1)
    holders = Counter(split_value(r[2])[1] or "unknown" for r in fulls)  # type: ignore[index]
    holder = holders.most_common(1)[0][0] if holders else None
    # A slot frees on a quorum when enough full nodes free one to make a quorum with
    # the nodes that are not full: the k-th shortest "frees first" among the fulls.
    ttls = sorted(int(r[3]) for r in fulls if isinstance(r, list) and int(r[3]) >= 0)
    missing = quorum - (len(results) - len(fulls))
    holder_ttl = ttls[missing - 1] / 1000.0 if 0 < missing <= len(ttls) else None
    # The turn the quorum-th full node handed out: nodes count turns alike, give or
    # take the callers only some of them heard.
    turns = sorted(int(r[4]) for r in fulls if isinstance(r, list) and int(r[4]) >= 0)
    turn = turns[missing - 1] / 1000.0 if 0 < missing <= len(turns) else None
    return PermitRound(
        None, full=len(fulls) >= quorum, holder=holder, holder_ttl=holder_ttl, clean=clean,
        turn=turn,
    )  # fmt: skip


def _recorded(raw: object) -> str:
    text = _text(raw) or "?"
    count, sep, period = text.partition("/")
    if not sep:
        return f"limit {count}"
    return f"rate {count}/{_period_text(int(period.rstrip('ms')) / 1000.0)}"
