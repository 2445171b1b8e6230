"""Reentrancy: which execution holds which key, and the holds of one lease.

An *execution* is a thread (a greenlet under gevent/eventlet) when the library is
used on its own, and one task run under Celery: task.py sets ``execution`` for the
run, and this room only reads it. Each ``Redlock`` remembers (``HeldLeases``) the
live leases each execution won through it, per key, so that re-acquiring a key the
execution already holds is told apart from contention:

- without ``reentrant=True`` it raises ``AlreadyHeld`` at once (waiting for itself
  would only run into its own TTL);
- with it, one more *hold* of the same value is counted on the nodes (Redisson's
  RLock, made quorum-safe): ``REENTER`` adds a nonce to the value's holds set on
  every node that still holds the value, and counts with a quorum, as an acquire
  does. Each release takes its own hold away; the last one deletes the key.

Timeline it guards against, without reentrancy: a helper called inside
``with redlock.lock("report")`` takes ``"report"`` again, waits for the outer
block's lease, and gives up after the outer lease's TTL -- or, with a long
timeout, the outer block's watchdog keeps renewing it and the helper never wins.

The command builders (commands.py) and the REENTER reply's judging are shared by
every driver; the re-acquiring round itself is ``LockRules.reenter_steps``
(rules.py), and the record each lock's rules keep (``LockRules.held``). A driver
says what its execution is: ``HeldLeases(identify=...)`` (the asyncio driver: the
current asyncio Task). Imports commands.py and lease.py; must not import rules.py,
node_set.py, redlock.py or Celery.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
import weakref
from contextvars import ContextVar
from fnmatch import fnmatchcase
from typing import Callable, Optional

from .commands import Keys
from .lease import LeaseState

__all__ = [
    "HeldLeases",
    "current_execution",
    "execution",
    "is_reentered",
]

#: The execution running now, when a framework says so (task.py: one per task run);
#: None: the current thread is the execution.
execution: ContextVar[Optional[str]] = ContextVar("celery_redlock_execution", default=None)


#: How many keys the record holds before it first drops its ended leases.
SWEEP_AT = 256


def current_execution() -> str:
    """Who is acquiring: the task run set in ``execution``, else this thread."""
    return execution.get() or _thread_serial()


# One serial per thread (greenlet) object, never reused: a thread ident is reused as
# soon as its thread ends, which would make a later thread the owner of an earlier
# one's leases (AlreadyHeld for a lease it never took; with reentrant=True a second
# holder beside whoever the lease was handed to).
_serials: weakref.WeakKeyDictionary[object, str] = weakref.WeakKeyDictionary()
_serial_numbers = itertools.count(1)
_serials_lock = threading.Lock()


#: This OS thread's serial, when no greenlet module is loaded (the common case: no
#: lock or weak dictionary per acquire). A thread-local dies with its thread, so a
#: later thread with the same ident gets a serial of its own.
_this_thread = threading.local()


def _thread_serial() -> str:
    greenlet = sys.modules.get("greenlet")  # gevent/eventlet: each greenlet is one
    if greenlet is None:
        try:
            return _this_thread.serial  # type: ignore[no-any-return]
        except AttributeError:
            with _serials_lock:
                _this_thread.serial = mine = f"thread #{next(_serial_numbers)}"
            return mine
    current = greenlet.getcurrent()
    with _serials_lock:
        serial = _serials.get(current)
        if serial is None:
            serial = _serials[current] = f"thread #{next(_serial_numbers)}"
        return serial


def is_reentered(reply: object) -> bool:
    """A node's REENTER reply said yes (``{1, holds}``)."""
    return isinstance(reply, list) and len(reply) == 2 and reply[0] == 1


class HeldLeases:
    """The live leases each execution of this process won through one ``Redlock``,
    per key. Like Redisson's lock identity (client id + thread), a lease is this
    execution's only through the lock object that granted it: another ``Redlock``
    over the same nodes is another client and contends as usual."""

    def __init__(self, identify: Callable[[], str] = current_execution) -> None:
        #: Who is acquiring now (default: the task run, else the thread).
        self.execution = identify
        self._held: dict[tuple[str, str], list[LeaseState]] = {}
        self._lock = threading.Lock()
        self._sweep_at = SWEEP_AT
        _ALL.add(self)

    def live(self, keys: Keys) -> Optional[LeaseState]:
        """A lease this execution won on one of ``keys`` that is still held, if any
        (a lease on several keys is found under each of them)."""
        if not self._held:
            return None  # nothing held through this lock: the usual case
        execution = self.execution()
        with self._lock:
            for key in keys:
                place = (execution, key)
                leases = [lease for lease in self._held.get(place, ()) if lease.held]
                if leases:
                    self._held[place] = leases
                    return leases[0]
                self._held.pop(place, None)
            return None

    def add(self, lease: LeaseState) -> None:
        lease.execution = self.execution()
        with self._lock:
            for key in lease.keys:
                self._held.setdefault((lease.execution, key), []).append(lease)
            if len(self._held) > self._sweep_at:
                # Leases left to expire (beat ticks) are never released: drop the
                # ended ones now and then, so the record stays as small as what is held.
                for place, leases in list(self._held.items()):
                    if not any(lease.held for lease in leases):
                        del self._held[place]
                self._sweep_at = max(SWEEP_AT, 2 * len(self._held))

    def forget(self, lease: LeaseState) -> None:
        with self._lock:
            self._drop({id(lease)}, [(lease.execution or "", key) for key in lease.keys])

    def forget_keys(self, key: Optional[str] = None, match: Optional[str] = None) -> None:
        """An operator deleted ``key`` (or every key matching the glob ``match``): no
        execution holds it any more, nor the rest of a set it was taken with."""
        with self._lock:
            gone = [p for p in self._held if p[1] == key or (match and fnmatchcase(p[1], match))]
            leases = {id(lease) for place in gone for lease in self._held[place]}
            self._drop(leases, list(self._held))

    def _drop(self, leases: set[int], places: list[tuple[str, str]]) -> None:
        for place in places:
            kept = [lease for lease in self._held.get(place, ()) if id(lease) not in leases]
            if kept:
                self._held[place] = kept
            else:
                self._held.pop(place, None)

    def clear(self) -> None:
        with self._lock:
            self._held.clear()


_ALL: weakref.WeakSet[HeldLeases] = weakref.WeakSet()


def _forget_all_in_child() -> None:
    # A forked child holds none of its parent's leases; a lock some other thread of
    # the parent held at the fork would never be let go in the child: new ones.
    global _serials_lock
    _serials_lock = threading.Lock()
    for held in list(_ALL):
        held._lock = threading.Lock()
        held.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_all_in_child)
