"""The API reference (docs/api/*.rst) documents every public name: each name in the
``__all__`` of ``celery_redlock`` and of its public modules appears in an autodoc
directive, under that module or under another public path to the same object (the
errors, say, are documented once, in ``celery_redlock.errors``).

Public modules: ``celery_redlock`` itself, its top-level modules, the ``__init__`` of
a subpackage that declares ``__all__`` (asyncio, cli, testing, testing.containers), and
the modules of ``contrib/``. The layer folders (wire, lock, tasks) and the private
submodules behind those ``__init__`` files are not the API.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]
PACKAGE = CHECKOUT / "celery_redlock"
DIRECTIVE = re.compile(
    r"^\.\. auto(?:module|class|exception|function|data|attribute)::\s+(\S+)", re.M
)
#: Importing it needs configured Django settings: its names are compared by path.
NOT_IMPORTED = {"celery_redlock.contrib.django_celery_beat"}


def declared_all(path: Path) -> list[str] | None:
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return [str(ast.literal_eval(e)) for e in node.value.elts]  # type: ignore[attr-defined]
    return None


def public_modules() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(CHECKOUT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if any(p.startswith("_") for p in parts):
            continue
        top_level = len(parts) == 2 and path.name != "__init__.py"
        package = path.name == "__init__.py"
        contrib = parts[:2] == ("celery_redlock", "contrib") and not package
        names = declared_all(path)
        if names is not None and (len(parts) == 1 or top_level or package or contrib):
            found[".".join(parts)] = names
    return found


def documented_targets() -> set[str]:
    return {
        target
        for page in (CHECKOUT / "docs" / "api").glob("*.rst")
        for target in DIRECTIVE.findall(page.read_text(encoding="utf-8"))
    }


def importable(target: str) -> bool:
    return not any(target == m or target.startswith(f"{m}.") for m in NOT_IMPORTED)


def resolve(target: str) -> object:
    module, _, name = target.rpartition(".")
    try:
        return importlib.import_module(target)
    except ImportError:
        return getattr(importlib.import_module(module), name)


def test_the_public_modules_are_the_expected_ones() -> None:
    # A new public module shows up here: give it a page in docs/api/.
    assert set(public_modules()) == {
        "celery_redlock", "celery_redlock.asyncio", "celery_redlock.beat",
        "celery_redlock.cli", "celery_redlock.contrib.django_celery_beat",
        "celery_redlock.errors", "celery_redlock.fencing", "celery_redlock.metrics",
        "celery_redlock.signals", "celery_redlock.skipped", "celery_redlock.testing",
        "celery_redlock.testing.containers",
    }  # fmt: skip


def test_the_api_reference_documents_every_public_name() -> None:
    targets = documented_targets()
    documented = [resolve(t) for t in sorted(targets) if importable(t)]
    missing = []
    for module_name, names in public_modules().items():
        for name in names:
            if f"{module_name}.{name}" in targets:
                continue
            if module_name in NOT_IMPORTED:
                missing.append(f"{module_name}.{name}")
                continue
            obj = getattr(importlib.import_module(module_name), name)
            if not any(obj is d for d in documented):
                missing.append(f"{module_name}.{name}")
    assert missing == [], "add these to docs/api/*.rst"


def test_every_documented_target_exists() -> None:
    for target in documented_targets():
        if importable(target):
            resolve(target)
