"""The four commands: read the options, call the library (listing.py, holders.py,
permits.py, release.py, doctor.py), print JSON or text (printing.py), and choose the
exit code.

Imports click and every module of this package except ``__init__`` (which imports
this one to build the ``redlock`` group).
"""

from __future__ import annotations

from typing import Optional

import click
from celery.bin.base import CeleryCommand, CeleryOption

from ..errors import ConfigurationError
from ..lock.redlock import FENCE, Redlock
from ..lock.stored import LIMIT
from ..tasks.config import app_config
from .base import json_option, load_config, open_redlock, timeout_option
from .checks import ERROR
from .common import configured_nodes, full_key
from .doctor import configuration_error_document, run_doctor
from .holders import holder_document
from .listing import list_locks
from .permits import Permits, permits_document, read_key, read_queued_and_cooldown
from .printing import (
    print_doctor,
    print_json,
    print_ls,
    print_permits_deletion,
    print_queued_and_cooldown,
    print_release,
    print_show,
)
from .release import DELETED, delete_permits_on_each_node, release_on_each_node
from .textfile import write_textfile


@click.command(name="ls", cls=CeleryCommand)
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
@timeout_option
@json_option
@click.pass_context
def ls(ctx: click.Context, pattern: str, limit: int, timeout: float, as_json: bool) -> None:
    """List the locks under the key prefix: holder, TTL per node, quorum agreement.

    A key with a limit or a rate is listed once per kind, not slot by slot: how many
    of its permits a quorum holds, and by whom (a limit) or when the next frees (a
    rate's starts in the window).
    """
    config = load_config(ctx)
    listing = list_locks(open_redlock(config, timeout), config.key_prefix, pattern, limit, timeout)
    if as_json:
        document = {
            "prefix": config.key_prefix,
            "pattern": pattern,
            "quorum": listing.quorum,
            "nodes": [n.address for n in listing.nodes],
            "keys": [holder_document(info) for info in listing.holders],
            "permits": [permits_document(p) for p in listing.permits],
            "truncated": listing.more > 0,
            "errors": listing.errors,
        }
        print_json(ctx, document)
    else:
        print_ls(ctx, listing, limit)
    if len(listing.errors) == len(listing.nodes):
        ctx.exit(1)


@click.command(name="show", cls=CeleryCommand)
@click.argument("key")
@timeout_option
@json_option
@click.pass_context
def show(ctx: click.Context, key: str, timeout: float, as_json: bool) -> None:
    """Who holds KEY, node by node.

    KEY is a full key ('redlock:import:42') or one relative to the prefix ('import:42').
    A key with a limit or a rate: the terms each node records, which permits a quorum
    holds, and every slot node by node. Then the copy queued for KEY (queue once)
    and its cooldown (redlock_cooldown), when there are.
    """
    config = load_config(ctx)
    lock = open_redlock(config, timeout)
    info, permits = read_key(lock, full_key(key, config.key_prefix), timeout)
    document = holder_document(info)
    document["permits"] = [permits_document(p, per_node=True) for p in permits]
    queued, cooling = read_queued_and_cooldown(lock, config.key_prefix, info, timeout)
    document["queued"] = holder_document(queued) if queued.holder else None
    document["cooldown"] = permits_document(cooling) if cooling else None
    if as_json:
        print_json(ctx, document)
    else:
        print_show(ctx, info, document, permits)
        print_queued_and_cooldown(ctx, document)
    if all(n.error is not None for n in info.nodes):
        ctx.exit(1)


def _check_release_options(
    ctx: click.Context, token: Optional[str], force: bool, all_permits: bool, yes: bool
) -> None:
    if all_permits and not force:
        raise click.UsageError(
            "--all-permits deletes every holder's permit: give it with --force", ctx=ctx
        )
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


def _permits_now(permits: list[Permits]) -> str:
    return "; ".join(p.summary() for p in permits) or "none, as far as the nodes answered"


def _permits_lost(permits: list[Permits]) -> str:
    """What deleting every permit of a key gives away, kind by kind."""
    lost = []
    for each in permits:
        count = "as many as the terms allow" if each.count is None else f"up to {each.count}"
        if each.kind == LIMIT:
            lost.append(f"{count} new holders may start beside the ones still running")
        else:
            lost.append(f"the rate's window starts empty ({count} starts at once)")
    return "; ".join(lost) or "nothing changes: no node that answered holds any"


def _confirm_force(
    ctx: click.Context, lock: Redlock, name: str, all_permits: bool, yes: bool, timeout: float
) -> None:
    """Read who holds ``name`` and its permits; refuse a forced release of a key that
    holds no lock but permits (unless ``all_permits``); then ask, unless ``yes``."""
    info, permits = read_key(lock, name, timeout)
    nodes = len(info.nodes)
    if permits and not all_permits and not any(n.token for n in info.nodes):
        raise click.UsageError(
            f"{name} holds no lock but permits ({_permits_now(permits)}): --force alone "
            "deletes a lock. Release one holder's permit with --token TOKEN (see "
            f"'redlock show {name}'), or every permit with --force --all-permits",
            ctx=ctx,
        )
    if yes:
        return
    if all_permits:
        click.confirm(
            f"Delete every permit of {name} on {nodes} nodes, whoever holds them (now: "
            f"{_permits_now(permits)}), and the terms the nodes record?\n"
            f"Then {_permits_lost(permits)}.",
            abort=True,
            err=True,
        )
        return
    holders = sorted({n.holder or n.token or "?" for n in info.nodes if n.token})
    who = ", ".join(holders) if holders else "nobody, as far as the nodes answered"
    click.confirm(
        f"Delete lock {name} on {nodes} nodes, whoever holds it (now: {who})?\n"
        "A task still running under it loses mutual exclusion.",
        abort=True,
        err=True,
    )


@click.command(name="release", cls=CeleryCommand)
@click.argument("key")
@click.option(
    "--token",
    cls=CeleryOption,
    metavar="TOKEN",
    help_group="Release Options",
    help="Delete the lock, or the limit permit, only where it holds this token (as "
    "shown by 'show').",
)
@click.option(
    "--force",
    cls=CeleryOption,
    is_flag=True,
    help_group="Release Options",
    help="Delete the lock whoever holds it (asks first).",
)
@click.option(
    "--all-permits",
    "all_permits",
    cls=CeleryOption,
    is_flag=True,
    help_group="Release Options",
    help="With --force: delete every permit of a limited or rated KEY and the terms "
    "the nodes record, whoever holds them (asks first).",
)
@click.option(
    "-y",
    "--yes",
    cls=CeleryOption,
    is_flag=True,
    help_group="Release Options",
    help="Do not ask before --force.",
)
@timeout_option
@json_option
@click.pass_context
def release(
    ctx: click.Context,
    key: str,
    token: Optional[str],
    force: bool,
    all_permits: bool,
    yes: bool,
    timeout: float,
    as_json: bool,
) -> None:
    """Release KEY on every node: only where it holds --token TOKEN, or --force.

    A forced release ends mutual exclusion for a task that may still be running
    under the lock: use it for a holder that is known dead and a TTL too long to wait.

    A key with a limit (redlock_limit, acquire(limit=N)) holds no lock itself but N
    permits: --token TOKEN releases the one that holder holds, as its own lease
    would. --force alone refuses such a key; --force --all-permits deletes every
    permit of KEY -- its limit's slots, its rate's starts in the window -- and the
    terms the nodes record, asking first unless --yes. Holders still running then
    lose their permit (up to N more may start beside them), the rate's window
    starts empty (up to R more starts at once), and callers may give the key new
    terms. A rate's start is never released by token: it leaves the window when its
    period has passed.

    Exits 1 when nothing was deleted.
    """
    _check_release_options(ctx, token, force, all_permits, yes)
    config = load_config(ctx)
    lock = open_redlock(config, timeout)
    name = full_key(key, config.key_prefix)
    if name.endswith(FENCE):
        raise click.BadParameter(
            f"{name} is a fence counter, not a lock: deleting it would let fence numbers "
            "go backwards",
            ctx=ctx,
            param_hint="'KEY'",
        )
    nodes = configured_nodes(lock)
    if force:
        _confirm_force(ctx, lock, name, all_permits, yes, timeout)
    if all_permits:
        deletions = delete_permits_on_each_node(nodes, name, timeout)
        deleted = sum(1 for d in deletions if d.result == DELETED)
        if as_json:
            document = {
                "key": name,
                "mode": "all-permits",
                "deleted": deleted,
                "nodes": [d.as_dict() for d in deletions],
            }
            print_json(ctx, document)
        else:
            print_permits_deletion(ctx, name, deletions)
        if deleted == 0:
            ctx.exit(1)
        return
    wanted = None if token is None else token.strip()
    outcome = release_on_each_node(nodes, name, wanted, timeout)
    deleted = sum(1 for r in outcome if r.result == DELETED)
    if as_json:
        document = {
            "key": name,
            "mode": "force" if force else "token",
            "deleted": deleted,
            "nodes": [r.as_dict() for r in outcome],
        }
        print_json(ctx, document)
    else:
        print_release(ctx, name, outcome, lock.quorum)
    if deleted == 0:
        ctx.exit(1)


@click.command(name="doctor", cls=CeleryCommand)
@click.option(
    "--textfile",
    cls=CeleryOption,
    metavar="PATH",
    type=click.Path(dir_okay=False, writable=True),
    help_group="Output Options",
    help="Also write the verdicts as Prometheus gauges to PATH (a *.prom file in "
    "node_exporter's textfile collector directory), replaced atomically.",
)
@timeout_option
@json_option
@click.pass_context
def doctor(ctx: click.Context, textfile: Optional[str], timeout: float, as_json: bool) -> None:
    """Check the lock nodes for settings that break Redlock's safety.

    Per node: reachable, round trip, server and version (Redis or Valkey), role (a
    replica is an ERROR), maxmemory-policy (anything but noeviction is an ERROR),
    persistence (a WARNING unless appendfsync always: use delayed restarts), clock
    offset, lock keys without a TTL (ERROR). Across nodes: the same server listed twice (ERROR),
    fewer than a quorum usable (ERROR), and what limits and rates cost: a permit
    needs a majority to give one slot (a WARNING with a node down: racing callers
    split more often), and a rate's period lengthens the delayed restart (a WARNING
    when it outlasts the lock TTL without appendfsync always). Exits 1 on any ERROR,
    else 0.

    With --textfile PATH the same verdicts are also written as Prometheus gauges, for
    node_exporter's textfile collector (run doctor from cron; docs/operations/alerts.md
    has the alert rules that read them).
    """
    try:
        document = run_doctor(app_config(ctx.obj.app), timeout)
    except ConfigurationError as exc:
        document = configuration_error_document(str(exc))
    if textfile is not None:
        try:
            write_textfile(document, textfile)
        except ImportError as exc:
            raise click.ClickException(str(exc)) from exc
    if as_json:
        print_json(ctx, document)
    else:
        print_doctor(ctx, document)
    if document["status"] == ERROR:
        ctx.exit(1)
