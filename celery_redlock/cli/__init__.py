"""``celery -A proj redlock ...``: the operators' view of the lock nodes and the locks.

Celery finds the ``redlock`` click group through the ``celery.commands`` entry point;
every command reads the app's ``redlock_*`` settings (config.py)::

    celery -A proj redlock doctor [--json] [--textfile PATH] [--timeout S]
    celery -A proj redlock ls [--pattern GLOB] [--limit N] [--json] [--timeout S]
    celery -A proj redlock show KEY [--json] [--timeout S]
    celery -A proj redlock release KEY --token TOKEN [--json] [--timeout S]
    celery -A proj redlock release KEY --force [--yes] [--json] [--timeout S]
    celery -A proj redlock release KEY --force --all-permits [--yes] [--json] [--timeout S]

KEY is a full key (``redlock:import:42``) or one relative to the prefix (``import:42``).
A key with a limit or a rate (lock/permits.py) is listed once per kind with how many
of its permits a quorum holds; ``show`` prints its slots node by node; ``release
--token`` releases one holder's limit permit, ``--force --all-permits`` all of them.

``doctor`` checks what breaks Redlock's safety on the nodes themselves: a replica
used as a master, the same server listed twice, an eviction policy that may drop
lock keys, persistence that loses them in a crash (redis.io: fsync=always, or keep a
crashed node down for longer than the largest TTL), stepped clocks, lock keys
without a TTL, whether a quorum is reachable at all, and what limits and rates cost
(a permit needs a majority on one slot; a rate's period lengthens the delayed restart).

Exit codes: 0 when all is well (doctor: only OK and WARNING); 1 when doctor found an
ERROR, release removed nothing, or no node answered; 2 for usage errors; 78
(EX_CONFIG) when the ``redlock_*`` settings are invalid.

Each node is inspected through a plain redis-py client (``Node.client()``), one
thread per node under one shared deadline, so a hung node costs ``--timeout`` once,
not once per node, key or command. ``show`` reads with ``Redlock.holder`` (one
round), then the key's permits on the nodes that answered it; ``release`` runs the
RELEASE compare-and-delete script on every node (RELEASE_PERMIT for a limit permit),
or a plain DEL with ``--force``. Fence counters (``<key>\\0fence``) are never listed as
locks nor deleted: fence numbers must never go backwards.

The package, one room per concern (each module's docstring says what it may import):

- ``__init__``: the ``redlock`` group; re-exports the names below.
- ``group``: the four click commands (options in, library call, print, exit code).
- ``base``: the shared options (``--json``, ``--timeout``) and settings loading.
- ``printing``: the text tables and the doctor report.
- ``listing`` (ls), ``holders`` (show), ``permits`` (a key's limit or rate, for
  both) and ``release``: the libraries of the lock commands.
- ``doctor`` (``run_doctor``), ``facts`` (``inspect_node``), ``checks`` (``check_*``):
  doctor as a library, usable without click; ``textfile``: its verdicts as
  Prometheus gauges (``doctor --textfile``).
- ``common``: all nodes at once under one deadline; keys and stored values.
"""

from __future__ import annotations

import click

from .base import DEFAULT_TIMEOUT, EX_CONFIG
from .checks import ERROR, OK, WARNING, Check
from .common import full_key, on_each_node
from .doctor import judge_cluster, judge_node, run_doctor
from .facts import NodeFacts, inspect_node
from .group import doctor, ls, release, show
from .holders import Holder, read_holders, read_holdings
from .release import NodeRelease, force_release, release_with_token

__all__ = [
    "DEFAULT_TIMEOUT",
    "ERROR",
    "EX_CONFIG",
    "OK",
    "WARNING",
    "Check",
    "Holder",
    "NodeFacts",
    "NodeRelease",
    "force_release",
    "full_key",
    "inspect_node",
    "judge_cluster",
    "judge_node",
    "on_each_node",
    "read_holders",
    "read_holdings",
    "redlock",
    "release_with_token",
    "run_doctor",
]


@click.group(name="redlock")
def redlock() -> None:
    """Inspect the Redlock nodes and locks of this app (celery-redlock).

    doctor checks node settings that break lock safety; ls and show say who holds
    which lock; release removes one (token-checked, or forced).
    """


for _command in (doctor, ls, show, release):
    redlock.add_command(_command)
