"""Lock keys: one key per distinct call, the same at enqueue time and after Celery's JSON."""

from __future__ import annotations

import datetime as dt
import json
import re
import uuid
from decimal import Decimal
from typing import Any, Callable, Optional

import pytest
from celery import Celery
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from kombu.utils import json as kombu_json

from celery_redlock.errors import ConfigurationError, LockKeyError
from celery_redlock.tasks.keys import KeySpec, lock_key, validate_spec

TASK = "proj.tasks.import_customer"
# Celery's default json serializer (kombu's functions are untyped).
kombu_dumps: Callable[[Any], str] = kombu_json.dumps
kombu_loads: Callable[[str], Any] = kombu_json.loads

HASHED_KEY = re.compile(r"redlock:proj\.tasks\.import_customer:[0-9a-f]{32}")

quick = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def two(a: Any, b: Any = 2) -> None: ...


def spread(a: Any, *rest: Any, flag: bool = False, **extra: Any) -> None: ...


def key(*args: Any, spec: KeySpec = None, run: Callable[..., Any] = two, **kwargs: Any) -> str:
    return lock_key(TASK, run, args, kwargs, spec=spec)


def round_trip(value: Any) -> Any:
    """What a worker receives from Celery's default json serializer."""
    return kombu_loads(kombu_dumps(value))


# -- binding --------------------------------------------------------------------------


def test_positional_keyword_and_reordered_calls_share_a_key() -> None:
    assert key(1, b=3) == key(a=1, b=3) == key(b=3, a=1) == key(1, 3)
    assert HASHED_KEY.fullmatch(key(1, b=3))


def test_defaults_are_applied() -> None:
    assert key(1) == key(1, 2) == key(a=1, b=2)
    assert key(1) != key(1, 3)


def test_var_positional_and_var_keyword_arguments_are_part_of_the_key() -> None:
    base = key(1, 2, 3, run=spread, x=1, y=2)
    assert base == key(1, 2, 3, run=spread, y=2, x=1)
    assert base == key(1, 2, 3, run=spread, y=2, x=1, flag=False)
    assert base != key(1, 2, run=spread, x=1, y=2)
    assert base != key(1, 2, 3, run=spread, x=1)
    assert base != key(1, 2, 3, run=spread, x=1, y=2, flag=True)
    # *rest and **extra are distinct places: (2,) positional is not extra={"rest": ...}
    assert key(1, 2, run=spread) != key(1, run=spread, rest=[2])


def test_self_of_a_bound_run_method_is_not_an_argument() -> None:
    class ImportCustomer:
        def run(self, a: Any, b: int = 2) -> None: ...

    run = ImportCustomer().run
    assert lock_key(TASK, run, (1,), {}) == lock_key(TASK, run, (), {"a": 1, "b": 2})
    assert lock_key(TASK, run, (1,), {}) == key(1)  # same arguments as two(a, b=2)
    # another instance (another process's task object) gives the same key
    assert lock_key(TASK, ImportCustomer().run, (1,), {}) == key(1)


def test_a_bind_true_celery_task_run_excludes_self() -> None:
    app = Celery("keys-test", set_as_current=False)

    def body(self: Any, a: Any, b: int = 2) -> None: ...

    task: Any = app.task(bind=True, name=TASK)(body)
    assert lock_key(task.name, task.run, [1], {}) == key(1) == key(a=1, b=2)


def test_the_prefix_leads_the_key() -> None:
    assert lock_key(TASK, two, (1,), {}, prefix="locks/v2").startswith(f"locks/v2:{TASK}:")


# -- argument names -------------------------------------------------------------------


def test_listed_names_ignore_the_other_arguments() -> None:
    assert key(1, 2, spec=["a"]) == key(1, 3, spec=["a"]) == key(a=1, b=object(), spec=("a",))
    assert key(1, 2, spec=["a"]) != key(2, 2, spec=["a"])
    assert HASHED_KEY.fullmatch(key(1, spec=["a"]))
    assert key(1, 2, spec=["a", "b"]) == key(1, 2, spec=["b", "a"]) == key(1, 2)


def test_an_empty_name_list_gives_one_key_per_task() -> None:
    assert key(1, spec=[]) == key(2, 3, spec=[])
    assert lock_key("other.task", two, (1,), {}, spec=[]) != key(1, spec=[])


def test_listed_names_may_be_keys_of_var_keyword() -> None:
    assert key(1, run=spread, spec=["customer"], customer=7, noise=1) == key(
        2, run=spread, spec=["customer"], customer=7
    )


# -- templates ------------------------------------------------------------------------


def test_a_template_renders_the_arguments() -> None:
    assert key(42, spec="import:{a}") == "redlock:import:42"
    assert key(a="acme", b=False, spec="import:{a}/{b}") == "redlock:import:acme/False"
    assert key(7, spec="nightly") == "redlock:nightly"
    assert key("x", run=spread, spec="{a}:{region}", region="eu") == "redlock:x:eu"
    u = uuid.UUID(int=5)
    assert key(u, spec="u:{a}") == f"redlock:u:{u}"
    assert key(1, spec="{{literal}}:{a}") == "redlock:{literal}:1"


def test_tasks_with_the_same_template_share_a_key() -> None:
    def other(customer: int, full: bool = False) -> None: ...

    spec = "import:{a}"
    assert lock_key("t1", two, (42,), {}, spec=spec) == lock_key(
        "t2", lambda a, c=1: None, (42, 9), {}, spec=spec
    )
    assert lock_key("t1", two, (42,), {}, spec=spec) == lock_key(
        "t3", other, (42,), {"full": True}, spec="import:{customer}"
    )


def test_a_template_hashes_values_that_are_not_short_safe_text() -> None:
    hashed = re.compile(r"redlock:v:#[0-9a-f]{32}")
    for value in ("has space", "", "#x", "{x}", "x" * 65, 10**70, 1.5, None, [1], {"a": 1}):
        assert hashed.fullmatch(key(value, spec="v:{a}")), value
    assert key("x" * 64, spec="v:{a}") == "redlock:v:" + "x" * 64


def test_template_text_never_passes_for_a_hashed_value() -> None:
    hashed = key([1], spec="v:{a}")
    part = hashed.removeprefix("redlock:v:")
    assert key(part, spec="v:{a}") != hashed


def test_a_value_holding_the_character_after_its_field_is_hashed() -> None:
    # without that rule both would read "x:y:z"
    assert key("x:y", "z", spec="{a}:{b}") != key("x", "y:z", spec="{a}:{b}")
    assert key("x", "y:z", spec="{a}:{b}") == "redlock:x:y:z"
    assert key("a-b", 1, spec="{a}-{b}") != key("a", "b-1", spec="{a}-{b}")


def test_a_template_field_left_at_an_uncanonical_default_is_stable() -> None:
    sentinel = object()

    def run(a: Any, b: Any = sentinel) -> None: ...

    assert key(1, run=run, spec="v:{b}") == key(1, run=run, spec="v:{b}", b=sentinel)
    assert key(1, run=run) == key(1, sentinel, run=run)
    assert key(1, run=run) != key(1, None, run=run)


# -- callables ------------------------------------------------------------------------


def test_a_callable_gets_the_call_as_made() -> None:
    seen: list[tuple[Any, ...]] = []

    def name(*args: Any, **kwargs: Any) -> str:
        seen.append((args, kwargs))
        return f"import:{kwargs.get('a', args[0] if args else None)}"

    assert key(42, b=1, spec=name) == "redlock:import:42"
    assert seen == [((42,), {"b": 1})]


def test_long_or_unsafe_callable_results_are_hashed() -> None:
    hashed = re.compile(r"redlock:#[0-9a-f]{32}")
    for result in ("x" * 201, "has space", "#" + "0" * 32, "tab\there"):
        assert hashed.fullmatch(key(1, spec=lambda *a, r=result, **k: r)), result
    assert key(1, spec=lambda *a, **k: "x" * 200) == "redlock:" + "x" * 200
    assert key(1, spec=lambda *a, **k: "#" + "0" * 32) != "redlock:#" + "0" * 32


# -- canonical values -----------------------------------------------------------------


def test_tuples_and_lists_share_a_key() -> None:
    assert key((1, (2, 3)), {"x": (4,)}) == key([1, [2, 3]], {"x": [4]})


def test_dict_keys_key_as_json_writes_them() -> None:
    # after Celery's JSON the worker has {"1": "x"}: the enqueue-time key must agree
    assert key({1: "x", None: 2, 1.5: 3}) == key({"1": "x", "null": 2, "1.5": 3})
    assert key({True: 1, False: 0}) == key({"true": 1, "false": 0})
    assert key({2: "a", 10: "b"}) == key(round_trip({2: "a", 10: "b"}))  # sorted as str


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ({"a": "1_b-2"}, {"a": 1, "b": 2}),
        ({"a": True}, {"a": 1}),
        ({"a": 1}, {"a": "1"}),
        ({"a": 1}, {"a": 1.0}),
        ({"a": ""}, {"a": None}),
        ({"a": []}, {"a": {}}),
        ({"a": []}, {"a": None}),
        ({"a": 0.0}, {"a": -0.0}),
        ({"a": b"x"}, {"a": "x"}),
        ({"a": Decimal("1.0")}, {"a": Decimal("1.00")}),
        ({"a": Decimal("1E+2")}, {"a": Decimal("100")}),
        ({"a": dt.date(2024, 1, 2)}, {"a": "2024-01-02"}),
        ({"a": uuid.UUID(int=1)}, {"a": uuid.UUID(int=1).hex}),
        ({"a": {"__type__": "date"}}, {"a": dt.date(2024, 1, 2)}),
        ({"a": [1, 2]}, {"a": [2, 1]}),
        ({"a": "x", "b": "y"}, {"a": "y", "b": "x"}),
    ],
)
def test_distinct_arguments_give_distinct_keys(one: dict[str, Any], other: dict[str, Any]) -> None:
    assert key(**one) != key(**other)
    assert key(run=spread, **one, flag=True) != key(run=spread, **other, flag=True)


def test_enum_arguments_key_as_their_json_value() -> None:
    import enum

    class Color(str, enum.Enum):
        RED = "red"

    class Level(enum.IntEnum):
        HIGH = 3

    assert key(Color.RED, Level.HIGH) == key("red", 3) == key(*round_trip([Color.RED, Level.HIGH]))
    assert key(Color.RED, spec="c:{a}") == "redlock:c:red"


def test_lone_surrogates_survive_the_round_trip() -> None:
    assert key("\ud800x") == key(round_trip("\ud800x"))
    assert key("\ud800x") != key("\ud801x")


# -- properties -----------------------------------------------------------------------

_ZONES = st.sampled_from(
    [
        None,
        dt.timezone.utc,
        dt.timezone(dt.timedelta(hours=5, minutes=30)),
        dt.timezone(-dt.timedelta(hours=8)),
    ]
)
_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6)
    | st.datetimes(timezones=_ZONES)
    | st.dates()
    | st.times(timezones=_ZONES)
    | st.uuids()
    | st.decimals(allow_nan=False, allow_infinity=False)
    | st.binary(max_size=6)
)
_DICT_KEYS = st.text(max_size=3) | st.integers(-3, 3) | st.booleans() | st.none() | st.just(0.5)


def _json_keys_distinct(value: dict[Any, Any]) -> bool:
    return len({json.dumps({k: 0}) for k in value}) == len(value)


JSONISH = st.recursive(
    _LEAVES,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(_DICT_KEYS, inner, max_size=3).filter(_json_keys_distinct)
    ),
    max_leaves=8,
)


def strict(value: Any) -> Any:
    """A hashable identity that tells apart what a task can tell apart (1, 1.0, True)."""
    if isinstance(value, (list, tuple)):
        return ("list", tuple(strict(v) for v in value))
    if isinstance(value, dict):
        return ("dict", frozenset((k, strict(v)) for k, v in value.items()))
    if isinstance(value, float):
        return ("float", repr(value))
    if isinstance(value, (dt.date, dt.time)):
        return (type(value).__name__, value.isoformat())
    return (type(value).__name__, str(value) if isinstance(value, Decimal) else value)


@quick
@given(
    args=st.lists(JSONISH, min_size=1, max_size=4),
    kwargs=st.dictionaries(st.text(max_size=4), JSONISH, max_size=3),
)
def test_the_enqueue_time_key_equals_the_key_after_celerys_json(
    args: list[Any], kwargs: dict[str, Any]
) -> None:
    assume("a" not in kwargs and "flag" not in kwargs)
    enqueued = lock_key(TASK, spread, tuple(args), kwargs)
    assert enqueued == lock_key(TASK, spread, round_trip(args), round_trip(kwargs))
    name = lambda *a, **k: "fixed"  # noqa: E731
    for spec in (["a", "rest"], "t:{a}", name):
        assert lock_key(TASK, spread, tuple(args), kwargs, spec=spec) == lock_key(
            TASK, spread, round_trip(args), round_trip(kwargs), spec=spec
        )


@quick
@given(first=st.tuples(JSONISH, JSONISH), second=st.tuples(JSONISH, JSONISH))
def test_keys_are_equal_exactly_when_the_delivered_arguments_are(
    first: tuple[Any, Any], second: tuple[Any, Any]
) -> None:
    one, other = key(*first), key(*second)
    same = strict(round_trip(list(first))) == strict(round_trip(list(second)))
    assert (one == other) is same
    assert len(one) <= len("redlock") + len(TASK) + 2 + 32


_TRICKY_TEXT = st.text(alphabet="ab:#-_ {}0123456789", max_size=40)
_TEMPLATE_VALUES = (
    _TRICKY_TEXT
    | st.integers()
    | st.booleans()
    | st.none()
    | st.uuids()
    | st.lists(st.integers(0, 2), max_size=2)
)


def _text(value: Any) -> Optional[str]:
    return str(value) if isinstance(value, (str, int, uuid.UUID)) else None


def _same_part(one: Any, other: Any) -> bool:
    """Template parts may coincide only for equal values, or the documented case of
    equal text (42 and "42", True and "True", a UUID and its str)."""
    return strict(one) == strict(other) or (_text(one) is not None and _text(one) == _text(other))


@quick
@given(
    first=st.tuples(_TEMPLATE_VALUES, _TEMPLATE_VALUES),
    second=st.tuples(_TEMPLATE_VALUES, _TEMPLATE_VALUES),
)
def test_template_keys_never_collide_for_different_values(
    first: tuple[Any, Any], second: tuple[Any, Any]
) -> None:
    assume(all(abs(v) < 10**60 for v in (*first, *second) if isinstance(v, int)))
    for spec in ("t:{a}:{b}", "{a}-{b}", "{a}#{b}", "{a}b{b}"):
        one, other = key(*first, spec=spec), key(*second, spec=spec)
        if strict(first) == strict(second):
            assert one == other
        if one == other:
            assert _same_part(first[0], second[0]) and _same_part(first[1], second[1])
        assert len(one) <= len("redlock:") + len(spec) + 2 * 64


# -- errors ---------------------------------------------------------------------------


def _recursive_list() -> list[Any]:
    items: list[Any] = [1]
    items.append(items)
    return items


def _recursive_dict() -> dict[str, Any]:
    mapping: dict[str, Any] = {}
    mapping["self"] = mapping
    return mapping


def _deep() -> list[Any]:
    nested: list[Any] = []
    for _ in range(5000):
        nested = [nested]
    return nested


@pytest.mark.parametrize(
    ("value", "argument", "says"),
    [
        (object(), "'a'", "object"),
        ({1, 2}, "'a'", "set"),
        ({"items": [0, 1, 2, {"when": {1}}]}, "'a.items[3].when'", "set"),
        (float("nan"), "'a'", "NaN"),
        ([float("inf")], "'a[0]'", "infinity"),
        (Decimal("NaN"), "'a'", "finite"),
        (bytearray(b"x"), "'a'", "bytearray"),
        (_recursive_list(), "'a[1]'", "recursive"),
        (_recursive_dict(), "'a.self'", "recursive"),
        (_deep(), "'a[0]", "deeper"),
        ({1: "x", "1": "y"}, "'a'", "one key"),
        ({(1, 2): "x"}, "'a[(1, 2)]'", "key"),
        ({"__type__": "x", "__value__": 1}, "'a'", "__type__"),
        (10**5000, "'a'", "JSON"),
    ],
    ids=lambda value: type(value).__name__ if not isinstance(value, str) else value[:20],
)
def test_an_argument_without_canonical_form_is_refused_by_name(
    value: Any, argument: str, says: str
) -> None:
    with pytest.raises(LockKeyError) as caught:
        key(value)
    message = str(caught.value)
    assert TASK in message and argument in message and says in message, message
    # a template or a name list that leaves it out does not care
    assert key(value, 1, spec=["b"]) == key(None, 1, spec=["b"])
    with pytest.raises(LockKeyError, match=re.escape(TASK)):
        key(value, spec="v:{a}")


def test_an_oversized_argument_is_refused_with_the_way_out() -> None:
    with pytest.raises(LockKeyError) as caught:
        lock_key(TASK, two, ("x" * 2000, "y"), {}, max_bytes=1000)
    message = str(caught.value)
    assert TASK in message and "'a' is 2002 bytes" in message and "template" in message
    assert lock_key(TASK, two, ("x" * 2000, "y"), {}, spec=["b"], max_bytes=1000)


@pytest.mark.parametrize(
    ("args", "kwargs", "says"),
    [
        ((), {}, "missing a required argument: 'a'"),
        ((1, 2, 3), {}, "too many positional arguments"),
        ((1,), {"c": 3}, "unexpected keyword argument 'c'"),
        ((1,), {"a": 3}, "multiple values for argument 'a'"),
    ],
)
def test_arguments_that_do_not_bind_are_refused(
    args: tuple[Any, ...], kwargs: dict[str, Any], says: str
) -> None:
    for spec in (None, ["a"], "v:{a}"):
        with pytest.raises(LockKeyError, match=re.escape(TASK)) as caught:
            lock_key(TASK, two, args, kwargs, spec=spec)
        assert says in str(caught.value)


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("v:{zz}", "'zz'"),
        ("v:{}", "positional field {}"),
        ("v:{0}", "positional field {0}"),
        ("v:{a.real}", "attribute and index access"),
        ("v:{a[0]}", "attribute and index access"),
        ("v:{a!r}", "conversion or format spec"),
        ("v:{a:>5}", "conversion or format spec"),
        ("v:{a}{b}", "side by side"),
        ("v:{a", "not a valid template"),
        ("v: {a}", "whitespace"),
        ("", "empty template"),
        (["a", "zz"], "'zz'"),
        ([""], "not an argument name"),
        ([1], "not an argument name"),
        (42, "a callable"),
        (b"a", "a callable"),
    ],
)
def test_a_bad_spec_is_refused_at_setup_and_at_call_time(spec: Any, says: str) -> None:
    with pytest.raises(LockKeyError) as at_setup:
        validate_spec(TASK, two, spec)
    with pytest.raises(LockKeyError) as at_call:
        key(1, spec=spec)
    for caught in (at_setup, at_call):
        assert TASK in str(caught.value) and says in str(caught.value), caught.value
    if says == "'zz'":
        assert "accepted names: a, b" in str(at_setup.value)
        assert "accepted names: a, b" in str(at_call.value)


def test_validate_spec_catches_what_only_setup_can_see() -> None:
    with pytest.raises(LockKeyError, match=r"template without fields.*'\{a\}'.*\['a'\]"):
        validate_spec(TASK, two, "a")
    with pytest.raises(LockKeyError, match="more than once"):
        validate_spec(TASK, two, ["a", "a"])


@pytest.mark.parametrize(
    "spec", [None, "import:{a}:{b}", "nightly", ["a"], [], ("b", "a"), lambda *a, **k: "x"]
)
def test_validate_spec_accepts_good_specs(spec: KeySpec) -> None:
    validate_spec(TASK, two, spec)


def test_a_var_keyword_run_accepts_any_name_at_setup() -> None:
    validate_spec(TASK, spread, "v:{customer}")
    validate_spec(TASK, spread, ["customer"])
    with pytest.raises(LockKeyError, match=r"'customer', which was not passed.*\*\*extra"):
        key(1, run=spread, spec="v:{customer}")


def test_a_bad_callable_result_or_error_is_refused() -> None:
    for result in (5, "", None, b"x"):
        with pytest.raises(
            LockKeyError, match=rf"{re.escape(TASK)}.*non-empty str.*{re.escape(repr(result))}"
        ):
            key(1, spec=lambda *a, r=result, **k: r)

    def broken(*args: Any, **kwargs: Any) -> str:
        raise KeyError("customer")

    with pytest.raises(LockKeyError, match=rf"{re.escape(TASK)}.*broken raised KeyError") as caught:
        key(1, spec=broken)
    assert isinstance(caught.value.__cause__, KeyError)


@pytest.mark.parametrize("prefix", ["", "has space", "tab\t", 7, None])
def test_a_bad_prefix_is_refused_by_setting_name(prefix: Any) -> None:
    with pytest.raises(ConfigurationError, match=rf"{re.escape(TASK)}.*redlock_key_prefix"):
        lock_key(TASK, two, (1,), {}, prefix=prefix)


@pytest.mark.parametrize("max_bytes", [0, -1, True, 1.5])
def test_a_bad_max_bytes_is_refused_by_setting_name(max_bytes: Any) -> None:
    with pytest.raises(LockKeyError, match="redlock_key_max_bytes"):
        lock_key(TASK, two, (1,), {}, max_bytes=max_bytes)


def test_lock_key_errors_are_value_errors() -> None:
    with pytest.raises(ValueError):
        key(object())
