"""Where the package makes its background threads and their locks.

Two rooms run a daemon thread per process: watchdog.py (lease renewal) and
finisher.py (replies owed after a round returned). Both create their thread and the
condition it sleeps on here, so the choice of threading module is made once: under
gevent or eventlet it is the one line below to change.

Imports nothing from the package.
"""

from __future__ import annotations

import threading
from typing import Callable

__all__ = ["new_condition", "new_lock", "start_daemon_thread"]


def start_daemon_thread(target: Callable[[], None], name: str) -> threading.Thread:
    """Start ``target`` on a daemon thread called ``name``."""
    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    return thread


def new_condition() -> threading.Condition:
    """A condition for a background thread to sleep on."""
    return threading.Condition()


def new_lock() -> threading.Lock:
    """A lock shared with a background thread."""
    return threading.Lock()
