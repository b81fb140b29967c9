"""Record ⇔ replay for every boundary, sync and async: one suite, four drivers.

Each case is agent code written once (an async function whose boundary calls are awaited
only when the run's are: a sync run's calls return at once, so the same code drives a
sync run without an event loop). Every case is recorded with the sync and the async
memory recorder and replayed through both replay runs, and what the code saw at each
boundary must be the same in all four: values with their types, exceptions with their
classes and messages, the completion order of concurrent work. The two recordings must
be the same events (ids, times and random values aside), and each replays through the
other flavour too. A boundary of the surface with no case here fails the suite.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

import pytest

from agent_blackbox.outbox import (
    AsyncMemoryRecorder,
    EffectOutcome,
    EffectReceipt,
    EffectRejected,
    MemoryRecorder,
    NotSerialisable,
    RecordedError,
    RunSnapshot,
    tool,
)
from agent_blackbox.outbox.contract import Boundaries
from agent_blackbox.replayer import (
    AsyncReplayRun,
    DivergenceKind,
    ReplayDivergence,
    ReplayReport,
    ReplayRun,
    replay_run,
)
from agent_blackbox.schemas import Envelope, PayloadPipeline, Settings

pytestmark = pytest.mark.timeout(60)

SNAPSHOT = RunSnapshot(code_version="conformance/2", input={"ticket": "T-1"})
OPTIONS: Any = {"agent_id": "conformance", "run_id": "run-1"}
"""One run id for every recording: effects keyed by their run come out the same."""


class ToolDown(Exception):
    """A tool's own failure: replay raises it again, as this class."""


class ModelDown(Exception):
    """A model's failure."""


class Gateway(Exception):
    """An effect whose outcome is unknown (the call failed before an answer)."""


# What the code saw ---------------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    """What one boundary call gave the code: a value and its type, or an exception's
    class and message."""

    kind: str
    type: type
    value: Any


async def cross(method: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Seen:
    """Call a boundary (awaited when the run is async) and say what came of it."""
    try:
        value = method(*args, **kwargs)
        if inspect.isawaitable(value):
            value = await value
    except RecordedError as exc:  # a class the recording could not name whole: see LOSSY
        return Seen("raised", RecordedError, exc.type_name)
    except Exception as exc:
        return Seen("raised", type(exc), str(exc))
    return Seen("returned", type(value), _comparable(value))


LOSSY: dict[str, str] = {}
"""Boundaries whose exceptions come back named, not as their class, and why (none since
llm.call records an error's module and typed arguments, as every other body does)."""


def _as_replayed(seen: list[Seen], boundary: str) -> list[Seen]:
    """What replay hands back of ``seen``: the same, but an exception of a lossy
    boundary, which comes back as a RecordedError named like its class."""
    if boundary not in LOSSY:
        return seen
    return [
        Seen(s.kind, RecordedError, s.type.__qualname__) if s.kind == "raised" else s for s in seen
    ]


def _comparable(value: Any) -> Any:
    if isinstance(value, Envelope):  # the envelope a transition appended, as recorded
        return (value.sequence, value.event_type, value.input_digest, value.output_digest)
    return value


@dataclass(frozen=True)
class Case:
    """Agent code crossing ``boundary``; ``script(run, seen)`` notes what each call gave."""

    boundary: str
    name: str
    script: Callable[[Any, list[Seen]], Coroutine[Any, Any, Any]]
    volatile: frozenset[str] = field(default=frozenset())
    """Event types whose recorded outputs differ from one recording to the next."""


# The cases -----------------------------------------------------------------------------


def lookup(ticket: str) -> dict[str, Any]:
    return {"ticket": ticket, "priority": 2, "due": datetime(2026, 1, 2), "cost": Decimal("1.5")}


def broken(ticket: str) -> Any:
    raise ToolDown(f"no ticket service for {ticket}")


def unrecordable(ticket: str) -> Any:
    return object()


@tool
def decorated(ticket: str) -> list[str]:
    """A tool that records itself (a sync one in an async run: opened, then settled on
    the run's loop)."""
    return [ticket, "decorated"]


@tool(name="awaited")
async def awaited(ticket: str) -> tuple[str, int]:
    """An async tool that records itself (in a sync run: opened, awaited, then settled)."""
    return ticket, 3


async def calls(run: Any, seen: list[Seen]) -> Any:
    seen.append(await cross(run.call, "lookup", lookup, "T-1"))
    seen.append(await cross(run.call, "lookup", broken, "T-1"))
    seen.append(await cross(run.call, "lookup", unrecordable, "T-1"))
    seen.append(await cross(decorated, "T-1"))
    seen.append(await cross(awaited, "T-1"))
    return {"done": True}


def model(request: Any) -> dict[str, Any]:
    return {"id": "r-1", "choices": [{"index": 0, "message": {"content": "ok"}}]}


def model_down(request: Any) -> Any:
    raise ModelDown("503 from the model")


async def llm_calls(run: Any, seen: list[Seen]) -> Any:
    request = {"model": "m-1", "messages": [{"role": "user", "content": "hi"}]}
    seen.append(await cross(run.llm, model, request, provider="openai"))
    seen.append(await cross(run.llm, model_down, request, provider="openai", model="m-2"))
    return None


def search(query: str, *, filters: Any, top_k: int | None) -> list[dict[str, Any]]:
    return [{"id": "doc-1", "score": 0.9, "chunk_version": "v2"}, {"id": "doc-2", "score": 0.5}]


def search_down(query: str, *, filters: Any, top_k: int | None) -> Any:
    raise ToolDown("index offline")


def not_hits(query: str, *, filters: Any, top_k: int | None) -> Any:
    return [{"score": 1.0}]


async def retrievals(run: Any, seen: list[Seen]) -> Any:
    for searched in (search, search_down, not_hits):
        seen.append(
            await cross(
                run.retrieve, "kb", searched, "refunds", index_version="7", filters={"lang": "en"}
            )
        )
    return len(seen)


async def clocks(run: Any, seen: list[Seen]) -> Any:
    seen.append(await cross(run.now))
    seen.append(await cross(run.monotonic))
    return None


async def draws(run: Any, seen: list[Seen]) -> Any:
    seen.append(await cross(run.random))
    seen.append(await cross(run.randint, 1, 6))
    seen.append(await cross(run.uuid))
    return None


def sent(key: str) -> EffectOutcome:
    return EffectOutcome(external_id=f"msg-{key}", result={"sent": True})


def refused(key: str) -> Any:
    raise EffectRejected("mailbox full", external_id="bounce-1")


def unknown(key: str) -> Any:
    raise Gateway("gateway timed out")


async def effects(run: Any, seen: list[Seen]) -> Any:
    seen.append(await cross(run.effect, "notify", sent, arguments={"to": "a"}))
    seen.append(await cross(run.effect, "notify", sent, arguments={"to": "b"}, key="k-1"))
    seen.append(await cross(run.effect, "notify", refused, arguments={"to": "c"}))
    seen.append(await cross(run.effect, "notify", unknown, arguments={"to": "d"}))
    return None


async def transitions(run: Any, seen: list[Seen]) -> Any:
    seen.append(await cross(run.transition, "triaged", state={"priority": 2}, reason="looked"))
    seen.append(await cross(run.transition, "closed", state={"priority": 2, "done": True}))
    return {"state": "closed"}


async def failing(run: Any, seen: list[Seen]) -> Any:
    seen.append(await cross(run.call, "lookup", lookup, "T-1"))
    raise ToolDown("the agent gave up")


CASES = [
    Case("call", "values, errors, unrecordable results, awaited tools", calls),
    Case("llm", "responses and errors", llm_calls),
    Case("retrieve", "hits, a failed search, hits that are not hits", retrievals),
    Case("now", "clocks", clocks, frozenset({"clock.read"})),
    Case("monotonic", "clocks", clocks, frozenset({"clock.read"})),
    Case("random", "draws", draws, frozenset({"random.draw"})),
    Case("randint", "draws", draws, frozenset({"random.draw"})),
    Case("uuid", "draws", draws, frozenset({"random.draw"})),
    Case("effect", "confirmed, keyed, rejected, unknown", effects),
    Case("transition", "states, the envelopes handed back", transitions),
    Case("finish", "a run the code ends by raising", failing),
]


# The four drivers ------------------------------------------------------------------------


def _at_once(work: Coroutine[Any, Any, Any]) -> Any:
    """Run agent code that never suspends (a sync run's calls return at once)."""
    try:
        work.send(None)
    except StopIteration as done:
        return done.value
    work.close()
    raise AssertionError("a sync run's boundary was awaited")


def _sync_entry(case: Case, seen: list[Seen]) -> Callable[[Any, Any], Any]:
    def entry(run: Any, input: Any) -> Any:
        return _at_once(case.script(run, seen))

    return entry


def _async_entry(case: Case, seen: list[Seen]) -> Callable[[Any, Any], Awaitable[Any]]:
    async def entry(run: Any, input: Any) -> Any:
        return await case.script(run, seen)

    return entry


def _record(case: Case, flavour: str) -> tuple[list[Seen], list[Envelope]]:
    seen: list[Seen] = []
    if flavour == "sync":
        recorder: Any = MemoryRecorder(settings=Settings())
        record = lambda: recorder.record(_sync_entry(case, seen), SNAPSHOT, **OPTIONS)  # noqa: E731
    else:
        recorder = AsyncMemoryRecorder(settings=Settings())
        entry = _async_entry(case, seen)
        record = lambda: asyncio.run(recorder.record(entry, SNAPSHOT, **OPTIONS))  # noqa: E731
    with contextlib.suppress(ToolDown):  # the case that ends by raising: recorded as failed
        record()
    return seen, list(recorder.events)


def _replay(case: Case, flavour: str, events: list[Envelope]) -> tuple[list[Seen], ReplayReport]:
    seen: list[Seen] = []
    entry = _sync_entry(case, seen) if flavour == "sync" else _async_entry(case, seen)
    return seen, replay_run(events, entry)


def _shape(events: list[Envelope], volatile: frozenset[str]) -> list[tuple[Any, ...]]:
    """The events of a recording, ids, times, latencies and random values aside."""
    pipeline, shaped = PayloadPipeline(), []
    for e in events:
        body = {
            k: v.replace(e.run_id, "<run>") if isinstance(v, str) else v
            for k, v in pipeline.unpack(e).items()
            if k not in {"latency_ms", "value_us", "value_json"}
        }
        attributes = {
            k: v.replace(e.run_id, "<run>") for k, v in e.attributes.items() if k != "latency_ms"
        }
        keyed = e.run_id in e.attributes.get("idempotency_key", "")
        digests = (
            None if keyed else e.input_digest,
            None if keyed or e.event_type in volatile else e.output_digest,
        )
        shaped.append((e.sequence, e.event_type, e.body_version, digests, attributes, body))
    return shaped


@pytest.fixture(scope="module")
def recordings() -> dict[tuple[str, str], tuple[list[Seen], list[Envelope]]]:
    return {
        (case.boundary, flavour): _record(case, flavour)
        for case in CASES
        for flavour in ("sync", "async")
    }


@pytest.mark.parametrize("recorded_with", ["sync", "async"])
@pytest.mark.parametrize("replayed_with", ["sync", "async"])
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.boundary)
def test_what_the_code_saw_when_recording_it_sees_in_replay(
    case: Case,
    recorded_with: str,
    replayed_with: str,
    recordings: dict[tuple[str, str], tuple[list[Seen], list[Envelope]]],
) -> None:
    seen, events = recordings[(case.boundary, recorded_with)]
    again, report = _replay(case, replayed_with, events)
    assert report.passed, report.divergence and report.divergence.describe()
    assert report.events == len(events)
    assert again == _as_replayed(seen, case.boundary)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.boundary)
def test_the_sync_and_the_async_run_record_the_same_events(
    case: Case, recordings: dict[tuple[str, str], tuple[list[Seen], list[Envelope]]]
) -> None:
    sync_seen, sync_events = recordings[(case.boundary, "sync")]
    async_seen, async_events = recordings[(case.boundary, "async")]
    assert _shape(async_events, case.volatile) == _shape(sync_events, case.volatile)
    if case.volatile:  # clocks and draws: the same kinds of values, not the same values
        assert [(s.kind, s.type) for s in async_seen] == [(s.kind, s.type) for s in sync_seen]
    else:
        assert async_seen == sync_seen


def test_what_each_case_saw_is_what_it_should() -> None:
    """The cases cross what they say: values with their types, the exceptions the code
    raised or the recorder refused, receipts of every status."""
    seen, _ = _record(CASES[0], "sync")
    assert [(s.kind, s.type) for s in seen] == [
        ("returned", dict),
        ("raised", ToolDown),
        ("raised", NotSerialisable),
        ("returned", list),
        ("returned", tuple),
    ]
    assert seen[0].value["cost"] == Decimal("1.5")
    effects_seen, _ = _record(CASES[8], "async")
    assert [s.type for s in effects_seen] == [EffectReceipt, EffectReceipt, EffectRejected, Gateway]
    assert effects_seen[1].value.idempotency_key == "k-1"
    transitions_seen, _ = _record(CASES[9], "sync")
    assert [s.value[1] for s in transitions_seen] == ["state.transition", "state.transition"]


def test_every_boundary_of_the_surface_has_a_case() -> None:
    surface = {name for name in vars(Boundaries) if not name.startswith("_")}
    surface -= {"core"}
    assert {case.boundary for case in CASES} == surface


# Divergences are the same whichever flavour replays --------------------------------


def _changed(run: Any, seen: list[Seen]) -> Coroutine[Any, Any, Any]:
    async def script() -> Any:
        seen.append(await cross(run.call, "lookup", lookup, "T-2"))  # another argument
        return {"done": True}

    return script()


@pytest.mark.parametrize("replayed_with", ["sync", "async"])
def test_a_changed_argument_diverges_at_the_same_event_in_both_flavours(
    replayed_with: str, recordings: dict[tuple[str, str], tuple[list[Seen], list[Envelope]]]
) -> None:
    _, events = recordings[("call", "sync")]
    changed = Case("call", "changed", _changed)
    _, report = _replay(changed, replayed_with, events)
    assert report.divergence is not None
    assert (report.divergence.kind, report.divergence.sequence) == (
        DivergenceKind.ARGUMENT_MISMATCH,
        2,
    )


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_finish_checks_the_end_the_code_gives_in_both_flavours(
    flavour: str, recordings: dict[tuple[str, str], tuple[list[Seen], list[Envelope]]]
) -> None:
    """``finish`` called by hand: the recorded envelope of the end comes back when the
    end is the recorded one; another output diverges."""
    _, events = recordings[("transition", "sync")]

    async def drive(output: Any) -> Any:
        run: Any = ReplayRun(events)
        if flavour == "async":
            run = AsyncReplayRun(run)
        seen: list[Seen] = []
        await transitions(run, seen)
        ended = run.finish(status="succeeded", output=output)
        return await ended if inspect.isawaitable(ended) else ended

    ended = asyncio.run(drive({"state": "closed"}))
    assert (ended.event_type, ended.sequence) == ("run.finished", len(events))
    with pytest.raises(ReplayDivergence) as diverged:
        asyncio.run(drive({"state": "open"}))
    assert diverged.value.divergence.kind == DivergenceKind.OUTPUT_MISMATCH


# Concurrent work -------------------------------------------------------------------


def _slow(delay: float, value: int) -> Callable[[], Any]:
    def tool() -> Any:
        time.sleep(delay)  # the order the calls complete in (recorded, then replayed)
        return value

    return tool


async def _async_children(run: Any, input: Any) -> Any:
    order: list[int] = []

    async def child(value: int, delay: float) -> None:
        async def tool() -> int:
            await asyncio.sleep(delay)
            return value

        order.append(await run.call("slow", tool))

    await asyncio.gather(child(1, 0.03), child(2, 0.0), child(3, 0.015))
    return order


def _thread_children(run: Any, input: Any) -> Any:
    order: list[int] = []
    lock = threading.Lock()

    def child(value: int, delay: float) -> None:
        got = run.call(f"slow-{value}", _slow(delay, value))
        with lock:
            order.append(got)

    with ThreadPoolExecutor(3) as pool:
        list(pool.map(child, (1, 2, 3), (0.06, 0.0, 0.03)))
    return order


@pytest.mark.parametrize(
    ("entry", "recorder"),
    [(_async_children, AsyncMemoryRecorder), (_thread_children, MemoryRecorder)],
    ids=["tasks", "threads"],
)
def test_concurrent_work_comes_back_in_the_recorded_completion_order(
    entry: Callable[[Any, Any], Any], recorder: type
) -> None:
    memory = recorder(settings=Settings())
    recorded = memory.record(entry, SNAPSHOT, agent_id="c")
    _, order = asyncio.run(recorded) if inspect.isawaitable(recorded) else recorded
    assert order == [2, 3, 1]
    report = replay_run(list(memory.events), entry)
    assert report.passed, report.divergence and report.divergence.describe()
