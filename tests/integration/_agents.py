"""Recording runs of the example agent for the integration tests."""

from __future__ import annotations

import base64
import json
import random
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from agent_blackbox.examples.ticket_agent import KeywordModel, Notifier, TicketAgent, sample_tickets
from agent_blackbox.outbox import AgentRun, Recorder


@dataclass(frozen=True)
class RecordedRun:
    run_id: str
    events: int
    code_version: str


def record_ticket_runs(
    recorder: Recorder,
    ticket_ids: Iterable[str],
    *,
    workers: int = 4,
    tags: Callable[[str], dict[str, str]] | None = None,
) -> list[RecordedRun]:
    """Record one run of the ticket agent per ticket id, each tagged ``tags(ticket_id)``
    when given; returns what was recorded."""
    ids = list(ticket_ids)
    agent = TicketAgent(sample_tickets(len(ids) + 1_000), KeywordModel(), Notifier())

    def one(ticket_id: str) -> RecordedRun:
        snapshot = agent.snapshot(ticket_id)
        if tags is not None:
            snapshot = replace(snapshot, tags=tags(ticket_id))
        run, _ = recorder.record(
            agent.run, snapshot, agent_id="ticket-agent", subject_ids=("customer-1",)
        )
        return RecordedRun(run.run_id, run.last_sequence, snapshot.code_version)

    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(one, ids))


def ticket_ids(count: int) -> list[str]:
    return [f"T-{i:05d}" for i in range(count)]


# An agent whose model writes a very long reply and asks for a tool: what a reply over
# the blob threshold, or over the ceiling, must still replay.

LARGE_REPLY_QUESTION = "summarise the archive"


def noise(length: int, *, seed: int = 0) -> str:
    """``length`` characters of random base64, the same for the same arguments: text
    that compression shrinks by a quarter at most, for tests about large bodies."""
    raw = random.Random(length * 7919 + seed).randbytes(length * 3 // 4 + 3)
    return base64.b64encode(raw).decode("ascii")[:length]


def large_reply(text_bytes: int, *, city: str = "Paris") -> dict[str, Any]:
    """A chat completion with ``text_bytes`` of text and one tool call.

    The text is random base64, which compression shrinks by a quarter at most: a body
    of this size stays large whatever the payload compression.
    """
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "weather", "arguments": json.dumps({"city": city})},
    }
    message = {
        "role": "assistant",
        "content": "Summary: " + noise(text_bytes),
        "tool_calls": [call],
    }
    return {
        "id": "chatcmpl-large",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 9_000_000, "total_tokens": 9_000_012},
    }


def large_reply_agent(reply: Mapping[str, Any]) -> Callable[[AgentRun, Any], Any]:
    """An entry point that asks the model (answering ``reply``), then calls the tool the
    reply names with its arguments, as agents do."""

    def weather(city: str) -> str:
        return f"sunny in {city}"

    def entry(run: AgentRun, question: Any) -> Any:
        request = {"model": "m-large", "messages": [{"role": "user", "content": question}]}
        answer = run.llm(lambda _: reply, request, provider="test", model="m-large")
        message = answer["choices"][0]["message"]
        call = message["tool_calls"][0]["function"]
        result = run.call(call["name"], weather, **json.loads(call["arguments"]))
        return {"starts": message["content"][:9], "tool": result}

    return entry
