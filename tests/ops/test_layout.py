"""The package's rooms and which may import which (docs/development/layout.md).

Read from the source with ``ast``, so a lazy import inside a function counts too: an
import cycle hidden that way is still a cycle.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "celery_redlock"

#: The map of the house: each room (a folder, or a public module at the top) and the
#: rooms it may reach, directly or through other modules. Every module falls in one
#: room; a room missing here fails ``test_every_module_has_a_room``. The layout page,
#: docs/development/layout.md, shows this table (``test_layout_page_shows_the_map``).
MAY_REACH: dict[str, frozenset[str]] = {
    "errors": frozenset(),
    "signals": frozenset(),
    "skipped": frozenset(),
    "_moved": frozenset(),
    "testing": frozenset(),
    # Containers as pytest-celery components: Celery and pytest-celery are its point.
    "testing/containers": frozenset({"testing"}),
    "wire": frozenset({"errors"}),
    "lock": frozenset({"wire", "errors"}),
    "asyncio": frozenset({"lock", "wire", "errors"}),
    "fencing": frozenset({"lock", "wire", "errors"}),
    "metrics": frozenset({"signals"}),
    "tasks": frozenset({"lock", "wire", "errors", "signals", "skipped"}),
    "beat": frozenset({"tasks", "lock", "wire", "errors", "signals", "skipped"}),
    "cli": frozenset({"tasks", "lock", "wire", "errors", "signals", "skipped"}),
    "contrib": frozenset({"beat", "tasks", "lock", "wire", "errors", "signals", "skipped"}),
    "": frozenset({"_moved", "tasks", "lock", "wire", "errors", "signals", "skipped"}),
}
#: Folders inside a room with a row of their own in the map (keyed by their path).
SUB_ROOMS = ("testing.containers",)
#: Rooms that must not reach Celery (or kombu), through any module they import.
CELERY_FREE = ("wire", "lock", "asyncio", "errors", "skipped", "fencing", "testing", "_moved")
#: Modules with no imports from the package at all (plain data or pure logic).
SELF_CONTAINED = (
    "errors",
    "wire.round",
    "wire.script",
    "wire.unpatched",
    "lock.stored",
    "tasks.headers",
    "signals",
)
#: Sans-IO: fed replies, no sockets and no clock.
SANS_IO = (
    "wire.round",
    "lock.steps",
    "lock.quorum",
    "lock.settings",
    "lock.acquire_replies",
    "lock.extend_replies",
)
#: The largest a module may grow before it wants splitting by concern.
MAX_MODULE_LINES = 550
MAX_FUNCTION_LINES = 80


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


@functools.cache
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


@functools.cache
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


def _room(name: str) -> str:
    for sub in SUB_ROOMS:
        if name == sub or name.startswith(f"{sub}."):
            return sub.replace(".", "/")
    return name.partition(".")[0]


def _reached(graph: dict[str, set[str]], name: str) -> set[str]:
    """Every package module ``name`` imports, directly or through others."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        for target in graph.get(todo.pop(), ()):
            if target not in seen and target != name:
                seen.add(target)
                todo.append(target)
    return seen


def test_every_module_has_a_room() -> None:
    assert {name: _room(name) for name in _modules() if _room(name) not in MAY_REACH} == {}


@pytest.mark.parametrize("room", sorted(MAY_REACH))
def test_rooms_reach_only_the_rooms_the_map_allows(room: str) -> None:
    graph = _graph()
    wrong = {
        f"{name} -> {target}"
        for name in graph
        if _room(name) == room
        for target in _reached(graph, name)
        if _room(target) not in MAY_REACH[room] | {room}
    }
    assert wrong == set(), f"{room} reaches rooms the map does not allow"


@pytest.mark.parametrize("room", CELERY_FREE)
def test_celery_free_rooms_never_reach_celery(room: str) -> None:
    modules, graph = _modules(), _graph()
    wrong = {
        f"{name} -> {target}"
        for name in graph
        if _room(name) == room
        for target in {name} | _reached(graph, name)
        if _third_party(modules[target]) & {"celery", "kombu", "django"}
    }
    assert wrong == set(), f"{room} reaches Celery"


@pytest.mark.parametrize("name", SELF_CONTAINED)
def test_self_contained_modules_import_nothing_from_the_package(name: str) -> None:
    assert _graph()[name] <= {"errors"} if name != "errors" else not _graph()[name]


@pytest.mark.parametrize("name", SANS_IO)
def test_sans_io_modules_have_no_sockets_and_no_clock(name: str) -> None:
    # The sync driver and the asyncio driver feed the same machines.
    io = {"socket", "select", "ssl", "time", "asyncio", "threading"}
    assert _third_party(_modules()[name]) & io == set()


def test_layout_page_shows_the_map() -> None:
    """The layout page's room table says what MAY_REACH says, and its module table lists
    every module of the package where it lives."""
    section = (PACKAGE.parent / "docs" / "development" / "layout.md").read_text()
    room_table = section.split("| room |", 1)[1].split("\n\n", 1)[0]
    rooms = {}
    for line in room_table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`") and cells[2] != "may reach":
            reach = {c.strip("` ") for c in cells[2].split(",")} - {"nothing"}
            rooms[cells[0].strip("`").rstrip("/").removesuffix(".py")] = frozenset(reach)
    shown = {("" if r == "celery_redlock" else r): v for r, v in rooms.items()}
    assert shown == MAY_REACH
    module_table = section.split("| module |", 1)[1].split("\n\n", 1)[0]
    firsts = [line.strip("|").split("|")[0] for line in module_table.splitlines()]
    listed = {m for cell in firsts for m in re.findall(r"`([a-z_/]+\.py)`", cell)}
    files = {
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if path.name != "__init__.py"
    }
    assert files - listed == set(), "modules the layout page does not list"
    assert listed - files == set(), "the layout page lists modules that do not exist"


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
