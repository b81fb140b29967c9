"""The Recorder against a real Postgres: bad input changes nothing, async works."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import create_async_engine

from agent_blackbox.outbox import (
    AsyncRecorder,
    EffectRejected,
    PayloadTooLarge,
    Recorder,
    RunNotActive,
    RunSnapshot,
)
from agent_blackbox.schemas import EnvelopeCodec, NotSerialisable, PayloadPipeline, Settings
from tests.integration._agents import noise

pytestmark = pytest.mark.integration


def _nested(levels: int) -> Any:
    value: Any = "bottom"
    for _ in range(levels):
        value = {"a": value}
    return value


def _events(engine: Engine, run_id: str) -> list[tuple[int, str]]:
    codec = EnvelopeCodec()
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT sequence, envelope FROM blackbox.outbox WHERE run_id = :r ORDER BY id"),
            {"r": run_id},
        ).all()
    return [(seq, codec.decode(env).event_type) for seq, env in rows]


@pytest.mark.parametrize(
    ("argument", "complaint"),
    [
        (object(), "a object is not JSON-serialisable"),
        (float("nan"), "nan is not a finite number"),
        ({1: "x"}, "key 1 is a int"),
        (_nested(3_000), "nest more than 100 levels deep"),
    ],
    ids=["object", "nan", "int key", "3000 levels deep"],
)
def test_bad_argument_is_refused_before_the_tool_runs(
    engine: Engine, settings: Settings, argument: Any, complaint: str
) -> None:
    recorder = Recorder(engine, settings=settings)
    run = recorder.start_run(RunSnapshot(code_version="v1"), agent_id="a")
    called = []
    with pytest.raises(NotSerialisable, match=complaint) as caught:
        run.call("lookup", lambda value: called.append(value), argument)
    assert "lookup.arguments.args[0]" in str(caught.value)
    assert called == []
    assert _events(engine, run.run_id) == [(1, "run.started")]
    run.call("lookup", lambda value: value, 1)  # the run goes on, at the next sequence
    assert _events(engine, run.run_id) == [(1, "run.started"), (2, "tool.call")]


def test_a_deeply_nested_result_is_a_recorded_error(engine: Engine, settings: Settings) -> None:
    run = Recorder(engine, settings=settings).start_run(
        RunSnapshot(code_version="v1"), agent_id="a"
    )
    with pytest.raises(NotSerialisable, match=r"lookup\.result\.rows\.a\.a.*100 levels"):
        run.call("lookup", lambda: {"rows": _nested(3_000)})
    assert _events(engine, run.run_id) == [(1, "run.started"), (2, "tool.call")]
    run.finish(output="handled")
    assert _events(engine, run.run_id)[-1] == (3, "run.finished")


def test_unserialisable_result_is_a_recorded_error_and_oversized_body_writes_nothing(
    engine: Engine, settings: Settings
) -> None:
    small = Settings(
        database_url=settings.database_url, max_blob_bytes=10_000, blob_threshold_bytes=1_000
    )
    recorder = Recorder(engine, settings=small)
    run = recorder.start_run(RunSnapshot(code_version="v1"), agent_id="a")
    with pytest.raises(NotSerialisable, match=r"lookup\.result\.when"):
        run.call("lookup", lambda: {"when": object()})
    # The tool ran: its call is recorded, as an error of kind unserialisable_result.
    assert _events(engine, run.run_id) == [(1, "run.started"), (2, "tool.call")]
    with pytest.raises(PayloadTooLarge, match="over the limit of 10000"):
        run.call("lookup", lambda: noise(20_000))
    run.call("lookup", lambda: noise(5_000))  # over the blob threshold: stored out of line
    assert _events(engine, run.run_id) == [(1, "run.started"), (2, "tool.call"), (3, "tool.call")]
    codec = EnvelopeCodec()
    with engine.connect() as conn:
        row = conn.execute(
            text("SELECT envelope FROM blackbox.outbox WHERE sequence = 2 AND run_id = :r"),
            {"r": run.run_id},
        ).scalar_one()
        first = codec.decode(row)
        stored = None  # the refusal's body may be over the blob threshold too
        if first.payload_ref is not None:
            stored = conn.execute(
                text("SELECT data FROM blackbox.blobs WHERE digest = :d"), {"d": first.payload_ref}
            ).scalar_one()
        refused = PayloadPipeline().unpack(first, None if stored is None else bytes(stored))
        assert refused["error"]["kind"] == "unserialisable_result"
        row = conn.execute(
            text("SELECT envelope FROM blackbox.outbox WHERE sequence = 3 AND run_id = :r"),
            {"r": run.run_id},
        ).scalar_one()
        envelope = codec.decode(row)
        assert envelope.payload is None
        assert envelope.payload_ref is not None
        blob = conn.execute(
            text("SELECT data FROM blackbox.blobs WHERE digest = :d"), {"d": envelope.payload_ref}
        ).scalar_one()
        # The oversized body left no blob behind: every blob is a recorded event's.
        referenced = {e.payload_ref for e in (first, envelope) if e.payload_ref is not None}
        assert conn.execute(text("SELECT count(*) FROM blackbox.blobs")).scalar_one() == len(
            referenced
        )
    body = PayloadPipeline().unpack(envelope, bytes(blob))
    assert body["result_json"] == '"' + noise(5_000) + '"'


def test_effect_intent_commits_before_the_external_call(engine: Engine, settings: Settings) -> None:
    recorder = Recorder(engine, settings=settings)
    run = recorder.start_run(RunSnapshot(code_version="v1"), agent_id="a")
    seen_before_call: list[list[tuple[int, str]]] = []

    def send(key: str) -> dict[str, str]:
        seen_before_call.append(_events(engine, run.run_id))  # another connection looks
        return {"external_id": f"ext-{key}"}

    receipt = run.effect("notify", send, arguments={"to": "x"})
    assert seen_before_call == [[(1, "run.started"), (2, "effect.intent")]]
    assert receipt.status == "confirmed"
    assert receipt.idempotency_key == f"{run.run_id}:2"

    def refuse(key: str) -> None:
        raise EffectRejected("mailbox full", external_id="bounce-1")

    with pytest.raises(EffectRejected):
        run.effect("notify", refuse, arguments={"to": "y"})

    def time_out(key: str) -> None:
        raise TimeoutError("no answer")

    with pytest.raises(TimeoutError):
        run.effect("notify", time_out, arguments={"to": "z"})
    codec = EnvelopeCodec()
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT envelope FROM blackbox.outbox WHERE run_id = :r ORDER BY id"),
            {"r": run.run_id},
        ).scalars()
        statuses = [codec.decode(r).attributes.get("status") for r in rows]
    assert statuses == [None, None, "confirmed", None, "failed", None, "unknown"]


def test_async_recorder_records_in_order(settings: Settings, engine: Engine) -> None:
    async def scenario() -> str:
        async_engine = create_async_engine(settings.database_url)
        recorder = AsyncRecorder(async_engine, settings=settings)
        try:
            async with await recorder.start_run(
                RunSnapshot(code_version="v1"), agent_id="a"
            ) as run:

                async def fetch(x: int) -> int:
                    await asyncio.sleep(0)
                    return x * 2

                assert await run.call("fetch", fetch, 21) == 42
                assert await run.call("sync", lambda: "plain") == "plain"
                await run.now()
                await run.uuid()
                await run.effect("notify", lambda key: {"external_id": key}, arguments={})
                await run.transition("done", state={"ok": True})
            return run.run_id
        finally:
            await async_engine.dispose()

    run_id = asyncio.run(scenario())
    assert [t for _, t in _events(engine, run_id)] == [
        "run.started",
        "tool.call",
        "tool.call",
        "clock.read",
        "random.draw",
        "effect.intent",
        "effect.receipt",
        "state.transition",
        "run.finished",
    ]


class _Crash(BaseException):
    """The agent process dying between intent and receipt."""


def test_effect_left_open_by_a_crash_is_resolved_by_asking_the_external_system(
    engine: Engine, settings: Settings
) -> None:
    crashed = Recorder(engine, settings=settings).start_run(
        RunSnapshot(code_version="v1"), agent_id="a"
    )
    calls: list[str] = []

    def die(key: str) -> None:
        calls.append(key)
        raise _Crash

    for target in ("x", "y"):
        with pytest.raises(_Crash):
            crashed.effect("notify", die, arguments={"to": target})

    successor = Recorder(engine, settings=settings)  # a new process after the crash
    pending = successor.unresolved_effects()
    assert [(p.run_id, p.status, p.intent_sequence) for p in pending] == [
        (crashed.run_id, "pending", 2),
        (crashed.run_id, "pending", 3),
    ]
    resumed = successor.resume(crashed.run_id)
    known = {calls[0]: {"external_id": "n-7"}}
    receipts = [resumed.resolve_effect(p, known.get) for p in pending]
    assert [(r.status, r.external_id) for r in receipts] == [("confirmed", "n-7"), ("failed", None)]
    assert successor.unresolved_effects() == []
    resumed.finish()
    assert [t for _, t in _events(engine, crashed.run_id)] == [
        "run.started",
        "effect.intent",
        "effect.intent",
        "effect.receipt",
        "effect.receipt",
        "run.finished",
    ]
    with pytest.raises(RunNotActive, match="only running runs resume"):
        successor.resume(crashed.run_id)


def test_appends_lend_the_pool_its_connections_back_in_transaction_mode(
    settings: Settings, engine: Engine
) -> None:
    # An append that is one statement commits on its own (autocommit, on the pool's
    # DB-API connection): the connection must go back to the pool as it came, so the
    # agent's own transactions on the same engine still roll back.
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE public.orders (id text PRIMARY KEY)"))
    run = Recorder(engine, settings=settings).start_run(RunSnapshot("lend"), agent_id="a")
    for _ in range(3):
        run.now()

    def order_then_fail() -> None:
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO public.orders VALUES ('O-1')"))
            raise RuntimeError("the agent's transaction fails")

    with pytest.raises(RuntimeError):
        order_then_fail()
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM public.orders")).scalar_one() == 0
    assert [seq for seq, _ in _events(engine, run.run_id)] == [1, 2, 3, 4]


def _status(engine: Engine, run_id: str) -> str | None:
    with engine.connect() as conn:
        found = conn.execute(
            text("SELECT status FROM blackbox.runs WHERE run_id = :r"), {"r": run_id}
        ).scalar_one_or_none()
    return None if found is None else str(found)


def test_a_nul_in_a_name_or_an_id_is_refused_as_a_value_not_as_an_outage(
    engine: Engine, settings: Settings
) -> None:
    recorder = Recorder(engine, settings=settings)

    def agent(run: Any, _: Any) -> str:
        run.transition("a\x00b", state={})
        return "ok"

    with pytest.raises(NotSerialisable, match="NUL") as raised:
        recorder.record(agent, RunSnapshot(code_version="n"), agent_id="nul", run_id="nul-state")
    assert "reachable" not in str(raised.value)
    assert _status(engine, "nul-state") == "failed"  # the run did not stay open
    assert [t for _, t in _events(engine, "nul-state")] == ["run.started", "run.finished"]
    for given in ({"agent_id": "a\x00b"}, {"agent_id": "nul", "subject_ids": ("s\x00",)}):
        with pytest.raises(NotSerialisable, match="NUL"):
            recorder.start_run(RunSnapshot(code_version="n"), run_id="nul-start", **given)
        assert _status(engine, "nul-start") is None  # nothing was recorded


def test_a_label_too_long_for_an_event_is_refused_before_anything_is_written(
    engine: Engine, settings: Settings
) -> None:
    recorder = Recorder(engine, settings=settings)
    snapshot = RunSnapshot(code_version="n")
    refused = pytest.raises(NotSerialisable, match=r"^state\.transition\.to_state: the event")
    with refused, recorder.start_run(snapshot, run_id="long", agent_id="a") as run:
        run.transition("s" * 300_000, state={})
    assert [t for _, t in _events(engine, "long")] == ["run.started", "run.finished"]
    assert _status(engine, "long") == "failed"


def test_an_error_whose_message_is_not_unicode_is_the_error_recorded_and_raised(
    engine: Engine, settings: Settings
) -> None:
    recorder = Recorder(engine, settings=settings)

    def tool() -> None:
        raise ValueError(b"caf\xe9".decode("utf-8", "surrogateescape"))

    def agent(run: Any, _: Any) -> str:
        run.call("tool", tool)
        return "ok"

    with pytest.raises(ValueError, match="caf"):  # the agent's own error, not an encoding one
        recorder.record(agent, RunSnapshot(code_version="n"), agent_id="u", run_id="surrogate")
    assert _status(engine, "surrogate") == "failed"
    with engine.connect() as conn:
        data = conn.execute(
            text("SELECT envelope FROM blackbox.outbox WHERE run_id = 'surrogate' AND sequence = 2")
        ).scalar_one()
    body = PayloadPipeline().unpack(EnvelopeCodec().decode(data))
    assert body["error"]["message"] == "caf\\udce9"
