"""How long a silent running run waits before retention marks it abandoned."""

from __future__ import annotations

from datetime import timedelta

import pytest

from agent_blackbox.consumers._retention import (
    RetentionConfigError,
    RetentionPolicy,
    abandon_after_from_env,
)


def test_a_day_by_default_and_hours_from_the_environment() -> None:
    assert abandon_after_from_env({}) == timedelta(hours=24)
    assert abandon_after_from_env({"BLACKBOX_ABANDON_AFTER_HOURS": "1.5"}) == timedelta(minutes=90)


@pytest.mark.parametrize("raw", ["0", "-3", "soon", "nan", "inf"])
def test_anything_but_a_positive_number_is_refused_naming_the_variable(raw: str) -> None:
    with pytest.raises(RetentionConfigError, match="BLACKBOX_ABANDON_AFTER_HOURS"):
        abandon_after_from_env({"BLACKBOX_ABANDON_AFTER_HOURS": raw})


def test_an_undefined_class_gets_the_standard_periods() -> None:
    policy = RetentionPolicy.from_env({})
    made_up = policy.for_unknown("keep-forever")
    assert made_up.name == "keep-forever"
    assert (made_up.bodies, made_up.metadata) == (timedelta(days=30), timedelta(days=400))


def test_without_a_standard_class_an_undefined_one_gets_the_shortest_periods() -> None:
    policy = RetentionPolicy.from_mapping(
        {
            "short": {"bodies_days": 3, "metadata_days": 900},
            "long": {"bodies_days": 90, "metadata_days": 100},
        }
    )
    made_up = policy.for_unknown("x")
    assert (made_up.bodies, made_up.metadata) == (timedelta(days=3), timedelta(days=100))


def test_a_policy_without_any_class_is_refused() -> None:
    with pytest.raises(RetentionConfigError, match="defines no class"):
        RetentionPolicy.from_mapping({})


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        (
            {"bodies_days": "1", "metadata_days": 400},
            "bodies_days must be a whole number of days ('1', a str)",
        ),
        ({"bodies_days": 1.5, "metadata_days": 400}, "(1.5, a float)"),
        ({"bodies_days": True, "metadata_days": 400}, "(True, a bool)"),
        ({"bodies_days": 7}, "metadata_days must be a whole number of days (missing)"),
        ({"body_days": 7, "metadata_days": 400}, "unknown key 'body_days'"),
        ([7, 400], "must be an object"),
    ],
)
def test_a_class_is_whole_days_under_its_two_keys(spec: object, says: str) -> None:
    with pytest.raises(RetentionConfigError) as raised:
        RetentionPolicy.from_mapping({"standard": spec})
    assert says in str(raised.value)
    assert "'standard'" in str(raised.value)
