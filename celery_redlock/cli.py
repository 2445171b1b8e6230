"""``celery -A proj redlock ...``: the operators' view of the lock nodes and the locks.

Celery finds the ``redlock`` click group through the ``celery.commands`` entry point;
every command reads the app's ``redlock_*`` settings (config.py)::

    celery -A proj redlock doctor [--json] [--timeout S]
    celery -A proj redlock ls [--pattern GLOB] [--limit N] [--json] [--timeout S]
    celery -A proj redlock show KEY [--json] [--timeout S]
    celery -A proj redlock release KEY --token TOKEN [--json] [--timeout S]
    celery -A proj redlock release KEY --force [--yes] [--json] [--timeout S]

KEY is a full key (``redlock:import:42``) or one relative to the prefix (``import:42``).

``doctor`` checks what breaks Redlock's safety on the nodes themselves: a replica
used as a master, the same server listed twice, an eviction policy that may drop
lock keys, persistence that loses them in a crash (redis.io: fsync=always, or keep a
crashed node down for longer than the largest TTL), stepped clocks, lock keys
without a TTL, and whether a quorum is reachable at all.

Exit codes: 0 when all is well (doctor: only OK and WARNING); 1 when doctor found an
ERROR, release removed nothing, or no node answered; 2 for usage errors; 78
(EX_CONFIG) when the ``redlock_*`` settings are invalid.

Each node is inspected through a plain redis-py client (``Node.client()``), one
thread per node under one shared deadline, so a hung node costs ``--timeout`` once,
not once per node, key or command. ``show`` reads with ``Redlock.holder`` (one
round); ``release`` runs the RELEASE compare-and-delete script on every node, or a
plain DEL with ``--force``. Fence counters (``<key>\\0fence``) are never listed as
locks nor deleted: fence numbers must never go backwards.
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, TypeVar, Union

import click
import redis
from celery.bin.base import CeleryCommand, CeleryOption
from celery.exceptions import CeleryCommandException

from . import scripts
from .config import AppConfig, app_config
from .errors import ConfigurationError
from .nodes import Node
from .redlock import (
    FENCE,
    HolderInfo,
    NodeHolding,
    Redlock,
    is_lock_key,
    quorum,
    tombstone,
)

__all__ = ["redlock"]

OK = "OK"
WARNING = "WARNING"
ERROR = "ERROR"
_RANK = {OK: 0, WARNING: 1, ERROR: 2}
_COLOURS = {OK: "green", WARNING: "yellow", ERROR: "red"}

#: Exit code for invalid ``redlock_*`` settings (sysexits.h EX_CONFIG).
EX_CONFIG = getattr(os, "EX_CONFIG", 78)
#: Seconds each node gets to answer (the default of ``--timeout``).
DEFAULT_TIMEOUT = 2.0
#: Redis TIME this far from local time (seconds) earns a WARNING.
CLOCK_OFFSET_WARNING = 0.5
#: SET key value NX PX (and Lua) arrived in Redis 2.6.12.
MIN_REDIS_VERSION = (2, 6, 12)
#: Lock keys without a TTL listed by doctor (all of them are counted).
NO_TTL_SHOWN = 10
#: Counter keys of fenced locks: they never expire, on purpose.
FENCE_SUFFIX = FENCE


def _is_lock_key(name: str) -> bool:
    """Lock keys, not the fence counters or release tombstones kept beside them."""
    return is_lock_key(name)


#: The scan for keys without a TTL stops at this fraction of the node's budget, so
#: a huge keyspace shortens the scan instead of losing the node's whole report.
SCAN_BUDGET = 0.6
TOKEN_SHOWN = 8

_T = TypeVar("_T")

REDIS_IO_ADVICE = (
    "Without appendfsync always, a node that crashes (power loss, SIGKILL) may "
    "restart without lock keys it had granted, and a second client can then win a "
    "quorum for a lock that is still held. Either set appendonly yes + appendfsync "
    "always (slow), or use delayed restarts: keep a crashed node down for a bit "
    "longer than the largest lock TTL{ttl_hint} before it rejoins, so every lock it "
    "took part in has expired (redis.io, 'Distributed locks with Redis': "
    "'Performance, crash-recovery and fsync')."
)


# -- the click group ---------------------------------------------------------------------


@click.group(name="redlock")
def redlock() -> None:
    """Inspect the Redlock nodes and locks of this app (celery-redlock).

    doctor checks node settings that break lock safety; ls and show say who holds
    which lock; release removes one (token-checked, or forced).
    """


def _json_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--json",
        "as_json",
        cls=CeleryOption,
        is_flag=True,
        help_group="Output Options",
        help="Print one JSON document instead of a table.",
    )(f)


class _Seconds(click.FloatRange):
    """A finite number of seconds (FloatRange lets nan and inf through)."""

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Any) -> Any:
        seconds = super().convert(value, param, ctx)
        if not math.isfinite(seconds):
            self.fail(f"{value!r} is not a finite number of seconds.", param, ctx)
        return seconds


def _timeout_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--timeout",
        cls=CeleryOption,
        type=_Seconds(min=0.001),
        default=DEFAULT_TIMEOUT,
        show_default=True,
        help_group="Connection Options",
        help="Seconds each node gets to answer (hung nodes are reported, not waited on).",
    )(f)


def _config(ctx: click.Context) -> AppConfig:
    try:
        return app_config(ctx.obj.app)
    except ConfigurationError as exc:
        raise CeleryCommandException(message=str(exc), exit_code=EX_CONFIG) from None


def _redlock(config: AppConfig, timeout: float) -> Redlock:
    try:
        return config.redlock(timeout, False)
    except ConfigurationError as exc:
        raise CeleryCommandException(message=str(exc), exit_code=EX_CONFIG) from None


def _nodes(lock: Redlock) -> list[Node]:
    # The configured nodes, in order. No public accessor yet: the CLI is the only
    # reader besides the lock itself.
    return list(lock._nodes.nodes)


def _print_json(ctx: click.Context, document: object) -> None:
    ctx.obj.echo(json.dumps(document, indent=2))


def _styled(ctx: click.Context, status: str, width: int = 0) -> str:
    text: str = ctx.obj.style(status.ljust(width), fg=_COLOURS.get(status), bold=status != OK)
    return text


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row[:-1]):
            widths[i] = max(widths[i], len(cell))
    lines = []
    for row in [list(headers), *rows]:
        cells = [cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    return lines


def _error_text(error: BaseException) -> str:
    text = str(error) or type(error).__name__
    return text.replace("\n", " ")


def full_key(key: str, prefix: str) -> str:
    """``KEY`` as given on the command line -> the key in Redis.

    A key already under ``<prefix>:`` is taken as is; any other is relative to it.
    """
    if key.startswith(prefix + ":"):
        return key
    return f"{prefix}:{key}"


def _glob_escape(text: str) -> str:
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def on_each_node(
    nodes: Sequence[Node], work: Callable[[Node], _T], timeout: float
) -> list[Union[_T, BaseException]]:
    """``work(node)`` for every node at once, in threads, under one shared deadline.

    One entry per node: what ``work`` returned, the exception it raised, or a
    ``redis.TimeoutError`` when it was still running at the deadline (the thread
    is a daemon and is left behind: a hung node must not hang the command).
    """
    pending = object()
    results: list[Any] = [pending] * len(nodes)

    def run(index: int, node: Node) -> None:
        try:
            results[index] = work(node)
        except BaseException as exc:
            results[index] = exc

    threads = [
        threading.Thread(target=run, args=(i, node), daemon=True, name=f"redlock-cli-{i}")
        for i, node in enumerate(nodes)
    ]
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return [
        redis.TimeoutError(f"{node.address}: no reply within {timeout:g} s")
        if result is pending
        else result
        for node, result in zip(nodes, results)
    ]


# -- holders -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Holder:
    """A holder string split into its parts: ``task-id@worker:pid`` as the task stores it.

    ``hostname:pid`` (a plain ``Redlock.acquire``) has no task id; a bare task id (a
    queued-copy lock) has no worker.
    """

    raw: Optional[str]
    task_id: Optional[str] = None
    worker: Optional[str] = None
    pid: Optional[int] = None

    @classmethod
    def parse(cls, holder: Optional[str]) -> Holder:
        if not holder:
            return cls(None)
        task_id, at, rest = holder.partition("@")
        if not at:
            task_id, rest = "", holder
        worker, colon, pid = rest.rpartition(":")
        if colon and pid.isdigit() and worker:
            return cls(holder, task_id or None, worker, int(pid))
        if at:
            return cls(holder, task_id or None, rest or None)
        return cls(holder, task_id=holder)

    def as_dict(self) -> dict[str, Any]:
        return {"holder": self.raw, "task_id": self.task_id, "worker": self.worker, "pid": self.pid}


def _agreeing(info: HolderInfo) -> tuple[Optional[str], int]:
    """The token most nodes hold for the key, and on how many nodes."""
    tokens = Counter(n.token for n in info.nodes if n.token)
    if not tokens:
        return None, 0
    token, count = tokens.most_common(1)[0]
    return token, count


def _holding_dict(holding: NodeHolding) -> dict[str, Any]:
    return {
        "node": holding.node,
        "token": holding.token,
        "holder": holding.holder,
        # A value without an expiry reads as ttl None too: say which it is.
        "ttl": holding.ttl,
        "no_expiry": holding.token is not None and holding.ttl is None,
        "error": None if holding.error is None else _error_text(holding.error),
    }


def _holder_doc(info: HolderInfo) -> dict[str, Any]:
    token, agreeing = _agreeing(info)
    holder = next((n.holder for n in info.nodes if token and n.token == token), None)
    return {
        "key": info.key,
        **Holder.parse(holder).as_dict(),
        "token": token,
        "agreeing_nodes": agreeing,
        "nodes_total": len(info.nodes),
        "quorum": info.quorum,
        "quorum_agrees": agreeing >= info.quorum,
        "ttl": info.ttl,
        "nodes": [_holding_dict(n) for n in info.nodes],
    }


def _ttl_cell(holding: NodeHolding) -> str:
    if holding.error is not None:
        return "error"
    if holding.token is None:
        return "-"
    if holding.ttl is None:
        return "no-ttl"
    return f"{holding.ttl:.1f}"


def _token_cell(token: Optional[str]) -> str:
    if not token:
        return "-"
    return token[:TOKEN_SHOWN] + "..." if len(token) > TOKEN_SHOWN else token


# -- ls ------------------------------------------------------------------------------------


@redlock.command(name="ls", cls=CeleryCommand)
@click.option(
    "--pattern",
    cls=CeleryOption,
    default="*",
    show_default=True,
    help_group="Listing Options",
    help="Glob (Redis MATCH syntax) for the part of the key after '<prefix>:'.",
)
@click.option(
    "--limit",
    cls=CeleryOption,
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help_group="Listing Options",
    help="List at most this many keys.",
)
@_timeout_option
@_json_option
@click.pass_context
def ls(ctx: click.Context, pattern: str, limit: int, timeout: float, as_json: bool) -> None:
    """List the locks under the key prefix: holder, TTL per node, quorum agreement."""
    config = _config(ctx)
    lock = _redlock(config, timeout)
    nodes = _nodes(lock)
    match = f"{_glob_escape(config.key_prefix)}:{pattern}"

    def scan(node: Node) -> list[str]:
        keys = []
        for raw in node.client().scan_iter(match=match, count=1000):
            key = _text(raw) or ""
            if _is_lock_key(key):
                keys.append(key)
        return keys

    scanned = on_each_node(nodes, scan, timeout)
    errors = {
        node.address: _error_text(result)
        for node, result in zip(nodes, scanned)
        if isinstance(result, BaseException)
    }
    found: set[str] = set()
    for result in scanned:
        if not isinstance(result, BaseException):
            found.update(result)
    keys = sorted(found)
    truncated = len(keys) > limit
    infos = read_holders(nodes, keys[:limit], scanned, lock.quorum, timeout)
    if as_json:
        _print_json(
            ctx,
            {
                "prefix": config.key_prefix,
                "pattern": pattern,
                "quorum": lock.quorum,
                "nodes": [n.address for n in nodes],
                "keys": [_holder_doc(info) for info in infos],
                "truncated": truncated,
                "errors": errors,
            },
        )
    else:
        _print_ls(ctx, lock, nodes, infos, match)
        if truncated:
            ctx.obj.echo(f"... {len(keys) - limit} more keys not shown (--limit {limit})")
        for address, text in errors.items():
            ctx.obj.error(ctx.obj.style(f"{address}: could not list keys: {text}", fg="red"))
    if len(errors) == len(nodes):
        ctx.exit(1)


def read_holdings(node: Node, keys: Sequence[str]) -> list[NodeHolding]:
    """Value and TTL of each key on one node: one MULTI/EXEC, so each pair is consistent.

    Per node rather than one ``Redlock.holder`` round per key: a hung node then costs
    the timeout once for the whole listing, not once per key.
    """
    pipe = node.client().pipeline(transaction=True)
    for key in keys:
        pipe.get(key)
        pipe.pttl(key)
    replies = pipe.execute(raise_on_error=False)
    holdings = []
    for i in range(len(keys)):
        value, pttl = replies[2 * i], replies[2 * i + 1]
        if isinstance(value, BaseException):
            holdings.append(NodeHolding(node.address, error=value))
            continue
        token, holder = (None, None)
        if value is not None:
            token, _, rest = (_text(value) or "").partition("|")
            holder = rest or None
        ttl = pttl / 1000.0 if isinstance(pttl, int) and pttl >= 0 else None
        holdings.append(NodeHolding(node.address, token, holder, ttl))
    return holdings


def read_holders(
    nodes: Sequence[Node],
    keys: Sequence[str],
    reachable: Sequence[object],
    need: int,
    timeout: float,
) -> list[HolderInfo]:
    """``HolderInfo`` of every key, reading each node once; nodes whose entry in
    ``reachable`` is an exception are not asked again (their error is reported)."""
    if not keys:
        return []
    asked = [n for n, r in zip(nodes, reachable) if not isinstance(r, BaseException)]
    answers = dict(zip(asked, on_each_node(asked, lambda n: read_holdings(n, keys), timeout)))
    per_node: list[list[NodeHolding]] = []
    for node, earlier in zip(nodes, reachable):
        answer = answers.get(node, earlier)
        if isinstance(answer, BaseException):
            per_node.append([NodeHolding(node.address, error=answer)] * len(keys))
        else:
            assert isinstance(answer, list)
            per_node.append(answer)
    return [
        HolderInfo(key, tuple(holdings[i] for holdings in per_node), need)
        for i, key in enumerate(keys)
    ]


def _print_ls(
    ctx: click.Context, lock: Redlock, nodes: Sequence[Node], infos: list[HolderInfo], match: str
) -> None:
    if not infos:
        ctx.obj.echo(f"no lock keys match {match!r} on {len(nodes)} nodes")
        return
    rows = []
    for info in infos:
        token, agreeing = _agreeing(info)
        holder = next((n.holder for n in info.nodes if token and n.token == token), None)
        parsed = Holder.parse(holder)
        ttls = " ".join(_ttl_cell(n) for n in info.nodes)
        verdict = "yes" if agreeing >= info.quorum else "NO"
        rows.append(
            [
                info.key,
                parsed.task_id or "-",
                (parsed.worker or "-") + (f" (pid {parsed.pid})" if parsed.pid else ""),
                f"{verdict} {agreeing}/{len(info.nodes)}",
                ttls,
            ]
        )
    headers = ["KEY", "TASK", "WORKER", "QUORUM", "TTL s per node"]
    for line in _table(headers, rows):
        ctx.obj.echo(line)
    ctx.obj.echo(
        f"{len(infos)} keys; nodes in TTL order: {', '.join(n.address for n in nodes)}; "
        f"quorum {lock.quorum} of {len(nodes)}"
    )


# -- show ----------------------------------------------------------------------------------


@redlock.command(cls=CeleryCommand)
@click.argument("key")
@_timeout_option
@_json_option
@click.pass_context
def show(ctx: click.Context, key: str, timeout: float, as_json: bool) -> None:
    """Who holds KEY, node by node.

    KEY is a full key ('redlock:import:42') or one relative to the prefix ('import:42').
    """
    config = _config(ctx)
    lock = _redlock(config, timeout)
    info = lock.holder(full_key(key, config.key_prefix))
    document = _holder_doc(info)
    if as_json:
        _print_json(ctx, document)
    else:
        _print_show(ctx, info, document)
    if all(n.error is not None for n in info.nodes):
        ctx.exit(1)


def _print_show(ctx: click.Context, info: HolderInfo, document: dict[str, Any]) -> None:
    echo = ctx.obj.echo
    echo(f"key       {info.key}")
    if document["token"] is None:
        echo("holder    nobody (no node holds this key)")
    else:
        parts = [
            f"task {document['task_id']}" if document["task_id"] else None,
            f"worker {document['worker']}" if document["worker"] else None,
            f"pid {document['pid']}" if document["pid"] else None,
        ]
        details = ", ".join(p for p in parts if p)
        echo(f"holder    {document['holder'] or '?'}" + (f" ({details})" if details else ""))
        state = "held" if document["quorum_agrees"] else "NOT held by a quorum"
        frees = f"; frees in {info.ttl:.1f} s" if info.ttl is not None else ""
        echo(
            f"quorum    {state}: {document['agreeing_nodes']} of {len(info.nodes)} nodes "
            f"agree, {info.quorum} needed{frees}"
        )
        echo(f"token     {document['token']}")
        echo(f"release   redlock release {info.key} --token={document['token']}")
    echo("")
    rows = [
        [
            n.node,
            n.holder or "-",
            _token_cell(n.token),
            _ttl_cell(n) if n.ttl is None else f"{n.ttl:.3f} s",
            "-" if n.error is None else _error_text(n.error),
        ]
        for n in info.nodes
    ]
    for line in _table(["NODE", "HOLDER", "TOKEN", "TTL", "ERROR"], rows):
        echo(line)


# -- release -------------------------------------------------------------------------------

DELETED = "deleted"
ABSENT = "absent"
OTHER_HOLDER = "other-holder"
FAILED = "error"


@dataclass
class NodeRelease:
    node: str
    result: str
    holder: Optional[str] = None
    token: Optional[str] = None
    error: Optional[str] = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "result": self.result,
            "holder": self.holder,
            "token": self.token,
            "error": self.error,
        }


def release_with_token(node: Node, key: str, token: str) -> NodeRelease:
    """Delete ``key`` on ``node`` only if it holds ``token`` (or the exact value
    ``token|holder``).

    Reads the stored value, then deletes with the RELEASE script (compare-and-delete
    of that whole value): if the key changed hands in between, nothing is deleted.
    """
    client = node.client()
    value = client.get(key)
    if value is None:
        return NodeRelease(node.address, ABSENT)
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    stored_token, _, holder = text.partition("|")
    wanted = text if "|" in token else stored_token
    if wanted != token:
        return NodeRelease(node.address, OTHER_HOLDER, holder or None, stored_token)
    # The key exists, so no tombstone is left (1 s is its TTL if it vanished meanwhile).
    deleted = client.eval(scripts.RELEASE.source, 2, key, tombstone(key, text), text, 1000)
    result = DELETED if deleted == 1 else OTHER_HOLDER
    return NodeRelease(node.address, result, holder or None, stored_token)


def force_release(node: Node, key: str) -> NodeRelease:
    """Delete ``key`` on ``node`` whoever holds it (its fence counter is kept)."""
    client = node.client()
    pipe = client.pipeline(transaction=True)
    pipe.get(key)
    pipe.delete(key)
    value, deleted = pipe.execute()
    if not deleted:
        return NodeRelease(node.address, ABSENT)
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    stored_token, _, holder = text.partition("|")
    return NodeRelease(node.address, DELETED, holder or None, stored_token)


@redlock.command(cls=CeleryCommand)
@click.argument("key")
@click.option(
    "--token",
    cls=CeleryOption,
    metavar="TOKEN",
    help_group="Release Options",
    help="Delete the lock only where it holds this token (as shown by 'show').",
)
@click.option(
    "--force",
    cls=CeleryOption,
    is_flag=True,
    help_group="Release Options",
    help="Delete the lock whoever holds it (asks first).",
)
@click.option(
    "-y",
    "--yes",
    cls=CeleryOption,
    is_flag=True,
    help_group="Release Options",
    help="Do not ask before --force.",
)
@_timeout_option
@_json_option
@click.pass_context
def release(
    ctx: click.Context,
    key: str,
    token: Optional[str],
    force: bool,
    yes: bool,
    timeout: float,
    as_json: bool,
) -> None:
    """Release KEY on every node: only where it holds --token TOKEN, or --force.

    A forced release ends mutual exclusion for a task that may still be running
    under the lock: use it for a holder that is known dead and a TTL too long to wait.
    Exits 1 when nothing was deleted.
    """
    if token is not None and force:
        raise click.UsageError("--token and --force are mutually exclusive: give one", ctx=ctx)
    if token is None and not force:
        raise click.UsageError(
            "give --token TOKEN (delete only that holder's lock) or --force (whoever holds it)",
            ctx=ctx,
        )
    if yes and not force:
        raise click.UsageError("--yes only applies to --force", ctx=ctx)
    if token is not None and not token.strip():
        raise click.BadParameter("must not be empty", ctx=ctx, param_hint="'--token'")
    config = _config(ctx)
    lock = _redlock(config, timeout)
    name = full_key(key, config.key_prefix)
    if name.endswith(FENCE_SUFFIX):
        raise click.BadParameter(
            f"{name} is a fence counter, not a lock: deleting it would let fence numbers "
            "go backwards",
            ctx=ctx,
            param_hint="'KEY'",
        )
    nodes = _nodes(lock)
    if force and not yes:
        info = lock.holder(name)
        holders = sorted({n.holder or n.token or "?" for n in info.nodes if n.token})
        who = ", ".join(holders) if holders else "nobody, as far as the nodes answered"
        click.confirm(
            f"Delete lock {name} on {len(nodes)} nodes, whoever holds it (now: {who})?\n"
            "A task still running under it loses mutual exclusion.",
            abort=True,
            err=True,
        )
    if token is not None:
        wanted = token.strip()
        results = on_each_node(nodes, lambda node: release_with_token(node, name, wanted), timeout)
    else:
        results = on_each_node(nodes, lambda node: force_release(node, name), timeout)
    outcome = [
        NodeRelease(node.address, FAILED, error=_error_text(r))
        if isinstance(r, BaseException)
        else r
        for node, r in zip(nodes, results)
    ]
    deleted = sum(1 for r in outcome if r.result == DELETED)
    if as_json:
        _print_json(
            ctx,
            {
                "key": name,
                "mode": "force" if force else "token",
                "deleted": deleted,
                "nodes": [r.as_dict() for r in outcome],
            },
        )
    else:
        _print_release(ctx, name, outcome, deleted, lock.quorum)
    if deleted == 0:
        ctx.exit(1)


def _print_release(
    ctx: click.Context, key: str, outcome: list[NodeRelease], deleted: int, need: int
) -> None:
    rows = []
    for r in outcome:
        if r.result == DELETED:
            detail = f"deleted (held by {r.holder or '?'})"
        elif r.result == ABSENT:
            detail = "no such key"
        elif r.result == OTHER_HOLDER:
            detail = f"left alone: held with another token ({_token_cell(r.token)}, {r.holder})"
        else:
            detail = f"error: {r.error}"
        rows.append([r.node, detail])
    for line in _table(["NODE", "RESULT"], rows):
        ctx.obj.echo(line)
    if deleted == 0:
        ctx.obj.error(ctx.obj.style(f"{key}: nothing deleted on any node", fg="red"))
    elif any(r.result == FAILED for r in outcome):
        ctx.obj.echo(
            f"{key}: deleted on {deleted} of {len(outcome)} nodes; a node that did not "
            "answer may still apply the release late, else its copy expires at its TTL "
            f"(a new holder needs {need} nodes)"
        )
    else:
        ctx.obj.echo(f"{key}: deleted on {deleted} of {len(outcome)} nodes")


# -- doctor --------------------------------------------------------------------------------


@dataclass
class Check:
    """One verdict: what was checked, OK / WARNING / ERROR, and why."""

    name: str
    status: str
    message: str
    advice: Optional[str] = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "check": self.name,
            "status": self.status,
            "message": self.message,
            "advice": self.advice,
        }


@dataclass
class NodeFacts:
    """What one node told us (the raw material of its checks)."""

    address: str
    reachable: bool = False
    error: Optional[str] = None
    latency_ms: Optional[float] = None
    version: Optional[str] = None
    run_id: Optional[str] = None
    role: Optional[str] = None
    master: Optional[str] = None
    replicas: int = 0
    maxmemory: Optional[int] = None
    maxmemory_policy: Optional[str] = None
    appendonly: Optional[bool] = None
    appendfsync: Optional[str] = None
    appendfsync_error: Optional[str] = None
    clock_offset: Optional[float] = None
    lock_keys: int = 0
    fence_keys: int = 0
    keys_without_ttl: list[str] = field(default_factory=list)
    keys_without_ttl_count: int = 0
    scan_complete: bool = True
    lock_scripts_error: Optional[str] = None
    restricted: bool = False  # answered, but this user may not inspect it
    checks: list[Check] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "node": self.address,
            "reachable": self.reachable,
            "error": self.error,
            "latency_ms": None if self.latency_ms is None else round(self.latency_ms, 3),
            "redis_version": self.version,
            "run_id": self.run_id,
            "role": self.role,
            "master": self.master,
            "connected_replicas": self.replicas,
            "maxmemory": self.maxmemory,
            "maxmemory_policy": self.maxmemory_policy,
            "appendonly": self.appendonly,
            "appendfsync": self.appendfsync,
            "clock_offset_s": None if self.clock_offset is None else round(self.clock_offset, 6),
            "lock_keys": self.lock_keys,
            "fence_keys": self.fence_keys,
            "keys_without_ttl": self.keys_without_ttl,
            "keys_without_ttl_count": self.keys_without_ttl_count,
            "scan_complete": self.scan_complete,
            "lock_scripts_error": self.lock_scripts_error,
            "status": _worst(self.checks),
            "checks": [c.as_dict() for c in self.checks],
        }


def _worst(checks: Sequence[Check]) -> str:
    return max((c.status for c in checks), key=_RANK.__getitem__, default=OK)


def _text(value: object) -> Optional[str]:
    # redis-py's INFO parser turns number-looking values into int/float.
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def inspect_node(node: Node, prefix: str, budget: float) -> NodeFacts:
    """Read everything doctor judges from one node; raises if it cannot be reached."""
    started = time.monotonic()
    facts = NodeFacts(node.address)
    client = node.client()
    client.ping()  # connects: not part of the round trip measured below
    facts.reachable = True
    trips = []
    for _ in range(5):
        before = time.perf_counter()
        client.ping()
        trips.append(time.perf_counter() - before)
    facts.latency_ms = statistics.median(trips) * 1000
    server = client.info("server")
    facts.version = _text(server.get("redis_version"))
    facts.run_id = _text(server.get("run_id"))
    replication = client.info("replication")
    facts.role = _text(replication.get("role"))
    if facts.role == "slave":
        facts.master = f"{replication.get('master_host')}:{replication.get('master_port')}"
    facts.replicas = int(replication.get("connected_slaves") or 0)
    memory = client.info("memory")
    facts.maxmemory = int(memory.get("maxmemory") or 0)
    facts.maxmemory_policy = _text(memory.get("maxmemory_policy"))
    persistence = client.info("persistence")
    facts.appendonly = bool(int(persistence.get("aof_enabled") or 0))
    try:
        # Not in INFO; CONFIG may be renamed or refused on managed Redis.
        facts.appendfsync = _text(client.config_get("appendfsync").get("appendfsync"))
    except redis.ResponseError as exc:
        facts.appendfsync_error = _error_text(exc)
    before = time.time()
    seconds, micros = client.time()
    after = time.time()
    facts.clock_offset = seconds + micros / 1e6 - (before + after) / 2
    facts.lock_scripts_error = _probe_lock_scripts(client, prefix)
    _scan_lock_keys(client, prefix, facts, started + budget * SCAN_BUDGET)
    return facts


def _probe_lock_scripts(client: redis.Redis, prefix: str) -> Optional[str]:
    """Take and release a probe lock with the lock's own commands (SCRIPT LOAD, then
    EVALSHA of the acquire and release scripts): None when this user may, else why not.
    Inspection alone cannot tell: an ACL may allow INFO and forbid EVALSHA or DEL."""
    key = f"{prefix}:doctor-probe:{os.getpid()}:{time.monotonic_ns()}"
    value = "doctor-probe|celery redlock doctor"
    try:
        for script in (scripts.ACQUIRE, scripts.RELEASE):
            client.script_load(script.source)
        taken = client.evalsha(scripts.ACQUIRE.sha, 2, key, tombstone(key, value), value, 5000)
        if taken != 1:
            return f"the probe lock {key} was not granted ({taken!r})"
        released = client.evalsha(scripts.RELEASE.sha, 2, key, tombstone(key, value), value, 5000)
        if released != 1:
            return f"the probe lock {key} was not released ({released!r})"
    except redis.RedisError as exc:
        return _error_text(exc)
    return None


def _scan_lock_keys(client: redis.Redis, prefix: str, facts: NodeFacts, stop_at: float) -> None:
    match = f"{_glob_escape(prefix)}:*"
    cursor = 0
    while True:
        cursor, batch = client.scan(cursor, match=match, count=1000)
        names = [_text(k) or "" for k in batch]
        keys = [k for k in names if _is_lock_key(k)]
        facts.fence_keys += sum(1 for k in names if k.endswith(FENCE_SUFFIX))
        facts.lock_keys += len(keys)
        if keys:
            pipe = client.pipeline(transaction=False)
            for key in keys:
                pipe.pttl(key)
            for key, pttl in zip(keys, pipe.execute()):
                if pttl == -1:
                    facts.keys_without_ttl_count += 1
                    if len(facts.keys_without_ttl) < NO_TTL_SHOWN:
                        facts.keys_without_ttl.append(key)
        if cursor == 0:
            return
        if time.monotonic() > stop_at:
            facts.scan_complete = False
            return


def _version(text: Optional[str]) -> tuple[int, ...]:
    numbers = re.findall(r"\d+", text or "")
    return tuple(int(n) for n in numbers[:3])


def judge_node(facts: NodeFacts, config: AppConfig) -> list[Check]:
    """The checks of one reachable node, from its facts."""
    checks = []
    if facts.lock_scripts_error:
        checks.append(
            Check(
                "permissions",
                ERROR,
                "this user cannot run the lock's commands: "
                f"{facts.lock_scripts_error}; an ACL user needs at least "
                f"~{config.key_prefix}:* +evalsha +script|load +get +set +exists +pttl "
                "+pexpire +del (and +eval to survive SCRIPT FLUSH)",
            )
        )
    else:
        checks.append(Check("permissions", OK, "a probe lock was taken and released"))
    latency = facts.latency_ms or 0.0
    timeout_ms = config.task_defaults.node_timeout * 1000
    if latency > timeout_ms / 2:
        checks.append(
            Check(
                "latency",
                WARNING,
                f"round trip {latency:.2f} ms is more than half of redlock_node_timeout "
                f"({timeout_ms:.0f} ms): lock rounds will often miss this node",
            )
        )
    else:
        checks.append(Check("latency", OK, f"round trip {latency:.2f} ms"))
    if _version(facts.version) < MIN_REDIS_VERSION:
        checks.append(
            Check("version", ERROR, f"Redis {facts.version}: SET NX PX needs Redis >= 2.6.12")
        )
    else:
        checks.append(Check("version", OK, f"Redis {facts.version}"))
    if facts.role == "slave":
        checks.append(
            Check(
                "role",
                ERROR,
                f"replica of {facts.master}: Redlock needs independent masters (a replica "
                "refuses the lock writes or keeps them apart from its master's)",
            )
        )
    elif facts.role != "master":
        checks.append(Check("role", WARNING, f"unexpected role {facts.role!r}"))
    elif facts.replicas:
        checks.append(
            Check(
                "role",
                WARNING,
                f"master with {facts.replicas} replica(s): replication is asynchronous, "
                "so a failover to a replica can lose lock keys it granted",
            )
        )
    else:
        checks.append(Check("role", OK, "master"))
    policy = facts.maxmemory_policy
    limit = f" (maxmemory {facts.maxmemory} bytes)" if facts.maxmemory else " (maxmemory unset)"
    if policy == "noeviction":
        checks.append(Check("maxmemory-policy", OK, "noeviction"))
    elif policy and policy.startswith("volatile-"):
        checks.append(
            Check(
                "maxmemory-policy",
                ERROR,
                f"{policy}{limit}: evicts keys that have a TTL, which is every lock key; "
                "set maxmemory-policy noeviction",
            )
        )
    else:
        checks.append(
            Check(
                "maxmemory-policy",
                ERROR,
                f"{policy}{limit}: may evict any key, lock keys included; "
                "set maxmemory-policy noeviction",
            )
        )
    checks.append(_persistence_check(facts, config))
    offset = facts.clock_offset or 0.0
    if abs(offset) > CLOCK_OFFSET_WARNING:
        checks.append(
            Check(
                "clock",
                WARNING,
                f"Redis TIME is {offset:+.3f} s from this host's clock: Redlock only needs "
                "clocks to run at the same rate, but an offset this large hints at a clock "
                "that gets stepped (a step makes TTLs expire early or late)",
            )
        )
    else:
        checks.append(Check("clock", OK, f"offset {offset * 1000:+.1f} ms from this host"))
    partial = "" if facts.scan_complete else " (scan stopped at the time budget)"
    if facts.keys_without_ttl_count:
        shown = ", ".join(facts.keys_without_ttl)
        more = facts.keys_without_ttl_count - len(facts.keys_without_ttl)
        checks.append(
            Check(
                "lock-keys",
                ERROR,
                f"{facts.keys_without_ttl_count} key(s) under '{config.key_prefix}:' without "
                f"a TTL, never freed: {shown}"
                + (f" and {more} more" if more > 0 else "")
                + partial,
                advice="Remove them with: celery -A proj redlock release KEY --force",
            )
        )
    else:
        status = OK if facts.scan_complete else WARNING
        checks.append(
            Check(
                "lock-keys",
                status,
                f"{facts.lock_keys} lock key(s) under '{config.key_prefix}:', all with a TTL"
                + partial,
            )
        )
    return checks


def _persistence_check(facts: NodeFacts, config: AppConfig) -> Check:
    hint = f" (redlock_ttl is {config.task_defaults.ttl:g} s; tasks may set more)"
    advice = REDIS_IO_ADVICE.format(ttl_hint=hint)
    if facts.appendonly and facts.appendfsync == "always":
        return Check("persistence", OK, "appendonly yes, appendfsync always")
    if not facts.appendonly:
        message = "appendonly no: a crashed node restarts without its lock keys"
    elif facts.appendfsync is None:
        message = f"appendonly yes, appendfsync unknown ({facts.appendfsync_error})"
    else:
        message = (
            f"appendonly yes, appendfsync {facts.appendfsync}: a crash can lose the "
            "lock keys of the last writes"
        )
    return Check("persistence", WARNING, message + " (see Notes: delayed restarts)", advice)


def judge_cluster(facts: list[NodeFacts], config: AppConfig) -> list[Check]:
    """Checks across nodes: node count, distinct servers, reachable quorum."""
    count = len(facts)
    need = quorum(count)
    checks = []
    if count == 1:
        checks.append(
            Check(
                "node-count",
                WARNING,
                "1 node: no fault tolerance (a crash loses every lock); use 3 or 5 "
                "independent masters",
            )
        )
    elif count % 2 == 0:
        checks.append(
            Check(
                "node-count",
                WARNING,
                f"{count} nodes: an even number tolerates no more failures than "
                f"{count - 1} ({count - need} down); prefer an odd number",
            )
        )
    else:
        checks.append(
            Check("node-count", OK, f"{count} nodes, quorum {need}, tolerates {count - need} down")
        )
    by_run_id: dict[str, list[str]] = defaultdict(list)
    for node in facts:
        if node.run_id:
            by_run_id[node.run_id].append(node.address)
    duplicates = [addresses for addresses in by_run_id.values() if len(addresses) > 1]
    for addresses in duplicates:
        checks.append(
            Check(
                "distinct-servers",
                ERROR,
                f"{' and '.join(addresses)} are the same server (same run_id): it would "
                "vote more than once in every quorum",
            )
        )
    if not duplicates:
        checks.append(Check("distinct-servers", OK, f"{len(by_run_id)} distinct servers answered"))
    seen: set[str] = set()
    usable = 0
    for node in facts:
        if not node.reachable or node.role != "master":
            continue
        if node.run_id:
            if node.run_id in seen:
                continue
            seen.add(node.run_id)
        usable += 1
    reachable = sum(1 for n in facts if n.reachable)
    detail = f"{usable} of {count} nodes usable (reachable, master, distinct), quorum {need}"
    if reachable < count or usable < reachable:
        detail += f"; {reachable} reachable"
    restricted = sum(1 for n in facts if n.restricted)
    if usable < need and restricted:
        checks.append(
            Check(
                "quorum",
                ERROR,
                f"{detail}; {restricted} answered but could not be inspected by this user: "
                "the quorum cannot be confirmed",
            )
        )
    elif usable < need:
        checks.append(Check("quorum", ERROR, detail + ": no lock can be taken"))
    else:
        checks.append(Check("quorum", OK, detail))
    return checks


def run_doctor(config: AppConfig, timeout: float) -> dict[str, Any]:
    """Every check, as the JSON document ``doctor --json`` prints."""
    nodes = _nodes(config.redlock(timeout, False))
    results = on_each_node(
        nodes, lambda node: inspect_node(node, config.key_prefix, timeout), timeout
    )
    facts = []
    for node, result in zip(nodes, results):
        if isinstance(result, BaseException):
            down = NodeFacts(node.address, error=_error_text(result))
            if isinstance(result, redis.exceptions.NoPermissionError):
                # It answered: only this user may not inspect it (a lock-only ACL user).
                down.restricted = True
                message = (
                    f"reachable, but this user may not inspect it ({down.error}); run doctor "
                    "as a user allowed PING, INFO, CONFIG GET, TIME, SCAN and PTTL"
                )
            else:
                message = f"unreachable: {down.error}"
            down.checks = [Check("reachable", ERROR, message)]
            facts.append(down)
            continue
        result.checks = [Check("reachable", OK, f"yes, run_id {str(result.run_id)[:8]}")]
        result.checks += judge_node(result, config)
        facts.append(result)
    cluster = judge_cluster(facts, config)
    every = [c for f in facts for c in f.checks] + cluster
    counts = Counter(c.status for c in every)
    return {
        "status": _worst(every),
        "key_prefix": config.key_prefix,
        "quorum": quorum(len(nodes)),
        "nodes": [f.as_dict() for f in facts],
        "checks": [c.as_dict() for c in cluster],
        "summary": {status: counts.get(status, 0) for status in (OK, WARNING, ERROR)},
    }


@redlock.command(cls=CeleryCommand)
@_timeout_option
@_json_option
@click.pass_context
def doctor(ctx: click.Context, timeout: float, as_json: bool) -> None:
    """Check the lock nodes for settings that break Redlock's safety.

    Per node: reachable, round trip, Redis version, role (a replica is an ERROR),
    maxmemory-policy (anything but noeviction is an ERROR), persistence (a WARNING
    unless appendfsync always: use delayed restarts), clock offset, lock keys
    without a TTL (ERROR). Across nodes: the same server listed twice (ERROR),
    fewer than a quorum usable (ERROR). Exits 1 on any ERROR, else 0.
    """
    try:
        document = run_doctor(app_config(ctx.obj.app), timeout)
    except ConfigurationError as exc:
        check = Check("configuration", ERROR, str(exc))
        document = {
            "status": ERROR,
            "key_prefix": None,
            "quorum": None,
            "nodes": [],
            "checks": [check.as_dict()],
            "summary": {OK: 0, WARNING: 0, ERROR: 1},
        }
    if as_json:
        _print_json(ctx, document)
    else:
        _print_doctor(ctx, document)
    if document["status"] == ERROR:
        ctx.exit(1)


def _print_doctor(ctx: click.Context, document: dict[str, Any]) -> None:
    echo = ctx.obj.echo
    nodes = document["nodes"]
    if document["key_prefix"] is not None:
        echo(
            f"redlock doctor: {len(nodes)} nodes, quorum {document['quorum']}, "
            f"key prefix {document['key_prefix']!r}"
        )
        echo("")
    groups = [(n["node"], n["checks"]) for n in nodes] + [("all nodes", document["checks"])]
    rows = []
    for name, checks in groups:
        for i, check in enumerate(checks):
            rows.append([name if i == 0 else "", check["check"], check["status"], check["message"]])
    width = max(len(s) for s in (OK, WARNING, ERROR))
    node_width = max([len("NODE")] + [len(r[0]) for r in rows])
    check_width = max([len("CHECK")] + [len(r[1]) for r in rows])
    echo(
        f"{'NODE'.ljust(node_width)}  {'CHECK'.ljust(check_width)}  {'STATUS'.ljust(width)}  DETAIL"
    )
    for node, name, status, message in rows:
        styled = _styled(ctx, status, width)
        echo(f"{node.ljust(node_width)}  {name.ljust(check_width)}  {styled}  {message}")
    advice = []
    for _, checks in groups:
        for check in checks:
            if check["advice"] and f"{check['check']}: {check['advice']}" not in advice:
                advice.append(f"{check['check']}: {check['advice']}")
    if advice:
        echo("")
        echo("Notes:")
        for note in advice:
            echo(f"  {note}")
    summary = document["summary"]
    echo("")
    echo(
        f"{summary[ERROR]} error(s), {summary[WARNING]} warning(s), {summary[OK]} OK"
        f" -> {document['status']}"
    )
