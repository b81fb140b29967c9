"""Faithful values: what crossed a boundary comes back in replay with its type, or is
refused at record time; exceptions come back as their own class."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import json
import math
import secrets
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any, NamedTuple, cast

import pydantic
import pytest

import agent_blackbox as bb
from agent_blackbox.outbox import (
    DEFAULT_CONVERTERS,
    AgentRun,
    AsyncMemoryRecorder,
    AsyncRun,
    EffectOutcome,
    MemoryRecorder,
    NotSerialisable,
    RecordedError,
    RunSnapshot,
    decode_value,
    encode_value,
    rebuild_error,
    register_converter,
)
from agent_blackbox.replayer import ReplayReport, read_archive, replay_run
from agent_blackbox.replayer._fork import RecordedTools, parent_snapshot
from agent_blackbox.schemas import (
    BodyReader,
    Envelope,
    MigratorRegistry,
    PayloadPipeline,
    Settings,
)


class Colour(enum.Enum):
    RED = "red"
    BLUE = (1, 2)


class Level(enum.IntEnum):
    LOW = 1


@dataclasses.dataclass(frozen=True)
class Refund:
    order: str
    amount: Decimal
    at: datetime
    tags: tuple[str, ...] = ()


@dataclasses.dataclass(slots=True)
class Basket:
    items: list[Refund]
    seen: set[int]
    derived: int = dataclasses.field(init=False, default=0)


class Point(NamedTuple):
    x: int
    y: int


class Customer(pydantic.BaseModel):
    name: str
    joined: date
    ids: tuple[int, ...]


class Money:
    """Not a dataclass: recordable only through a converter."""

    def __init__(self, cents: int, currency: str) -> None:
        self.cents, self.currency = cents, currency

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Money) and (self.cents, self.currency) == (
            other.cents,
            other.currency,
        )

    def __hash__(self) -> int:
        return hash((self.cents, self.currency))


class FraudServiceDown(Exception):
    def __init__(self, service: str, retry_after: float) -> None:
        super().__init__(service, retry_after)
        self.service, self.retry_after = service, retry_after


class QuotaExceeded(Exception):
    """Keeps a message in args but takes keywords: rebuilt without calling __init__."""

    def __init__(self, *, quota: int) -> None:
        super().__init__(f"quota {quota} exceeded")
        self.quota = quota


class PaymentDeclined(Exception):
    def __init__(self, reason: Money) -> None:
        super().__init__("declined")
        self.reason = reason


SAMPLES: dict[str, Any] = {
    "tuple": (1, "a", (2.5, None)),
    "set": {3, 1, 2},
    "frozenset": frozenset({"x", "y"}),
    "frozen dataclass": Refund("o-1", Decimal("10.50"), datetime(2026, 1, 2, 3, 4, 5, 678901, UTC)),
    "slots dataclass": Basket([Refund("o-2", Decimal("1"), datetime(2026, 1, 1), ("a",))], {7}),
    "enum": Colour.BLUE,
    "int enum": Level.LOW,
    "aware datetime": datetime(2026, 12, 2, 10, 0, 0, 123456, timezone(timedelta(hours=2))),
    "naive datetime": datetime(2026, 12, 2, 10, 0, 0, 123456),
    "date": date(2026, 12, 2),
    "time": time(10, 0, 0, 123456),
    "timedelta": timedelta(days=2, seconds=5, microseconds=7),
    "decimal": Decimal("-0.000100"),
    "uuid": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    "bytes": b"\x00\xffbinary",
    "named tuple": Point(1, 2),
    "pydantic model": Customer(name="Ada", joined=date(2020, 5, 17), ids=(1, 2)),
    "int keys": {1: "one", 2: (2,)},
    "a key like the tag": {"$type": "tuple", "items": [1]},
    "nested": {"refunds": [Refund("o-3", Decimal("2"), datetime(2026, 1, 1, tzinfo=UTC))]},
    "infinity": math.inf,
    "plain json": {"a": [1, 2.5, "x", None, True], "b": {}},
}


def _type_tree(value: Any) -> Any:
    """The types of ``value`` all the way down, so a list where a tuple was fails."""
    if isinstance(value, dict):
        return (dict, [(_type_tree(k), _type_tree(v)) for k, v in value.items()])
    if isinstance(value, list | tuple):
        return (type(value), [_type_tree(v) for v in value])
    if dataclasses.is_dataclass(value):
        return (
            type(value),
            [_type_tree(getattr(value, f.name)) for f in dataclasses.fields(value)],
        )
    return type(value)


def _record(
    entry: Callable[[AgentRun, Any], Any], *, input: Any = None
) -> tuple[MemoryRecorder, list[Envelope]]:
    recorder = MemoryRecorder()
    # A run that fails is recorded as failed; the replay checks that it fails the same way.
    with contextlib.suppress(Exception):
        recorder.record(entry, RunSnapshot(code_version="t", input=input), agent_id="values")
    return recorder, list(recorder.events)


def _replay(events: list[Envelope], entry: Callable[[AgentRun, Any], Any]) -> ReplayReport:
    return replay_run(events, entry)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_a_tool_result_comes_back_with_its_type_and_value(name: str) -> None:
    original = SAMPLES[name]
    seen: list[Any] = []

    def agent(run: AgentRun, _: Any) -> str:
        seen.append(run.call("lookup", lambda: original))
        return "done"

    _, events = _record(agent)
    report = _replay(events, agent)
    assert report.passed, report
    recorded, replayed = seen
    assert recorded is original
    if name == "pydantic model":
        assert type(replayed) is Customer
        assert replayed == original
        assert type(replayed.ids) is tuple
        return
    assert type(replayed) is type(original)
    assert replayed == original or (name == "infinity" and math.isinf(replayed))
    assert _type_tree(replayed) == _type_tree(original)


def test_the_run_input_comes_back_with_its_type() -> None:
    original = (Point(1, 2), frozenset({Decimal("1.5")}), Colour.RED)
    seen: list[Any] = []

    def agent(run: AgentRun, given: Any) -> None:
        seen.append(given)

    _, events = _record(agent, input=original)
    assert _replay(events, agent).passed
    assert seen[1] == original
    assert _type_tree(seen[1]) == _type_tree(original)


def test_an_effect_result_comes_back_with_its_type() -> None:
    seen: list[Any] = []

    def agent(run: AgentRun, _: Any) -> None:
        result = (Decimal("9.99"), datetime(2026, 3, 4, 5, 6, 7, 890123, UTC))
        receipt = run.effect(
            "charge",
            lambda key: EffectOutcome(external_id="ch-1", result=result),
            arguments={"cents": 999},
        )
        seen.append(receipt.result)

    _, events = _record(agent)
    assert _replay(events, agent).passed
    assert type(seen[1]) is tuple
    assert seen[1] == seen[0]


def test_typed_values_survive_redaction_of_the_strings_around_them() -> None:
    # A timestamp with microseconds looks like a phone number to the detectors.
    value = {"note": "mail ada@example.com", "at": datetime(2026, 12, 2, 10, 0, 0, 123456)}
    seen: list[Any] = []

    def agent(run: AgentRun, _: Any) -> None:
        seen.append(run.call("lookup", lambda: value))

    _, events = _record(agent)
    assert _replay(events, agent).passed
    assert seen[1] == {"note": "mail [redacted:email]", "at": value["at"]}


def test_a_tool_result_that_cannot_be_recorded_is_a_recorded_error_raised_to_the_agent() -> None:
    class Local:  # not reachable by module and name: replay could not rebuild it
        pass

    caught: list[NotSerialisable] = []

    def agent(run: AgentRun, _: Any) -> str:
        try:
            run.call("fetch_profile", lambda: {"rows": [Local()]})
        except NotSerialisable as exc:
            caught.append(exc)
            return "handled"
        return "not raised"

    _recorder, events = _record(agent)
    [tool] = [e for e in events if e.event_type == "tool.call"]
    body = PayloadPipeline().unpack(tool)
    assert body["result_json"] is None
    assert body["error"]["kind"] == "unserialisable_result"
    assert body["error"]["type"] == "NotSerialisable"
    message = str(caught[0])
    assert "fetch_profile.result.rows[0]" in message
    assert "defined at module level" in message
    assert "register_converter" in message
    report = _replay(events, agent)
    assert report.passed, report
    assert type(caught[1]) is NotSerialisable
    assert str(caught[1]) == message
    assert (caught[1].path, caught[1].reason) == (caught[0].path, caught[0].reason)


def test_an_unrecordable_result_that_ends_the_run_replays() -> None:
    def agent(run: AgentRun, _: Any) -> None:
        run.call("lookup", object)

    _, events = _record(agent)
    assert PayloadPipeline().unpack(events[-1])["error"]["kind"] == "unserialisable_result"
    assert _replay(events, agent).passed


@pytest.mark.parametrize(
    "output",
    [{"ratio": math.nan}, {"ada@example.com": math.inf}, [object()], {1: "a"}],
    ids=["nan", "inf-under-an-email", "object", "int-key"],
)
def test_an_output_that_cannot_be_recorded_ends_the_run_failed_and_replays(output: Any) -> None:
    def agent(run: AgentRun, _: Any) -> Any:
        run.call("lookup", lambda: {"n": 1})
        return output

    recorder = MemoryRecorder()
    with pytest.raises(NotSerialisable, match=r"^run\.output") as raised:
        recorder.record(agent, RunSnapshot(code_version="t"), agent_id="values")
    assert any("(failed)" in note for note in raised.value.__notes__)
    events = list(recorder.events)
    assert [e.event_type for e in events][-1] == "run.finished"  # the run did not stay open
    body = PayloadPipeline().unpack(events[-1])
    assert (body["status"], body["output_json"]) == ("failed", None)
    assert body["error"]["kind"] == "unserialisable_result"
    assert body["error"]["message"] == str(raised.value)
    assert "ada@example.com" not in body["error"]["message"]
    report = _replay(events, agent)
    assert report.passed, report
    assert report.recorded_status == "failed"

    def mended(run: AgentRun, _: Any) -> Any:
        run.call("lookup", lambda: {"n": 1})
        return {"ratio": 0.5}

    assert not _replay(events, mended).passed  # it ends otherwise now


def test_an_async_run_whose_output_cannot_be_recorded_ends_failed_and_replays() -> None:
    async def agent(run: AsyncRun, _: Any) -> Any:
        await run.call("lookup", lambda: {"n": 1})
        return {"ratio": math.nan}

    recorder = AsyncMemoryRecorder()
    with pytest.raises(NotSerialisable, match="nan is not a finite number"):
        asyncio.run(recorder.record(agent, RunSnapshot(code_version="t"), agent_id="values"))
    events = list(recorder.events)
    assert PayloadPipeline().unpack(events[-1])["status"] == "failed"
    assert replay_run(events, agent).passed


def test_values_that_would_change_type_are_refused_with_a_path_and_a_way_out() -> None:
    class Local:
        pass

    with pytest.raises(NotSerialisable, match=r"r\.x\[1\]: an object would not come back"):
        encode_value({"x": [1, object()]}, path="r")
    with pytest.raises(NotSerialisable, match="not reachable by its module and name"):
        encode_value(dataclasses.make_dataclass("Made", ["a"])(1), path="r")
    with pytest.raises(NotSerialisable, match="register a converter"):
        encode_value(Local(), path="r")
    with pytest.raises(NotSerialisable, match="a type would not come back"):
        encode_value(Refund, path="r")  # a class is not a value


def test_plain_json_is_its_own_encoding() -> None:
    value = {"a": [1, 2.5, "x", None, True], "b": {"c": {}}}
    assert encode_value(value) == value
    assert decode_value(value) == value


def test_a_tool_raising_its_own_exception_class_replays_as_that_class() -> None:
    caught: list[Any] = []

    def agent(run: AgentRun, _: Any) -> str:
        try:
            run.call("score", _raise(FraudServiceDown("fraud-api", 2.5)))
        except FraudServiceDown as exc:
            caught.append((type(exc), exc.args, exc.service, exc.retry_after))
            return "fallback"
        return "scored"

    _, events = _record(agent)
    assert _replay(events, agent).passed
    assert caught[0] == caught[1] == (FraudServiceDown, ("fraud-api", 2.5), "fraud-api", 2.5)


def test_a_run_that_ends_on_a_tool_exception_replays() -> None:
    def agent(run: AgentRun, _: Any) -> None:
        run.call("score", _raise(FraudServiceDown("fraud-api", 2.5)))

    _, events = _record(agent)
    assert PayloadPipeline().unpack(events[-1])["error"]["module"] == __name__
    assert _replay(events, agent).passed


def test_a_class_whose_init_takes_other_arguments_is_still_raised_as_itself() -> None:
    caught: list[BaseException] = []

    def agent(run: AgentRun, _: Any) -> None:
        try:
            run.call("spend", _raise(QuotaExceeded(quota=5)))
        except QuotaExceeded as exc:
            caught.append(exc)
            raise

    _, events = _record(agent)
    assert _replay(events, agent).passed
    assert type(caught[1]) is QuotaExceeded
    assert str(caught[1]) == "quota 5 exceeded"


def test_an_exception_class_not_at_hand_is_a_recorded_error_named_like_it() -> None:
    info = {
        "type": "Gone.Missing",
        "message": "no such thing",
        "module": "not_imported_anywhere",
        "args_json": '["no such thing"]',
    }
    exc = rebuild_error(info)
    assert isinstance(exc, RecordedError)
    assert type(exc).__name__ == "Missing"
    assert type(exc).__qualname__ == "Gone.Missing"
    assert exc.type_name == "Gone.Missing"
    assert exc.message == "no such thing"
    assert type(rebuild_error(info)) is type(exc)  # one class per recorded type
    # Old bodies have neither module nor arguments: a RecordedError, as before.
    assert type(rebuild_error({"type": "KeyError", "message": "'x'"})).__bases__ == (RecordedError,)


def test_a_local_exception_class_replays_as_a_recorded_error() -> None:
    class LocalError(Exception):
        pass

    caught: list[BaseException] = []

    def agent(run: AgentRun, _: Any) -> str:
        try:
            run.call("t", _raise(LocalError("boom")))
        except Exception as exc:
            caught.append(exc)
            return "ok"
        return "no"

    _, events = _record(agent)
    assert _replay(events, agent).passed
    assert isinstance(caught[1], RecordedError)
    assert "LocalError" in type(caught[1]).__qualname__


def test_the_arguments_of_a_recorded_exception_are_redacted_like_its_message() -> None:
    caught: list[BaseException] = []

    def agent(run: AgentRun, _: Any) -> None:
        try:
            run.call("notify", _raise(ValueError("bounced: ada@example.com", 550)))
        except ValueError as exc:
            caught.append(exc)
            raise

    _, events = _record(agent)
    [tool] = [e for e in events if e.event_type == "tool.call"]
    error = PayloadPipeline().unpack(tool)["error"]
    assert "ada@example.com" not in error["message"] + error["args_json"]
    assert _replay(events, agent).passed
    assert type(caught[1]) is ValueError
    assert caught[1].args == ("bounced: [redacted:email]", 550)


@pytest.fixture
def money_converter() -> Iterator[None]:
    register_converter(
        Money,
        to_recorded=lambda m: (m.cents, m.currency),
        from_recorded=lambda data: Money(*data),
    )
    register_converter(
        PaymentDeclined,
        to_recorded=lambda e: e.reason,
        from_recorded=PaymentDeclined,
    )
    yield
    DEFAULT_CONVERTERS.unregister(Money)
    DEFAULT_CONVERTERS.unregister(PaymentDeclined)


@pytest.mark.usefixtures("money_converter")
def test_a_registered_converter_records_values_and_exceptions() -> None:
    seen: list[Any] = []

    def agent(run: AgentRun, _: Any) -> None:
        seen.append(run.call("price", lambda: [Money(250, "EUR")]))
        try:
            run.call("pay", _raise(PaymentDeclined(Money(250, "EUR"))))
        except PaymentDeclined as exc:
            seen.append(exc.reason)

    _, events = _record(agent)
    assert _replay(events, agent).passed
    assert seen[2:] == [[Money(250, "EUR")], Money(250, "EUR")]


def test_a_value_whose_converter_is_missing_in_replay_is_a_setup_error() -> None:
    register_converter(
        Money, to_recorded=lambda m: [m.cents, m.currency], from_recorded=lambda data: Money(*data)
    )
    try:

        def agent(run: AgentRun, _: Any) -> None:
            run.call("price", lambda: Money(1, "EUR"))

        _, events = _record(agent)
    finally:
        DEFAULT_CONVERTERS.unregister(Money)
    report = _replay(events, agent)
    assert report.divergence is None
    assert report.error is not None
    assert "register it" in report.error


def _raise(exc: Exception) -> Callable[[], Any]:
    def tool() -> Any:
        raise exc

    return tool


def test_a_fork_gets_the_parent_input_and_tool_results_with_their_types() -> None:
    def agent(run: AgentRun, given: Any) -> None:
        run.call("lookup", lambda: Point(3, 4))
        with contextlib.suppress(FraudServiceDown):
            run.call("score", _raise(FraudServiceDown("fraud-api", 1.0)))

    _, events = _record(agent, input=(1, Decimal("2")))
    snapshot = parent_snapshot(events, PayloadPipeline())
    assert snapshot.input == (1, Decimal("2"))
    assert type(snapshot.input) is tuple
    tools = RecordedTools(events)
    answer = tools.call("lookup", (), {}, lambda: None)
    assert type(answer) is Point
    assert answer == Point(3, 4)
    with pytest.raises(FraudServiceDown):
        tools.call("score", (), {}, lambda: None)


def test_a_run_that_ends_on_an_llm_client_exception_replays() -> None:
    def send(request: Any) -> Any:
        raise ValueError("upstream said no", 503)

    def agent(run: AgentRun, _: Any) -> None:
        run.llm(send, {"model": "m", "messages": []}, provider="test")

    _, events = _record(agent)
    assert PayloadPipeline().unpack(events[-1])["status"] == "failed"
    report = _replay(events, agent)
    assert report.passed, report


def test_v1_bodies_migrate_to_what_avro_resolution_reads() -> None:
    golden = Path(__file__).resolve().parents[1] / "golden" / "ticket-agent.v1.avro"
    migrated, resolved = BodyReader(), BodyReader(migrators=MigratorRegistry())
    kinds = {"run.started", "tool.call", "effect.receipt", "run.finished"}
    seen = set()
    for envelope in read_archive(golden):
        if envelope.event_type in kinds and envelope.payload is not None:
            assert envelope.body_version == 1
            args = (envelope.event_type, 1, envelope.payload)
            assert migrated.read(*args) == resolved.read(*args)
            assert migrated.path(envelope.event_type, 1, 2)[0].kind == "migrate"
            seen.add(envelope.event_type)
    assert seen == kinds


def test_an_effect_result_that_cannot_be_recorded_is_said_so_and_replays() -> None:
    caught: list[NotSerialisable] = []

    def agent(run: AgentRun, _: Any) -> str:
        try:
            run.effect(
                "charge",
                lambda key: EffectOutcome(external_id="ch-9", result=object()),
                arguments={"cents": 1},
            )
        except NotSerialisable as exc:
            caught.append(exc)
            return "charged, result unknown"
        return "not raised"

    _, events = _record(agent)
    [receipt] = [e for e in events if e.event_type == "effect.receipt"]
    body = PayloadPipeline().unpack(receipt)
    assert (body["status"], body["external_id"]) == ("confirmed", "ch-9")
    assert body["error"]["kind"] == "unserialisable_result"
    assert "charge.result" in str(caught[0])
    assert _replay(events, agent).passed
    assert str(caught[1]) == str(caught[0])


def test_the_async_recorder_records_typed_results_and_refuses_the_same_way() -> None:
    async def agent(run: AsyncRun, _: Any) -> str:
        assert await run.call("lookup", lambda: (1, 2)) == (1, 2)
        try:
            await run.call("fetch", object)
        except NotSerialisable:
            return "refused"
        return "not raised"

    recorder = AsyncMemoryRecorder()
    recorded: tuple[AsyncRun, str] = asyncio.run(
        # Any: mypy cannot pick T out of record's ``Awaitable[T] | T`` for a coroutine.
        recorder.record(cast(Any, agent), RunSnapshot(code_version="t"), agent_id="values")
    )
    assert recorded[1] == "refused"
    bodies = [PayloadPipeline().unpack(e) for e in recorder.events if e.event_type == "tool.call"]
    assert json.loads(bodies[0]["result_json"]) == {"$type": "tuple", "items": [1, 2]}
    assert bodies[0]["result_codec"] == "tagged"
    assert bodies[1]["error"]["kind"] == "unserialisable_result"


def test_a_run_interrupted_by_ctrl_c_ends_failed_and_the_interruption_goes_on() -> None:
    interrupted = [True]  # pressed while recording, not in replay

    def agent(run: AgentRun, _: Any) -> Any:
        run.call("lookup", lambda: {"n": 1})
        if interrupted[0]:
            raise KeyboardInterrupt
        return run.call("lookup", lambda: {"n": 2})

    recorder = MemoryRecorder()
    with pytest.raises(KeyboardInterrupt) as raised:
        recorder.record(agent, RunSnapshot(code_version="t"), agent_id="values")
    assert any("(failed)" in note for note in raised.value.__notes__)
    events = list(recorder.events)
    assert events[-1].event_type == "run.finished"  # the run did not stay open
    body = PayloadPipeline().unpack(events[-1])
    assert body["status"] == "failed"
    assert body["error"]["type"] == "KeyboardInterrupt"
    # Replayed, the code goes on where the recording was stopped, and the report says so.
    interrupted[0] = False
    divergence = replay_run(events, agent).divergence
    assert divergence is not None
    assert divergence.kind == "missing_event"
    assert "the recording was interrupted there (KeyboardInterrupt)" in divergence.detail


def test_a_cancelled_async_run_ends_failed_and_the_cancellation_goes_on() -> None:
    started = asyncio.Event()

    async def agent(run: AsyncRun, _: Any) -> Any:
        await run.call("lookup", lambda: {"n": 1})
        started.set()
        await asyncio.sleep(3600)  # cancelled here
        return {"n": 2}

    recorder = AsyncMemoryRecorder()

    async def main() -> None:
        task = asyncio.create_task(
            recorder.record(agent, RunSnapshot(code_version="t"), agent_id="values")
        )
        await asyncio.wait_for(started.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    events = list(recorder.events)
    assert events[-1].event_type == "run.finished"
    body = PayloadPipeline().unpack(events[-1])
    assert (body["status"], body["error"]["type"]) == ("failed", "CancelledError")


def test_a_call_that_cannot_be_recorded_found_at_the_end_ends_the_run_failed() -> None:
    """A tool's result recorded only when the run ends (an async generator's, which the
    agent iterated instead of awaiting) cannot be recorded: the run still ends."""

    @bb.tool
    async def numbers(n: int) -> Any:
        for i in range(n):
            yield i

    async def agent(run: AsyncRun, _: Any) -> Any:
        return [i async for i in numbers(3)]

    recorder = AsyncMemoryRecorder()
    with pytest.raises(NotSerialisable, match=r"numbers\.result") as raised:
        asyncio.run(recorder.record(agent, RunSnapshot(code_version="t"), agent_id="values"))
    assert any("(failed)" in note for note in raised.value.__notes__)
    events = list(recorder.events)
    assert events[-1].event_type == "run.finished"
    assert PayloadPipeline().unpack(events[-1])["status"] == "failed"


def test_a_label_too_long_is_refused_and_a_big_body_is_not_counted_as_one() -> None:
    def agent(run: AgentRun, size: int) -> Any:
        text = secrets.token_urlsafe(size)  # a body zstd cannot shrink under 256 KiB
        run.call("lookup", lambda: {"text": text})  # inline: under its threshold
        run.transition("s" * 300_000, state={})  # a label
        return "ok"

    recorder = MemoryRecorder(settings=Settings(blob_threshold_bytes=2 * 1024 * 1024))
    with pytest.raises(NotSerialisable, match=r"^state\.transition\.to_state: the event's ids"):
        recorder.record(agent, RunSnapshot(code_version="t", input=400_000), agent_id="labels")
    types = [e.event_type for e in recorder.events]
    assert types == ["run.started", "tool.call", "run.finished"]  # the big body went in
    assert len(recorder.events[1].payload or b"") > 256 * 1024  # inline
