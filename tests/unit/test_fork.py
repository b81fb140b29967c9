"""Forks and re-execution, recorded in memory with a local stand-in model."""

from __future__ import annotations

import json
from typing import Any

from agent_blackbox.examples.ticket_agent import (
    KeywordModel,
    Notifier,
    OfflineNotifier,
    OfflineTickets,
    TicketAgent,
    sample_tickets,
)
from agent_blackbox.outbox import MemoryRecorder, RunSnapshot
from agent_blackbox.replayer._fork import fork_run, reexecute
from agent_blackbox.schemas import EventType, PayloadPipeline


class _CountingModel(KeywordModel):
    def __init__(self) -> None:
        super().__init__()
        self.requests: list[dict[str, Any]] = []

    def complete(self, request: Any) -> dict[str, Any]:
        self.requests.append(dict(request))
        return super().complete(request)


def _parent() -> tuple[MemoryRecorder, str]:
    recorder = MemoryRecorder()
    agent = TicketAgent(sample_tickets(1), KeywordModel(), Notifier())
    run, _ = recorder.record(agent.run, agent.snapshot("T-00000"), agent_id="ticket-agent")
    return recorder, run.run_id


def _body(envelope: Any) -> dict[str, Any]:
    return PayloadPipeline().unpack(envelope)


def test_fork_runs_from_the_parent_snapshot_with_changes_and_refuses_effects() -> None:
    parent, parent_id = _parent()
    model = _CountingModel()

    def factory(snapshot: RunSnapshot, *, base_url: str, api_key: str) -> Any:
        agent = TicketAgent.from_snapshot(
            snapshot, tickets=OfflineTickets(), model=model, notifier=OfflineNotifier()
        )
        return agent.run

    result = fork_run(
        parent.events,
        factory,
        changes={"model": "bigger-2", "prompt": "Be terse."},
        base_url="http://127.0.0.1:9",
        api_key="k",
    )
    assert result.parent_run_id == parent_id
    assert result.run_id != parent_id
    # The notification was refused, so the agent failed there, and says so.
    assert result.status == "failed"
    assert result.error is not None
    assert "refused" in result.error
    started = _body(result.events[0])
    assert started["parent_run_id"] == parent_id
    assert started["changes"] == {"model": "bigger-2", "prompt": "Be terse."}
    assert started["model_ids"] == ["bigger-2"]
    # The model was called for real, with the changed model and prompt.
    assert [r["model"] for r in model.requests] == ["bigger-2"]
    assert model.requests[0]["messages"][0]["content"] == "Be terse."
    # The ticket came from the parent's recording: the offline ticket store was not called.
    types = [e.event_type for e in result.events]
    assert EventType.TOOL_CALL in types
    receipt = next(e for e in result.events if e.event_type == EventType.EFFECT_RECEIPT)
    assert receipt.attributes["status"] == "failed"


def test_fork_with_sandboxed_effects_completes_and_lists_them() -> None:
    parent, _ = _parent()

    def factory(snapshot: RunSnapshot, *, base_url: str, api_key: str) -> Any:
        return TicketAgent.from_snapshot(
            snapshot, tickets=OfflineTickets(), model=KeywordModel(), notifier=OfflineNotifier()
        ).run

    result = fork_run(
        parent.events,
        factory,
        changes={"flag.escalation": "off"},
        base_url="x",
        api_key="k",
        effects="sandbox",
    )
    assert result.status == "succeeded"
    assert [e["effect"] for e in result.sandboxed_effects] == ["send_notification"]
    assert _body(result.events[0])["flags"]["escalation"] == "off"


def test_reexecute_diffs_each_call_ignoring_ids_and_times() -> None:
    parent, _ = _parent()
    same = reexecute(
        parent.events,
        lambda request: {**KeywordModel().complete(request), "id": "other", "created": 1},
    )
    assert [d.same for d in same] == [True]

    def different(request: Any) -> dict[str, Any]:
        answer = KeywordModel().complete(request)
        answer["choices"][0]["message"]["content"] = json.dumps({"category": "outage"})
        answer["usage"]["completion_tokens"] = 99
        return answer

    [diff] = reexecute(parent.events, different)
    assert not diff.same
    assert set(diff.changed) == {"text", "usage"}
    assert diff.sequence == 4
