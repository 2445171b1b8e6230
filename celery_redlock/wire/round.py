"""One round, as a state machine: what the replies mean, with no I/O at all.

A lock operation sends one command to N nodes and counts the answers. The counting
is the same whoever does the I/O (node_set.py's poll loop today, an asyncio driver
tomorrow), so it lives here, fed with events:

- ``failed(i, exc)``: node i cannot answer (connection refused, hung up): a no;
- ``replied(i, reply)``: node i answered; True means "send it again as EVAL" (the
  node forgot our scripts: NOSCRIPT), and node i is still awaited;
- ``deadline_passed(names, timeout, silent)``: every node still awaited timed out.

``decided`` turns True once ``enough_yes`` replies satisfy ``is_yes`` or ``enough_no``
do not (failures count as no), or once ``settled`` says so of the results so far
(a round whose outcome is not a count of yes, e.g. a quorum on one of several
values): the driver stops reading then. ``finish()`` gives one
entry per node: the reply, the exception, a ``redis.TimeoutError``, or
``NOT_AWAITED`` (the outcome was decided before that node answered).

``Batch`` is several commands sent to the same nodes in one round, each reply a list
with one entry per *item* (e.g. one lease of a multi-key extend): every item gets its
own ``Round``, so one item's outcome never depends on another's. A node answers its
commands in the order they were sent; the batch keeps that order per node.

No sockets, no poll, no clock: this module must not import any of them, nor
anything from the package.
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Container, Final, Optional, Protocol, Sequence

from redis import exceptions as rexc

__all__ = ["AWAITED", "NOT_AWAITED", "Batch", "Round", "Tally"]


class Tally(Protocol):
    """What the driver tells a tally and asks of it (``Round`` and ``Batch``)."""

    @property
    def decided(self) -> bool: ...
    @property
    def awaited(self) -> list[int]: ...
    def awaiting(self, node: int) -> bool: ...
    def failed(self, node: int, error: BaseException) -> None: ...
    def deadline_passed(
        self, names: Sequence[str], timeout: float, silent: Container[int] = ()
    ) -> None: ...


class _NotAwaited:
    """A node whose reply the round stopped waiting for: the outcome was decided."""

    def __repr__(self) -> str:
        return "NOT_AWAITED"


#: In a round's results: the outcome was decided before this node answered.
NOT_AWAITED: Final = _NotAwaited()


class _Awaited:
    def __repr__(self) -> str:
        return "AWAITED"


#: In ``Round.results`` while the round runs: no answer from this node yet.
AWAITED: Final = _Awaited()


class Round:
    """The tally of one command sent to ``count`` nodes."""

    __slots__ = (
        "_enough_no", "_enough_yes", "_is_yes", "_settled", "decided", "no", "results", "yes",
    )  # fmt: skip

    def __init__(
        self,
        count: int,
        is_yes: Callable[[object], bool] = bool,
        enough_yes: Optional[int] = None,
        enough_no: Optional[int] = None,
        settled: Optional[Callable[[list[object]], bool]] = None,
    ) -> None:
        #: One entry per node: ``AWAITED`` until the node answers or fails.
        self.results: list[object] = [AWAITED] * count
        self._is_yes = is_yes
        self._settled = settled
        # None: never decided early, every node is heard (or times out).
        self._enough_yes = count + 1 if enough_yes is None else enough_yes
        self._enough_no = count + 1 if enough_no is None else enough_no
        self.yes = 0
        self.no = 0
        self.decided = self._enough_yes <= 0 or self._enough_no <= 0

    def awaiting(self, node: int) -> bool:
        """True while ``node`` has neither answered nor failed."""
        return self.results[node] is AWAITED

    @property
    def awaited(self) -> list[int]:
        """The nodes not heard from yet, in order."""
        return [i for i, result in enumerate(self.results) if result is AWAITED]

    def failed(self, node: int, error: BaseException) -> None:
        """``node`` cannot answer this round: it counts as a no."""
        self.results[node] = error
        self.no += 1
        if self.no >= self._enough_no:
            self.decided = True
        self._settle()

    def replied(self, node: int, reply: object) -> bool:
        """``node`` answered. True: it answered NOSCRIPT, send it the command again
        as EVAL (``Command.fallback``) and keep waiting for it."""
        if isinstance(reply, rexc.NoScriptError):
            return True
        self.results[node] = reply
        if self._is_yes(reply):
            self.yes += 1
            if self.yes >= self._enough_yes:
                self.decided = True
        else:
            self.no += 1
            if self.no >= self._enough_no:
                self.decided = True
        if self._settled is not None:
            self._settle()
        return False

    def _settle(self) -> None:
        if self._settled is not None and not self.decided and self._settled(self.results):
            self.decided = True

    def deadline_passed(
        self, names: Sequence[str], timeout: float, silent: Container[int] = ()
    ) -> None:
        """The round's deadline passed: every node still awaited timed out.

        ``names[i]`` names node i in its error; ``timeout`` is the round's, in seconds.
        ``silent``: nodes the round stopped waiting for before its deadline, as they
        had not answered for a whole deadline before it (the drivers' rule).
        """
        results = self.results
        for i, result in enumerate(results):
            if result is AWAITED:
                why = "silent for a round's deadline, " if i in silent else ""
                results[i] = rexc.TimeoutError(
                    f"{names[i]}: {why}no reply within {timeout * 1000:.0f} ms"
                )

    def finish(self) -> list[object]:
        """The per-node results; nodes still awaited are ``NOT_AWAITED``."""
        results = self.results
        for i, result in enumerate(results):
            if result is AWAITED:
                results[i] = NOT_AWAITED
        return results


class Batch:
    """The tallies of several commands sent to ``count`` nodes in one round.

    Command ``c`` carries ``sizes[c]`` items and each node answers it with a list of
    ``sizes[c]`` replies, item by item; item ``k`` overall has its own ``Round``
    (``rounds[k]``), with the same ``is_yes`` / ``enough_yes`` / ``enough_no`` for
    every item. An error reply, or a reply of the wrong shape, counts for every item
    of its command. ``decided`` turns True once every item's round is decided.
    """

    __slots__ = ("_first", "_owed", "_sizes", "_undecided", "rounds")

    def __init__(
        self,
        count: int,
        sizes: Sequence[int],
        is_yes: Callable[[object], bool] = bool,
        enough_yes: Optional[int] = None,
        enough_no: Optional[int] = None,
    ) -> None:
        self._sizes = list(sizes)
        self._first: list[int] = []
        total = 0
        for size in self._sizes:
            self._first.append(total)
            total += size
        #: One round per item, in command order.
        self.rounds = [Round(count, is_yes, enough_yes, enough_no) for _ in range(total)]
        self._undecided = sum(1 for r in self.rounds if not r.decided)
        # Per node: the commands it still owes a reply to, in the order they were sent.
        self._owed = [deque(range(len(self._sizes))) for _ in range(count)]

    @property
    def decided(self) -> bool:
        return self._undecided == 0

    def awaiting(self, node: int) -> bool:
        """True while ``node`` owes a reply to some command of the batch."""
        return bool(self._owed[node])

    @property
    def awaited(self) -> list[int]:
        """The nodes that still owe a reply, in order."""
        return [i for i, owed in enumerate(self._owed) if owed]

    def unanswered(self, node: int) -> list[int]:
        """The commands ``node`` owes a reply to, in the order they were sent."""
        return list(self._owed[node])

    def _items(self, command: int) -> list[Round]:
        first = self._first[command]
        return self.rounds[first : first + self._sizes[command]]

    def failed(self, node: int, error: BaseException) -> None:
        """``node`` cannot answer: a no for every item of the commands it owes."""
        owed = self._owed[node]
        while owed:
            for tally in self._items(owed.popleft()):
                was = tally.decided
                tally.failed(node, error)
                if tally.decided and not was:
                    self._undecided -= 1

    def replied(self, node: int, reply: object) -> Optional[int]:
        """``node`` answered its oldest owed command. Returns that command's index
        when the node answered NOSCRIPT (send it again as EVAL: it is owed again,
        after the others), else None."""
        command = self._owed[node].popleft()
        if isinstance(reply, rexc.NoScriptError):
            self._owed[node].append(command)
            return command
        items = self._items(command)
        whole = isinstance(reply, list) and len(reply) == len(items)
        for k, tally in enumerate(items):
            was = tally.decided
            tally.replied(node, reply[k] if whole else reply)  # type: ignore[index]
            if tally.decided and not was:
                self._undecided -= 1
        return None

    def deadline_passed(
        self, names: Sequence[str], timeout: float, silent: Container[int] = ()
    ) -> None:
        """The round's deadline passed: every item still awaited at a node timed out."""
        for tally in self.rounds:
            tally.deadline_passed(names, timeout, silent)
        for owed in self._owed:
            owed.clear()

    def finish(self) -> list[list[object]]:
        """Per item, the per-node results (see ``Round.finish``)."""
        return [tally.finish() for tally in self.rounds]
