"""``python -m bench NAME [options]``: the names and what they measure are in bench/__init__.py."""

from __future__ import annotations

import sys

USAGE = (
    "usage: python -m bench"
    " {locks,async,cluster,limits,profile,renewals,scale,tasks,wake} [options]"
    "   (-h after the name for options)"
)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name == "locks":
        from .locks import main as run_locks

        return run_locks(rest)
    if name == "async":
        from .async_locks import main as run_async

        return run_async(rest)
    if name == "cluster":
        from .cluster import main as run_cluster

        return run_cluster(rest)
    if name == "limits":
        from .limits import main as run_limits

        return run_limits(rest)
    if name == "profile":
        from .profile import main as run_profile

        return run_profile(rest)
    if name == "renewals":
        from .renewals import main as run_renewals

        return run_renewals(rest)
    if name == "scale":
        from .scale import main as run_scale

        return run_scale(rest)
    if name == "tasks":
        from .tasks import main as run_tasks

        return run_tasks(rest)
    if name == "wake":
        from .wake import main as run_wake

        return run_wake(rest)
    print(f"unknown benchmark {name!r}\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
