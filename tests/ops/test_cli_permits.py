"""``redlock ls | show | release | doctor`` for keys with a limit or a rate, against
real redis-server nodes.

A limited key's permits are taken with ``Redlock.acquire(key, limit=N)`` and a rate's
starts with ``Redlock.admit``; what a test leaves on a node by hand (a slot a minority
holds, a name the lock never writes) is written with a plain client. Two tests go
through the real ``celery`` program; the rest invoke the click group in-process.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from celery_redlock import ConfigurationError, Redlock
from celery_redlock.cli.common import glob_match
from celery_redlock.cli.listing import scan_matches
from celery_redlock.cli.permits import period_text, permit_name, read_terms
from celery_redlock.lock.stored import LIMIT, RATE, permit_slot, permit_terms_record
from celery_redlock.tasks.cooldown import cooldown_key
from celery_redlock.testing import RedisNodes, RedisNodesFactory
from tests.support.cli import doc, invoke, run_celery

KEY = "redlock:api:7"
RATED = "redlock:rate:t"
TTL = 30.0
HOLDERS = ("task-1@worker-a:42", "task-2@worker-b:43")


@pytest.fixture(autouse=True)
def first_slot_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """Permit rounds scan from slot 0 (the lock starts each at a random slot): the
    listings then show slot 0, 1, ... in the order the permits were taken."""
    monkeypatch.setattr(random, "randrange", lambda n: 0)


@pytest.fixture
def nodes(module_nodes: RedisNodes) -> RedisNodes:
    """Three healthy independent masters, emptied for each test."""
    module_nodes.flushall()
    return module_nodes


@pytest.fixture
def lock(nodes: RedisNodes) -> Iterator[Redlock]:
    redlock = Redlock(nodes.urls, ttl=TTL, node_timeout=0.5)
    yield redlock
    redlock.close()


@contextmanager
def opened(urls: list[str], **settings: Any) -> Iterator[Redlock]:
    redlock = Redlock(urls, ttl=TTL, **settings)
    try:
        yield redlock
    finally:
        redlock.close()


def take_permits(lock: Redlock, key: str = KEY, limit: int = 5) -> list[str]:
    """One permit of ``key`` for each of HOLDERS; their tokens, slot 0 first."""
    tokens = []
    for holder in HOLDERS:
        lease = lock.acquire(key, limit=limit, holder=holder, blocking=False)
        assert lease is not None
        tokens.append(lease.token)
    return tokens


def admit(lock: Redlock, starts: int, key: str = RATED, rate: str = "100/m") -> None:
    for i in range(starts):
        assert lock.admit(key, rate, holder=f"start-{i}@worker-c:9") == 0.0


def names_on(nodes: RedisNodes, key: str) -> list[set[str]]:
    """Per node, the names the lock keeps behind ``key``'s NUL."""
    return [{n.decode() for n in node.client().scan_iter(match=f"{key}\x00*")} for node in nodes]


def permits_of(listing: Any, key: str, kind: str) -> dict[str, Any]:
    (entry,) = [p for p in listing["permits"] if (p["key"], p["kind"]) == (key, kind)]
    return dict(entry)


# -- ls --------------------------------------------------------------------------------------


def test_ls_lists_a_limited_key_once_with_its_holders_through_the_celery_program(
    nodes: RedisNodes, lock: Redlock
) -> None:
    take_permits(lock)
    proc = run_celery(nodes.urls, "ls")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["KEY", "PERMITS", "(held", "by", "a", "quorum)"]
    assert lines[1] == (f"{KEY}  limit 2/5 held (holders: task-1@worker-a:42, task-2@worker-b:43)")
    assert lines[2].startswith("1 limits and rates; nodes in TTL order: ")
    assert len(lines) == 3  # no slot, terms record or tombstone of its own
    assert "\x00" not in proc.stdout


def test_ls_shows_a_rated_keys_starts_in_the_window_and_when_the_next_frees(
    nodes: RedisNodes, lock: Redlock
) -> None:
    admit(lock, 3)
    result = invoke(nodes.urls, "ls")
    assert result.exit_code == 0, result.output
    (line,) = [line for line in result.output.splitlines() if line.startswith(RATED)]
    head, _, frees = line.partition(" (next frees in ")
    assert head == f"{RATED}  rate 3/100 per 1m in the window"
    # A start holds its slot for the period and a little more (drift, the round's slack).
    assert 55.0 < float(frees.rstrip("s)")) < 61.0, line


def test_ls_json_gives_the_same_facts_as_fields(nodes: RedisNodes, lock: Redlock) -> None:
    tokens = take_permits(lock)
    admit(lock, 2, key=KEY)  # the same key, limited and rated: one entry per kind
    taken = lock.acquire("redlock:import:42", blocking=False)
    assert taken is not None
    result = invoke(nodes.urls, "ls", "--json")
    assert result.exit_code == 0, result.output
    listing = doc(result.stdout)
    assert [k["key"] for k in listing["keys"]] == ["redlock:import:42"]
    limit = permits_of(listing, KEY, LIMIT)
    assert (limit["terms"], limit["count"], limit["period"], limit["held"]) == ("5", 5, None, 2)
    assert [(h["slot"], h["holder"], h["token"]) for h in limit["holders"]] == [
        (0, HOLDERS[0], tokens[0]),
        (1, HOLDERS[1], tokens[1]),
    ]
    assert (limit["holders"][0]["task_id"], limit["holders"][0]["worker"]) == ("task-1", "worker-a")
    assert all(0 < h["ttl"] <= TTL for h in limit["holders"])
    assert limit["unagreed_slots"] == []
    assert (limit["quorum"], limit["nodes_total"]) == (2, 3)
    rate = permits_of(listing, KEY, RATE)
    assert (rate["terms"], rate["count"], rate["period"], rate["held"]) == (
        "100/60000ms",
        100,
        60.0,
        2,
    )
    assert 55.0 < rate["next_frees"] < 61.0
    assert rate["summary"].startswith("rate 2/100 per 1m in the window (next frees in ")


def test_a_permit_counts_only_where_a_quorum_holds_one_value_in_its_slot(
    nodes: RedisNodes, lock: Redlock
) -> None:
    take_permits(lock)  # slots 0 and 1 on every node
    slot = permit_slot(KEY, LIMIT, 2)
    nodes[0].client().set(slot, "lone|left@host:1", px=20_000)  # one node of three
    nodes[1].client().set(permit_slot(KEY, LIMIT, 3), "a|one@host:1", px=20_000)
    nodes[2].client().set(permit_slot(KEY, LIMIT, 3), "b|other@host:2", px=20_000)
    for node in nodes[1:]:  # two of three agree: held
        node.client().set(permit_slot(KEY, LIMIT, 4), "pair|two@host:3", px=20_000)
    listing = doc(invoke(nodes.urls, "ls", "--json").stdout)
    limit = permits_of(listing, KEY, LIMIT)
    assert limit["held"] == 3
    assert [h["holder"] for h in limit["holders"]] == [*HOLDERS, "two@host:3"]
    assert limit["unagreed_slots"] == [2, 3]
    assert limit["summary"].endswith("; 2 slot(s) without a quorum")


def test_ls_skips_names_the_lock_never_writes_without_crashing(
    nodes: RedisNodes, lock: Redlock
) -> None:
    take_permits(lock)
    client = nodes[0].client()
    for name in (
        f"{KEY}\x00limit\x00\u00b2",  # a digit int() cannot read
        f"{KEY}\x00limit\x00007",  # not the name of slot 7
        f"{KEY}\x00limit\x00x",
        f"{KEY}\x00limit\x00released\x00tok",  # a permit tombstone
        f"{KEY}\x00limit\x000\x00fence",  # a slot's fence counter
        f"{KEY}\x00bogus",
    ):
        client.set(name, "x|by-hand@host:1")
    client.hset(permit_slot(KEY, LIMIT, 3), "not", "a string")  # GET says WRONGTYPE
    client.set(permit_slot("redlock:odd", LIMIT, 0), "t|h@host:1", px=20_000)
    client.set(permit_terms_record("redlock:odd", LIMIT), "five")  # terms written by hand
    result = invoke(nodes.urls, "ls", "--json")
    assert result.exit_code == 0, result.output
    listing = doc(result.stdout)
    assert listing["keys"] == []
    assert [(p["key"], p["kind"]) for p in listing["permits"]] == [
        (KEY, LIMIT),
        ("redlock:odd", LIMIT),
    ]
    limit = permits_of(listing, KEY, LIMIT)
    assert (limit["held"], limit["unagreed_slots"]) == (2, [])
    odd = permits_of(listing, "redlock:odd", LIMIT)
    assert (odd["terms"], odd["count"], odd["held"]) == ("five", None, 0)
    assert odd["summary"] == "limit 0/? held; 1 slot(s) without a quorum; terms recorded as 'five'"
    assert invoke(nodes.urls, "ls").exit_code == 0
    shown = invoke(nodes.urls, "show", KEY)
    assert shown.exit_code == 0, shown.output
    assert "WRONGTYPE" in shown.output


def test_ls_pattern_matches_the_key_never_the_names_behind_it(
    nodes: RedisNodes, lock: Redlock
) -> None:
    take_permits(lock)
    admit(lock, 1, key=KEY)  # KEY\0rate ends with "rate", KEY does not
    admit(lock, 1, key="redlock:my:rate")

    def listed(pattern: str) -> list[tuple[str, str]]:
        result = invoke(nodes.urls, "ls", "--pattern", pattern, "--json")
        assert result.exit_code == 0, result.output
        return [(p["key"], p["kind"]) for p in doc(result.stdout)["permits"]]

    assert listed("*rate") == [("redlock:my:rate", RATE)]
    assert listed("api:7") == [(KEY, LIMIT), (KEY, RATE)]  # also found behind an exact key
    assert listed("api:*") == [(KEY, LIMIT), (KEY, RATE)]
    assert listed("api:[0-6]") == []


def test_ls_limit_counts_each_key_and_kind_once(nodes: RedisNodes, lock: Redlock) -> None:
    take_permits(lock)
    admit(lock, 1, key=KEY)
    assert lock.acquire("redlock:a", blocking=False) is not None
    result = invoke(nodes.urls, "ls", "--limit", "2", "--json")
    listing = doc(result.stdout)
    assert [k["key"] for k in listing["keys"]] == ["redlock:a"]
    assert [(p["key"], p["kind"]) for p in listing["permits"]] == [(KEY, LIMIT)]
    assert listing["truncated"] is True
    text = invoke(nodes.urls, "ls", "--limit", "2").output
    assert "... 1 more keys not shown (--limit 2)" in text


@pytest.mark.parametrize(
    "pattern",
    ["*", "*rate", "api:*", "api:7", "a?i:*", "api:[0-9]", "api:[^7]", "[", "x[ab", "\\*",
     "a\\", "api:[7-0]", "*:*:*", "api:\\7", "[a-]*"],
)  # fmt: skip
def test_glob_matching_agrees_with_redis_match(nodes: RedisNodes, pattern: str) -> None:
    names = ["api:7", "api:8", "api:70", "*", "a\\", "x", "xa", "xb", "x[ab", "my:rate",
             "a:b:c", "[", "-", "api:7\x00rate", "\u00e9"]  # fmt: skip
    client = nodes[0].client()
    for name in names:
        client.set(name, "1")
    by_redis = {n.decode() for n in client.scan_iter(match=pattern, count=1000)}
    assert {n for n in names if glob_match(pattern, n)} == by_redis


def test_scans_take_the_permits_behind_a_pattern_that_ends_without_a_star() -> None:
    assert scan_matches("redlock:*") == ["redlock:*"]
    assert scan_matches("redlock:api:*") == ["redlock:api:*"]
    assert scan_matches("redlock:api:7") == ["redlock:api:7", "redlock:api:7\x00*"]
    assert scan_matches("redlock:a\\*") == ["redlock:a\\*", "redlock:a\\*\x00*"]
    assert scan_matches("redlock:a\\**") == ["redlock:a\\**"]
    assert scan_matches("redlock:[*") == ["redlock:[*", "redlock:[*\x00*"]


def test_permit_names_and_terms_read_only_what_the_lock_writes() -> None:
    assert permit_name(permit_slot(KEY, LIMIT, 12)) == (KEY, LIMIT, 12)
    assert permit_name(permit_terms_record(KEY, RATE)) == (KEY, RATE, None)
    for name in (KEY, f"{KEY}\x00limit\x00\u00b2", f"{KEY}\x00limit\x0007", f"{KEY}\x00fence"):
        assert permit_name(name) is None
    assert read_terms(LIMIT, "5") == (5, None)
    assert read_terms(RATE, "100/60000ms") == (100, 60.0)
    assert read_terms(RATE, "100/m") == (None, None)
    assert read_terms(LIMIT, "\u00b2") == (None, None)
    assert [period_text(s) for s in (60.0, 10.0, 1.5, 3600.0, 0.25, 90.0)] == [
        "1m", "10s", "1.5s", "1h", "250ms", "90s",
    ]  # fmt: skip


# -- show ------------------------------------------------------------------------------------


def test_show_a_limited_key_slot_by_slot_through_the_celery_program(
    nodes: RedisNodes, lock: Redlock
) -> None:
    tokens = take_permits(lock)
    proc = run_celery(nodes.urls, "show", "api:7")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"key       {KEY}\n" in out
    assert "holder    nobody" not in out  # the key itself holds no lock: not shown
    assert "limit     limit 5 (recorded on 3 of 3 nodes): 2 held by a quorum\n" in out
    assert (
        "slot 0    task-1@worker-a:42 (task task-1, worker worker-a, pid 42): 3 of 3 nodes agree"
        in out
    )
    assert f"release: redlock release {KEY} --token={tokens[0]}\n" in out
    assert f"release: redlock release {KEY} --token={tokens[1]}\n" in out
    rows = [line.split() for line in out.splitlines()]
    assert ["LIMIT", "NODE", "HOLDER", "TOKEN", "TTL", "ERROR"] in rows
    for server in nodes:
        address = f"127.0.0.1:{server.port}/0"
        assert ["terms", address, "5", "-"] == next(
            r[:4] for r in rows if r[:2] == ["terms", address]
        )
        assert ["0", address, HOLDERS[0], tokens[0][:8] + "..."] in [r[:4] for r in rows]
        assert ["1", address, HOLDERS[1], tokens[1][:8] + "..."] in [r[:4] for r in rows]


def test_show_json_of_a_limited_and_rated_key_with_a_node_down(
    redis_nodes_factory: RedisNodesFactory,
) -> None:
    cluster = redis_nodes_factory(3)
    with opened(cluster.urls) as lock:
        tokens = take_permits(lock)
        admit(lock, 1, key=KEY)
    cluster[1].stop()
    result = invoke(cluster.urls, "show", KEY, "--json")
    assert result.exit_code == 0, result.output
    shown = doc(result.stdout)
    assert (shown["key"], shown["token"], shown["agreeing_nodes"]) == (KEY, None, 0)
    limit, rate = shown["permits"]
    assert (limit["kind"], limit["held"], rate["kind"], rate["held"]) == (LIMIT, 2, RATE, 1)
    assert [s["slot"] for s in limit["slots"]] == [0, 1]
    first = limit["slots"][0]
    assert (first["token"], first["agreeing_nodes"], first["quorum_agrees"]) == (tokens[0], 2, True)
    assert first["key"] == KEY
    up, down, _ = first["nodes"]
    assert (up["holder"], up["token"], up["error"]) == (HOLDERS[0], tokens[0], None)
    assert "Connection refused" in down["error"]
    terms = limit["terms_per_node"]
    assert [t["terms"] for t in terms] == ["5", None, "5"]
    assert "Connection refused" in terms[1]["error"]
    assert rate["terms_per_node"][0]["terms"] == "100/60000ms"


def test_show_prints_a_lock_and_the_permits_of_one_key(nodes: RedisNodes, lock: Redlock) -> None:
    admit(lock, 2, key=RATED)
    nodes[0].client().set(RATED, "tok|plain@host:1", px=20_000)  # a lock on a minority
    result = invoke(nodes.urls, "show", RATED)
    assert result.exit_code == 0, result.output
    out = result.output
    assert "holder    plain@host:1" in out
    assert "quorum    NOT held by a quorum: 1 of 3 nodes agree, 2 needed" in out
    assert "rate      rate 100 per 1m (recorded on 3 of 3 nodes): 2 starts in the window" in out
    assert "release: redlock release" not in out.split("rate      ", 1)[1]  # starts stay


def test_a_hung_node_costs_each_permit_command_its_timeout_once(
    redis_nodes_factory: RedisNodesFactory,
) -> None:
    # As for a lock key (test_cli.py): the hung node is paid once, not once per pass.
    timeout = 3.0
    cluster = redis_nodes_factory(3)
    with opened(cluster.urls) as lock:
        tokens = take_permits(lock)
    cluster[2].pause()
    try:
        for args in (
            ("ls", "--json"),
            ("show", KEY, "--json"),
            ("release", KEY, "--token", tokens[0], "--json"),
        ):
            started = time.monotonic()
            result = invoke(cluster.urls, *args, "--timeout", f"{timeout:g}")
            elapsed = time.monotonic() - started
            assert timeout <= elapsed < 2 * timeout, (args, elapsed)
            assert result.exit_code == 0, result.output
            report = doc(result.stdout)
            if args[0] == "ls":
                (limit,) = report["permits"]
                assert limit["held"] == 2
            elif args[0] == "show":
                (limit,) = report["permits"]
                assert (
                    f"no reply within {timeout * 1000:.0f} ms"
                    in limit["slots"][0]["nodes"][2]["error"]
                )
            else:
                assert [n["result"] for n in report["nodes"]] == ["deleted", "deleted", "error"]
    finally:
        cluster[2].resume()


# -- release ---------------------------------------------------------------------------------


def test_release_with_a_permits_token_frees_that_permit_only(
    nodes: RedisNodes, lock: Redlock
) -> None:
    tokens = take_permits(lock, limit=2)
    assert lock.acquire(KEY, limit=2, blocking=False) is None  # both permits held
    result = invoke(nodes.urls, "release", "api:7", "--token", tokens[0])
    assert result.exit_code == 0, result.output
    assert result.output.count(f"deleted limit permit 0 (held by {HOLDERS[0]})") == 3
    slot0, slot1 = permit_slot(KEY, LIMIT, 0), permit_slot(KEY, LIMIT, 1)
    assert [slot1 in names and slot0 not in names for names in names_on(nodes, KEY)] == [True] * 3
    again = lock.acquire(KEY, limit=2, blocking=False)
    assert again is not None and again.keys == (slot0,)  # the freed permit is taken again

    result = invoke(nodes.urls, "release", KEY, "--token", "not-a-token", "--json")
    assert result.exit_code == 1
    assert [n["result"] for n in doc(result.stdout)["nodes"]] == ["absent"] * 3


def test_a_rates_start_is_never_released_by_token(nodes: RedisNodes, lock: Redlock) -> None:
    admit(lock, 1)
    value = nodes[0].client().get(permit_slot(RATED, RATE, 0))
    assert isinstance(value, bytes)
    token = value.decode().partition("|")[0]
    result = invoke(nodes.urls, "release", RATED, "--token", token)
    assert result.exit_code == 1
    assert "nothing deleted on any node" in result.output
    assert all(permit_slot(RATED, RATE, 0) in names for names in names_on(nodes, RATED))


@pytest.mark.parametrize("yes", [(), ("--yes",)])
def test_a_forced_release_of_a_key_with_only_permits_is_refused_naming_what_to_do(
    nodes: RedisNodes, lock: Redlock, yes: tuple[str, ...]
) -> None:
    take_permits(lock)
    before = names_on(nodes, KEY)
    result = invoke(nodes.urls, "release", KEY, "--force", *yes)
    assert result.exit_code == 2
    assert "holds no lock but permits (limit 2/5 held" in result.output
    assert "--token TOKEN" in result.output
    assert "--force --all-permits" in result.output
    assert names_on(nodes, KEY) == before


def test_all_permits_needs_force(nodes: RedisNodes) -> None:
    result = invoke(nodes.urls, "release", KEY, "--all-permits")
    assert result.exit_code == 2
    assert "--all-permits deletes every holder's permit: give it with --force" in result.output


def test_all_permits_asks_first_then_deletes_every_slot_and_the_terms(
    nodes: RedisNodes,
) -> None:
    with opened(nodes.urls, fencing=True) as fenced:
        take_permits(fenced)
        admit(fenced, 3, key=KEY)
    result = invoke(nodes.urls, "release", KEY, "--force", "--all-permits", input="n\n")
    assert result.exit_code == 1
    assert f"Delete every permit of {KEY} on 3 nodes, whoever holds them (now: limit 2/5" in (
        result.output
    )
    assert "up to 5 new holders may start beside the ones still running" in result.output
    assert "the rate's window starts empty (up to 100 starts at once)" in result.output
    assert "Aborted" in result.output

    result = invoke(nodes.urls, "release", KEY, "--force", "--all-permits", input="y\n")
    assert result.exit_code == 0, result.output
    assert (
        result.output.count(
            "deleted 2 limit slot(s) (held by task-1@worker-a:42, task-2@worker-b:43), "
            "3 rate slot(s), 2 terms record(s)"
        )
        == 3
    )
    fences = {permit_slot(KEY, LIMIT, i) + "\x00fence" for i in (0, 1)}
    assert names_on(nodes, KEY) == [fences] * 3  # fence numbers never go backwards


def test_all_permits_lets_callers_give_the_key_new_terms(nodes: RedisNodes, lock: Redlock) -> None:
    take_permits(lock)
    with pytest.raises(ConfigurationError, match="disagrees"):
        lock.acquire(KEY, limit=3, blocking=False)
    result = invoke(nodes.urls, "release", KEY, "--force", "--all-permits", "--yes", "--json")
    assert result.exit_code == 0, result.output
    outcome = doc(result.stdout)
    assert (outcome["mode"], outcome["deleted"]) == ("all-permits", 3)
    assert outcome["nodes"][0]["slots"] == {LIMIT: 2, RATE: 0}
    assert outcome["nodes"][0]["holders"] == list(HOLDERS)
    assert lock.acquire(KEY, limit=3, blocking=False) is not None

    lock.clear("redlock:*")
    result = invoke(nodes.urls, "release", "free:key", "--force", "--all-permits", "--yes")
    assert result.exit_code == 1
    assert "no permits deleted on any node" in result.output


# -- doctor ----------------------------------------------------------------------------------


def limits_check(report: Any) -> dict[str, Any]:
    (check,) = [c for c in report["checks"] if c["check"] == "limits"]
    return dict(check)


def test_doctor_says_what_a_permit_needs_when_no_key_is_limited(nodes: RedisNodes) -> None:
    check = limits_check(doc(invoke(nodes.urls, "doctor", "--json").stdout))
    assert check["status"] == "OK"
    assert check["message"] == (
        "no limited or rated keys under 'redlock:' (a permit needs 2 of 3 nodes to give "
        "the same slot)"
    )


def test_doctor_explains_the_cost_of_limits_and_warns_with_a_node_down(
    redis_nodes_factory: RedisNodesFactory,
) -> None:
    cluster = redis_nodes_factory(5)
    with opened(cluster.urls) as lock:
        take_permits(lock)
        admit(lock, 1, rate="5/h")
    cluster[4].stop()
    result = invoke(cluster.urls, "doctor", "--json")
    report = doc(result.stdout)
    check = limits_check(report)
    assert check["status"] == "WARNING"
    assert check["message"].startswith("1 limited and 1 rated key(s); a permit needs 3 of 5 nodes")
    assert (
        "1 of 5 nodes down: a permit needs 3 of the 4 left to give the same slot, so "
        in (check["message"])
    )
    assert "racing callers split more often (nobody wins; they retry)" in check["message"]
    assert (
        "the longest rate period (1 h) is longer than the largest lock TTL (30 s)"
        in (check["message"])
    )
    assert (
        "must stay down for at least max(largest TTL, longest rate period) (here 1 h"
        in (check["advice"])
    )
    assert "a window can admit more than R starts" in check["advice"]
    node = report["nodes"][0]
    assert (node["limited_keys"], node["rated_keys"], node["permit_slots"]) == (1, 1, 3)
    assert node["longest_rate_period_s"] == 3600.0
    assert 0 < node["longest_ttl_s"] <= TTL
    text = invoke(cluster.urls, "doctor").output
    assert "limits: A limited key's permit is won when a majority of the nodes (3 of 5)" in text


def test_doctor_limits_are_ok_with_every_node_up_and_fsync_always(
    redis_nodes_factory: RedisNodesFactory,
) -> None:
    cluster = redis_nodes_factory(3, appendonly=True)
    with opened(cluster.urls) as lock:
        admit(lock, 1, rate="5/h")
    check = limits_check(doc(invoke(cluster.urls, "doctor", "--json").stdout))
    assert check["status"] == "OK"
    assert check["message"] == "0 limited and 1 rated key(s); a permit needs 2 of 3 nodes"
    assert "(here 1 h: the longest rate period)" in check["advice"]


def test_doctor_names_a_permit_slot_without_a_ttl(nodes: RedisNodes) -> None:
    nodes[1].client().set(permit_slot(KEY, LIMIT, 3), "tok|stuck@host:1")
    report = doc(invoke(nodes.urls, "doctor", "--json").stdout)
    node = report["nodes"][1]
    assert node["keys_without_ttl"] == [f"{KEY} limit slot 3"]
    (check,) = [c for c in node["checks"] if c["check"] == "lock-keys"]
    assert check["status"] == "ERROR"
    assert "--force --all-permits" in check["advice"]


def test_a_cooldown_is_listed_with_its_end_and_a_forced_release_ends_it(
    nodes: RedisNodes, lock: Redlock
) -> None:
    key = cooldown_key("redlock", "redlock:report:7")
    assert key == "redlock:cooldown:report:7"
    assert lock.admit(key, (1, 60.0), holder="task-1@worker-a:42") == 0.0
    result = invoke(nodes.urls, "ls", "--pattern", "cooldown:*")
    assert result.exit_code == 0, result.output
    (line,) = [line for line in result.output.splitlines() if line.startswith(key)]
    head, _, frees = line.partition(" (next frees in ")
    assert head == f"{key}  rate 1/1 per 1m in the window"
    assert 55.0 < float(frees.rstrip("s)")) < 61.0, line
    assert lock.admit(key, (1, 60.0)) > 0  # inside the cooldown
    result = invoke(nodes.urls, "release", key, "--force", "--all-permits", input="y\n")
    assert result.exit_code == 0, result.output
    assert lock.admit(key, (1, 60.0)) == 0.0  # the cooldown has ended


def test_show_names_the_queued_copy_and_the_cooldown_of_a_key(
    nodes: RedisNodes, lock: Redlock
) -> None:
    key = "redlock:report:8"
    queued = lock.acquire(key + ":queued", ttl=60, holder="queued-task-id")
    assert queued is not None
    assert lock.admit(cooldown_key("redlock", key), (1, 60.0), holder="t@w:1") == 0.0
    result = invoke(nodes.urls, "show", "report:8")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "queued    queued-task-id (queue once: the copy waiting to run)" in lines
    (cooling,) = [line for line in lines if line.startswith("cooldown  ")]
    assert "rate 1/1 per 1m in the window (next frees in " in cooling
    document = json.loads(invoke(nodes.urls, "show", "report:8", "--json").output)
    assert document["queued"]["task_id"] == "queued-task-id"
    assert document["cooldown"]["held"] == 1
    result = invoke(nodes.urls, "show", "report:9")  # neither: nothing more printed
    assert "queued" not in result.output and "cooldown" not in result.output
