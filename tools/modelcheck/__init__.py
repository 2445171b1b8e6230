"""An explicit-state model checker for celery-redlock's Redlock protocol with fencing.

``model.py`` states the protocol (N Redis masters, clients, a network that
delays, reorders and loses requests, crashes and restarts, drifting clocks) as a
finite transition system with two invariants: mutual exclusion in real time, and
fences that strictly increase in grant order. ``checker.py`` explores it
breadth-first, so the first counterexample is a shortest one, and prints it as a
timeline. ``handoff.py`` models the hand-off to waiting duplicates
(checked by ``handoff_check.py``) and
``beatsplit.py`` two beats claiming a tick with a lock node down (how a lost round's
replies are read decides whether a split loses the tick), and ``limits.py`` at most N
holders per key (N permit slots against the naive per-node counter, checked by
``limits_check.py``), each with its own small checker, and ``replace.py`` queue once
replacing the pending copy (``replace_check.py``); the hand-off and replace checkers
share ``search.py``'s breadth-first search. ``python -m tools.modelcheck``
runs the scenario catalogue and prints a table (``--full`` for the large
configurations, ``--json FILE`` to save it).

Standard library only; nothing here imports ``celery_redlock``, on purpose: the
model is an independent statement of DESIGN.md's algorithm.
"""

from .checker import BOUNDED, Result, check, check_all, in_processes
from .model import FENCE_ORDER, MUTUAL_EXCLUSION, SAFE, VIOLATES, Model, Scenario, scenarios

__all__ = [
    "BOUNDED",
    "FENCE_ORDER",
    "MUTUAL_EXCLUSION",
    "SAFE",
    "VIOLATES",
    "Model",
    "Result",
    "Scenario",
    "check",
    "check_all",
    "in_processes",
    "scenarios",
]
