"""The option table (celery_redlock/options.py) is the one declaration of every
setting and task option: the configuration page's table (docs/guides/configuration.md),
TaskOptions, the defaults and the task class attributes must all agree with it, and
settings are refused when validated."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest
from celery import Celery

from celery_redlock import ConfigurationError, RedlockTask
from celery_redlock.tasks.config import DEFAULTS, TASK_OPTIONS, TaskOptions, app_config
from celery_redlock.tasks.options import OPTIONS, TaskAttribute, configuration_table

CONFIGURATION_PAGE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "configuration.md"


def page_configuration_table() -> list[str]:
    """The first table of the configuration page, line by line."""
    lines = CONFIGURATION_PAGE.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return lines[start:end]


def test_configuration_page_table_matches_the_option_table() -> None:
    expected = configuration_table().splitlines()
    assert page_configuration_table() == expected, (
        "docs/guides/configuration.md's table disagrees with celery_redlock/tasks/options.py; "
        "replace it with the output of: python -c "
        "'from celery_redlock.tasks.options import configuration_table; "
        "print(configuration_table())'"
    )


def test_task_options_has_one_field_per_task_option_in_table_order() -> None:
    assert [f"redlock_{f.name}" for f in fields(TaskOptions)] == list(TASK_OPTIONS)


def test_defaults_and_task_options_come_from_the_table() -> None:
    assert {option.name: option.default for option in OPTIONS} == DEFAULTS
    assert tuple(o.name for o in OPTIONS if o.scope == "task") == TASK_OPTIONS


def test_every_task_option_is_a_documented_redlock_task_attribute_reading_none() -> None:
    for name in TASK_OPTIONS:
        attribute = vars(RedlockTask)[name]
        assert isinstance(attribute, TaskAttribute)
        assert attribute.__doc__ and attribute.option.doc in attribute.__doc__
        assert getattr(RedlockTask, name) is None


def test_the_table_defaults_pass_their_own_checks() -> None:
    app = Celery("defaults", broker="redis://127.0.0.1:1/0", set_as_current=False)
    config = app_config(app)
    assert config.key_prefix == DEFAULTS["redlock_key_prefix"]
    assert config.task_defaults.ttl == DEFAULTS["redlock_ttl"]
    for option in OPTIONS:
        if option.default is not None:
            option.check(option.name, option.default)


@pytest.mark.parametrize("prefix", ["lock\x01s", "locks\x7f", "tab\tbed", "\u200blocks"])
def test_a_key_prefix_with_a_control_character_is_refused_when_settings_are_validated(
    prefix: str,
) -> None:
    app = Celery("prefix", broker="memory://", set_as_current=False)
    app.conf.redlock_nodes = ["redis://127.0.0.1:1/0"]
    app.conf.redlock_key_prefix = prefix
    with pytest.raises(ConfigurationError, match="redlock_key_prefix") as caught:
        app_config(app)
    assert repr(prefix) in str(caught.value)


class DjangoSettings:
    """A Django-style settings module: upper case, Celery's under CELERY_."""

    DEBUG = True
    CELERY_BROKER_URL = "memory://"
    CELERY_REDLOCK_NODES = ("redis://127.0.0.1:1/0",)
    CELERY_REDLOCK_TTL = 7
    CELERY_REDLOCK_ON_CONTENDED = "skip"
    REDLOCK_EXTRA = "another library's setting, outside the namespace"


def _namespaced_app(**settings: object) -> Celery:
    app = Celery("django", set_as_current=False)
    app.config_from_object(type("Settings", (DjangoSettings,), settings), namespace="CELERY")
    return app


def test_namespaced_settings_are_read() -> None:
    app = _namespaced_app()
    config = app_config(app)
    assert config.nodes == ("redis://127.0.0.1:1/0",)
    assert config.task_defaults.ttl == 7
    assert config.task_defaults.on_contended == "skip"

    def job() -> None:
        return None

    task = app.task(shared=False, base=RedlockTask, name="t.namespaced")(job)
    assert task.redlock_options().ttl == 7


@pytest.mark.parametrize("typo", ["CELERY_REDLOCK_TTLL", "CELERY_redlock_ttl"])
def test_an_unknown_namespaced_setting_is_named_with_the_accepted_ones(typo: str) -> None:
    app = _namespaced_app(**{typo: 5})
    with pytest.raises(ConfigurationError, match=f"unknown setting '{typo}'") as caught:
        app_config(app)
    accepted = str(caught.value).split("accepted redlock settings: ", 1)[1].split(", ")
    assert "CELERY_REDLOCK_TTL" in accepted and "CELERY_REDLOCK_NODES" in accepted
    assert len(accepted) == len(DEFAULTS)


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("CELERY_REDLOCK_LIMIT", 0),
        ("CELERY_REDLOCK_RATE", "10/fortnight"),
        ("CELERY_REDLOCK_TTL", -1),
    ],
)
def test_a_bad_namespaced_value_is_named_as_the_settings_write_it(
    setting: str, value: object
) -> None:
    with pytest.raises(ConfigurationError, match=f"^{setting} must be ") as caught:
        app_config(_namespaced_app(**{setting: value}))
    assert str(caught.value).endswith(f"got {value!r}")


def test_a_namespaced_app_hears_of_every_setting_by_its_written_name() -> None:
    app = _namespaced_app(CELERY_REDLOCK_RETRY_BACKOFF=10, CELERY_REDLOCK_RETRY_BACKOFF_MAX=5)
    with pytest.raises(ConfigurationError) as caught:
        app_config(app)
    assert str(caught.value) == (
        "CELERY_REDLOCK_RETRY_BACKOFF_MAX (5.0s) must be >= CELERY_REDLOCK_RETRY_BACKOFF (10.0s)"
    )


def test_a_plain_redlock_setting_is_still_checked_under_a_namespace() -> None:
    app = _namespaced_app()
    app.conf.redlock_ttll = 5
    with pytest.raises(ConfigurationError, match="unknown setting 'redlock_ttll'"):
        app_config(app)
