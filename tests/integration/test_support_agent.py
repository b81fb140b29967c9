"""Issue 10's acceptance run, on the asyncio support agent (``examples/support_agent.py``).

Runs of the agent are recorded through the real stack (``AsyncRecorder`` on Postgres,
the relay to Kafka, the views consumer) against the local OpenAI-compatible server,
with the agent's case rows written in its own transactions. Then the server is stopped,
a socket guard refuses and counts every connection the Python code opens, and
``blackbox replay --all`` must pass every run with no connection made. Postgres and
Kafka are reached through their C clients (libpq, librdkafka), which the guard does not
see and need not: they are the two services replay may use. What it does see is what a
replay must never do, such as the model SDK (httpx) opening a connection.

The number of runs is ``BLACKBOX_SUPPORT_RUNS`` (default 200, the issue's figure).

A mutation corpus follows: variants of the agent that change an argument, the order in
which the parallel tool calls start, add a child task, leave a call out, handle the
fraud service's exception differently and change a state. Each is replayed against
recorded runs read back from Kafka, through ``replay_run``, and must be caught with the
right kind of divergence and a call site in the agent's code.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
from typing import Any

import openai
import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import create_async_engine

from agent_blackbox.cli import main
from agent_blackbox.consumers import ViewRunIndex
from agent_blackbox.examples import support_agent
from agent_blackbox.examples.support_agent import (
    CaseStore,
    SupportAgent,
    offline_agent,
    record_ticket,
    sample_ticket,
)
from agent_blackbox.outbox import AsyncRecorder
from agent_blackbox.outbox.relay import Relay
from agent_blackbox.replayer import DivergenceKind, KafkaRunSource, ReplayReport, replay_run
from agent_blackbox.schemas import Envelope, EnvelopeCodec, Settings
from tests.integration._guard import SocketGuard, port_of, service_ports
from tests.integration._openai_server import OpenAIServer
from tests.integration._views import build_views

pytestmark = pytest.mark.integration

RUNS = int(os.environ.get("BLACKBOX_SUPPORT_RUNS", "200"))
AT_ONCE = 8
"""Tickets handled concurrently while recording, as a service would."""


async def _record(settings: Settings, base_url: str, count: int) -> dict[str, str]:
    """Record ``count`` runs; returns ticket id → run id."""
    engine = create_async_engine(settings.database_url, pool_size=AT_ONCE + 2)
    try:
        recorder = AsyncRecorder(engine, settings=settings)
        await CaseStore(engine).create_table()
        agent = support_agent.production_agent(base_url=base_url, api_key="test", engine=engine)
        gate = asyncio.Semaphore(AT_ONCE)

        async def one(index: int) -> tuple[str, str]:
            ticket = sample_ticket(index)
            async with gate:
                run, _ = await record_ticket(recorder, agent, ticket)
            return ticket["ticket_id"], run.run_id

        recorded = dict(await asyncio.gather(*(one(i) for i in range(count))))
        await agent.llm.close()
        return recorded
    finally:
        await engine.dispose()


def _publish(settings: Settings, engine: Engine, count: int) -> dict[str, str]:
    """Record ``count`` runs, publish them to Kafka and index them in the views; the
    model server is stopped on return."""
    with OpenAIServer() as server:
        runs = asyncio.run(_record(settings, server.base_url, count))
        assert len(server.requests) == 2 * count
    # Every call of the agent crossed a boundary: with the recorder's network guard at
    # its default (warn), no run reported a hole.
    assert _holes(engine) == []
    relay = Relay(engine, settings=settings)
    try:
        published = relay.drain(timeout=120)
    finally:
        relay.close()
    assert published == 11 * count  # every run: 11 events
    build_views(settings, engine, expect=11 * count, timeout=120)
    return runs


def _holes(engine: Engine) -> list[str]:
    """The unrecorded calls the runs in the outbox reported on their run.finished."""
    codec = EnvelopeCodec()
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT envelope FROM blackbox.outbox")).scalars()
        ends = [e for e in map(codec.decode, rows) if e.event_type == "run.finished"]
    assert ends, "no run finished"
    return [e.attributes["unrecorded_call"] for e in ends if "unrecorded_calls" in e.attributes]


# The socket guard ---------------------------------------------------------------------


def test_the_guard_refuses_and_counts_a_connection_to_the_model_server() -> None:
    with OpenAIServer() as server:
        port = port_of(server.base_url)
        with SocketGuard({1}) as guard:
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", port), timeout=2)
            # The model SDK's async transport goes through the guard too.
            client = openai.AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)
            request = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hello"}]
            )
            with pytest.raises(openai.APIConnectionError):
                asyncio.run(request)
        assert server.requests == []
    assert guard.refused[0] == ("127.0.0.1", port)
    assert len(guard.refused) >= 2


# Unchanged code: every run passes, offline ---------------------------------------------


def _cases(engine: Engine) -> list[tuple[str, str, str | None]]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT ticket_id, status, refund FROM support_cases ORDER BY 1"))
        return [(r[0], r[1], r[2]) for r in rows]


def test_every_recorded_run_replays_offline_with_the_model_server_stopped(
    settings: Settings, engine: Engine
) -> None:
    recorded = _publish(settings, engine, RUNS)
    cases = _cases(engine)
    assert len(cases) == RUNS
    assert {status for _, status, _ in cases} == {"refunded", "review"}
    env = {
        "BLACKBOX_DATABASE_URL": settings.database_url,
        "BLACKBOX_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "BLACKBOX_TOPIC": settings.topic,
        "BLACKBOX_AGENTS": f"support-agent={support_agent.__name__}:replay_entry",
        "BLACKBOX_PURPOSE": "acceptance run of issue 10",
        "BLACKBOX_KEK": None,
        "BLACKBOX_KEK_FILE": None,
    }
    with SocketGuard(service_ports(settings)) as guard:
        args = ["replay", "--all", "--json", "--nondeterminism", "fail"]
        result = CliRunner(env=env).invoke(main, args)
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    *runs, summary = lines
    assert sorted(line["run_id"] for line in runs) == sorted(recorded.values())
    assert {line["result"] for line in runs} == {"PASS"}
    assert [line["nondeterminism"] for line in runs] == [[]] * RUNS  # no direct clock reads
    assert (summary["runs"], summary["pass_rate"]) == (RUNS, 1.0)
    assert guard.refused == []  # nothing but Postgres and Kafka was even attempted
    assert _cases(engine) == cases  # replay wrote no business row


# The mutation corpus -------------------------------------------------------------------


class ChangedArgument(SupportAgent):
    async def use_tool(self, run: Any, name: str, args: dict[str, Any]) -> Any:
        if name == "lookup_order":
            args = {"order_id": args["order_id"].lower()}
        return await run.call(name, getattr(self.desk, name), **args)


class StartsReversed(SupportAgent):
    async def investigate(self, run: Any, calls: list[tuple[str, dict[str, Any]]]) -> Any:
        results = await asyncio.gather(*(self.use_tool(run, n, a) for n, a in calls[::-1]))
        return dict(zip((name for name, _ in calls[::-1]), results, strict=True))


class ExtraChild(SupportAgent):
    async def investigate(self, run: Any, calls: list[tuple[str, dict[str, Any]]]) -> Any:
        extra = ("quote_refund", dict(calls[0][1]))
        results = await asyncio.gather(*(self.use_tool(run, n, a) for n, a in [*calls, extra]))
        return dict(zip((name for name, _ in calls), results, strict=False))


class LeftOutCall(SupportAgent):
    async def investigate(self, run: Any, calls: list[tuple[str, dict[str, Any]]]) -> Any:
        kept = [(name, args) for name, args in calls if name != "quote_refund"]
        results = await asyncio.gather(*(self.use_tool(run, n, a) for n, a in kept))
        return {**dict(zip((n for n, _ in kept), results, strict=True)), "quote_refund": {}}


class FraudDownMeansFlagged(SupportAgent):
    async def use_tool(self, run: Any, name: str, args: dict[str, Any]) -> Any:
        try:
            return await run.call(name, getattr(self.desk, name), **args)
        except support_agent.FraudServiceDown as exc:
            return {"customer_id": exc.customer_id, "flagged": True}


class ChangedState(SupportAgent):
    async def close(self, run: Any, ticket: Any, decision: Any) -> str:
        refund = decision.get("refund")
        status = "refunded" if refund and decision["tag_ticket"]["tag"] == "refund" else "review"
        amount = refund["amount"] if refund else None
        state = {"ticket_id": ticket["ticket_id"], "refund": amount, "priority": "high"}
        await run.transition(status, state=state)
        return status


MUTANTS: list[tuple[type[SupportAgent], DivergenceKind, str, str]] = [
    # variant, the kind it must be caught as, the function and the file of the call site
    (ChangedArgument, DivergenceKind.ARGUMENT_MISMATCH, "use_tool", __file__),
    (StartsReversed, DivergenceKind.ARGUMENT_MISMATCH, "use_tool", support_agent.__file__),
    (ExtraChild, DivergenceKind.MISSING_EVENT, "use_tool", support_agent.__file__),
    (LeftOutCall, DivergenceKind.CONCURRENCY_MISMATCH, "use_tool", support_agent.__file__),
    (FraudDownMeansFlagged, DivergenceKind.ARGUMENT_MISMATCH, "decide", support_agent.__file__),
    (ChangedState, DivergenceKind.STATE_MISMATCH, "close", __file__),
]
SAMPLE = [0, 1, 3, 7, 17, 27]
"""Tickets the mutants are replayed against (7, 17 and 27: the fraud service was down)."""


def _entry(variant: type[SupportAgent]) -> Any:
    offline = offline_agent()

    async def entry(run: Any, input: Any) -> Any:
        return await variant(offline.llm, offline.desk, offline.cases).entry(run, input)

    return entry


def _fraud_was_down(events: list[Envelope]) -> bool:
    return any(e.attributes.get("error") == "FraudServiceDown" for e in events)


def test_every_mutant_is_caught_with_its_kind_and_call_site(
    settings: Settings, engine: Engine
) -> None:
    recorded = _publish(settings, engine, max(SAMPLE) + 1)
    index = ViewRunIndex(engine)
    sample = {
        f"S-{i:05d}": list(KafkaRunSource(settings, index, recorded[f"S-{i:05d}"])) for i in SAMPLE
    }
    assert any(_fraud_was_down(events) for events in sample.values())
    for events in sample.values():
        assert replay_run(events, _entry(SupportAgent)).passed  # the baseline passes
    parallel = sample["S-00007"]
    for _ in range(100):  # parallel tool calls replay the same way every time
        report = replay_run(parallel, _entry(SupportAgent))
        assert report.passed, report.divergence and report.divergence.describe()
    for variant, kind, function, file in MUTANTS:
        for ticket_id, events in sample.items():
            if variant is FraudDownMeansFlagged and not _fraud_was_down(events):
                continue  # the handler it changes never ran in this run
            report = replay_run(events, _entry(variant), stall_timeout=0.5)
            _assert_caught(report, variant.__name__, ticket_id, kind, function, file)


def _assert_caught(
    report: ReplayReport,
    variant: str,
    ticket_id: str,
    kind: DivergenceKind,
    function: str,
    file: str,
) -> None:
    what = f"{variant} on {ticket_id}"
    assert report.error is None, f"{what}: {report.error}"
    divergence = report.divergence
    assert divergence is not None, f"{what} was not caught"
    assert divergence.kind == kind, f"{what}: {divergence.describe()}"
    site = divergence.call_site
    assert site is not None, f"{what}: no call site"
    assert (site.function, site.file) == (function, file), f"{what}: {divergence.describe()}"
