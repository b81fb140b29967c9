"""One agent script, every recorder: the envelopes must be the same apart from ids and times.

The script is data (a list of boundary calls), so that the sync recorders and the async
ones run exactly the same thing: a runner calls each step on the run and awaits what an
async run returns. Postgres recorders are read back from the outbox; memory recorders
from their list. Volatile values (event and run ids, times, latencies, random draws) are
masked; everything else, digests and bodies included, must be equal across recorders.
A crash between an effect's intent and its receipt, the recovery of that effect and
the replay of every recorded run are part of the suite.
"""

from __future__ import annotations

import asyncio
import base64
import inspect
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import create_async_engine

from agent_blackbox.keystore import SEALED_ENCODING
from agent_blackbox.outbox import (
    AsyncMemoryRecorder,
    AsyncRecorder,
    EffectOutcome,
    EffectRejected,
    MemoryRecorder,
    RecordedError,
    Recorder,
    RunOptions,
    RunSnapshot,
)
from agent_blackbox.replayer import ReplayRun
from agent_blackbox.schemas import (
    GENESIS_CHAIN_HASH,
    Envelope,
    EnvelopeCodec,
    PayloadPipeline,
    Settings,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

RECORDERS = ["memory", "async-memory", "postgres", "async-postgres"]
OPTIONS = RunOptions(
    agent_id="conformance-agent",
    tenant_id="tenant-c",
    subject_ids=("customer-7",),
    classification="internal",
    retention_class="standard",
)
SNAPSHOT = RunSnapshot(
    code_version="conformance/1",
    input={"ticket": "T-9", "email": "someone@example.com"},
    model_ids=("m-1",),
    flags={"beta": "on"},
)


class ToolDown(Exception):
    """A tool's own failure."""


class Crash(BaseException):
    """The agent process dies between an effect's intent and its receipt."""


def lookup(ticket: str) -> dict[str, Any]:
    return {"ticket": ticket, "priority": 2}


def broken(ticket: str) -> Any:
    raise ToolDown(f"no ticket service for {ticket}")


def model(request: Any) -> dict[str, Any]:
    return {"id": "r-1", "choices": [{"index": 0, "message": {"content": "ok"}}]}


def send(key: str) -> EffectOutcome:
    return EffectOutcome(external_id="msg-1", result={"sent": True})


def refuse(key: str) -> Any:
    raise EffectRejected("mailbox full", external_id="bounce-1")


def die(key: str) -> Any:
    raise Crash


@dataclass(frozen=True)
class Step:
    """One boundary call: ``getattr(run, method)(*args, **kwargs)``; ``raises`` is the
    exception the agent expects (and catches)."""

    method: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] | None = None
    raises: type[BaseException] | None = None


SCRIPT = [
    Step("call", ("lookup", lookup, "T-9")),
    Step("call", ("lookup", broken, "T-9"), raises=ToolDown),
    Step(
        "llm",
        (model, {"model": "m-1", "messages": [{"role": "user", "content": "hi"}]}),
        {"provider": "openai"},
    ),
    Step("now"),
    Step("monotonic"),
    Step("random"),
    Step("randint", (1, 6)),
    Step("uuid"),
    Step("effect", ("notify", send), {"arguments": {"to": "someone@example.com"}}),
    Step(
        "effect",
        ("notify", refuse),
        {"arguments": {"to": "x"}, "key": "k-1"},
        raises=EffectRejected,
    ),
    Step("transition", ("triaged",), {"state": {"priority": 2}, "reason": "looked up"}),
]
CRASHING = [
    Step("transition", ("sending",), {"state": {}}),
    Step("effect", ("notify", die), {"arguments": {"to": "y"}}, raises=Crash),
]


async def _perform(run: Any, step: Step) -> Any:
    try:
        value = getattr(run, step.method)(*step.args, **(step.kwargs or {}))
        if inspect.isawaitable(value):
            value = await value
    except BaseException as exc:
        if step.raises is None or not _expected(exc, step.raises):
            raise
        return None
    assert step.raises is None, f"{step.method} did not raise {step.raises}"
    return value


def _expected(exc: BaseException, raises: type[BaseException]) -> bool:
    # Replay raises a recorded tool error as RecordedError naming the original class.
    recorded = isinstance(exc, RecordedError) and exc.type_name == raises.__qualname__
    return recorded or isinstance(exc, raises)


async def _settle(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def _script(recorder: Any, steps: list[Step], *, finish: bool) -> str:
    run = await _settle(recorder.start_run(SNAPSHOT, OPTIONS))
    for step in steps:
        await _perform(run, step)
    if finish:
        await _settle(run.finish(output={"done": True}))
    return str(run.run_id)


async def _recover(recorder: Any, run_id: str) -> None:
    pending = await _settle(recorder.unresolved_effects(run_id=run_id))
    assert [p.effect for p in pending] == ["notify"]
    run = await _settle(recorder.resume(run_id))
    receipt = await _settle(run.resolve_effect(pending[0], lambda key: {"external_id": "late"}))
    assert receipt.status == "confirmed"
    assert await _settle(recorder.unresolved_effects(run_id=run_id)) == []
    await _settle(run.finish(error=RuntimeError("crashed once")))


@dataclass
class Harness:
    recorder: Any
    read: Callable[[str], list[Envelope]]


def _outbox_reader(engine: Engine) -> Callable[[str], list[Envelope]]:
    codec = EnvelopeCodec()

    def read(run_id: str) -> list[Envelope]:
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT envelope FROM blackbox.outbox WHERE run_id = :r ORDER BY sequence"),
                {"r": run_id},
            ).scalars()
            return [codec.decode(bytes(row)) for row in rows]

    return read


def _memory_reader(recorder: Any) -> Callable[[str], list[Envelope]]:
    return lambda run_id: [e for e in recorder.events if e.run_id == run_id]


def _harness(kind: str, request: pytest.FixtureRequest) -> Iterator[Harness]:
    if kind == "memory":
        memory = MemoryRecorder(settings=Settings())
        yield Harness(memory, _memory_reader(memory))
        return
    if kind == "async-memory":
        async_memory = AsyncMemoryRecorder(settings=Settings())
        yield Harness(async_memory, _memory_reader(async_memory))
        return
    settings: Settings = request.getfixturevalue("settings")
    engine: Engine = request.getfixturevalue("engine")
    if kind == "postgres":
        yield Harness(Recorder(engine, settings=settings), _outbox_reader(engine))
        return
    async_engine = create_async_engine(settings.database_url)
    try:
        yield Harness(AsyncRecorder(async_engine, settings=settings), _outbox_reader(engine))
    finally:
        asyncio.run(async_engine.dispose())


@pytest.fixture(params=RECORDERS)
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    yield from _harness(str(request.param), request)


_VOLATILE_ATTRIBUTES = {"latency_ms"}
_VOLATILE_BODY = {"latency_ms", "value_us", "value_json"}


def _shape(envelopes: list[Envelope]) -> list[dict[str, Any]]:
    """What must match across recorders: everything but ids, times and random values.

    The run id is replaced by a placeholder wherever it shows (default idempotency keys
    hold it); a digest taken over it, or over a time or a random value, is left out.
    """
    pipeline = PayloadPipeline()
    shaped = []
    for e in envelopes:
        run = e.run_id
        volatile = e.event_type in ("clock.read", "random.draw")
        keyed_by_run = run in e.attributes.get("idempotency_key", "")
        body = {
            k: v.replace(run, "<run>") if isinstance(v, str) else v
            for k, v in pipeline.unpack(e).items()
            if k not in _VOLATILE_BODY
        }
        attributes = {
            k: v.replace(run, "<run>")
            for k, v in e.attributes.items()
            if k not in _VOLATILE_ATTRIBUTES
        }
        shaped.append(
            {
                "sequence": e.sequence,
                "event_type": e.event_type,
                "body_version": e.body_version,
                "tenant_id": e.tenant_id,
                "agent_id": e.agent_id,
                "subject_ids": tuple(e.subject_ids),
                "classification": e.classification,
                "retention_class": e.retention_class,
                "input_digest": None if keyed_by_run else e.input_digest,
                "output_digest": None if volatile or keyed_by_run else e.output_digest,
                "payload_encoding": e.payload_encoding,
                "attributes": attributes,
                "body": body,
            }
        )
    return shaped


def _record_all(harness: Harness) -> tuple[list[Envelope], list[Envelope]]:
    async def scenario() -> tuple[str, str]:
        finished = await _script(harness.recorder, SCRIPT, finish=True)
        crashed = await _script(harness.recorder, CRASHING, finish=False)
        await _recover(harness.recorder, crashed)
        return finished, crashed

    finished, crashed = asyncio.run(scenario())
    return harness.read(finished), harness.read(crashed)


def _chained(run: list[Envelope]) -> bool:
    previous = GENESIS_CHAIN_HASH
    for envelope in run:
        if envelope.chain_hash != envelope.expected_chain_hash(previous):
            return False
        previous = envelope.chain_hash
    return True


def test_every_recorder_records_the_same_envelopes(request: pytest.FixtureRequest) -> None:
    shapes = {}
    for kind in RECORDERS:
        harnesses = _harness(kind, request)
        harness = next(harnesses)
        try:
            finished, crashed = _record_all(harness)
        finally:
            harnesses.close()
        events = 2 + sum(2 if step.method == "effect" else 1 for step in SCRIPT)
        assert [e.sequence for e in finished] == list(range(1, events + 1)), kind
        assert [e.event_type for e in crashed][-3:] == [
            "effect.intent",
            "effect.receipt",
            "run.finished",
        ], kind
        assert _chained(finished), kind
        assert _chained(crashed), kind
        shapes[kind] = (_shape(finished), _shape(crashed))
    reference = shapes["memory"]
    for kind, shape in shapes.items():
        assert shape == reference, f"{kind} records other envelopes than the memory recorder"


def test_what_every_recorder_records_replays(harness: Harness) -> None:
    finished, _ = _record_all(harness)
    replay = ReplayRun(finished)

    async def again() -> None:
        for step in SCRIPT:
            await _perform(replay, step)

    asyncio.run(again())
    replay.finish(output={"done": True})
    assert replay.consumed == len(finished)


def test_recorders_from_settings_seal_alike(
    settings: Settings, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a key-encryption key in the environment, the sync and the async recorder
    built from settings both seal every body under the run's data key."""
    monkeypatch.setenv("BLACKBOX_KEK", "v1:" + base64.b64encode(os.urandom(32)).decode())
    read = _outbox_reader(engine)

    async def record_async() -> str:
        recorder = AsyncRecorder.from_settings(settings)
        try:
            return await _script(recorder, SCRIPT, finish=True)
        finally:
            await recorder.engine.dispose()

    recorder = Recorder.from_settings(settings)
    try:
        sync_run = asyncio.run(_script(recorder, SCRIPT, finish=True))
    finally:
        recorder.engine.dispose()
    async_run = asyncio.run(record_async())
    for run_id in (sync_run, async_run):
        envelopes = read(run_id)
        assert len(envelopes) > len(SCRIPT)
        assert {e.payload_encoding for e in envelopes} == {SEALED_ENCODING}
        assert all(e.key_id for e in envelopes)
