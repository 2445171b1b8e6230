"""The text the commands print: tables for ``ls``, ``show``, ``release`` and the
``doctor`` report, from the results the libraries return (``--json`` prints those
results as they are).

Only rendering: echo through Celery's context object (``ctx.obj``), no Redis.
Imports click (types) and the result types of holders.py, release.py and checks.py.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Optional

import click

from ..lock.redlock import HolderInfo, NodeHolding
from ..lock.stored import LIMIT
from .checks import ERROR, OK, WARNING
from .common import error_text
from .holders import holder_document
from .listing import Listing
from .permits import Permits
from .release import ABSENT, DELETED, FAILED, OTHER_HOLDER, NodeRelease, PermitsDeletion

_COLOURS = {OK: "green", WARNING: "yellow", ERROR: "red"}
#: Characters of a token shown in tables (``show`` prints it whole).
TOKEN_SHOWN = 8


def print_json(ctx: click.Context, document: object) -> None:
    ctx.obj.echo(json.dumps(document, indent=2))


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Columns padded to their widest cell; the last column is left ragged."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row[:-1]):
            widths[i] = max(widths[i], len(cell))
    lines = []
    for row in [list(headers), *rows]:
        cells = [cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    return lines


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


# -- ls and show -----------------------------------------------------------------------------


def print_ls(ctx: click.Context, listing: Listing, limit: int) -> None:
    nodes = listing.nodes
    if not listing.entries:
        ctx.obj.echo(f"no lock keys match {listing.match!r} on {len(nodes)} nodes")
    if listing.holders:
        rows = []
        for info in listing.holders:
            doc = holder_document(info)
            pid = f" (pid {doc['pid']})" if doc["pid"] else ""
            verdict = "yes" if doc["quorum_agrees"] else "NO"
            rows.append(
                [
                    info.key,
                    doc["task_id"] or "-",
                    (doc["worker"] or "-") + pid,
                    f"{verdict} {doc['agreeing_nodes']}/{len(info.nodes)}",
                    " ".join(_ttl_cell(n) for n in info.nodes),
                ]
            )
        headers = ["KEY", "TASK", "WORKER", "QUORUM", "TTL s per node"]
        for line in _table(headers, rows):
            ctx.obj.echo(line)
    if listing.permits:
        if listing.holders:
            ctx.obj.echo("")
        rows = [[p.key, p.summary()] for p in listing.permits]
        for line in _table(["KEY", "PERMITS (held by a quorum)"], rows):
            ctx.obj.echo(line)
    if listing.entries:
        counts = []
        if listing.holders:
            counts.append(f"{len(listing.holders)} keys")
        if listing.permits:
            counts.append(f"{len(listing.permits)} limits and rates")
        counted = ", ".join(counts)
        ctx.obj.echo(
            f"{counted}; nodes in TTL order: "
            f"{', '.join(n.address for n in nodes)}; quorum {listing.quorum} of {len(nodes)}"
        )
    if listing.more:
        ctx.obj.echo(f"... {listing.more} more keys not shown (--limit {limit})")
    for address, text in listing.errors.items():
        ctx.obj.error(ctx.obj.style(f"{address}: could not list keys: {text}", fg="red"))


def _holder_text(document: dict[str, Any]) -> str:
    parts = [
        f"task {document['task_id']}" if document["task_id"] else None,
        f"worker {document['worker']}" if document["worker"] else None,
        f"pid {document['pid']}" if document["pid"] else None,
    ]
    details = ", ".join(p for p in parts if p)
    return (document["holder"] or "?") + (f" ({details})" if details else "")


def _node_row(n: NodeHolding) -> list[str]:
    """NODE, HOLDER, TOKEN, TTL, ERROR of one node's holding."""
    return [
        n.node,
        n.holder or "-",
        _token_cell(n.token),
        _ttl_cell(n) if n.ttl is None else f"{n.ttl:.3f} s",
        "-" if n.error is None else error_text(n.error),
    ]


def print_show(
    ctx: click.Context, info: HolderInfo, document: dict[str, Any], permits: Sequence[Permits] = ()
) -> None:
    echo = ctx.obj.echo
    echo(f"key       {info.key}")
    if document["token"] is None and permits:
        for each in permits:
            _print_permits(ctx, each)
        return
    if document["token"] is None:
        echo("holder    nobody (no node holds this key)")
    else:
        echo(f"holder    {_holder_text(document)}")
        state = "held" if document["quorum_agrees"] else "NOT held by a quorum"
        frees = f"; frees in {info.ttl:.1f} s" if info.ttl is not None else ""
        echo(
            f"quorum    {state}: {document['agreeing_nodes']} of {len(info.nodes)} nodes "
            f"agree, {info.quorum} needed{frees}"
        )
        echo(f"token     {document['token']}")
        echo(f"release   redlock release {info.key} --token={document['token']}")
    echo("")
    rows = [_node_row(n) for n in info.nodes]
    for line in _table(["NODE", "HOLDER", "TOKEN", "TTL", "ERROR"], rows):
        echo(line)
    for each in permits:
        echo("")
        _print_permits(ctx, each)


def print_queued_and_cooldown(ctx: click.Context, document: dict[str, Any]) -> None:
    """``show``'s last lines: the copy queued for the key, and its cooldown."""
    echo = ctx.obj.echo
    queued, cooling = document["queued"], document["cooldown"]
    if queued is not None:
        state = "" if queued["quorum_agrees"] else " (NOT held by a quorum)"
        echo(f"\nqueued    {queued['holder']}{state} (queue once: the copy waiting to run)")
    if cooling is not None:
        echo(f"\ncooldown  {cooling['summary']}")


def _print_permits(ctx: click.Context, permits: Permits) -> None:
    """A key's limit or rate: the terms, each slot a quorum holds, then every slot
    node by node."""
    echo = ctx.obj.echo
    recorded = f"recorded on {permits.recorded_on} of {len(permits.records)} nodes"
    if permits.record is None:
        recorded = "no node records the terms"
    held = permits.held
    if permits.kind == LIMIT:
        count = f"{len(held)} held by a quorum"
    else:
        count = f"{len(held)} starts in the window"
        if permits.next_frees is not None:
            count += f", next frees in {permits.next_frees:.1f} s"
    echo(f"{permits.kind:<9} {permits.terms_text()} ({recorded}): {count}")
    for slot, info in permits.slots:
        document = holder_document(info)
        label = f"slot {slot}"
        if info.holder is None:
            agree = f"{document['agreeing_nodes']} of {len(info.nodes)} nodes agree"
            echo(f"{label:<9} NOT held by a quorum: {agree}, {info.quorum} needed")
            continue
        frees = f"; frees in {info.ttl:.1f} s" if info.ttl is not None else ""
        echo(
            f"{label:<9} {_holder_text(document)}: {document['agreeing_nodes']} of "
            f"{len(info.nodes)} nodes agree{frees}"
        )
        if permits.kind == LIMIT:
            echo(f"{'':<9} release: redlock release {permits.key} --token={document['token']}")
    echo("")
    # The terms record's text sits where a slot's holder does (it has no token).
    records = [NodeHolding(r.node, None, r.token, r.ttl, r.error) for r in permits.records]
    rows = [["terms", *_node_row(r)] for r in records]
    for slot, info in permits.slots:
        rows.extend([str(slot), *_node_row(n)] for n in info.nodes)
    for line in _table([permits.kind.upper(), "NODE", "HOLDER", "TOKEN", "TTL", "ERROR"], rows):
        echo(line)


# -- release ---------------------------------------------------------------------------------


def _release_detail(r: NodeRelease) -> str:
    if r.result == DELETED and r.permit is not None:
        return f"deleted limit permit {r.permit} (held by {r.holder or '?'})"
    if r.result == DELETED:
        return f"deleted (held by {r.holder or '?'})"
    if r.result == ABSENT:
        return "no such key"
    if r.result == OTHER_HOLDER:
        return f"left alone: held with another token ({_token_cell(r.token)}, {r.holder})"
    return f"error: {r.error}"


def print_release(ctx: click.Context, key: str, outcome: list[NodeRelease], need: int) -> None:
    for line in _table(["NODE", "RESULT"], [[r.node, _release_detail(r)] for r in outcome]):
        ctx.obj.echo(line)
    deleted = sum(1 for r in outcome if r.result == DELETED)
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


def _deletion_detail(d: PermitsDeletion) -> str:
    if d.result == FAILED:
        return f"error: {d.error}"
    if d.result == ABSENT:
        return "no permits"
    parts = []
    if d.slots.get(LIMIT):
        held = f" (held by {', '.join(d.holders)})" if d.holders else ""
        parts.append(f"{d.slots[LIMIT]} limit slot(s){held}")
    for kind, count in d.slots.items():
        if kind != LIMIT and count:
            parts.append(f"{count} {kind} slot(s)")
    if d.records:
        parts.append(f"{d.records} terms record(s)")
    return "deleted " + ", ".join(parts)


def print_permits_deletion(
    ctx: click.Context, key: str, outcome: Sequence[PermitsDeletion]
) -> None:
    rows = [[d.node, _deletion_detail(d)] for d in outcome]
    for line in _table(["NODE", "RESULT"], rows):
        ctx.obj.echo(line)
    deleted = sum(1 for d in outcome if d.result == DELETED)
    if deleted == 0:
        ctx.obj.error(ctx.obj.style(f"{key}: no permits deleted on any node", fg="red"))
    elif any(d.result == FAILED for d in outcome):
        ctx.obj.echo(
            f"{key}: permits deleted on {deleted} of {len(outcome)} nodes; a node that "
            "did not answer keeps its slots until they expire"
        )
    else:
        ctx.obj.echo(f"{key}: permits deleted on {deleted} of {len(outcome)} nodes")


# -- doctor ----------------------------------------------------------------------------------


def _styled(ctx: click.Context, status: str, width: int = 0) -> str:
    text: str = ctx.obj.style(status.ljust(width), fg=_COLOURS.get(status), bold=status != OK)
    return text


def _notes(groups: Sequence[tuple[str, list[dict[str, Any]]]]) -> list[str]:
    """Each distinct advice once, in the order the checks came."""
    advice = []
    for _, checks in groups:
        for check in checks:
            note = f"{check['check']}: {check['advice']}"
            if check["advice"] and note not in advice:
                advice.append(note)
    return advice


def print_doctor(ctx: click.Context, document: dict[str, Any]) -> None:
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
    notes = _notes(groups)
    if notes:
        echo("")
        echo("Notes:")
        for note in notes:
            echo(f"  {note}")
    summary = document["summary"]
    echo("")
    echo(
        f"{summary[ERROR]} error(s), {summary[WARNING]} warning(s), {summary[OK]} OK"
        f" -> {document['status']}"
    )
