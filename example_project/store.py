"""The long job's storage: one SQLite row per job, written only with a fence.

Each row keeps ``last_fence``, the highest fence that wrote it, and
:func:`write_progress` goes through ``celery_redlock.fencing.sql_fenced_update``::

    UPDATE jobs SET progress = :progress, last_fence = :fence
     WHERE name = :name AND last_fence <= :fence

so a holder whose lease was superseded while it paused (its fence is lower than
the one that wrote last) is refused by the database itself, whatever it believes.

Several worker processes share the file; each opens its own connection.
"""

from __future__ import annotations

import os
import sqlite3
from typing import Optional

from celery_redlock.fencing import sql_fenced_update

__all__ = ["connect", "ensure_job", "read_job", "write_progress"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    name TEXT PRIMARY KEY,
    progress TEXT NOT NULL DEFAULT '',
    last_fence INTEGER NOT NULL DEFAULT 0
)
"""

_connection: Optional[tuple[int, str, sqlite3.Connection]] = None


def connect(path: str) -> sqlite3.Connection:
    """This process's connection to ``path`` (a forked child opens its own), with
    the table created."""
    global _connection
    if _connection is None or _connection[:2] != (os.getpid(), path):
        connection = sqlite3.connect(path, timeout=30.0)
        connection.execute(SCHEMA)
        connection.commit()
        _connection = (os.getpid(), path, connection)
    return _connection[2]


def ensure_job(connection: sqlite3.Connection, name: str) -> None:
    """Create the job's row (fence 0) unless it exists."""
    connection.execute("INSERT OR IGNORE INTO jobs (name) VALUES (?)", (name,))
    connection.commit()


def write_progress(connection: sqlite3.Connection, name: str, progress: str, fence: int) -> bool:
    """Record the job's progress unless a holder with a higher fence wrote it first.

    True: written. False: refused, this writer is stale and must stop.
    """
    return sql_fenced_update(connection, "jobs", {"progress": progress}, {"name": name}, fence)


def read_job(connection: sqlite3.Connection, name: str) -> Optional[tuple[str, int]]:
    """(progress, last_fence) of the job, or None."""
    row = connection.execute(
        "SELECT progress, last_fence FROM jobs WHERE name = ?", (name,)
    ).fetchone()
    return None if row is None else (str(row[0]), int(row[1]))
