"""A replay that diverges on values after handing back redacted results says so: code
that slices or compares a redacted value sees its placeholder in replay, and a user must
not take that for a change in the code."""

from __future__ import annotations

from typing import Any

import agent_blackbox as bb
from agent_blackbox.testing import MemoryRecorder

ADDRESS = "ada@example.org"


@bb.tool
def lookup(customer: str) -> str:
    return f"{customer} <{ADDRESS}>"


def passes_through(run: Any, customer: str) -> str:
    return lookup(customer)  # the redacted value goes out as it came in


def slices(run: Any, customer: str) -> str:
    return lookup(customer)[-12:]  # cuts into the address: differs from its placeholder


def _recorded(agent: Any) -> MemoryRecorder:
    recorder = MemoryRecorder()
    recorder.record(agent, bb.RunSnapshot(code_version="v1", input="c-1"), agent_id="a")
    return recorder


def test_a_redacted_value_passed_through_replays() -> None:
    recorder = _recorded(passes_through)
    assert bb.replay(recorder.events, passes_through).result == "PASS"


def test_a_divergence_after_a_redacted_result_names_it() -> None:
    recorder = _recorded(slices)
    report = bb.replay(recorder.events, slices)
    assert report.result == "DIVERGED"
    assert report.divergence is not None
    detail = report.divergence.detail
    assert "1 recorded event(s) handed back to the code had values redacted (email;" in detail
    assert "sequence 2)" in detail  # the tool call, after run.started
    assert ADDRESS not in detail


def test_a_divergence_without_redacted_results_says_nothing_of_redaction() -> None:
    @bb.tool
    def plain(customer: str) -> str:
        return customer.upper()

    def agent(run: Any, customer: str) -> str:
        return plain(customer)

    recorder = _recorded(agent)
    report = bb.replay(recorder.events, lambda run, customer: plain(customer) + "!")
    assert report.result == "DIVERGED"
    assert report.divergence is not None
    assert "redacted" not in report.divergence.detail
