"""Where the modules went when the package was split into layer folders (0.2).

``import celery_redlock.task`` (or ``from celery_redlock.redlock import Redlock``)
still works for one release: the old name is the new module itself, with a
``DeprecationWarning`` naming where it lives now. The public names are unchanged
(``from celery_redlock import ...``); this serves code that reached into a module.
Imports nothing from the rest of the package.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType
from typing import Optional, Sequence

__all__ = ["MOVED"]

#: Old module (under ``celery_redlock.``) -> where it lives now.
MOVED = {
    "admin": "lock.clear",
    "background": "wire.background",
    "call_options": "tasks.call_options",
    "canonical": "tasks.canonical",
    "cli.commands": "cli.group",
    "commands": "lock.commands",
    "config": "tasks.config",
    "connection": "wire.connection",
    "contention": "tasks.contention",
    "extension": "lock.extend_replies",
    "finisher": "wire.late_replies",
    "handoff": "lock.waiters",
    "headers": "tasks.headers",
    "holders": "lock.stored",
    "keys": "tasks.keys",
    "lease": "lock.lease",
    "lua": "wire.script",
    "multi_scripts": "lock.multi_scripts",
    "node": "wire.node",
    "nodes": "wire.node_set",
    "options": "tasks.options",
    "queue_once": "tasks.queue_once",
    "quorum": "lock.quorum",
    "redlock": "lock.redlock",
    "reentry": "lock.reentry",
    "refusal": "lock.acquire_replies",
    "renewals": "lock.renewals",
    "resp": "wire.resp",
    "round": "wire.round",
    "rules": "lock.rules",
    "scripts": "lock.scripts",
    "sentinel": "wire.sentinel",
    "task": "tasks.task",
    "testing.cluster": "testing.nodes",
    "ticks": "tasks.ticks",
    "unpatched": "wire.unpatched",
    "validate": "lock.validate",
    "waiting": "tasks.handoff",
    "wake": "lock.wake",
    "watchdog": "lock.watchdog",
}
_PREFIX = "celery_redlock."


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old module name and loads it as the module it became."""

    def __init__(self) -> None:
        self._specs: dict[str, Optional[importlib.machinery.ModuleSpec]] = {}

    def find_spec(
        self, fullname: str, path: Optional[Sequence[str]], target: Optional[ModuleType] = None
    ) -> Optional[importlib.machinery.ModuleSpec]:
        if not fullname.startswith(_PREFIX) or fullname[len(_PREFIX) :] not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = _PREFIX + MOVED[spec.name[len(_PREFIX) :]]
        warnings.warn(
            f"{spec.name} moved to {new}; import it from there (or the public names from "
            "celery_redlock); the old path goes in 0.3",
            DeprecationWarning,
            stacklevel=2,
        )
        module = importlib.import_module(new)
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The module ran when it was imported under its own name. The import system
        # has just set its __spec__ to the old name's: give it its own back.
        assert module.__spec__ is not None
        module.__spec__ = self._specs.pop(module.__spec__.name)


def install() -> None:
    if not any(isinstance(finder, _Alias) for finder in sys.meta_path):
        sys.meta_path.append(_Alias())
