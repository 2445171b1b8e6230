"""The package's rooms and which may import which (README: "How the code is laid out").

Read from the source with ``ast``, so a lazy import inside a function counts too: an
import cycle hidden that way is still a cycle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "celery_redlock"

#: Rooms that must not reach Celery: the lock itself and everything under it.
CELERY_FREE = (
    "errors",
    "validate",
    "resp",
    "round",
    "connection",
    "node",
    "nodes",
    "holders",
    "lease",
    "watchdog",
    "renewals",
    "extension",
    "redlock",
    "scripts",
    "fencing",
    "canonical",
    "finisher",
    "admin",
    "unpatched",
    "background",
    "skipped",
    "rules",
    "quorum",
    "asyncio",
    "asyncio.redlock",
    "asyncio.nodes",
    "asyncio.connection",
    "asyncio.wake",
)
#: Rooms with no imports from the package at all (plain data or pure logic).
SELF_CONTAINED = ("errors", "round", "holders", "headers", "lua", "signals", "unpatched")
#: Rooms split by feature that import only their own parts.
SPLIT_ROOMS = {"scripts": {"lua", "multi_scripts"}, "multi_scripts": {"lua"}}
#: The largest a module may grow before it wants splitting by concern.
MAX_MODULE_LINES = 550
MAX_FUNCTION_LINES = 80


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path) -> Iterator[str]:
    """Package modules imported by ``name`` (relative or absolute, anywhere in it)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    modules = _modules()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                target = ".".join([*base, *(node.module.split(".") if node.module else [])])
            elif node.module and node.module.startswith("celery_redlock"):
                target = node.module.removeprefix("celery_redlock").lstrip(".")
            else:
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}" if target else alias.name
                yield sub if sub in modules else target
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("celery_redlock."):
                    yield alias.name.removeprefix("celery_redlock.")


def _third_party(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {
        name: {target for target in _imports(name, path) if target != name and target}
        for name, path in modules.items()
    }


def test_the_package_has_no_import_cycle() -> None:
    graph = _graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(name: str) -> None:
        state[name] = 1
        stack.append(name)
        for target in sorted(graph.get(name, ())):
            # A package __init__ re-exports its own modules; importing the parent
            # package from inside is what a cycle through __init__ would look like.
            if name.startswith(f"{target}.") or target == "":
                continue
            if state.get(target) == 1:
                cycle = [*stack[stack.index(target) :], target]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if state.get(target) is None:
                visit(target)
        stack.pop()
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)


@pytest.mark.parametrize("room", CELERY_FREE)
def test_the_lock_rooms_never_import_celery(room: str) -> None:
    path = _modules()[room]
    assert "celery" not in _third_party(path), f"{room}.py imports Celery"
    reached = _graph()[room]
    assert not reached & {"task", "beat", "config", "options", "queue_once", "cli"}, (
        f"{room}.py imports a Celery-facing room: {sorted(reached)}"
    )


@pytest.mark.parametrize("room", SELF_CONTAINED)
def test_self_contained_rooms_import_nothing_from_the_package(room: str) -> None:
    assert _graph()[room] <= {"errors"} if room != "errors" else not _graph()[room]


@pytest.mark.parametrize("room", sorted(SPLIT_ROOMS))
def test_split_rooms_import_only_their_parts(room: str) -> None:
    assert _graph()[room] <= SPLIT_ROOMS[room]


def test_the_round_has_no_sockets_and_no_clock() -> None:
    # The sans-IO round: the sync driver and an asyncio driver feed the same machine.
    assert not _third_party(_modules()["round"]) & {"socket", "select", "ssl", "time", "asyncio"}


def test_the_testing_kit_imports_nothing_of_the_lock() -> None:
    for name, targets in _graph().items():
        if name.startswith("testing"):
            assert all(t.startswith("testing") for t in targets), (name, targets)


def test_no_module_outgrows_a_room() -> None:
    sizes = {name: len(path.read_text().splitlines()) for name, path in _modules().items()}
    assert {n: s for n, s in sizes.items() if s > MAX_MODULE_LINES} == {}


def test_no_function_is_longer_than_a_screen() -> None:
    long = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long.append(f"{name}.{node.name}: {length} lines")
    assert long == []
