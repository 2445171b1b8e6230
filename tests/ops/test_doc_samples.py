"""Every Python block of README.md and docs/ runs, against real redis-servers.

A small collector of our own rather than Sybil: what the blocks need beyond a plain
exec is ours to say (which servers stand behind the host names, when a worker runs),
and it takes these few lines, no plugin and no new dependency.

The rules, for whoever writes a page:

- The ```python blocks of a page run in order in one namespace, which starts with
  ``app`` (the Quick start's app: a Celery app on the test's broker with
  ``redlock_nodes`` set) and ``RedlockTask``, so a guide can define tasks on ``app``
  without repeating it.
- Host names stand for servers the test starts: ``redis://lock1:6379/0`` to
  ``redis://lock5:6379/0`` are five lock nodes, ``redis://broker:6379/N`` is db N of a
  broker Redis.
- ``<!-- sample: worker -->`` on the line before a block runs it while an embedded
  worker (threads pool) serves ``app`` as the namespace holds it then.
- ``<!-- sample: skip: REASON -->`` shows a block without running it: a configuration
  fragment, or code that needs what the tests do not have. Keep these few.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import pytest
from celery import Celery, _state
from celery.contrib.testing.worker import start_worker

from celery_redlock import RedlockTask
from celery_redlock.testing import RedisNodes, RedisServer

CHECKOUT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!-- sample: (worker|skip: (?P<reason>.+?)) -->$")
LOCK_URL = re.compile(r"redis://lock([1-5]):6379/0")
BROKER_URL = re.compile(r"redis://broker:6379/(\d+)")


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # of the opening fence, 1-based
    source: str
    worker: bool
    skip_reason: Optional[str]


def pages() -> list[Path]:
    return [CHECKOUT / "README.md", *sorted((CHECKOUT / "docs").rglob("*.md"))]


def blocks_of(path: Path) -> list[Block]:
    """The page's ```python blocks, each with the marker on the line before it."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found, fence, start, marker = [], None, 0, None
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if fence is None and stripped.startswith("```"):
            fence, start = stripped[3:].strip(), number
            before = next((x.strip() for x in reversed(lines[: number - 1]) if x.strip()), "")
            marker = MARKER.match(before)
        elif fence is not None and stripped == "```":
            if fence == "python":
                found.append(
                    Block(
                        page=str(path.relative_to(CHECKOUT)),
                        line=start,
                        source="\n".join(lines[start : number - 1]),
                        worker=bool(marker and marker.group(1) == "worker"),
                        skip_reason=marker.group("reason") if marker else None,
                    )
                )
            fence = None
    return found


ALL_BLOCKS = [block for path in pages() for block in blocks_of(path)]
RUNNABLE_PAGES = sorted({b.page for b in ALL_BLOCKS if b.skip_reason is None})


def with_servers(source: str, nodes: RedisNodes, broker: RedisServer) -> str:
    source = LOCK_URL.sub(lambda m: nodes.urls[int(m.group(1)) - 1], source)
    return BROKER_URL.sub(lambda m: f"{broker.url.rsplit('/', 1)[0]}/{m.group(1)}", source)


@pytest.fixture
def celery_state() -> Iterator[None]:
    """What a page does to Celery's process-wide state stays on the page: a sample's
    ``Celery(...)`` becomes the current app, and its ``app.task`` / ``shared_task``
    (shared by default) would be added to every app finalized later in the session."""
    finalizers = set(_state._on_app_finalizers)
    current = _state.get_current_app()
    yield
    _state._on_app_finalizers.clear()
    _state._on_app_finalizers.update(finalizers)
    _state._set_current_app(current)


@pytest.fixture
def page_app(redis_nodes: RedisNodes, broker: RedisServer) -> Iterator[Celery]:
    app = Celery("proj", broker=f"{broker.url}", backend=f"{broker.url.rsplit('/', 1)[0]}/1")
    app.conf.redlock_nodes = redis_nodes.urls[:3]
    yield app
    app.close()


@pytest.mark.parametrize("page", RUNNABLE_PAGES)
@pytest.mark.usefixtures("celery_state")
def test_the_python_blocks_of_a_page_run(
    page: str, page_app: Celery, redis_nodes: RedisNodes, broker: RedisServer
) -> None:
    # A module name for what the page defines (Celery names a task's function by it).
    module = "docs_sample_" + re.sub(r"\W", "_", page.removesuffix(".md"))
    namespace: dict[str, Any] = {"__name__": module, "app": page_app, "RedlockTask": RedlockTask}
    for block in (b for b in ALL_BLOCKS if b.page == page and b.skip_reason is None):
        code = compile(
            with_servers(block.source, redis_nodes, broker), f"{page}:{block.line}", "exec"
        )
        if block.worker:
            app = namespace["app"]
            with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
                exec(code, namespace)
        else:
            exec(code, namespace)


def test_blocks_shown_without_running_say_why_and_are_few() -> None:
    skipped = [b for b in ALL_BLOCKS if b.skip_reason is not None]
    assert all(len(b.skip_reason or "") >= 20 for b in skipped), skipped
    assert len(skipped) <= len(ALL_BLOCKS) // 4, [f"{b.page}:{b.line}" for b in skipped]


def test_every_sample_marker_is_one_the_runner_knows() -> None:
    for path in pages():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.startswith("<!-- sample"):
                assert MARKER.match(line.strip()), f"{path}:{number}: {line}"
