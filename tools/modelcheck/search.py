"""The breadth-first search shared by the hand-off and replace models.

A model gives ``initial()``, ``canonical(state)`` (the key two states share when
they differ only by names), ``successors(state)`` (``(what, next, violation)``
steps; a step whose violation is not None is a counterexample's last step) and
``lost(state)`` (the violation of a final state, one with no step left, if any).
States are explored in order of depth, so the first violation met is a shortest
one; its trace is the path of steps that first reached each state.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Generic, Optional, Protocol, TypeVar

S = TypeVar("S")
Step = tuple[str, S, Optional[str]]


class Explorable(Protocol[S]):
    def initial(self) -> S: ...

    def canonical(self, s: S) -> object: ...

    def successors(self, s: S) -> list[tuple[str, S, Optional[str]]]: ...

    def lost(self, s: S) -> Optional[str]: ...


@dataclass
class Found(Generic[S]):
    """What a search found: states explored, the first violation and its trace."""

    states: int = 0
    violation: Optional[str] = None
    trace: list[str] = field(default_factory=list)
    #: stopped at ``max_states`` before the space was explored.
    bounded: bool = False


def search(
    model: Explorable[S],
    max_states: int,
    visit: Optional[Callable[[S, list[tuple[str, S, Optional[str]]]], None]] = None,
) -> Found[S]:
    """Every reachable state, breadth-first; ``visit(state, steps)`` sees each one
    explored (``steps`` empty: a final state)."""
    init = model.initial()
    canonical = model.canonical
    parent: dict[object, Optional[tuple[S, str]]] = {canonical(init): None}
    queue = deque([init])
    found: Found[S] = Found()
    while queue:
        s = queue.popleft()
        steps = model.successors(s)
        if visit is not None:
            visit(s, steps)
        violation = None if steps else model.lost(s)
        last: list[str] = []
        for what, nxt, bad in steps:
            key = canonical(nxt)
            if key not in parent:
                parent[key] = (s, what)
                queue.append(nxt)
            if bad is not None:
                violation, last = bad, [what]
                break
        if violation is not None:
            found.violation = violation
            lines = [*_path(parent, canonical, s), *last]
            found.trace = [f"{i + 1:2d}. {line}" for i, line in enumerate(lines)]
            found.trace.append(f"!! VIOLATION: {violation}")
            break
        if len(parent) >= max_states:
            found.bounded = True
            break
    found.states = len(parent)
    return found


def _path(
    parent: dict[object, Optional[tuple[S, str]]],
    canonical: Callable[[S], object],
    end: S,
) -> list[str]:
    lines: list[str] = []
    node = parent.get(canonical(end))
    while node is not None:
        prev, what = node
        lines.append(what)
        node = parent[canonical(prev)]
    return lines[::-1]
