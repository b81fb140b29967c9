"""How long a silent running run waits before retention marks it abandoned."""

from __future__ import annotations

from datetime import timedelta

import pytest

from agent_blackbox.consumers._retention import RetentionConfigError, abandon_after_from_env


def test_a_day_by_default_and_hours_from_the_environment() -> None:
    assert abandon_after_from_env({}) == timedelta(hours=24)
    assert abandon_after_from_env({"BLACKBOX_ABANDON_AFTER_HOURS": "1.5"}) == timedelta(minutes=90)


@pytest.mark.parametrize("raw", ["0", "-3", "soon", "nan", "inf"])
def test_anything_but_a_positive_number_is_refused_naming_the_variable(raw: str) -> None:
    with pytest.raises(RetentionConfigError, match="BLACKBOX_ABANDON_AFTER_HOURS"):
        abandon_after_from_env({"BLACKBOX_ABANDON_AFTER_HOURS": raw})
