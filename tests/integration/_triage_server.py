"""The local OpenAI-compatible endpoint as the ticket agent's triage model, for the
experiment tests: it answers from the request alone, as the example agent's own
``KeywordModel`` does, except that its answer depends on the prompt it is given.

Under a system prompt that names ``URGENT`` (:data:`URGENT_PROMPT`), an outage ticket
gets priority ``urgent``, which the agent's output schema does not allow; and every
request is billed one prompt token per word of its messages, so a longer prompt costs
more. So an experiment comparing the two prompts has known differences: the outage
tickets' outputs and schema validity, and every run's cost.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import replace
from http import HTTPStatus
from typing import Any

from sqlalchemy import Engine, text

from agent_blackbox.consumers import AnalyticsConsumer, ViewConsumer
from agent_blackbox.examples.ticket_agent import (
    CATEGORIES,
    PROMPT,
    ChatEndpoint,
    Notifier,
    SampleTickets,
    TicketAgent,
)
from agent_blackbox.outbox import Recorder
from agent_blackbox.schemas import Settings
from tests.integration._backups import relay
from tests.integration._llm_server import Reply
from tests.integration._openai_server import OpenAIServer
from tests.integration._wait import eventually

URGENT_PROMPT = PROMPT + " Mark an outage URGENT, whatever the ticket says."
"""The variant prompt."""

COMPLETION_TOKENS = 12
PRICE_FILE = """
[local."triage-small-1"]
input = 2.00
output = 8.00
as_of = 2026-01-01
"""
"""Prices for the model the ticket agent calls (provider ``local``), per million tokens."""

OUTPUT_SCHEMA = {
    "type": "object",
    "required": ["ticket_id", "category", "priority", "summary"],
    "properties": {
        "category": {"enum": list(CATEGORIES)},
        "priority": {"enum": ["high", "normal"]},
        "summary": {"type": "string"},
    },
}
"""The ticket agent's output, as its users rely on it."""


def prompt_tokens(request: Mapping[str, Any]) -> int:
    """What the server bills as the request's prompt: one token per word."""
    return sum(len(str(m["content"]).split()) for m in request["messages"])


def triage(request: Mapping[str, Any]) -> dict[str, Any]:
    """The chat completion answering ``request``."""
    system, text = request["messages"][0]["content"], request["messages"][-1]["content"]
    lowered = str(text).lower()
    category = next((c for c in CATEGORIES if c in lowered), "feature")
    priority = "high" if "down" in lowered or "urgent" in lowered else "normal"
    if "URGENT" in system and category == "outage":
        priority = "urgent"
    answer = {"category": category, "priority": priority, "summary": lowered[:60]}
    tokens = prompt_tokens(request)
    return {
        "id": "chatcmpl-triage",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": request["model"],
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": json.dumps(answer)},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": tokens,
            "completion_tokens": COMPLETION_TOKENS,
            "total_tokens": tokens + COMPLETION_TOKENS,
        },
    }


class TriageServer(OpenAIServer):
    """Serves :func:`triage` on ``/v1/chat/completions``."""

    name = "triage-test-server"

    def reply(self, path: str, request: Mapping[str, Any]) -> Reply:
        return Reply(HTTPStatus.OK, triage(request))


# Recording the ticket agent against the server, and bringing its runs into the views.

KEY = "sk-test-experiments-0000"
"""The key the ticket agent's model client sends (the server takes any)."""


def record_tickets(
    engine: Engine, settings: Settings, base_url: str, ids: list[str], arm: str
) -> dict[str, str]:
    """One run of the ticket agent per ticket, against ``base_url``, tagged ``arm``."""
    recorder = Recorder(engine, settings=settings)
    agent = TicketAgent(SampleTickets(), ChatEndpoint(base_url, KEY), Notifier())
    runs = {}
    for ticket_id in ids:
        snapshot = replace(agent.snapshot(ticket_id), tags={"prompt_version": arm})
        run, _ = recorder.record(agent.run, snapshot, agent_id="ticket-agent")
        runs[run.run_id] = ticket_id
    return runs


def catch_up(settings: Settings, engine: Engine, done: Callable[[Any], bool]) -> None:
    """Relay the outbox and run both consumers until ``done(connection)`` holds."""
    relay(engine, settings)
    with (
        ViewConsumer(settings, engine=engine) as views,
        AnalyticsConsumer(
            settings, group_id=f"{settings.consumer_group}-a", engine=engine
        ) as analytics,
    ):

        def caught_up() -> bool:
            views.poll_once(0.2)
            analytics.poll_once(0.2)
            with engine.connect() as conn:
                return done(conn)

        eventually(caught_up, timeout=120, what="the views and analytics caught up")


def finished_rollups(conn: Any, run_ids: list[str]) -> int:
    return int(
        conn.execute(
            text(
                "SELECT count(*) FROM blackbox_views.run_rollups u JOIN blackbox_views.runs r "
                "USING (run_id) WHERE run_id = ANY (:ids) AND r.status <> 'running' "
                "AND u.llm_calls = 1"
            ),
            {"ids": run_ids},
        ).scalar_one()
    )
