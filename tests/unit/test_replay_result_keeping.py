"""``replay --all`` keeps its results in batches, and a refused one run by run."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from agent_blackbox.cli.commands import replay as command
from agent_blackbox.replayer import ReplayReport
from agent_blackbox.schemas import BlackboxError


@dataclass
class _Results:
    """Replay results that refuse one run, as the database refuses a row."""

    refused: str | None = None
    kept: list[str] = field(default_factory=list)
    transactions: int = 0

    def record(self, report: ReplayReport, *, code_version: str | None) -> None:
        self.record_many([report], code_version=code_version)

    def record_many(self, reports: Sequence[ReplayReport], *, code_version: str | None) -> None:
        self.transactions += 1
        if any(r.run_id == self.refused for r in reports):
            raise BlackboxError(f"run {self.refused} is not in the views")
        self.kept.extend(r.run_id for r in reports)


@dataclass
class _Out:
    warnings: list[str] = field(default_factory=list)

    def warn(self, message: str) -> None:
        self.warnings.append(message)


def _keeper(results: _Results) -> Any:
    keeper = command._ResultKeeper("v1", None)
    keeper._results = results  # as the views' results would be wired
    return keeper


def _reports(count: int) -> list[ReplayReport]:
    return [ReplayReport(f"run-{i}", "a", 3) for i in range(count)]


def test_results_are_kept_a_batch_per_transaction_and_the_rest_at_close(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(command, "KEEP_BATCH", 4)
    results, out = _Results(), _Out()
    keeper = _keeper(results)
    for report in _reports(10):
        keeper.keep(report, out)
    assert (results.kept, results.transactions) == ([f"run-{i}" for i in range(8)], 2)
    keeper.close(out)
    assert results.kept == [f"run-{i}" for i in range(10)]
    assert (results.transactions, out.warnings) == (3, [])


def test_a_refused_batch_keeps_the_runs_before_the_refused_one_and_says_so_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(command, "KEEP_BATCH", 4)
    results, out = _Results(refused="run-5"), _Out()
    keeper = _keeper(results)
    for report in _reports(10):
        keeper.keep(report, out)
    keeper.close(out)
    assert results.kept == [f"run-{i}" for i in range(5)]
    assert out.warnings == ["replay results are not kept: run run-5 is not in the views"]


def test_a_run_that_was_not_found_to_read_is_not_kept_nor_warned_about() -> None:
    """A mistyped run id is one error, said once: not also a warning that its result
    cannot be kept (the views have no such run to keep it with)."""
    results, out = _Results(refused="typo"), _Out()
    keeper = _keeper(results)
    unread = ReplayReport("typo", None, 0, error="SourceError: run typo is not in the index")
    keeper.keep(unread, out)
    keeper.close(out)
    assert (results.kept, results.transactions, out.warnings) == ([], 0, [])
