"""A small support-ticket agent, written the way production agents use the Recorder.

It reads a ticket through a tool, asks a language model to triage it through an
injected client, sends a notification as a side effect, and moves its business state.
Every one of those crosses a recorded boundary; the agent's own control logic is plain
Python in between. The model and the notifier here are local stand-ins so the demo and
the tests run without a network; a real deployment injects real clients.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from agent_blackbox.outbox import AgentRun, EffectOutcome, RunSnapshot
from agent_blackbox.schemas import BlackboxError, digest

MODEL = "triage-small-1"
CODE_VERSION = "ticket-agent/1.0.0"
PROMPT = "You triage support tickets. Answer with JSON: category, priority, summary."
CATEGORIES = ("billing", "outage", "account", "feature")


@dataclass
class TicketStore:
    """The ticket system the agent reads from (a tool)."""

    tickets: dict[str, dict[str, str]] = field(default_factory=dict)

    def read(self, ticket_id: str) -> dict[str, str]:
        return dict(self.tickets[ticket_id])


class KeywordModel:
    """A deterministic stand-in for a chat-completion endpoint (OpenAI-compatible JSON)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._served = 0

    def complete(self, request: Mapping[str, Any]) -> dict[str, Any]:
        with self._lock:
            self._served += 1
            served = self._served
        text = str(request["messages"][-1]["content"]).lower()
        category = next((c for c in CATEGORIES if c in text), "feature")
        priority = "high" if "down" in text or "urgent" in text else "normal"
        answer = {"category": category, "priority": priority, "summary": text[:60]}
        prompt_tokens = len(text.split()) + len(PROMPT.split())
        return {
            "id": f"chatcmpl-{served}",
            "object": "chat.completion",
            "model": request["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": json.dumps(answer)},
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": 12,
                "total_tokens": prompt_tokens + 12,
            },
        }


class ChatModel(Protocol):
    """What the agent needs of a model: an OpenAI-compatible chat completion."""

    def complete(self, request: Mapping[str, Any]) -> dict[str, Any]: ...


class ChatEndpoint:
    """A real OpenAI-compatible endpoint, through the official SDK (``openai`` extra)."""

    def __init__(self, base_url: str, api_key: str) -> None:
        from openai import OpenAI

        self._client = OpenAI(base_url=base_url, api_key=api_key)

    def complete(self, request: Mapping[str, Any]) -> dict[str, Any]:
        response = self._client.chat.completions.create(**request)
        body: dict[str, Any] = response.model_dump(mode="json", exclude_unset=True)
        return body


@dataclass
class Notifier:
    """An external notification service that honours idempotency keys."""

    sent: dict[str, dict[str, str]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def send(self, *, to: str, message: str, idempotency_key: str) -> EffectOutcome:
        with self._lock:
            if idempotency_key not in self.sent:
                self.sent[idempotency_key] = {"to": to, "message": message}
            external_id = f"notif-{len(self.sent)}"
        return EffectOutcome(external_id=external_id, result={"accepted": True})


@dataclass
class TicketAgent:
    """The agent: its dependencies, injected, and the model and prompt it uses."""

    tickets: TicketStore
    model: ChatModel
    notifier: Notifier
    model_id: str = MODEL
    prompt: str = PROMPT

    @classmethod
    def from_snapshot(
        cls, snapshot: RunSnapshot, *, tickets: TicketStore, model: ChatModel, notifier: Notifier
    ) -> TicketAgent:
        """The agent a snapshot describes: a fork changes its model or prompt there."""
        return cls(
            tickets,
            model,
            notifier,
            model_id=snapshot.model_ids[0] if snapshot.model_ids else MODEL,
            prompt=snapshot.changes.get("prompt", PROMPT),
        )

    def snapshot(self, ticket_id: str) -> RunSnapshot:
        """The input snapshot a run of this agent starts from."""
        return RunSnapshot(
            code_version=CODE_VERSION,
            input={"ticket_id": ticket_id},
            prompt_templates={"triage": digest(self.prompt)},
            tool_schemas={"read_ticket": "1"},
            model_ids=(self.model_id,),
            flags={"escalation": "on"},
            permissions=("tickets:read", "notify:send"),
        )

    def run(self, run: AgentRun, input: Any) -> dict[str, Any]:
        """The agent's entry point, the same in record and replay: ``entry(run, input)``."""
        return self.handle(run, input["ticket_id"])

    def handle(self, run: AgentRun, ticket_id: str) -> dict[str, Any]:
        """Triage one ticket and notify its owner. Returns the run's output."""
        ticket = run.call("read_ticket", self.tickets.read, ticket_id)
        received_at = run.now()
        request = {
            "model": self.model_id,
            "temperature": 0,
            "messages": [
                {"role": "system", "content": self.prompt},
                {"role": "user", "content": ticket["text"]},
            ],
        }
        reply = run.llm(self.model.complete, request, provider="local")
        triage = json.loads(reply["choices"][0]["message"]["content"])
        run.transition("triaged", state={"ticket_id": ticket_id, **triage})
        # A sampled audit: one ticket in ten gets a second pair of eyes.
        audited = run.random() < 0.1
        reference = str(run.uuid())
        message = f"[{triage['priority']}] {triage['category']}: ticket {ticket_id} ({reference})"
        receipt = run.effect(
            "send_notification",
            lambda key: self.notifier.send(
                to=ticket["owner"], message=message, idempotency_key=key
            ),
            arguments={"to": ticket["owner"], "message": message},
        )
        state = {"ticket_id": ticket_id, "notification": receipt.external_id, "audited": audited}
        run.transition("notified", state=state)
        return {"ticket_id": ticket_id, **triage, "received_at": received_at.isoformat()}


SAMPLE_TEXTS = (
    "Our billing page charges twice",
    "Service is down for all users, urgent",
    "Cannot reset my account password",
    "Please add dark mode as a feature",
    "Outage in the EU region since 10:00",
)


def _sample_ticket(index: int) -> dict[str, str]:
    return {
        "text": SAMPLE_TEXTS[index % len(SAMPLE_TEXTS)],
        "owner": f"owner{index % 7}@example.test",
    }


def sample_tickets(count: int) -> TicketStore:
    """A deterministic set of tickets for demos and tests."""
    return TicketStore({f"T-{index:05d}": _sample_ticket(index) for index in range(count)})


class SampleTickets(TicketStore):
    """The ticket system of the demo: every ticket :func:`sample_tickets` makes, however
    many, built when it is read (what a fork with live tools reads)."""

    def read(self, ticket_id: str) -> dict[str, str]:
        number = ticket_id.removeprefix("T-")
        if not number.isdigit():
            raise KeyError(ticket_id)
        return _sample_ticket(int(number))


class ExternalCallRefused(BlackboxError):
    """Raised by the offline stand-ins: replay reached for the outside world."""


class OfflineTickets(TicketStore):
    """A ticket system that refuses every call."""

    def read(self, ticket_id: str) -> dict[str, str]:
        raise ExternalCallRefused(f"replay tried to read ticket {ticket_id}")


class OfflineModel(KeywordModel):
    """A model endpoint that refuses every call."""

    def complete(self, request: Mapping[str, Any]) -> dict[str, Any]:
        raise ExternalCallRefused("replay tried to call the model")


class OfflineNotifier(Notifier):
    """A notification service that refuses every call."""

    def send(self, *, to: str, message: str, idempotency_key: str) -> EffectOutcome:
        raise ExternalCallRefused(f"replay tried to notify {to}")


def replay_entry(run: AgentRun, input: Any) -> dict[str, Any]:
    """The agent's entry point for replay: its own code, with transports that refuse
    every call, so a replay that passes proves nothing external was needed."""
    return TicketAgent(OfflineTickets(), OfflineModel(), OfflineNotifier()).run(run, input)


def fork_entry(snapshot: RunSnapshot, *, base_url: str, api_key: str) -> Callable[..., Any]:
    """The agent's entry point for a fork: the model from the (changed) snapshot, called
    for real at ``base_url``; tools and effects are governed by the fork's policies (the
    ticket system is read only when the fork's tools are live)."""
    agent = TicketAgent.from_snapshot(
        snapshot,
        tickets=SampleTickets(),
        model=ChatEndpoint(base_url, api_key),
        notifier=OfflineNotifier(),
    )
    return agent.run
