"""Bad input, kind by kind: each refusal has the right type, and its message names
what was wrong and what is accepted.

Not repeated here (see those files): Redlock construction and call arguments
(test_redlock.py), task options, the unknown app setting, a non-Redis broker and an
``object()`` argument through ``apply()`` (test_task.py), key specs and unkeyable
values at the unit level (test_keys.py), ``release`` usage errors (test_cli.py).

Task-level cases run against a real Redis broker, 3 real lock nodes and one embedded
worker (threads pool) shared by the module. After each, the worker must still serve
the next task, and nothing may be lost silently: the caller gets the error at once, or
the task ends FAILURE with it.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Optional

import pytest
import redis
from celery import Celery
from celery.bin.base import CLIContext
from celery.contrib.testing.worker import start_worker
from celery.result import AsyncResult
from celery.signals import after_task_publish
from click.testing import CliRunner, Result
from kombu.exceptions import EncodeError

from celery_redlock import (
    ConfigurationError,
    LockContended,
    LockKeyError,
    QuorumUnavailable,
    Redlock,
    RedlockTask,
)
from celery_redlock.cli import redlock as redlock_cli
from celery_redlock.tasks.config import reset
from celery_redlock.testing import RedisNodes, RedisServer
from tests.support.appfixture import free_results

#: What every message about a URL lists as accepted.
ACCEPTED_URLS = "accepted: redis://[[user]:password@]host[:port][/db], rediss://"
#: What every message about an unkeyable argument lists as accepted, and the way out.
ACCEPTED_VALUES = "a lock key needs str, int, float, bool, None, list, tuple, dict"
WAY_OUT = "pass redlock_key a template or a list of argument names that leaves it out"


# -- the stack: broker, 3 lock nodes, one embedded worker ------------------------------------


@dataclass(frozen=True)
class SettingCase:
    id: str
    settings: Mapping[str, Any]
    at_enqueue: bool  # delay() refuses it (else only the worker can tell)
    says: tuple[str, ...]  # what was wrong, what is accepted


SETTING_CASES = [
    SettingCase(
        "nodes-int",
        {"redlock_nodes": 5},
        True,
        ("redlock_nodes must be a non-empty list of Redis URLs", "comma-separated", "got 5"),
    ),
    SettingCase(
        "nodes-empty-string",
        {"redlock_nodes": " , "},
        True,
        ("redlock_nodes must be a non-empty list of Redis URLs", "got []"),
    ),
    SettingCase(
        "nodes-non-url",
        {"redlock_nodes": ["redis://127.0.0.1:1/0", "localhost:6379"]},
        False,
        ("nodes[1]: 'localhost:6379' is not a Redis URL", ACCEPTED_URLS),
    ),
    SettingCase(
        "prefix-spaces",
        {"redlock_key_prefix": "my locks"},
        True,
        ("redlock_key_prefix must be a non-empty str without whitespace", "got 'my locks'"),
    ),
    SettingCase(
        "drift-out-of-range",
        {"redlock_drift_factor": 1.5},
        True,
        ("redlock_drift_factor must be in [0, 1)", "got 1.5"),
    ),
    SettingCase(
        "drift-str",
        {"redlock_drift_factor": "0.01"},
        True,
        ("redlock_drift_factor must be in [0, 1)", "got '0.01'"),
    ),
    SettingCase(
        "backoff-max-below-backoff",
        {"redlock_retry_backoff": 2, "redlock_retry_backoff_max": 1},
        True,
        ("redlock_retry_backoff_max (1.0s) must be >= redlock_retry_backoff (2.0s)",),
    ),
    SettingCase(
        "on-retries-exhausted",
        {"redlock_on_retries_exhausted": "retry"},
        True,
        ("redlock_on_retries_exhausted must be one of 'fail', 'skip'", "got 'retry'"),
    ),
    SettingCase(
        "queued-ttl-zero",
        {"redlock_queued_ttl": 0},
        True,
        ("redlock_queued_ttl must be > 0 seconds", "got 0"),
    ),
    SettingCase(
        "on-queued",
        {"redlock_on_queued": "ignore"},
        True,
        ("redlock_on_queued must be one of 'return', 'raise'", "got 'ignore'"),
    ),
    SettingCase(
        "wait-timeout-negative",
        {"redlock_wait_timeout": -1},
        True,
        ("redlock_wait_timeout must be >= 0 seconds", "got -1"),
    ),
    SettingCase(
        "cooldown-zero",
        {"redlock_cooldown": 0},
        True,
        ("redlock_cooldown must be > 0 seconds or None", "got 0"),
    ),
    SettingCase(
        "cooldown-text",
        {"redlock_cooldown": "1h"},
        True,
        ("redlock_cooldown must be a finite number of seconds (int, float or timedelta)",),
    ),
    SettingCase(
        "unlimited-without-rate-or-cooldown",
        {"redlock_limit": "unlimited"},
        True,
        ('redlock_limit="unlimited" needs redlock_rate or redlock_cooldown',),
    ),
    SettingCase(
        "node-timeout-not-below-ttl",
        {"redlock_node_timeout": 30},
        True,
        ("redlock_node_timeout (30.0s) must be smaller than redlock_ttl (30.0s)",),
    ),
    SettingCase(
        "handoff-claim-ttl-below-fallback",
        {"redlock_handoff": True, "redlock_handoff_claim_ttl": 10},
        True,
        (
            "redlock_handoff_claim_ttl (10.0s) must be longer than "
            "redlock_retry_backoff_max + redlock_ttl (30.3s)",
        ),
    ),
    SettingCase(
        "max-hold-negative",
        {"redlock_max_hold": timedelta(seconds=-1)},
        True,
        ("redlock_max_hold must be > 0 seconds", "got -1.0"),
    ),
    SettingCase(
        "fencing-str",
        {"redlock_fencing": "yes"},
        True,
        ("redlock_fencing must be True or False", "got 'yes'"),
    ),
]


@dataclass
class Stack:
    broker: RedisServer
    nodes: RedisNodes
    node_clients: list[redis.Redis]
    app: Celery
    tasks: dict[str, Any]

    def lock_keys(self) -> list[str]:
        """Lock keys left on any node (release tombstones and fence counters aside)."""
        keys = (str(key) for client in self.node_clients for key in client.keys("*"))
        return sorted(k for k in keys if "\x00" not in k)


def _define(app: Celery) -> dict[str, Any]:
    @app.task(shared=False, bind=True, base=RedlockTask, redlock_ttl=5, name="t.arg")
    def arg(self: RedlockTask, payload: Any, tag: str = "x") -> str:
        return "ran"

    @app.task(
        shared=False,
        bind=True,
        base=RedlockTask,
        redlock_ttl=5,
        redlock_key="imp:{customer}:{part}",
        name="t.tmpl",
    )
    def tmpl(self: RedlockTask, customer: Any, part: Any) -> str:
        lease = self.redlock
        assert lease is not None and lease.held
        return lease.key

    @app.task(
        shared=False,
        bind=True,
        base=RedlockTask,
        redlock_ttl=5,
        redlock_key="fimp:{customer}:{part}",
        redlock_fencing=True,
        redlock_on_contended="fail",
        name="t.fenced",
    )
    def fenced(self: RedlockTask, customer: Any, part: Any) -> Optional[int]:
        lease = self.redlock
        assert lease is not None
        return lease.fence

    @app.task(
        shared=False, bind=True, base=RedlockTask, redlock_dedupe_queued=True, name="t.queued"
    )
    def queued(self: RedlockTask, payload: Any) -> str:
        return "ran"

    @app.task(shared=False, bind=True, base=RedlockTask, name="t.ok")
    def ok(self: RedlockTask, tag: str) -> str:
        lease = self.redlock
        assert lease is not None and lease.held
        return "ok"

    def noop(tag: str = "x") -> str:
        return "ran"

    for case in SETTING_CASES:  # one task each: no options cached from a good config
        app.task(shared=False, base=RedlockTask, name=f"t.setting.{case.id}")(noop)
    return {"arg": arg, "tmpl": tmpl, "fenced": fenced, "queued": queued, "ok": ok}


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with RedisServer() as broker, RedisNodes(3) as nodes:
        app = Celery("bad_input", broker=broker.url, backend=broker.url, set_as_current=False)
        app.conf.update(
            broker_connection_retry_on_startup=True,
            task_create_missing_queues=True,
            redlock_nodes=nodes.urls,
            redlock_retry_backoff=0.1,
            redlock_retry_backoff_max=0.3,
        )
        tasks = _define(app)
        with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
            clients = [server.client(decode_responses=True) for server in nodes]
            yield Stack(broker, nodes, clients, app, tasks)
            free_results()


@pytest.fixture
def clean(stack: Stack) -> Iterator[Stack]:
    """The stack; afterwards the worker must still serve and no lock may linger."""
    yield stack
    tag = uuid.uuid4().hex
    assert stack.tasks["ok"].delay(tag).get(timeout=10) == "ok"
    deadline = time.monotonic() + 5  # after_return releases just after the result is stored
    while stack.lock_keys():
        assert time.monotonic() < deadline, stack.lock_keys()
        time.sleep(0.02)


@contextmanager
def settings(app: Celery, values: Mapping[str, Any]) -> Iterator[None]:
    """``app.conf`` with ``values``; restored (and the cached config dropped) after."""
    missing = object()
    saved = {name: app.conf.get(name, missing) for name in values}
    app.conf.update(values)
    reset(app)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is missing:
                del app.conf[name]
            else:
                app.conf[name] = value
        reset(app)


def _failure(result: AsyncResult, timeout: float = 15) -> BaseException:
    error = result.get(timeout=timeout, propagate=False)
    assert result.state == "FAILURE", (result.state, error)
    assert isinstance(error, BaseException)
    return error


def _says(error: BaseException, *fragments: str) -> None:
    message = str(error)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


# -- app settings ------------------------------------------------------------------------------


@pytest.mark.parametrize("case", SETTING_CASES, ids=[c.id for c in SETTING_CASES])
def test_a_bad_app_setting_is_named_with_what_it_accepts_and_the_worker_lives_on(
    clean: Stack, case: SettingCase
) -> None:
    app = clean.app
    task = app.tasks[f"t.setting.{case.id}"]
    with settings(app, case.settings):
        if case.at_enqueue:
            with pytest.raises(ConfigurationError) as caught:
                task.delay()
            _says(caught.value, *case.says)
        else:  # only a lock round parses the URLs: the worker fails it
            _says(_failure(task.delay()), *case.says)
        # Sent by name from another client, it reaches the worker anyway:
        error = _failure(app.send_task(task.name))
        assert isinstance(error, ConfigurationError), error
        _says(error, *case.says)


# -- the lock's own API ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ttl", "says"),
    [
        (-1, "ttl must be > 0 seconds, got -1"),
        ("soon", "ttl must be a number of seconds (int, float or timedelta), got str: 'soon'"),
        (float("inf"), "ttl must be a finite number of seconds, got inf"),
    ],
    ids=["negative", "str", "infinite"],
)
def test_a_bad_extend_ttl_is_refused_and_the_lease_is_kept(
    stack: Stack, ttl: Any, says: str
) -> None:
    redlock = Redlock(stack.nodes.urls, ttl=5)
    lease = redlock.acquire("bad:extend", blocking=False)
    assert lease is not None
    try:
        with pytest.raises(ConfigurationError, match=re.escape(says)):
            lease.extend(ttl=ttl)
        assert lease.held and lease.extend()  # a bad argument loses nothing
    finally:
        lease.release()
        redlock.close()


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"timeout": "x"}, "timeout must be a number of seconds (int, float or timedelta)"),
        ({"ttl": "10"}, "ttl must be a number of seconds (int, float or timedelta), got str"),
        ({"ttl": timedelta(seconds=-3)}, "ttl must be > 0 seconds"),
    ],
    ids=["timeout str", "ttl str", "ttl negative timedelta"],
)
def test_a_bad_lock_argument_is_refused_before_anything_is_taken(
    stack: Stack, kwargs: dict[str, Any], says: str
) -> None:
    redlock = Redlock(stack.nodes.urls, ttl=5)
    try:
        with (
            pytest.raises(ConfigurationError, match=re.escape(says)),
            redlock.lock("bad:lock", **kwargs),
        ):
            pytest.fail("the block ran")
    finally:
        redlock.close()
    assert not any(client.exists("bad:lock") for client in stack.node_clients)


@pytest.mark.parametrize("call", ["acquire", "lock"])
@pytest.mark.parametrize("timeout", [5, 0, timedelta(seconds=1)], ids=["5", "0", "timedelta"])
def test_a_timeout_with_blocking_false_is_refused_not_ignored(
    stack: Stack, call: str, timeout: Any
) -> None:
    # One attempt and no wait: a timeout there would be ignored silently (pottery and
    # python-redis-lock refuse it too).
    redlock = Redlock(stack.nodes.urls, ttl=5)
    try:
        with pytest.raises(ConfigurationError, match=re.escape("needs blocking=True")):
            if call == "acquire":
                redlock.acquire("bad:nonblocking", blocking=False, timeout=timeout)
            else:
                with redlock.lock("bad:nonblocking", blocking=False, timeout=timeout):
                    pytest.fail("the block ran")
    finally:
        redlock.close()
    assert not any(client.exists("bad:nonblocking") for client in stack.node_clients)


@pytest.mark.parametrize(
    ("nodes", "says"),
    [
        ([None], "nodes[0]: expected a Redis URL (str) or a redis.Redis client, got NoneType"),
        ([b"redis://127.0.0.1:1/0"], "nodes[0]: expected a Redis URL (str)"),
        ({"redis://127.0.0.1:1/0"}, "nodes must be a list of Redis URLs or redis.Redis clients"),
    ],
    ids=["None", "bytes", "set"],
)
def test_a_node_that_is_not_a_url_or_client_is_refused(nodes: Any, says: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(says)):
        Redlock(nodes)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis://host:notaport/0", "Port could not be cast to integer value as 'notaport'"),
        ("redis://127.0.0.1:6379/0?socket_timeout=abc", "Invalid value for 'socket_timeout'"),
        ("http://127.0.0.1:6379/0", "must specify one of the following schemes"),
    ],
    ids=["port", "query", "scheme"],
)
def test_a_malformed_node_url_is_refused_naming_it_and_the_accepted_forms(
    url: str, says: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        Redlock(["redis://127.0.0.1:1/0", url])
    _says(caught.value, f"nodes[1]: {url!r} is not a Redis URL", says, ACCEPTED_URLS)


def test_a_node_url_without_a_host_is_refused() -> None:
    with pytest.raises(ConfigurationError) as caught:
        Redlock(["redis://:pw@"])
    _says(caught.value, "nodes[0]:", "has no host")


@pytest.mark.parametrize("url", ["redis://:hunter2@host:notaport/0", "redis://:hunter2@"])
def test_a_refused_node_url_does_not_echo_its_password(url: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        Redlock([url])
    assert "hunter2" not in str(caught.value)


def test_a_node_url_with_a_bad_db_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="notadb"):
        Redlock(["redis://127.0.0.1:6379/notadb"])


def test_a_missing_ca_file_is_a_configuration_error_naming_it(tmp_path: Any) -> None:
    missing = tmp_path / "no-such-ca.pem"
    with pytest.raises(ConfigurationError) as caught:
        Redlock([f"rediss://127.0.0.1:6380/0?ssl_ca_certs={missing}&ssl_cert_reqs=required"])
    _says(caught.value, "nodes[0]", str(missing))


def test_a_bad_ssl_cert_reqs_names_the_node_and_the_accepted_values() -> None:
    with pytest.raises(ConfigurationError) as caught:
        Redlock(["rediss://127.0.0.1:6380/0?ssl_cert_reqs=bogus"])
    _says(caught.value, "nodes[0]", "bogus", "required")


def test_a_unix_socket_that_does_not_exist_fails_at_acquire_naming_the_path(
    stack: Stack, tmp_path: Any
) -> None:
    path = tmp_path / "gone" / "redis.sock"
    redlock = Redlock([f"unix://{path}", *stack.nodes.urls[:2]], ttl=5)
    lease = redlock.acquire("bad:unix", blocking=False)  # 2 of 3 still make a quorum
    assert lease is not None
    lease.release()
    lonely = Redlock([f"unix://{path}"], ttl=5)
    try:
        with pytest.raises(QuorumUnavailable) as caught:
            lonely.acquire("bad:unix", blocking=False)
    finally:
        redlock.close()
        lonely.close()
    ((address, error),) = caught.value.errors.items()
    assert address == f"unix:{path}/0"
    assert isinstance(error, redis.ConnectionError)
    _says(caught.value, str(path), "No such file or directory", "a quorum of 1 nodes")


def test_separators_in_a_holder_survive_the_round_trip(stack: Stack) -> None:
    holder = "task|1@celery@host:a:7 {x}"
    redlock = Redlock(stack.nodes.urls, ttl=5)
    other = Redlock(stack.nodes.urls, ttl=5)  # another client: this one would be AlreadyHeld
    try:
        lease = redlock.acquire("bad:holder", blocking=False, holder=holder)
        assert lease is not None
        with pytest.raises(LockContended) as caught:
            other.try_acquire("bad:holder", blocking=False)
        assert caught.value.holder == holder
        assert redlock.holder("bad:holder").holder == holder
        lease.release()
    finally:
        redlock.close()
        other.close()


@pytest.mark.parametrize(("key", "holder"), [("bad:\udcff", None), ("k", "w\udcff")])
def test_an_unencodable_key_or_holder_is_a_configuration_error(
    stack: Stack, key: str, holder: Optional[str]
) -> None:
    redlock = Redlock(stack.nodes.urls, ttl=5)
    try:
        with pytest.raises(ConfigurationError, match="UTF-8"):
            redlock.acquire(key, blocking=False, holder=holder)
    finally:
        redlock.close()


def test_release_value_with_a_non_str_value_is_a_configuration_error(stack: Stack) -> None:
    redlock = Redlock(stack.nodes.urls, ttl=5)
    try:
        with pytest.raises(ConfigurationError, match="value"):
            redlock.release_value("bad:release", 123)  # type: ignore[arg-type]
    finally:
        redlock.close()


def test_a_template_value_ending_in_fence_is_a_lock_of_its_own(clean: Stack) -> None:
    fenced = clean.tasks["fenced"]
    assert isinstance(fenced.apply(args=("42", "x"), throw=True).get(), int)
    assert fenced.lock_key(("42", "x:fence")) == fenced.lock_key(("42", "x")) + ":fence"
    assert isinstance(fenced.apply(args=("42", "x:fence"), throw=True).get(), int)


# -- task arguments ----------------------------------------------------------------------------


def test_unicode_and_separators_in_arguments_make_distinct_working_locks(clean: Stack) -> None:
    tmpl = clean.tasks["tmpl"]
    calls = [
        ("Zürich", "東京"),
        ("a:b", "c"),
        ("a", "b:c"),
        ("x|y", "z"),
        ("{brace}", "w"),
        ("🔑", "end"),
        ("tab\there", "nul\x00"),
    ]
    keys = [tmpl.delay(c, p).get(timeout=10) for c, p in calls]
    assert len(set(keys)) == len(calls)
    assert keys[0] == "redlock:imp:Zürich:東京"
    assert re.fullmatch(r"redlock:imp:#[0-9a-f]{32}:c", keys[1])  # ':' before ':' is hashed
    assert keys[2] == "redlock:imp:a:b:c"
    assert keys[3] == "redlock:imp:x|y:z"
    assert re.fullmatch(r"redlock:imp:#[0-9a-f]{32}:w", keys[4])
    assert re.fullmatch(r"redlock:imp:#[0-9a-f]{32}:#[0-9a-f]{32}", keys[6])
    # Unicode dict keys and values: the enqueue-time key is the worker's.
    payload = {"ключ": ["значение", 1], "🔑": {"ü": None}, "a:b|c{d}": True}
    arg = clean.tasks["arg"]
    assert arg.delay(payload).get(timeout=10) == "ran"
    expected = arg.lock_key((payload,))
    assert re.fullmatch(r"redlock:t\.arg:[0-9a-f]{32}", expected)


def test_a_10_mb_argument_is_refused_in_under_2_s_naming_the_limit_and_the_way_out(
    clean: Stack,
) -> None:
    blob = "x" * (10 * 1024 * 1024)
    says = (
        "task 't.arg': argument 'payload' is 10485762 bytes as canonical JSON",
        "1048576-byte limit",
        WAY_OUT,
    )
    arg = clean.tasks["arg"]
    # CPU time of this thread, which apply() runs in: a loaded machine stretches the
    # wall clock, not the work done before the refusal.
    began = time.thread_time()
    with pytest.raises(LockKeyError) as caught:
        arg.apply(args=(blob,), throw=True)
    took = time.thread_time() - began
    assert took < 2.0, took
    _says(caught.value, *says)
    # Through the broker, the worker refuses it the same way and serves on (`clean`).
    error = _failure(arg.delay(blob), timeout=30)
    assert isinstance(error, LockKeyError)
    _says(error, *says)


def test_the_setting_named_by_the_size_limit_error_can_be_set(clean: Stack) -> None:
    with settings(clean.app, {"redlock_key_max_bytes": 32 << 20}):
        assert clean.tasks["arg"].apply(args=("x" * (2 << 20),), throw=True).get() == "ran"


@pytest.mark.parametrize(
    ("payload", "path", "says"),
    [
        (float("nan"), "'payload'", "is nan; NaN and infinity have no JSON form"),
        ([[0, float("-inf")]], "'payload[0][1]'", "is -inf; NaN and infinity"),
        ("deep", "'payload[0][0][0][0][0][0][0][0][0][0][0][0]...'", "nests containers deeper"),
    ],
    ids=["nan", "nested -inf", "500 levels deep"],
)
def test_an_argument_json_carries_but_a_key_cannot_fails_the_task_by_name(
    clean: Stack, payload: Any, path: str, says: str
) -> None:
    if payload == "deep":
        payload = []
        for _ in range(500):
            payload = [payload]
    error = _failure(clean.tasks["arg"].delay(payload))
    assert isinstance(error, LockKeyError), error
    _says(error, "task 't.arg'", f"argument {path} {says}", ACCEPTED_VALUES, WAY_OUT)


def test_recursion_far_deeper_than_python_allows_is_refused_at_once(clean: Stack) -> None:
    payload: list[Any] = []
    for _ in range(200_000):
        payload = [payload]
    began = time.thread_time()  # CPU time, as above: load does not stretch it
    with pytest.raises(LockKeyError) as caught:
        clean.tasks["arg"].apply(args=(payload,), throw=True)
    assert time.thread_time() - began < 2.0
    _says(caught.value, "deeper than 100 levels", ACCEPTED_VALUES, WAY_OUT)


@contextmanager
def published() -> Iterator[list[str]]:
    """Names of the tasks published while the block runs."""
    names: list[str] = []

    def receiver(sender: Any = None, **_: Any) -> None:
        names.append(str(sender))

    after_task_publish.connect(receiver, weak=False)
    try:
        yield names
    finally:
        after_task_publish.disconnect(receiver)


def test_a_set_argument_to_a_queue_once_task_fails_the_caller_and_publishes_nothing(
    clean: Stack,
) -> None:
    with published() as sent, pytest.raises(LockKeyError) as caught:
        clean.tasks["queued"].delay({1, 2})
    assert sent == []
    _says(caught.value, "task 't.queued'", "argument 'payload' is a set", ACCEPTED_VALUES)


def test_an_object_argument_fails_the_caller_at_serialization_and_publishes_nothing(
    clean: Stack,
) -> None:
    """Not the lock's doing: Celery's JSON serializer refuses it first."""
    with published() as sent, pytest.raises(EncodeError, match="not JSON serializable"):
        clean.tasks["arg"].delay(object())
    assert sent == []


# -- CLI arguments -----------------------------------------------------------------------------


def invoke(stack: Stack, *args: str) -> Result:
    app = Celery("bad_cli", broker="memory://", set_as_current=False)
    app.conf.redlock_nodes = stack.nodes.urls
    obj = CLIContext(app=app, no_color=True, workdir=None)
    return CliRunner().invoke(redlock_cli, list(args), obj=obj, catch_exceptions=False)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("doctor", "--timeout", "abc"), "Invalid value for '--timeout': 'abc' is not a valid"),
        (("ls", "--timeout", "0"), "'--timeout': 0.0 is not in the range x>=0.001"),
        (("show", "k", "--timeout", "-1"), "'--timeout': -1.0 is not in the range x>=0.001"),
        (("ls", "--limit", "0"), "Invalid value for '--limit': 0 is not in the range x>=1"),
        (("ls", "--limit", "many"), "Invalid value for '--limit': 'many' is not a valid"),
        (("release", "k", "--token", "   "), "Invalid value for '--token': must not be empty"),
        (("show",), "Missing argument 'KEY'"),
    ],
    ids=["timeout-word", "timeout-zero", "timeout-negative", "limit-zero", "limit-word",
         "token-blank", "show-without-key"],
)  # fmt: skip
def test_a_bad_cli_argument_is_a_usage_error_naming_the_option(
    stack: Stack, args: tuple[str, ...], says: str
) -> None:
    result = invoke(stack, *args)
    assert result.exit_code == 2, result.output
    assert says in result.output and "Usage:" in result.output


@pytest.mark.parametrize("command", [("ls",), ("doctor",)])
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_non_finite_cli_timeout_is_a_usage_error(
    stack: Stack, command: tuple[str, ...], value: str
) -> None:
    result = invoke(stack, *command, "--timeout", value)
    assert result.exit_code == 2 and "'--timeout'" in result.output, result.output
