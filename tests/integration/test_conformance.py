"""One agent script, every recorder: the envelopes must be the same apart from ids and times.

The script is data (a list of boundary calls), so that the sync recorders and the async
ones run exactly the same thing: a runner calls each step on the run and awaits what an
async run returns. Postgres recorders are read back from the outbox; memory recorders
from their list. Volatile values (event and run ids, times, latencies, random draws) are
masked; everything else, digests and bodies included, must be equal across recorders.
A crash between an effect's intent and its receipt, the recovery of that effect and
the replay of every recorded run are part of the suite: through :class:`ReplayRun` and
:class:`AsyncReplayRun` driven by hand (the code sees what it saw when recording), and
through ``replay_run`` with a coroutine entry (every boundary, sync and async, through
record and replay, is ``tests/unit/test_record_replay.py``'s, with the memory
recorders). An agent written twice, as a plain function and as a coroutine function,
records the same envelopes with every recorder and replays through either twin. With a
key-encryption key in the environment, the sync and the async recorder built from
settings seal every body alike.
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
from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import create_async_engine

from agent_blackbox.keystore import (
    SEALED_ENCODING,
    AesGcmSealer,
    AuditedKeys,
    LocalKeyProvider,
    WrongKey,
)
from agent_blackbox.outbox import (
    AsyncMemoryRecorder,
    AsyncRecorder,
    EffectOutcome,
    EffectRejected,
    GroupCommit,
    MemoryRecorder,
    RecordedError,
    Recorder,
    RunOptions,
    RunSnapshot,
)
from agent_blackbox.replayer import (
    AsyncReplayRun,
    ReplayRun,
    is_async_entry,
    replay_run,
    replay_run_async,
)
from agent_blackbox.schemas import (
    GENESIS_CHAIN_HASH,
    Envelope,
    PayloadPipeline,
    Settings,
    UndecodableMessage,
    split_encoding,
)
from tests.integration._outbox import outbox_envelopes

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

RECORDERS = [
    "memory",
    "async-memory",
    "postgres",
    "async-postgres",
    "postgres-group",
    "async-postgres-group",
]
GROUP = GroupCommit(max_delay_ms=5)
"""Group commit mode (``-group``): its envelopes must be per-event mode's."""
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


def search(query: str, *, filters: Any, top_k: int | None) -> list[dict[str, Any]]:
    return [{"id": "kb-1", "score": 0.8, "chunk_version": "3"}]


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
    Step(
        "retrieve",
        ("kb", search, "refund policy"),
        {"index_version": "v3", "filters": {"lang": "en"}, "top_k": 1},
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
        return type(exc)
    assert step.raises is None, f"{step.method} did not raise {step.raises}"
    if isinstance(value, Envelope):  # a transition's: as appended, or as recorded
        return value.sequence, value.chain_hash
    return value


def _expected(exc: BaseException, raises: type[BaseException]) -> bool:
    # Replay raises a recorded tool error as RecordedError naming the original class.
    recorded = isinstance(exc, RecordedError) and exc.type_name == raises.__qualname__
    return recorded or isinstance(exc, raises)


async def _settle(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def _script(
    recorder: Any, steps: list[Step], *, finish: bool, seen: list[Any] | None = None
) -> str:
    run = await _settle(recorder.start_run(SNAPSHOT, OPTIONS))
    for step in steps:
        value = await _perform(run, step)
        if seen is not None:
            seen.append(value)
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

    def read(run_id: str) -> list[Envelope]:
        return outbox_envelopes(engine, run_id)

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
    group = GROUP if kind.endswith("-group") else None
    if kind.startswith("postgres"):
        recorder = Recorder(engine, settings=settings, group_commit=group)
        yield Harness(recorder, _outbox_reader(engine))
        return
    async_engine = create_async_engine(settings.database_url)
    try:
        async_recorder = AsyncRecorder(async_engine, settings=settings, group_commit=group)
        yield Harness(async_recorder, _outbox_reader(engine))
    finally:
        asyncio.run(async_engine.dispose())


@pytest.fixture(params=RECORDERS)
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    yield from _harness(str(request.param), request)


_VOLATILE_ATTRIBUTES = {"latency_ms"}
_VOLATILE_BODY = {"latency_ms", "value_us", "value_json"}


def _shape(
    envelopes: list[Envelope], pipeline: PayloadPipeline | None = None
) -> list[dict[str, Any]]:
    """What must match across recorders: everything but ids, times and random values.

    The run id is replaced by a placeholder wherever it shows (default idempotency keys
    hold it); a digest taken over it, or over a time or a random value, is left out.
    """
    pipeline = pipeline or PayloadPipeline()
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


def _record_all(
    harness: Harness, seen: list[Any] | None = None
) -> tuple[list[Envelope], list[Envelope]]:
    async def scenario() -> tuple[str, str]:
        finished = await _script(harness.recorder, SCRIPT, finish=True, seen=seen)
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


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_what_every_recorder_records_replays(harness: Harness, flavour: str) -> None:
    """Through :class:`ReplayRun` and :class:`AsyncReplayRun` driven by hand: the code
    sees what it saw when recording (values with their types, the exceptions it
    expected), and the recorded end comes back."""
    seen: list[Any] = []
    finished, _ = _record_all(harness, seen)
    replay = ReplayRun(finished)
    run: Any = replay if flavour == "sync" else AsyncReplayRun(replay)

    async def again() -> tuple[list[Any], Envelope]:
        values = [await _perform(run, step) for step in SCRIPT]
        return values, await _settle(run.finish(output={"done": True}))

    values, ended = asyncio.run(again())
    assert [(type(v), v) for v in values] == [(type(v), v) for v in seen]
    assert (ended.event_type, ended.sequence) == ("run.finished", len(finished))
    assert replay.consumed == len(finished)


driven_with: list[type] = []
"""The class of run each call of :func:`scripted_entry` was given."""


async def scripted_entry(run: Any, input: Any) -> Any:
    """The script as an async agent entry: what ``replay_run`` drives with an async run."""
    driven_with.append(type(run))
    for step in SCRIPT:
        await _perform(run, step)
    return {"done": True}


def test_what_every_recorder_records_replays_through_a_coroutine_entry(
    harness: Harness,
) -> None:
    finished, _ = _record_all(harness)
    assert is_async_entry(scripted_entry)
    driven_with.clear()
    report = replay_run(finished, scripted_entry)
    assert report.passed, report.divergence and report.divergence.describe()
    assert driven_with == [AsyncReplayRun]
    assert report.result == "PASS"

    async def changed(run: Any, input: Any) -> Any:  # the first step's argument differs
        await run.call("lookup", lookup, "T-10")
        return {"done": True}

    diverged = replay_run(finished, changed)
    assert not diverged.passed
    assert diverged.divergence is not None
    assert diverged.divergence.sequence == 2


# One agent written twice: as a plain function and as a coroutine function ------------


def sync_agent(run: Any, input: Any) -> Any:
    found = run.call("lookup", lookup, input["ticket"])
    try:
        run.call("lookup", broken, input["ticket"])
    except ToolDown as exc:
        found["fallback"] = str(exc)
    reply = run.llm(model, {"model": "m-1", "messages": []}, provider="openai", model="m-1")
    run.now()
    dice = run.randint(1, 6)
    receipt = run.effect("notify", send, arguments={"to": input["email"]}, key="notify-1")
    state = {"priority": found["priority"], "dice": 1 <= dice <= 6}
    run.transition("triaged", state=state, reason="looked up")
    return {"found": found, "reply": reply["choices"][0], "receipt": receipt.status}


async def async_agent(run: Any, input: Any) -> Any:
    found = await run.call("lookup", lookup, input["ticket"])
    try:
        await run.call("lookup", broken, input["ticket"])
    except ToolDown as exc:
        found["fallback"] = str(exc)
    request = {"model": "m-1", "messages": []}
    reply = await run.llm(model, request, provider="openai", model="m-1")
    await run.now()
    dice = await run.randint(1, 6)
    receipt = await run.effect("notify", send, arguments={"to": input["email"]}, key="notify-1")
    state = {"priority": found["priority"], "dice": 1 <= dice <= 6}
    await run.transition("triaged", state=state, reason="looked up")
    return {"found": found, "reply": reply["choices"][0], "receipt": receipt.status}


def _record_twin(harness: Harness) -> list[Envelope]:
    """Record the twin that fits the recorder through ``record``: the coroutine function
    with an async recorder, the plain one with a sync recorder."""
    recorder = harness.recorder
    output: Any
    if isinstance(recorder, AsyncRecorder | AsyncMemoryRecorder):
        run, output = asyncio.run(recorder.record(async_agent, SNAPSHOT, OPTIONS))
    else:
        run, output = recorder.record(sync_agent, SNAPSHOT, OPTIONS)
    assert output["receipt"] == "confirmed"
    assert output["found"]["fallback"] == "no ticket service for T-9"
    return harness.read(run.run_id)


def test_an_async_agent_records_what_its_sync_twin_records_and_replays_through_either(
    request: pytest.FixtureRequest,
) -> None:
    shapes = {}
    for kind in RECORDERS:
        harnesses = _harness(kind, request)
        try:
            events = _record_twin(next(harnesses))
        finally:
            harnesses.close()
        assert events[-1].event_type == "run.finished", kind
        assert _chained(events), kind
        shapes[kind] = _shape(events)
        for entry in (sync_agent, async_agent):
            report = replay_run(events, entry)
            assert report.passed, (kind, entry.__name__, report.divergence)
        inside = asyncio.run(replay_run_async(events, async_agent))
        assert inside.passed, (kind, inside.divergence)
    for kind, shape in shapes.items():
        assert shape == shapes["memory"], f"{kind} records the twin otherwise than memory"


# Encryption from settings ---------------------------------------------------------


@pytest.fixture(params=["BLACKBOX_KEK", "BLACKBOX_KEK_FILE"])
def kek_in_environment(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> LocalKeyProvider:
    """A key-encryption key configured the way an operator does: inline or in a file."""
    key = base64.b64encode(os.urandom(32)).decode()
    monkeypatch.delenv("BLACKBOX_KEK", raising=False)
    monkeypatch.delenv("BLACKBOX_KEK_FILE", raising=False)
    if request.param == "BLACKBOX_KEK":
        monkeypatch.setenv("BLACKBOX_KEK", f"v1:{key}")
    else:
        path = tmp_path / "kek.json"
        path.write_text(f'{{"current": "v1", "keys": {{"v1": "{key}"}}}}', encoding="utf-8")
        path.chmod(0o600)  # a key file others can read is refused
        monkeypatch.setenv("BLACKBOX_KEK_FILE", str(path))
    provider = LocalKeyProvider.from_env()
    assert provider is not None
    return provider


def test_recorders_from_settings_seal_alike(
    settings: Settings, engine: Engine, kek_in_environment: LocalKeyProvider
) -> None:
    """With a key-encryption key in the environment, the sync and the async recorder
    built from settings both seal every body under the run's own data key: nothing
    opens without the key, everything opens and replays with it."""
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
    keys = AuditedKeys(engine, kek_in_environment, purpose="conformance: sealing parity")
    sealed = PayloadPipeline(sealer=AesGcmSealer(keys))
    other_kek = LocalKeyProvider({"v1": os.urandom(32)})
    stranger = AuditedKeys(engine, other_kek, purpose="conformance: the wrong key")
    shapes = []
    for run_id in (sync_run, async_run):
        envelopes = read(run_id)
        assert len(envelopes) == 2 + sum(2 if s.method == "effect" else 1 for s in SCRIPT)
        assert {split_encoding(e.payload_encoding)[1] for e in envelopes} == {SEALED_ENCODING}, (
            run_id
        )
        assert len({e.key_id for e in envelopes}) == 1, "one data key per run"
        assert envelopes[0].key_id, run_id
        for envelope in envelopes:
            assert envelope.payload is not None
            assert b"T-9" not in envelope.payload, "a sealed body shows its content"
            with pytest.raises(UndecodableMessage, match=r"sealed .* no key provider"):
                PayloadPipeline().unpack(envelope)
        with pytest.raises(WrongKey):
            PayloadPipeline(sealer=AesGcmSealer(stranger)).unpack(envelopes[1])
        shapes.append(_shape(envelopes, sealed))
        report = replay_run(envelopes, scripted_entry, pipeline=sealed, digests=keys)
        assert report.passed, report.divergence and report.divergence.describe()
        keyless = replay_run(envelopes, scripted_entry)
        assert keyless.result == "ERROR", "a run replayed without its key is no divergence"
        assert keyless.error is not None
        assert run_id in keyless.error
    assert shapes[0] == shapes[1], "the async recorder seals other bodies than the sync one"
