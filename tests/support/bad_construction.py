"""Bad ``Redlock(...)`` arguments and what the error must say, for both drivers
(tests/lock/test_redlock.py, tests/lock/test_drivers.py)."""

from __future__ import annotations

from typing import Any

#: (what is wrong, the keyword arguments, a piece of the error's message)
BAD_CONSTRUCTION: list[tuple[str, dict[str, Any], str]] = [
    ("no nodes", {"nodes": []}, "at least one"),
    ("a str instead of a list", {"nodes": "redis://127.0.0.1:1/0"}, "list of Redis URLs"),
    ("malformed URL", {"nodes": ["http://127.0.0.1:1"]}, "nodes[0]"),
    ("port out of range", {"nodes": ["redis://127.0.0.1:99999/0"]}, "nodes[0]"),
    ("not a URL or client", {"nodes": [6379]}, "got int"),
    (
        "same node twice",
        {"nodes": ["redis://127.0.0.1:7001/0", "redis://localhost:7001/1"]},
        "listed twice",
    ),
    ("ttl zero", {"ttl": 0}, "ttl must be > 0"),
    ("ttl negative", {"ttl": -1}, "ttl must be > 0"),
    ("ttl not a number", {"ttl": "10"}, "ttl must be a number"),
    ("ttl bool", {"ttl": True}, "ttl must be a number"),
    ("ttl nan", {"ttl": float("nan")}, "finite"),
    ("node_timeout >= ttl", {"ttl": 1, "node_timeout": 1}, "smaller than ttl"),
    ("node_timeout zero", {"node_timeout": 0}, "node_timeout must be > 0"),
    ("drift_factor out of range", {"drift_factor": 1.5}, "drift_factor"),
    ("retry_count negative", {"retry_count": -1}, "retry_count"),
    ("retry_delay negative", {"retry_delay": -0.1}, "retry_delay"),
    ("max_hold zero", {"max_hold": 0}, "max_hold"),
]
