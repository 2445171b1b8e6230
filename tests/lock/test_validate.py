"""The shared value checks: what each accepts, and messages that name the value and
what is accepted (the texts Redlock's, the settings' and beat's callers rely on)."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any, Callable

import pytest

from celery_redlock import ConfigurationError
from celery_redlock.lock import validate as v

NUL = "\x00"

REFUSED: list[tuple[str, Callable[[], Any], str]] = [
    ("negative", lambda: v.seconds("ttl", -1), "ttl must be > 0 seconds, got -1"),
    (
        "str",
        lambda: v.seconds("ttl", "soon"),
        "ttl must be a number of seconds (int, float or timedelta), got str: 'soon'",
    ),
    ("bool", lambda: v.seconds("ttl", True), "ttl must be a number of seconds"),
    ("inf", lambda: v.seconds("ttl", float("inf")), "ttl must be a finite number of seconds"),
    ("timedelta", lambda: v.seconds("ttl", timedelta(seconds=-3)), "ttl must be > 0 seconds"),
    (
        "optional",
        lambda: v.optional_seconds("timeout", -1, minimum=">= 0"),
        "timeout must be >= 0 seconds or None, got -1",
    ),
    (
        "setting",
        lambda: v.seconds("redlock_ttl", "10", wording=v.SETTING),
        "redlock_ttl must be a finite number of seconds",
    ),
    (
        "rule",
        lambda: v.seconds("S.skew", -1, minimum=">= 0", wording=v.RULE),
        "S.skew must be a number of seconds >= 0 (int, float or timedelta), got int: -1",
    ),
    ("choice", lambda: v.choice("x", "wait", ("a", "b")), "x must be one of 'a', 'b', got 'wait'"),
    ("flag", lambda: v.flag("x", "yes"), "x must be True or False, got 'yes'"),
    ("count", lambda: v.count("x", -1), "x must be an int >= 0, got -1"),
    ("count bool", lambda: v.count("x", True, minimum=1), "x must be an int >= 1"),
    ("fraction", lambda: v.fraction("x", 1.5), "x must be in [0, 1), got 1.5"),
    ("prefix space", lambda: v.key_prefix("p", "a b"), "p must be a non-empty str without"),
    ("prefix control", lambda: v.key_prefix("p", "a\x01"), "whitespace or control characters"),
    ("key type", lambda: v.lock_key_name(42, reserved=NUL), "key must be a non-empty str"),
    ("key nul", lambda: v.lock_key_name("a\x00b", reserved=NUL), "key must not contain NUL"),
    ("key utf8", lambda: v.lock_key_name("k\udcff", reserved=NUL), "UTF-8"),
    ("nodes", lambda: v.node_list("n", 5), "n must be a non-empty list of Redis URLs"),
    ("node", lambda: v.node_list("n", ["redis://h", 3]), "n[1] must be a Redis URL string"),
    ("key spec", lambda: v.key_spec("k", 42), "k must be None (all arguments)"),
    ("empty template", lambda: v.key_spec("k", ""), "k must not be an empty string"),
]


@pytest.mark.parametrize(("check", "says"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_a_refused_value_is_named_with_what_is_accepted(
    check: Callable[[], Any], says: str
) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(says)):
        check()


def test_accepted_values_come_back_in_their_working_form() -> None:
    assert v.seconds("t", timedelta(milliseconds=1500)) == 1.5
    assert v.seconds("t", 0, minimum=">= 0") == 0.0
    assert v.seconds("t", -2, minimum=None) == -2.0
    assert v.optional_seconds("t", None) is None
    assert v.node_list("n", " redis://a , redis://b ") == ("redis://a", "redis://b")
    assert v.key_spec("k", ["a", "b"]) == ("a", "b")
    assert v.lock_key_name("job:1", reserved=NUL) == "job:1"
    assert v.key_prefix("p", "my-locks") == "my-locks"
