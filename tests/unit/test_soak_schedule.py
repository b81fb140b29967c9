"""``make soak``'s schedule and settings (no service: nothing is started)."""

from __future__ import annotations

import pytest

from bench import soak
from tests.faults._scenarios import SCENARIOS


def test_the_soak_runs_every_fault_of_both_stacks() -> None:
    replicated = {"leader_kill", "broker_stop", "two_brokers_stop", "broker_freeze"}
    others = {"pg_standby_promotion", "store_outage"}
    assert set(soak.EXPERIMENTS) == set(SCENARIOS) | replicated | others
    assert set(soak.STACK_OF) == set(soak.EXPERIMENTS)


def test_a_seed_gives_one_order_of_all_of_them() -> None:
    names = list(soak.EXPERIMENTS)
    first = soak.schedule(names, 31)
    assert first == soak.schedule(names, 31)
    assert sorted(first) == sorted(names)
    assert any(soak.schedule(names, seed) != first for seed in range(32, 40))


READERS = {"SOAK_EVENTS": soak._events, "SOAK_SEED": soak._seed, "SOAK_SCENARIOS": soak._chosen}


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("SOAK_EVENTS", "many", "not a whole number of events"),
        ("SOAK_EVENTS", "0", "must be positive"),
        ("SOAK_SEED", "x", "not a whole number"),
        ("SOAK_SCENARIOS", "relay_kill,nope", r"unknown experiments \['nope'\]"),
    ],
)
def test_bad_settings_are_refused_with_what_was_wrong(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, said: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SystemExit, match=said):
        READERS[variable]()


def test_small_sizes_are_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOAK_EVENTS", "50_000")
    monkeypatch.setenv("SOAK_SEED", "7")
    monkeypatch.setenv("SOAK_SCENARIOS", "relay_kill, store_outage")
    assert soak._events() == 50_000
    assert soak._seed() == 7
    assert soak._chosen() == ["relay_kill", "store_outage"]
