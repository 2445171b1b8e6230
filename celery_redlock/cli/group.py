"""The four commands: read the options, call the library (holders.py, release.py,
doctor.py), print JSON or text (printing.py), and choose the exit code.

Imports click and every module of this package except ``__init__`` (which imports
this one to build the ``redlock`` group).
"""

from __future__ import annotations

from typing import Optional

import click
from celery.bin.base import CeleryCommand, CeleryOption

from ..errors import ConfigurationError
from ..lock.redlock import FENCE
from ..tasks.config import app_config
from .base import json_option, load_config, open_redlock, timeout_option
from .checks import ERROR
from .common import configured_nodes, full_key
from .doctor import configuration_error_document, run_doctor
from .holders import holder_document, list_locks
from .printing import print_doctor, print_json, print_ls, print_release, print_show
from .release import DELETED, release_on_each_node


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
    """List the locks under the key prefix: holder, TTL per node, quorum agreement."""
    config = load_config(ctx)
    listing = list_locks(open_redlock(config, timeout), config.key_prefix, pattern, limit, timeout)
    if as_json:
        document = {
            "prefix": config.key_prefix,
            "pattern": pattern,
            "quorum": listing.quorum,
            "nodes": [n.address for n in listing.nodes],
            "keys": [holder_document(info) for info in listing.holders],
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
    """
    config = load_config(ctx)
    lock = open_redlock(config, timeout)
    info = lock.holder(full_key(key, config.key_prefix))
    document = holder_document(info)
    if as_json:
        print_json(ctx, document)
    else:
        print_show(ctx, info, document)
    if all(n.error is not None for n in info.nodes):
        ctx.exit(1)


def _check_release_options(
    ctx: click.Context, token: Optional[str], force: bool, yes: bool
) -> None:
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


@click.command(name="release", cls=CeleryCommand)
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
@timeout_option
@json_option
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
    _check_release_options(ctx, token, force, yes)
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
@timeout_option
@json_option
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
        document = configuration_error_document(str(exc))
    if as_json:
        print_json(ctx, document)
    else:
        print_doctor(ctx, document)
    if document["status"] == ERROR:
        ctx.exit(1)
