"""``AsyncRedlock`` and ``AsyncLease``: the Redlock for asyncio code.

Same constructor, same checks, same algorithm as ``celery_redlock.Redlock``: both
have a ``LockRules`` (lock/rules.py) holding their ``Settings`` (lock/settings.py),
whose steps yield rounds; here each round is awaited on the event loop (nodes.py in
this package) instead of run on a blocking poll. So a FastAPI or aiohttp service
and the Celery workers take the same locks on the same nodes, and see each other's
holders::

    redlock = AsyncRedlock(["redis://lock1:6379/0", "redis://lock2:6379/0", ...])
    async with redlock.lock("report:42", ttl=10, auto_extend=True) as lease:
        ...  # lease.fence, lease.held; LockLost on leaving if it was lost

Cancellation: a cancelled acquire releases what it got (its release goes to every
node behind the SET, without waiting); a cancelled ``lock`` block's lease is
released in a shielded task, so a second cancellation cannot stop the release.
Auto-extension is one asyncio task per block, renewing at ttl/3.

Blocking: between attempts an acquire hears the key's release (wake.py in this
package: pooled pub/sub connections per node, on the event loop) and tries again
as soon as one is heard, at the latest when the holder's lock expires; cancelled
while waiting, it unsubscribes and hands its connections back.

Reentrancy (``reentrant=True``, ``AlreadyHeld``; see reentry.py): the execution is
the current asyncio Task, so two tasks of one event loop are two executions, as two
threads are for ``Redlock``.

``AsyncLease`` shares ``LeaseState`` (lock/lease.py) with ``Lease``: the same state,
with coroutines where ``Lease`` blocks. Must not import Celery, lock/redlock.py or
the watchdog (its thread is for sync leases).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any, Callable, NoReturn, Optional, Sequence, TypeVar, Union

from ..errors import QuorumUnavailable, RedlockError
from ..lock.acquire_replies import Attempt
from ..lock.clear import clear_matching
from ..lock.commands import lock_keys
from ..lock.lease import Duration, Extension, LeaseState, next_renewal, renewal_interval
from ..lock.quorum import clear_match, judge_exit, lease_value
from ..lock.reentry import HeldLeases
from ..lock.rules import LockRules
from ..lock.settings import DEFAULTS, Settings, ShowsSettings
from ..lock.steps import Ask, Pause, Settle, Steps
from ..lock.stored import HolderInfo
from ..lock.validate import seconds
from .nodes import AsyncNodeSet
from .wake import AsyncWakeups

__all__ = ["AsyncLease", "AsyncRedlock"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Live tasks' execution names, by ``id(task)``, with the task itself (so its id is
#: not reused while listed); dropped when the task is done. A plain dict: a weak one
#: builds a weak reference per lookup, and this is looked up on every acquire.
_task_names: dict[int, tuple[asyncio.Task[Any], str]] = {}
_task_serials = itertools.count(1)


def current_task_execution() -> str:
    """The execution acquiring now: the current asyncio Task (named once, by a
    serial number, so a later task never inherits an ended one's name)."""
    task = asyncio.current_task()
    if task is None:
        return "no asyncio task"
    entry = _task_names.get(id(task))
    if entry is None:
        entry = _task_names[id(task)] = (task, f"asyncio task {next(_task_serials)}")
        task.add_done_callback(_forget_task)
    return entry[1]


def _forget_task(task: asyncio.Task[Any]) -> None:
    _task_names.pop(id(task), None)


class AsyncLease(LeaseState):
    """A lease won by ``AsyncRedlock``: the same state as ``Lease`` (``LeaseState``:
    ``validity``, ``held``, ``lost``, ``fence``, ``ensure_held``, callbacks), with
    ``extend``, ``release`` and ``owned`` as coroutines that return and raise as
    ``Lease``'s, and ``async with`` where ``Lease`` has ``with``."""

    _owner: AsyncRedlock
    #: The extension round in flight, if any (a re-acquire waits for it: ``Settle``).
    _extending: Optional[asyncio.Future[None]] = None

    @property
    def owner(self) -> AsyncRedlock:
        """The lock that granted the lease: its rounds go through it."""
        return self._owner

    async def extend(self, ttl: Optional[Duration] = None) -> bool:
        """See ``Lease.extend``."""
        new_ttl = self.ttl if ttl is None else seconds("ttl", ttl)
        await self._settled()  # one extension round at a time
        if self._released or self._lost_reason is not None:
            return False
        done = self._extending = asyncio.get_running_loop().create_future()
        try:
            outcome = await self._owner._extend_lease(self, new_ttl)
        finally:
            self._extending = None
            done.set_result(None)
        with self._lock:
            callbacks = self._record(outcome)
        return self._announce(outcome, callbacks)

    async def _settled(self) -> None:
        """Return once no extension round of this lease is in flight."""
        while self._extending is not None:
            await asyncio.wait([self._extending])  # never cancels the round's future

    async def release(self) -> bool:
        """See ``Lease.release``: True, False or ``QuorumUnavailable``."""
        if self._released:
            return False
        self._released = True
        return await self._owner._release_lease(self)

    async def owned(self) -> bool:
        """See ``Lease.owned``."""
        return await self._owner._owned_lease(self)

    def __enter__(self) -> NoReturn:
        # A plain ``with`` would never release the lease: say what to write instead.
        raise TypeError("an AsyncLease is released with 'async with', not 'with'")

    def __exit__(self, *exc_info: object) -> None:
        """Never reached (``__enter__`` refuses); Python wants both to say so."""

    async def __aenter__(self) -> AsyncLease:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await asyncio.shield(self.release())


class AsyncRedlock(ShowsSettings):
    """The Redlock over N independent Redis masters, for asyncio.

    Arguments as ``Redlock``'s (same defaults, same checks, same errors); ``sleep``
    is a coroutine function (default ``asyncio.sleep``; an injected one turns
    hearing releases off: a blocked acquire then polls through it). One connection
    per node per event loop, opened on first use, and pub/sub connections for
    blocked acquires (``close`` closes them all). Its settings are attributes, as
    ``Redlock``'s.
    """

    _rules: LockRules

    def __init__(
        self,
        nodes: Sequence[object],
        ttl: Duration = DEFAULTS.ttl,
        node_timeout: Duration = DEFAULTS.node_timeout,
        drift_factor: float = DEFAULTS.drift_factor,
        retry_count: int = DEFAULTS.retry_count,
        retry_delay: Duration = DEFAULTS.retry_delay,
        *,
        fencing: bool = DEFAULTS.fencing,
        max_hold: Optional[Duration] = DEFAULTS.max_hold,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        settings = Settings.checked(
            nodes, ttl, node_timeout, drift_factor, retry_count, retry_delay, fencing, max_hold
        )
        self._sleep = sleep
        self._nodes = AsyncNodeSet(nodes, clock=clock)
        # Which leases each execution (asyncio Task) won: in the rules' record.
        held = HeldLeases(current_task_execution)
        self._rules = LockRules(settings, self.nodes, held, clock)
        # A blocked acquire hears releases (wake.py here), unless waits were injected.
        self._wakeups: Optional[AsyncWakeups] = None
        if sleep is asyncio.sleep:
            heard_enough = self._rules.enough_no
            self._wakeups = AsyncWakeups(self._nodes.nodes, heard_enough, settings.node_timeout)

    def __repr__(self) -> str:
        return f"<AsyncRedlock [{', '.join(self.nodes)}] ttl={self.ttl}s>"

    @property
    def nodes(self) -> list[str]:
        """The node addresses, in the order given."""
        return [n.address for n in self._nodes.nodes]

    def close(self) -> None:
        """Close every connection, the idle pub/sub ones too (they reopen on next use)."""
        self._nodes.close()
        if self._wakeups is not None:
            self._wakeups.close()

    async def _drive(
        self, steps: Steps[T], pause: Optional[Callable[[Pause], Awaitable[None]]] = None
    ) -> T:
        """Run an operation's steps, each round awaited on this lock's nodes; a
        pause is ``pause``'s to wait out (a blocked acquire's listener), else slept."""
        try:
            step = next(steps)
            while True:
                if isinstance(step, Ask):
                    step = steps.send(await self._nodes.round(step))
                    continue
                if isinstance(step, Pause):
                    if pause is not None:
                        await pause(step)
                    else:
                        await self._sleep(step.seconds)
                elif isinstance(step, Settle) and isinstance(step.lease, AsyncLease):
                    await step.lease._settled()
                step = steps.send([])
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    # -- acquire ------------------------------------------------------------------

    async def acquire(
        self,
        key: Union[str, Sequence[str]],
        ttl: Optional[Duration] = None,
        blocking: bool = True,
        timeout: Optional[Duration] = None,
        holder: Optional[str] = None,
        token: Optional[str] = None,
        *,
        reentrant: bool = False,
        limit: int = 1,
    ) -> Optional[AsyncLease]:
        """See ``Redlock.acquire``: the lease, ``None`` when not won, or
        ``QuorumUnavailable``; blocking, it waits for the key's release (``timeout``
        None: until won). Cancelled, it releases whatever it got. A key this
        asyncio Task holds already: ``AlreadyHeld``, or with ``reentrant=True`` one
        more hold of its lease. ``key`` may be a list of keys taken together.
        ``limit=N``: a lease on one of the key's N permits."""
        attempt = await self._acquire(key, ttl, blocking, timeout, holder, token, reentrant, limit)
        return attempt.outcome(key, False)

    async def try_acquire(
        self,
        key: Union[str, Sequence[str]],
        ttl: Optional[Duration] = None,
        blocking: bool = True,
        timeout: Optional[Duration] = None,
        holder: Optional[str] = None,
        token: Optional[str] = None,
        *,
        reentrant: bool = False,
        limit: int = 1,
    ) -> AsyncLease:
        """Like ``acquire`` but raises ``LockContended`` instead of returning None."""
        attempt = await self._acquire(key, ttl, blocking, timeout, holder, token, reentrant, limit)
        lease = attempt.outcome(key, True)
        assert lease is not None
        return lease

    async def _acquire(
        self,
        key: Union[str, Sequence[str]],
        ttl: Optional[Duration],
        blocking: bool,
        timeout: Optional[Duration],
        holder: Optional[str],
        token: Optional[str],
        reentrant: bool,
        limit: int = 1,
    ) -> Attempt[AsyncLease]:
        steps = self._rules.acquire_steps(
            self, AsyncLease, key, ttl, blocking, timeout, holder, token, reentrant, limit
        )
        wakeups = self._wakeups
        if not blocking or wakeups is None:
            return await self._drive(steps)
        listener = wakeups.listener(self._rules.clock, self._sleep)
        try:  # also when cancelled: unsubscribed, its connections pooled
            return await self._drive(steps, listener.pause)
        finally:
            listener.close()

    @contextlib.asynccontextmanager
    async def lock(
        self,
        key: Union[str, Sequence[str]],
        ttl: Optional[Duration] = None,
        timeout: Optional[Duration] = None,
        blocking: bool = True,
        auto_extend: bool = False,
        holder: Optional[str] = None,
        *,
        reentrant: bool = False,
        limit: int = 1,
    ) -> AsyncIterator[AsyncLease]:
        """``async with redlock.lock(key) as lease:`` -- as ``Redlock.lock``.

        ``LockContended`` when not won in time. ``auto_extend=True``: an asyncio
        task renews the lease at ttl/3 while the block runs (a failed renewal marks
        it lost). Released on exit -- shielded, so also when the block is
        cancelled; leaving normally raises ``LockLost`` when the lease was lost
        meanwhile and ``QuorumUnavailable`` when the release reached no quorum.
        """
        lease = await self.try_acquire(
            key, ttl=ttl, blocking=blocking, timeout=timeout, holder=holder,
            reentrant=reentrant, limit=limit,
        )  # fmt: skip
        keeper = (
            asyncio.ensure_future(keep_alive(lease, self._rules.clock)) if auto_extend else None
        )
        try:
            yield lease
        except BaseException:
            if keeper is not None:
                keeper.cancel()
            try:
                await asyncio.shield(lease.release())
            except RedlockError as exc:  # the block's own error is the one to see
                logger.warning("releasing lock %s after an error failed: %s", key, exc)
            raise
        if keeper is not None:
            keeper.cancel()
        if lease.released:
            return  # released in the block: its outcome was the block's to read
        lost = lease.lost_reason
        try:
            released: Union[bool, QuorumUnavailable] = await asyncio.shield(lease.release())
        except QuorumUnavailable as exc:
            released = exc
        judge_exit(lease, lost, released)

    async def admit(
        self,
        key: str,
        rate: Union[str, tuple[int, float]],
        *,
        timeout: Optional[Duration] = 0,
        holder: Optional[str] = None,
        reserve: Optional[bool] = None,
    ) -> float:
        """See ``Redlock.admit``: 0.0 when a start under ``rate`` was admitted and
        counted, else the seconds until the window admits one (after waiting up to
        ``timeout``; None: until admitted)."""
        return await self._drive(self._rules.admit_steps(key, rate, holder, timeout, reserve))

    # -- release, extend and inspection -------------------------------------------------

    async def release_value(self, key: Union[str, Sequence[str]], value: str) -> bool:
        """See ``Redlock.release_value``."""
        steps = self._rules.release_steps(lock_keys(key), lease_value(value), self.ttl)
        return await self._drive(steps)

    async def extend_value(
        self, key: Union[str, Sequence[str]], value: str, ttl: Optional[Duration] = None
    ) -> bool:
        """See ``Redlock.extend_value``."""
        return await self._drive(self._rules.extend_value_steps(key, value, ttl))

    async def holder(self, key: str) -> HolderInfo:
        """See ``Redlock.holder``."""
        return await self._drive(self._rules.holder_steps(key))

    async def locked(self, key: str) -> bool:
        """See ``Redlock.locked``."""
        return await self._drive(self._rules.locked_steps(key))

    async def force_release(self, key: str) -> int:
        """See ``Redlock.force_release``."""
        return await self._drive(self._rules.force_release_steps(key))

    async def clear(self, match: str = "*") -> int:
        """See ``Redlock.clear``. SCAN runs on a worker thread (plain redis-py
        clients, as the synchronous lock's), not on the event loop."""
        match = clear_match(match)
        self._rules.held.forget_keys(match=match)
        quorum = self._rules.quorum
        return await asyncio.to_thread(clear_matching, self._nodes.nodes, match, quorum)

    def hand_over(self, lease: LeaseState) -> None:
        """See ``Redlock.hand_over``."""
        self._rules.held.forget(lease)

    # -- what an AsyncLease asks of its lock ------------------------------------------

    async def _extend_lease(self, lease: AsyncLease, ttl: float) -> Extension:
        return await self._drive(self._rules.extend_steps(lease, ttl))

    async def _release_lease(self, lease: AsyncLease) -> bool:
        return await self._drive(self._rules.release_lease_steps(lease))

    async def _owned_lease(self, lease: AsyncLease) -> bool:
        return await self._drive(self._rules.owned_steps(lease))


async def keep_alive(lease: AsyncLease, clock: Callable[[], float]) -> None:
    """Renew ``lease`` every ttl/3 until it is released or lost, on the watchdog's
    schedule (lease.py's ``renewal_interval`` and ``next_renewal``)."""
    every = renewal_interval(lease.ttl)
    due: Optional[float] = clock() + every
    while due is not None:
        await asyncio.sleep(max(due - clock(), 0.0))
        if lease.released:
            return
        try:
            extended = await lease.extend()
        except RedlockError as exc:
            logger.error("renewing lock %s failed: %s", lease.key, exc)
            extended = False
        due = next_renewal(lease, every, extended, clock())
