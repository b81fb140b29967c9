"""An experiment run in memory: recorded runs of the example agent, forked with a
changed prompt by a model stand-in, scored, kept in a store, summed up, and read back."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

import pytest

from agent_blackbox.examples.ticket_agent import (
    PROMPT,
    KeywordModel,
    Notifier,
    OfflineNotifier,
    SampleTickets,
    TicketAgent,
)
from agent_blackbox.outbox import MemoryRecorder, RunSnapshot
from agent_blackbox.replayer import (
    Experimenter,
    ExperimentPlan,
    ExperimentReport,
    ForkVariant,
    Opening,
    RunResult,
    SelectedRun,
    load_scorer,
    run_experiment,
)
from agent_blackbox.replayer._experiment import shown_changes, shown_url
from agent_blackbox.replayer._outcomes import OutcomeError, recorded_outcome
from agent_blackbox.schemas import BlackboxError, Envelope, PayloadPipeline

LOUD = "Answer in capitals."


class PromptedModel(KeywordModel):
    """The example agent's stand-in model, shouting its summary under :data:`LOUD`, and
    counting the prompt it was given (a longer one costs more)."""

    def complete(self, request: Mapping[str, Any]) -> dict[str, Any]:
        reply = super().complete(request)
        words = sum(len(str(m["content"]).split()) for m in request["messages"])
        reply["usage"]["prompt_tokens"] = words
        if LOUD in request["messages"][0]["content"]:
            answer = json.loads(reply["choices"][0]["message"]["content"])
            answer["summary"] = answer["summary"].upper()
            reply["choices"][0]["message"]["content"] = json.dumps(answer)
        return reply


def factory(snapshot: RunSnapshot, *, base_url: str, api_key: str) -> Callable[..., Any]:
    """A fork factory over :class:`PromptedModel` (no endpoint is called)."""
    agent = TicketAgent.from_snapshot(
        snapshot, tickets=SampleTickets(), model=PromptedModel(), notifier=OfflineNotifier()
    )
    return agent.run


def broken_factory(snapshot: RunSnapshot, *, base_url: str, api_key: str) -> Callable[..., Any]:
    raise RuntimeError("the code under test does not build")


@dataclass
class MemoryStore:
    """An :class:`ExperimentStore` that remembers what it was told, in order."""

    calls: list[tuple[str, Any]] = field(default_factory=list)

    def begin(self, plan: ExperimentPlan) -> None:
        self.calls.append(("begin", plan.experiment_id))

    def record(self, experiment_id: str, result: RunResult) -> None:
        self.calls.append(("record", result))

    def end(self, experiment_id: str, status: str) -> None:
        self.calls.append(("end", status))


def _recorded(count: int) -> dict[str, list[Envelope]]:
    recorder = MemoryRecorder()
    agent = TicketAgent(SampleTickets(), PromptedModel(), Notifier())
    for index in range(count):
        snapshot = replace(agent.snapshot(f"T-{index:05d}"), tags={"prompt_version": "v1"})
        recorder.record(agent.run, snapshot, agent_id="ticket-agent")
    runs: dict[str, list[Envelope]] = {}
    for envelope in recorder.events:
        runs.setdefault(envelope.run_id, []).append(envelope)
    return runs


def _pricing(provider: str, model: str, usage: Any) -> Decimal | None:
    tokens = (usage or {}).get("prompt_tokens")
    return None if tokens is None else Decimal(tokens) / 1000


def _experiment(
    runs: Mapping[str, Sequence[Envelope]], made: Callable[..., Any], specs: Sequence[str]
) -> tuple[ExperimentPlan, Experimenter]:
    variant = ForkVariant(
        factory=made,
        factory_name="tests:factory",
        base_url="http://user:secret@model.invalid/v1?key=k",
        api_key="sk-never-kept",
        changes={"prompt": f"{PROMPT} {LOUD}", "tag.prompt_version": "v2"},
        in_memory=True,
    )

    def events(run_id: str) -> Sequence[Envelope]:
        if run_id == "missing":
            raise BlackboxError("run missing is not in the topic")
        return runs[run_id]

    scorers = tuple(load_scorer(spec) for spec in specs)
    plan = ExperimentPlan(
        experiment_id="x1",
        name="loud",
        runs=tuple(SelectedRun(run_id, "default") for run_id in [*runs, "missing"]),
        selection={"agent": "ticket-agent"},
        variant=variant.describe(),
        evaluators=tuple(s.name for s in scorers),
    )
    experimenter = Experimenter(
        variant=variant,
        scorers=scorers,
        events=events,
        reading=Opening(PayloadPipeline()),
        pricing=_pricing,
    )
    return plan, experimenter


def test_each_run_is_forked_scored_kept_and_summed_up() -> None:
    runs = _recorded(4)
    plan, experimenter = _experiment(runs, factory, ["success", "equality=$.received_at", "cost"])
    store = MemoryStore()
    seen: list[RunResult] = []
    report = run_experiment(plan, experimenter, store, workers=2, done=seen.append)

    assert store.calls[0] == ("begin", "x1")
    assert store.calls[-1] == ("end", "finished")
    kept = [result for kind, result in store.calls if kind == "record"]
    assert sorted(r.run_id for r in kept) == sorted([*runs, "missing"])
    assert seen == kept
    by_run = {r.run_id: r for r in report.results}
    assert by_run["missing"].outcome == "not_run"
    assert by_run["missing"].error == "BlackboxError: run missing is not in the topic"
    assert by_run["missing"].reason == (  # what the views keep: no message
        "BlackboxError; the message is not kept (blackbox experiment run shows it)"
    )
    scored = [r for r in report.results if r.outcome == "scored"]
    assert len(scored) == 4
    for result in scored:
        scores = {p.score: (p.baseline, p.variant) for p in result.scores}
        assert scores["succeeded"] == (1.0, 1.0)
        assert scores["output_equal"] == (1.0, 0.0)  # the summary is in capitals now
        assert scores["output_fields_equal"] == (1.0, 0.75)  # 1 of 4 fields
        before, after = scores["cost_usd"]
        assert before is not None
        assert after is not None
        assert after > before
        assert result.fork_status == "succeeded"
        assert result.fork_run_id not in runs

    summary = {s.score: s for s in report.summaries}
    assert summary["output_equal"].verdict == "worse"
    assert summary["output_equal"].difference.value == -1.0
    assert report.exit_code(fail_on_regression=False) == 2  # a run was not run
    assert report.exit_code(fail_on_regression=True) == 1  # ...but regressions come first
    document = report.to_dict()
    assert document["runs"]["not_run"] == 1
    assert "secret" not in json.dumps(document)
    assert "sk-never-kept" not in json.dumps(document)

    again = ExperimentReport.kept(
        _Header(plan, "finished", len(plan.runs)), [_kept(r) for r in report.results]
    )
    assert again.to_dict()["scores"] == document["scores"]
    assert again.to_dict()["regressions"] == document["regressions"]


def test_a_factory_that_fails_is_a_run_not_run_and_the_experiment_goes_on() -> None:
    runs = _recorded(2)
    plan, experimenter = _experiment(runs, broken_factory, ["success"])
    report = run_experiment(plan, experimenter, MemoryStore(), workers=1)
    assert {r.outcome for r in report.results} == {"not_run"}
    assert all("does not build" in (r.error or "") for r in report.results if r.run_id in runs)
    assert report.summaries == []
    assert report.exit_code(fail_on_regression=True) == 2


def test_an_evaluator_failing_is_reported_with_the_other_scores_kept() -> None:
    runs = _recorded(1)
    plan, experimenter = _experiment(
        runs, factory, ["success", "tests.integration._experiment_evaluators:broken"]
    )
    report = run_experiment(plan, experimenter, MemoryStore())
    [result] = [r for r in report.results if r.run_id in runs]
    assert result.outcome == "evaluator_failed"
    assert "the judge is away" in (result.error or "")
    assert result.reason == (
        "evaluators failed: tests.integration._experiment_evaluators:broken; the messages "
        "are not kept"
    )
    assert [p.score for p in result.scores] == ["succeeded"]


def test_an_interruption_marks_the_experiment_interrupted() -> None:
    runs = _recorded(1)
    plan, experimenter = _experiment(runs, factory, ["success"])
    store = MemoryStore()

    def interrupt(result: RunResult) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_experiment(plan, experimenter, store, workers=1, done=interrupt)
    assert store.calls[-1] == ("end", "interrupted")


def test_what_is_shown_of_a_variant_holds_no_prompt_text_or_credentials() -> None:
    shown = shown_changes({"prompt": "Be kind.", "model": "gpt-x", "flag.fast": "on"})
    assert shown["model"] == "gpt-x"
    assert shown["flag.fast"] == "on"
    assert shown["prompt"].startswith("sha256:")
    assert shown["prompt"].endswith("(8 characters)")
    assert (
        shown_url("https://u:p@api.example.test:8443/v1?key=1")
        == "https://api.example.test:8443/v1"
    )


@dataclass(frozen=True)
class _Header:
    plan: ExperimentPlan
    status: str
    planned: int

    def __getattr__(self, name: str) -> Any:
        return getattr(self.plan, name)


@dataclass(frozen=True)
class _Score:
    score: str
    evaluator: str
    lower_is_better: bool
    baseline: float | None
    variant: float | None


def _kept(result: RunResult) -> Any:
    scores = [
        _Score(p.score, p.evaluator, p.lower_is_better, p.baseline, p.variant)
        for p in result.scores
    ]
    return replace(result, scores=tuple(scores))  # type: ignore[arg-type]


def test_a_run_without_its_end_is_not_scored() -> None:
    recorder = MemoryRecorder()
    agent = TicketAgent(SampleTickets(), PromptedModel(), Notifier())
    run = recorder.start_run(agent.snapshot("T-00001"), agent_id="ticket-agent")
    run.call("read_ticket", SampleTickets().read, "T-00001")
    with pytest.raises(OutcomeError, match="has not finished"):
        recorded_outcome(recorder.events)
    with pytest.raises(OutcomeError, match=r"does not start with run\.started"):
        recorded_outcome(recorder.events[1:])
    finished = _recorded(1)
    [events] = finished.values()
    outcome = recorded_outcome(events, pricing=_pricing)
    assert outcome.status == "succeeded"
    assert [c.model for c in outcome.llm_calls] == ["triage-small-1"]
    assert outcome.cost_usd == outcome.llm_calls[0].cost_usd
    assert [t.tool for t in outcome.tool_calls] == ["read_ticket"]
    assert outcome.input == {"ticket_id": "T-00000"}
