"""A lock's settings: the constructor's arguments, checked once and frozen.

``Redlock`` and ``AsyncRedlock`` take the same arguments with the same defaults
(``DEFAULTS``, the one place they are written) and check them the same way
(``Settings.checked``); each keeps the result in its rules (rules.py), which read
it on every operation. Per call, ``acquire``'s own arguments override the defaults
(``Settings.acquire_arguments``), as node-redlock's frozen settings do.

No I/O. Imports validate.py, quorum.py, commands.py, permits.py and stored.py; must not import
rules.py, node_set.py, redlock.py, asyncio or Celery.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Generic, Optional, Protocol, TypeVar, Union, overload

from ..errors import ConfigurationError
from . import validate
from .commands import Keys, lock_keys
from .permits import Terms
from .quorum import CLOCK_PRECISION, token_argument
from .stored import default_holder

__all__ = [
    "DEFAULTS",
    "AcquireArguments",
    "Settings",
    "ShowsSettings",
    "holder_argument",
    "outlasts_a_round",
]

#: acquire's arguments, checked: keys, lease ttl, timeout (None: no limit), the
#: caller's token (None: a random one), holder.
AcquireArguments = tuple[Keys, float, Optional[float], Optional[str], str]


def outlasts_a_round(
    ttl: float, node_timeout: float, names: tuple[str, str] = ("ttl", "node_timeout")
) -> float:
    """``ttl``, checked against ``node_timeout``: a lease that one round could outlast
    is never valid (the constructor's ttl, acquire's per-call ttl, a task's options
    alike; ``names``: what the caller calls the two)."""
    if node_timeout >= ttl:
        ttl_name, timeout_name = names
        raise ConfigurationError(
            f"{timeout_name} ({node_timeout}s) must be smaller than {ttl_name} ({ttl}s): "
            f"a lease must outlast a round; keep {timeout_name} a small fraction of "
            f"{ttl_name} (e.g. 5-50 ms for a 10 s {ttl_name})"
        )
    return ttl


@dataclass(frozen=True)
class Settings:
    """What a lock was built with, in working units (seconds as float)."""

    #: Default lease length, seconds (default 30).
    ttl: float = 30.0
    #: Deadline of one round to all nodes, seconds (default 0.05); below ``ttl``.
    node_timeout: float = 0.05
    #: Clock-rate error allowed for, as a fraction of a lease's ttl (default 0.01).
    drift_factor: float = 0.01
    #: Attempts in a row that reached too few nodes before a blocking acquire
    #: without a timeout gives up (default 3).
    retry_count: int = 3
    #: Polling delay between attempts, seconds x random 0.5..1.5 (default 0.2).
    retry_delay: float = 0.2
    #: Give every lease a fence number (a second round; default off).
    fencing: bool = False
    #: Bound on a lease's total hold time through extensions, seconds (default None).
    max_hold: Optional[float] = None

    @classmethod
    def checked(
        cls,
        nodes: object,
        ttl: object,
        node_timeout: object,
        drift_factor: object,
        retry_count: object,
        retry_delay: object,
        fencing: object,
        max_hold: object,
    ) -> Settings:
        """The constructor's arguments checked (``nodes`` only for being a non-empty
        list: each node is the node set's to read); ``ConfigurationError`` naming
        the first one wrong."""
        if isinstance(nodes, (str, bytes)) or not isinstance(nodes, Sequence):
            raise ConfigurationError(
                "nodes must be a list of Redis URLs or redis.Redis clients "
                f"(one per independent master), got {type(nodes).__name__}: {nodes!r}"
            )
        if not nodes:
            raise ConfigurationError("nodes must list at least one Redis master, got none")
        lease_ttl = validate.seconds("ttl", ttl)
        timeout = validate.seconds("node_timeout", node_timeout)
        return cls(
            ttl=outlasts_a_round(lease_ttl, timeout),
            node_timeout=timeout,
            drift_factor=validate.fraction("drift_factor", drift_factor),
            retry_count=validate.count("retry_count", retry_count),
            retry_delay=validate.seconds("retry_delay", retry_delay, minimum=">= 0"),
            fencing=bool(fencing),
            max_hold=None if max_hold is None else validate.seconds("max_hold", max_hold),
        )

    def margin(self, ttl: float) -> float:
        """The drift allowance taken off a lease of ``ttl`` seconds: the nodes' clocks
        may run at another rate (``drift_factor``), and Redis expires a key up to
        1 ms early (``CLOCK_PRECISION``)."""
        return ttl * self.drift_factor + CLOCK_PRECISION

    def acquire_arguments(
        self,
        key: Union[str, Sequence[str]],
        ttl: object,
        blocking: bool,
        timeout: object,
        holder: Optional[str],
        token: Optional[str],
        reentrant: bool,
    ) -> AcquireArguments:
        """acquire's arguments, checked against these defaults."""
        keys = lock_keys(key)
        # The defaults (checked when the settings were made) skip their checks.
        if reentrant is not False and validate.flag("reentrant", reentrant) and len(keys) > 1:
            raise ConfigurationError(
                f"reentrant=True takes one key, got key={list(keys)!r}: a lease on "
                "several keys is not re-entered (take the set once)"
            )
        if ttl is None:
            lease_ttl = self.ttl
        else:
            lease_ttl = outlasts_a_round(validate.seconds("ttl", ttl), self.node_timeout)
        limit = None if timeout is None else validate.wait_limit("timeout", timeout)
        if not blocking and timeout is not None:
            raise ConfigurationError(
                f"timeout={timeout!r} needs blocking=True (blocking=False makes one "
                "attempt): drop timeout or set blocking=True"
            )
        if token is not None:
            token = token_argument(token)
        return keys, lease_ttl, limit, token, holder_argument(holder)

    def permit_terms(self, keys: Keys, limit: object, reentrant: bool) -> Optional[Terms]:
        """acquire's ``limit``: None for a mutex (1), else the terms of its permits."""
        if validate.permit_count("limit", limit) == 1:
            return None  # the mutex: nothing more to check or build
        terms = Terms.limit(limit)
        if len(keys) > 1:
            raise ConfigurationError(
                f"limit={limit!r} takes one key, got key={list(keys)!r}: a set of keys "
                "is taken as one mutex (limit=1)"
            )
        if reentrant:
            raise ConfigurationError(
                f"limit={limit!r} is not re-entered: drop reentrant=True (each acquire "
                "of a limited key takes one more permit)"
            )
        return terms


def holder_argument(holder: object) -> str:
    """Who takes the lock, as stored beside the token: a one-line str (default
    ``hostname:pid``)."""
    if holder is None:
        return default_holder()
    if not isinstance(holder, str) or "\n" in holder:
        raise ConfigurationError(f"holder must be a one-line str, got {holder!r}")
    return validate.utf8_text("holder", holder)


#: The defaults of ``Redlock`` and ``AsyncRedlock``'s arguments.
DEFAULTS = Settings()


V = TypeVar("V")


class _Rules(Protocol):
    settings: Settings
    quorum: int
    addresses: tuple[str, ...]


class _Setting(Generic[V]):
    """One setting as an attribute of a lock (``redlock.ttl``), read from its rules'
    frozen ``Settings``. Assigned, the new value is checked with the others as the
    constructor checks them, so ``redlock.node_timeout = 60`` cannot pass ttl unseen."""

    name: str

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, lock: None, owner: type) -> _Setting[V]: ...

    @overload
    def __get__(self, lock: ShowsSettings, owner: type) -> V: ...

    def __get__(self, lock: Optional[ShowsSettings], owner: type) -> Union[V, _Setting[V]]:
        if lock is None:
            return self
        return getattr(lock._rules.settings, self.name)  # type: ignore[no-any-return]

    def __set__(self, lock: ShowsSettings, value: V) -> None:
        rules = lock._rules
        fields = {**asdict(rules.settings), self.name: value}
        rules.settings = Settings.checked(rules.addresses, **fields)


class ShowsSettings:
    """What ``Redlock`` and ``AsyncRedlock`` show of their rules: each setting as an
    attribute (see ``Settings`` for their meaning), and the quorum."""

    _rules: _Rules

    ttl: _Setting[float] = _Setting()
    node_timeout: _Setting[float] = _Setting()
    drift_factor: _Setting[float] = _Setting()
    retry_count: _Setting[int] = _Setting()
    retry_delay: _Setting[float] = _Setting()
    fencing: _Setting[bool] = _Setting()
    max_hold: _Setting[Optional[float]] = _Setting()

    @property
    def quorum(self) -> int:
        """How many nodes make a majority."""
        return self._rules.quorum
