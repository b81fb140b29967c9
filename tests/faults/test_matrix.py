"""The fault matrix, short form (issue 12, item 9): each scenario once, then the check.

Every scenario runs against the package's own Postgres and Kafka (see ``conftest.py``)
with real ``blackbox relay`` and ``blackbox consume`` processes and writer threads, and
ends with the same after-heal check: committed = published after deduplication, per-run
order, views exact, effects table = effect events, outbox empty, ``verify --all`` clean.
``make soak`` runs the same scenarios over a million events.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.faults._check import Figures
from tests.faults._harness import FaultStack
from tests.faults._scenarios import SCENARIOS

pytestmark = [pytest.mark.integration, pytest.mark.faults, pytest.mark.timeout(600)]

SHORT_EVENTS = 1_000
"""Events per scenario in the short form: enough for several batches per relay."""

Run = Callable[[str], Figures]


@pytest.fixture(scope="module")
def run_scenario(fault_stack: FaultStack, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """Runs a scenario once per module and keeps its figures for every test that asks."""
    done: dict[str, Figures] = {}
    logs = tmp_path_factory.mktemp("fault-logs")

    def run(name: str) -> Figures:
        if name not in done:
            done[name] = SCENARIOS[name](fault_stack, Path(logs), SHORT_EVENTS)
            print(done[name].json_line(), file=sys.stderr)
        return done[name]

    return run


def _holds(figures: Figures) -> None:
    problems = figures.problems()
    assert not problems, f"{figures.scenario}: {problems}; figures: {figures.json_line()}"
    assert figures.events >= SHORT_EVENTS


@pytest.mark.parametrize(
    "name",
    [
        "relay_kill",
        "two_relays",
        "paused_relay",
        "broker_kill",
        "postgres_stop",
        "consumer_kill",
        "held_transaction",
        "ambiguous_commit",
    ],
)
def test_every_guarantee_holds_after_heal(name: str, run_scenario: Run) -> None:
    _holds(run_scenario(name))


def test_a_killed_relays_shards_are_taken_over(run_scenario: Run) -> None:
    figures = run_scenario("relay_kill")
    assert len(figures.takeovers_s) >= 1


def test_an_ambiguous_commit_appends_its_event_once(run_scenario: Run) -> None:
    figures = run_scenario("ambiguous_commit")
    assert figures.notes["cuts"] > 0
    assert figures.committed_twice == 0


def test_a_paused_relays_copies_are_never_applied(run_scenario: Run) -> None:
    figures = run_scenario("paused_relay")
    assert figures.stale_applied == 0
    assert figures.views_exact


def test_a_paused_relays_copies_published_late_are_all_fenced_off(run_scenario: Run) -> None:
    """What the paused relay's producer had already queued may still go out when it is
    continued (librdkafka sends it before it notices the message timeout, and before the
    relay's own thread can purge it); each such copy carries the old lease epoch, and
    the readers' fence drops it."""
    figures = run_scenario("paused_relay")
    assert figures.stale_published <= figures.fenced, figures.json_line()


def test_a_paused_relay_does_not_stall_the_relay_that_took_over(run_scenario: Run) -> None:
    figures = run_scenario("paused_relay")
    assert figures.notes.get("stalled_takeovers", 0) == 0, figures.json_line()


def test_poison_messages_are_skipped_by_every_reader(run_scenario: Run) -> None:
    figures = run_scenario("poison")
    _holds(figures)  # the views and verify --all among them
    assert figures.undecodable == figures.notes["poison"] > 0
