"""A customer-support agent for asyncio, written the way a team would write one.

For each ticket it searches the help centre (a retrieval), asks a model which tools to
use (an OpenAI call through one client captured for every run with
:func:`capture_openai`: each call is recorded into the run in force where it is made; the
reply asks for several tools at once), runs those tool calls in parallel with
``asyncio.gather``, handles the fraud
service's own exception, asks the model for a decision as a streamed call with tool
calls, e-mails the customer (a side effect with an idempotency key) and closes the case
in its own Postgres table, in the same transaction as the recorded state change.

The same code records and replays: :meth:`SupportAgent.entry` is the entry point of
both. Only what it is given changes. In production it gets the real model client, the
real help desk and the case table (:func:`production_agent`); in replay
(:func:`replay_entry`) the boundaries answer from the recording, the help desk refuses
every call, and the case store skips its business writes (:class:`ReplayCases`): replay
checks the state change against the recording and never touches the agent's tables.

Every call it makes to the outside crosses a boundary, so its runs record no hole with
the recorder's network guard at its default (``warn``), and a replay never needs the
network.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Protocol

import openai
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agent_blackbox.outbox import (
    AsyncMemoryRecorder,
    AsyncRecorder,
    AsyncRun,
    EffectOutcome,
    RunSnapshot,
)
from agent_blackbox.outbox.integrations.openai import capture_openai
from agent_blackbox.schemas import digest

AGENT_ID = "support-agent"
CODE_VERSION = "support-agent/1.0.0"
MODEL = "support-small-1"
KB_INDEX = "help-centre"
KB_VERSION = "2026-12-01"
PROMPT = "You resolve support tickets. Investigate with the tools, then decide."


def _tool(name: str, description: str, *parameters: str) -> dict[str, Any]:
    properties = {parameter: {"type": "string"} for parameter in parameters}
    schema = {"type": "object", "properties": properties, "required": list(parameters)}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": schema},
    }


INVESTIGATE = [
    _tool("lookup_order", "The order: status and total.", "order_id"),
    _tool("check_fraud", "Whether the customer's account is flagged.", "customer_id"),
    _tool("quote_refund", "What a refund of the order would be.", "order_id"),
]
DECIDE = [
    _tool("refund", "Refund the order.", "order_id", "amount"),
    _tool("tag_ticket", "Tag the ticket for the team.", "tag"),
]


class FraudServiceDown(Exception):
    """The fraud service could not answer for ``customer_id``; the agent goes on without."""

    def __init__(self, customer_id: str) -> None:
        super().__init__(customer_id)
        self.customer_id = customer_id


@dataclass(frozen=True)
class Order:
    """An order, as the order system returns it (comes back as itself in replay)."""

    order_id: str
    status: str
    total: Decimal


# The outside world -----------------------------------------------------------------


class HelpDesk:
    """The systems the agent's tools reach: orders, fraud checks, the help centre, mail.

    A deterministic stand-in with small delays, so that parallel calls complete in
    another order than they started; a deployment puts its real clients here.
    """

    def __init__(self) -> None:
        self.sent: dict[str, dict[str, str]] = {}

    async def lookup_order(self, order_id: str) -> Order:
        await asyncio.sleep(0.003)
        number = int(order_id.removeprefix("O-"))
        status = "delivered" if number % 3 else "lost"
        return Order(order_id, status, Decimal(10 + number % 40) + Decimal("0.50"))

    async def check_fraud(self, customer_id: str) -> dict[str, Any]:
        await asyncio.sleep(0.001)
        if customer_id.endswith("7"):
            raise FraudServiceDown(customer_id)
        return {"customer_id": customer_id, "flagged": customer_id.endswith("3")}

    async def quote_refund(self, order_id: str) -> dict[str, Any]:
        number = int(order_id.removeprefix("O-"))
        return {"order_id": order_id, "amount": f"{10 + number % 40}.50", "currency": "EUR"}

    def search(
        self, query: str, *, filters: Mapping[str, Any] | None = None, top_k: int | None = None
    ) -> list[dict[str, Any]]:
        words = set(query.lower().split())
        scores = {doc_id: len(words & set(body.split())) / 10 for doc_id, body in ARTICLES.items()}
        ranked = sorted(scores, key=lambda doc_id: (-scores[doc_id], doc_id))
        return [{"id": d, "chunk_version": "2", "score": scores[d]} for d in ranked[:top_k]]

    async def send_email(self, customer_id: str, body: str, idempotency_key: str) -> EffectOutcome:
        self.sent.setdefault(idempotency_key, {"to": customer_id, "body": body})
        return EffectOutcome(external_id=f"mail-{idempotency_key[:12]}", result={"queued": True})


ARTICLES = {
    "kb-refunds": "refund refunds money back order lost damaged",
    "kb-delivery": "delivery order lost late parcel tracking",
    "kb-account": "account password login locked",
}


class ReplayCalledOut(Exception):
    """Replay reached for the outside world: it must never happen."""


class OfflineHelpDesk(HelpDesk):
    """The help desk of replay: every call is refused, so a replay that passes proves
    that nothing outside was needed."""

    async def lookup_order(self, order_id: str) -> Order:
        raise ReplayCalledOut(f"lookup_order {order_id}")

    async def check_fraud(self, customer_id: str) -> dict[str, Any]:
        raise ReplayCalledOut(f"check_fraud {customer_id}")

    async def quote_refund(self, order_id: str) -> dict[str, Any]:
        raise ReplayCalledOut(f"quote_refund {order_id}")

    def search(
        self, query: str, *, filters: Mapping[str, Any] | None = None, top_k: int | None = None
    ) -> list[dict[str, Any]]:
        raise ReplayCalledOut(f"search {query!r}")

    async def send_email(self, customer_id: str, body: str, idempotency_key: str) -> EffectOutcome:
        raise ReplayCalledOut(f"send_email {customer_id}")


# The agent's own table ---------------------------------------------------------------


class Cases(Protocol):
    """Where the agent keeps its cases: a transaction, and a write inside it."""

    def transaction(self) -> AbstractAsyncContextManager[AsyncConnection | None]: ...

    async def save(
        self, conn: AsyncConnection | None, ticket_id: str, status: str, refund: str | None
    ) -> None: ...


class CaseStore:
    """The agent's business state: one row per ticket in its own table."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def create_table(self) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(
                text(
                    "CREATE TABLE IF NOT EXISTS support_cases ("
                    "ticket_id text PRIMARY KEY, status text NOT NULL, refund text)"
                )
            )

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection | None]:
        async with self.engine.begin() as conn:
            yield conn

    async def save(
        self, conn: AsyncConnection | None, ticket_id: str, status: str, refund: str | None
    ) -> None:
        if conn is None:
            raise ValueError("CaseStore.save writes inside CaseStore.transaction()")
        await conn.execute(
            text(
                "INSERT INTO support_cases (ticket_id, status, refund) "
                "VALUES (:ticket_id, :status, :refund) ON CONFLICT (ticket_id) "
                "DO UPDATE SET status = excluded.status, refund = excluded.refund"
            ),
            {"ticket_id": ticket_id, "status": status, "refund": refund},
        )


class ReplayCases:
    """The cases of replay: business writes are skipped. Replay checks the recorded
    state change; the row was written when the run was recorded, and writing it again
    would change a system of record from an offline check."""

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection | None]:
        yield None  # no connection: replay's transition accepts one and touches nothing

    async def save(
        self, conn: AsyncConnection | None, ticket_id: str, status: str, refund: str | None
    ) -> None:
        return None


# The agent ---------------------------------------------------------------------------


@dataclass
class SupportAgent:
    """The agent and what it is given: a model client (captured: see
    :func:`production_agent`), the help desk and the case store."""

    llm: openai.AsyncOpenAI
    desk: HelpDesk
    cases: Cases
    model: str = MODEL

    def snapshot(self, ticket: Mapping[str, str]) -> RunSnapshot:
        """The input snapshot a run for ``ticket`` starts from."""
        return RunSnapshot(
            code_version=CODE_VERSION,
            input=dict(ticket),
            prompt_templates={"support": digest(PROMPT)},
            tool_schemas={tool["function"]["name"]: "1" for tool in INVESTIGATE + DECIDE},
            model_ids=(self.model,),
            permissions=("orders:read", "fraud:read", "mail:send", "cases:write"),
        )

    async def entry(self, run: Any, input: Any) -> dict[str, Any]:
        """Handle one ticket; ``run`` is an ``AsyncRun`` or, in replay, an
        ``AsyncReplayRun``. Returns the run's output."""
        client = self.llm  # records into this run: the run in force here
        articles = await run.retrieve(
            KB_INDEX,
            self.desk.search,
            input["text"],
            index_version=KB_VERSION,
            filters={"lang": "en"},
            top_k=2,
        )
        calls = await self.plan(client, input, articles)
        findings = await self.investigate(run, calls)
        decision = await self.decide(client, input, findings)
        receipt = await self.reply(run, input, decision)
        status = await self.close(run, input, decision)
        return {"ticket_id": input["ticket_id"], "status": status, "mail": receipt.external_id}

    async def plan(
        self, client: Any, ticket: Mapping[str, str], articles: list[Any]
    ) -> list[tuple[str, dict[str, Any]]]:
        """Ask the model which tools to call; it asks for several at once (all three,
        as :meth:`decide` expects: an agent for a real model would check)."""
        context = " ".join(article["id"] for article in articles)
        completion = await client.chat.completions.create(
            model=self.model,
            messages=[
                {"role": "system", "content": f"{PROMPT} Articles: {context}"},
                {"role": "user", "content": _facts(ticket)},
            ],
            tools=INVESTIGATE,
            parallel_tool_calls=True,
        )
        tool_calls = completion.choices[0].message.tool_calls or []
        return [(call.function.name, json.loads(call.function.arguments)) for call in tool_calls]

    async def investigate(
        self, run: Any, calls: list[tuple[str, dict[str, Any]]]
    ) -> dict[str, Any]:
        """Run the model's tool calls in parallel; each is a child task of the run."""
        results = await asyncio.gather(*(self.use_tool(run, name, args) for name, args in calls))
        return dict(zip((name for name, _ in calls), results, strict=True))

    async def use_tool(self, run: Any, name: str, args: dict[str, Any]) -> Any:
        """One tool call the model asked for, through the run; the fraud service being
        down is an answer the agent handles, not a failure of the run."""
        tool = {
            "lookup_order": self.desk.lookup_order,
            "check_fraud": self.desk.check_fraud,
            "quote_refund": self.desk.quote_refund,
        }[name]
        try:
            return await run.call(name, tool, **args)
        except FraudServiceDown as exc:
            # Raised again in replay as FraudServiceDown: the same branch is taken.
            return {"customer_id": exc.customer_id, "flagged": None}

    async def decide(
        self, client: Any, ticket: Mapping[str, str], findings: Mapping[str, Any]
    ) -> dict[str, dict[str, Any]]:
        """Ask for a decision as a streamed call; its tool calls arrive in pieces."""
        order: Order = findings["lookup_order"]
        fraud = findings["check_fraud"]["flagged"]
        tag = {True: "fraud-review", False: "refund", None: "fraud-check-pending"}[fraud]
        facts = f"order_id={order.order_id} amount={findings['quote_refund']['amount']} tag={tag}"
        stream = await client.chat.completions.create(
            model=self.model,
            messages=[
                {"role": "system", "content": PROMPT},
                {"role": "user", "content": f"{_facts(ticket)} status={order.status} {facts}"},
            ],
            tools=DECIDE,
            parallel_tool_calls=True,
            stream=True,
        )
        names: dict[int, str] = {}
        arguments: dict[int, str] = {}
        async for chunk in stream:
            delta = chunk.choices[0].delta if chunk.choices else None
            for piece in (delta.tool_calls if delta else None) or []:
                if piece.function and piece.function.name:
                    names[piece.index] = piece.function.name
                if piece.function and piece.function.arguments:
                    arguments[piece.index] = (
                        arguments.get(piece.index, "") + piece.function.arguments
                    )
        return {names[i]: json.loads(arguments.get(i) or "{}") for i in sorted(names)}

    async def reply(self, run: Any, ticket: Mapping[str, str], decision: Mapping[str, Any]) -> Any:
        """E-mail the customer: the intent commits before the mail goes, the receipt after."""
        refund = decision.get("refund")
        body = f"Refund of {refund['amount']} EUR is on its way." if refund else "We are on it."
        return await run.effect(
            "email_customer",
            lambda key: self.desk.send_email(ticket["customer_id"], body, key),
            arguments={"customer_id": ticket["customer_id"], "body": body},
        )

    async def close(self, run: Any, ticket: Mapping[str, str], decision: Mapping[str, Any]) -> str:
        """Write the case row and record the state change in one transaction."""
        refund = decision.get("refund")
        status = "refunded" if refund and decision["tag_ticket"]["tag"] == "refund" else "review"
        amount = refund["amount"] if refund else None
        async with self.cases.transaction() as conn:
            await self.cases.save(conn, ticket["ticket_id"], status, amount)
            state = {"ticket_id": ticket["ticket_id"], "refund": amount}
            await run.transition(status, state=state, connection=conn)
        return status


def _facts(ticket: Mapping[str, str]) -> str:
    """The ticket as the model reads it: its text, then ``name=value`` facts."""
    ids = f"order_id={ticket['order_id']} customer_id={ticket['customer_id']}"
    return f"{ticket['text']} {ids}"


# Entry points ------------------------------------------------------------------------


def production_agent(*, base_url: str, api_key: str, engine: AsyncEngine) -> SupportAgent:
    """The agent as production runs it: a real model endpoint (one client for every run,
    captured), the help desk, the case table of ``engine``."""
    client = capture_openai(openai.AsyncOpenAI(base_url=base_url, api_key=api_key))
    return SupportAgent(client, HelpDesk(), CaseStore(engine))


async def record_ticket(
    recorder: AsyncRecorder | AsyncMemoryRecorder, agent: SupportAgent, ticket: Mapping[str, str]
) -> tuple[AsyncRun, dict[str, Any]]:
    """Handle ``ticket`` as one recorded run (what production calls per ticket)."""
    return await recorder.record(
        agent.entry, agent.snapshot(ticket), agent_id=AGENT_ID, subject_ids=(ticket["customer_id"],)
    )


@functools.cache
def offline_agent() -> SupportAgent:
    """The agent as replay builds it: a model client that is never used (no key, an
    address nothing listens on), a help desk that refuses every call, no case writes.

    Built once per process: nothing in it keeps state between runs, and creating a
    model client (its TLS context) costs more than replaying a run."""
    client = openai.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused-in-replay")
    return SupportAgent(capture_openai(client), OfflineHelpDesk(), ReplayCases())


async def replay_entry(run: Any, input: Any) -> dict[str, Any]:
    """The replay entry point (``--agent agent_blackbox.examples.support_agent:replay_entry``):
    the same :meth:`SupportAgent.entry`, given the offline agent."""
    return await offline_agent().entry(run, input)


def sample_ticket(index: int) -> dict[str, str]:
    """A deterministic ticket for demos and tests."""
    texts = ("my order is lost", "refund please, parcel damaged", "where is my order")
    return {
        "ticket_id": f"S-{index:05d}",
        "customer_id": f"c-{index % 50:02d}",
        "order_id": f"O-{index:05d}",
        "text": texts[index % len(texts)],
    }
