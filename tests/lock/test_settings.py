"""A lock's settings as attributes: read from the frozen settings, and assigned only
through the constructor's checks."""

from __future__ import annotations

import re

import pytest
import redis

from celery_redlock import ConfigurationError, Redlock
from celery_redlock.asyncio import AsyncRedlock
from celery_redlock.testing import RedisServer


def test_an_assigned_ttl_is_the_next_leases_ttl_on_the_node(redis_server: RedisServer) -> None:
    redlock = Redlock([redis_server.url], ttl=30, node_timeout=0.5)
    redlock.ttl = 5
    lease = redlock.acquire("settings:ttl", blocking=False)
    assert lease is not None
    # Read by a plain client, not by the lock: the key's expiry is the new ttl.
    pttl = redis.Redis.from_url(redis_server.url).pttl("settings:ttl")
    assert 4_000 < pttl <= 5_000
    assert lease.ttl == redlock.ttl == 5.0
    lease.release()
    redlock.close()


@pytest.mark.parametrize("lock_class", [Redlock, AsyncRedlock])
@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("node_timeout", 60, "node_timeout (60.0s) must be smaller than ttl (30.0s)"),
        ("ttl", -1, "ttl"),
        ("retry_count", "three", "retry_count"),
        ("drift_factor", 2, "drift_factor"),
    ],
)
def test_a_bad_assigned_setting_is_refused_and_the_old_one_kept(
    lock_class: type, name: str, value: object, says: str
) -> None:
    lock = lock_class(["redis://127.0.0.1:1/0"], ttl=30, node_timeout=0.05)
    before = getattr(lock, name)
    with pytest.raises(ConfigurationError, match=re.escape(says)):
        setattr(lock, name, value)
    assert getattr(lock, name) == before
    lock.close()


def test_the_quorum_is_not_a_setting() -> None:
    redlock = Redlock([f"redis://127.0.0.1:{port}/0" for port in (1, 2, 3)])
    assert redlock.quorum == 2
    with pytest.raises(AttributeError):
        redlock.quorum = 1  # type: ignore[misc]
