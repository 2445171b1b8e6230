"""Storage-side fencing: the store refuses a writer whose lease was superseded.

A lease is exclusive only for its validity. A holder that pauses past it (GC, swap,
SIGSTOP) wakes up believing it still holds the lock::

    t0  A acquires K, fence 41          A: write(x, fence=41)  -> accepted
    t1  A pauses; its lease runs out
    t2  B acquires K, fence 42          B: write(y, fence=42)  -> accepted
    t3  A resumes                       A: write(z, fence=41)  -> REFUSED

Only the storage can stop A's last write, so it remembers the highest fence that
wrote and refuses lower ones. Equal fences are accepted: one holder writes many times.

Redis::

    from celery_redlock.fencing import fenced_set
    if not fenced_set(client, "report:latest", data, self.redlock.fence):
        raise LockLost(...)   # superseded: stop

SQL (any database; the row keeps the highest fence that wrote it)::

    UPDATE reports SET body = :body, last_fence = :fence
     WHERE id = :id AND last_fence <= :fence
    -- rowcount 0: a later holder wrote first; this writer is stale

``sql_fenced_update`` runs exactly that through a sqlite3 connection (other drivers:
the same statement with their placeholder style).

Imports scripts.py only; the client is the caller's redis-py client.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Union

from .errors import ConfigurationError
from .lock.scripts import FENCED_SET

__all__ = ["fence_key", "fenced_set", "sql_fenced_update"]

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def fence_key(key: str) -> str:
    """Where ``fenced_set`` keeps the highest fence that wrote ``key``."""
    return f"{key}:written-by-fence"


def _check_fence(fence: object) -> int:
    if isinstance(fence, bool) or not isinstance(fence, int):
        raise ConfigurationError(
            f"fence must be an int (lease.fence of a lock taken with fencing=True), got {fence!r}"
        )
    return fence


def fenced_set(client: Any, key: str, value: Union[bytes, str, int, float], fence: int) -> bool:
    """Set ``key`` to ``value`` unless a writer with a higher fence got there first.

    True when written; False when refused (the caller's lease was superseded).
    Atomic on the node (one Lua script).
    """
    fence = _check_fence(fence)
    return bool(client.eval(FENCED_SET.source, 2, key, fence_key(key), value, fence))


def sql_fenced_update(
    connection: Any,
    table: str,
    values: Mapping[str, Any],
    where: Mapping[str, Any],
    fence: int,
    fence_column: str = "last_fence",
) -> bool:
    """``UPDATE table SET values..., fence_column = fence WHERE where... AND
    fence_column <= fence`` on a sqlite3 connection (``:name`` placeholders); True
    when a row was written, False when the row's fence is higher (a later holder
    wrote: this writer is stale). Commits.

    Table and column names must be plain identifiers (they cannot be bound).
    """
    fence = _check_fence(fence)
    for name in (table, fence_column, *values, *where):
        if not _IDENTIFIER.match(name):
            raise ConfigurationError(f"sql_fenced_update: {name!r} is not a plain SQL identifier")
    if not values or not where:
        raise ConfigurationError("sql_fenced_update needs at least one value and one where column")
    sets = ", ".join(f"{column} = :set_{column}" for column in values)
    conditions = " AND ".join(f"{column} = :where_{column}" for column in where)
    statement = (
        f"UPDATE {table} SET {sets}, {fence_column} = :fence "
        f"WHERE {conditions} AND {fence_column} <= :fence"
    )
    params = {f"set_{k}": v for k, v in values.items()}
    params.update({f"where_{k}": v for k, v in where.items()})
    params["fence"] = fence
    cursor = connection.cursor()
    cursor.execute(statement, params)
    connection.commit()
    return bool(cursor.rowcount)
