"""What every framework recipe's acceptance test does, on the real stack.

1. **Record** ``RUNS`` runs of the agent with the recorder on Postgres (sync or async),
   each through the recipe's own wiring (``agent_blackbox.instrument()``, a captured
   client, ``http_client=``), against the local model servers.
2. **Publish**: the relay drains the outbox to Kafka, the view consumer indexes it.
3. **Replay offline**: the model servers are stopped, every run is read back from Kafka
   (located through the views' run index) and replayed through the same agent code,
   under a socket guard that refuses and counts every connection the Python code opens
   but to Postgres and Kafka; every run must pass, with no connection made.
4. **A prompt change** replays as an ``argument_mismatch`` whose call site is the
   agent's own line (the recipe's module), not the framework's.
5. **Two runs at once** in one process, through one process-wide client, each record
   exactly their own calls.

The number of runs is ``BLACKBOX_FRAMEWORK_RUNS`` (default 20, the issue's figure).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, func, select, text
from sqlalchemy.ext.asyncio import create_async_engine

from agent_blackbox.consumers import ViewRunIndex, events_index, runs_view
from agent_blackbox.outbox import AsyncRecorder, Recorder, RunSnapshot
from agent_blackbox.outbox.relay import Relay
from agent_blackbox.replayer import KafkaRunSource, ReplayReport, replay_run
from agent_blackbox.schemas import Envelope, PayloadPipeline, Settings
from tests.integration._guard import SocketGuard, service_ports
from tests.integration._views import build_views

RUNS = int(os.environ.get("BLACKBOX_FRAMEWORK_RUNS", "20"))

Entry = Callable[[Any, Any], Any]
"""An agent entry point: ``entry(run, input)``, sync or ``async``."""

CITIES = ("Oslo", "Lima", "Quito", "Accra", "Hanoi", "Perth", "Bern", "Riga", "Baku", "Doha")
"""The cities the recipes' questions name, in turn (the model servers read ``city=``)."""


def questions(count: int, *, start: int = 0, ask: str = "What is the weather like?") -> list[str]:
    """``count`` questions ``"<ask> city=<city>"``, the cities of :data:`CITIES` in turn
    from the ``start``-th."""
    return [f"{ask} city={CITIES[i % len(CITIES)]}" for i in range(start, start + count)]


def city_of(question: str) -> str:
    """The city a question names: its ``city=`` word."""
    return question.split("city=", 1)[1].split()[0]


@dataclass(frozen=True)
class Recorded:
    """The runs one recording made: run id → (input, output)."""

    runs: dict[str, tuple[Any, Any]]

    @property
    def run_ids(self) -> list[str]:
        return list(self.runs)


def record_runs(
    settings: Settings, engine: Engine, entry: Entry, inputs: list[Any], *, agent_id: str
) -> Recorded:
    """Record one run of the sync ``entry`` per input, one after the other."""
    recorder = Recorder(engine, settings=settings)
    runs: dict[str, tuple[Any, Any]] = {}
    for given in inputs:
        snapshot = RunSnapshot(code_version=f"{agent_id}/1", input=given)
        run, output = recorder.record(entry, snapshot, agent_id=agent_id)
        runs[run.run_id] = (given, output)
    return Recorded(runs)


def record_runs_async(
    settings: Settings,
    entry: Callable[[Any, Any], Awaitable[Any]],
    inputs: list[Any],
    *,
    agent_id: str,
    at_once: int = 1,
) -> Recorded:
    """Record one run of the async ``entry`` per input, ``at_once`` at a time, in an
    event loop of its own."""

    async def all_of_them() -> dict[str, tuple[Any, Any]]:
        async_engine = create_async_engine(settings.database_url, pool_size=at_once + 2)
        try:
            recorder = AsyncRecorder(async_engine, settings=settings)
            gate = asyncio.Semaphore(at_once)

            async def one(given: Any) -> tuple[str, tuple[Any, Any]]:
                snapshot = RunSnapshot(code_version=f"{agent_id}/1", input=given)
                async with gate:
                    run, output = await recorder.record(entry, snapshot, agent_id=agent_id)
                return run.run_id, (given, output)

            return dict(await asyncio.gather(*(one(given) for given in inputs)))
        finally:
            await async_engine.dispose()

    return Recorded(asyncio.run(all_of_them()))


def publish(settings: Settings, engine: Engine) -> int:
    """Relay every event in the outbox to Kafka and index it in the views; returns how
    many were published."""
    with engine.connect() as conn:
        pending = int(conn.execute(text("SELECT count(*) FROM blackbox.outbox")).scalar_one())
        indexed = int(conn.execute(select(func.count()).select_from(events_index)).scalar_one())
    relay = Relay(engine, settings=settings)
    try:
        published = relay.drain(timeout=120)
    finally:
        relay.close()
    assert published == pending, f"published {published} of {pending} events"
    build_views(settings, engine, expect=indexed + published, timeout=120)
    return published


def replay_from_kafka(
    settings: Settings, engine: Engine, run_id: str, entry: Entry, **options: Any
) -> ReplayReport:
    """Replay one run read back from Kafka, located through the views' run index."""
    source = KafkaRunSource(settings, ViewRunIndex(engine), run_id)
    return replay_run(source, entry, **options)


def replay_all_offline(
    settings: Settings, engine: Engine, recorded: Recorded, entry: Entry
) -> list[ReplayReport]:
    """Replay every recorded run from Kafka under a socket guard that allows only
    Postgres and Kafka; asserts that nothing else was even tried."""
    with SocketGuard(service_ports(settings)) as guard:
        reports = [replay_from_kafka(settings, engine, r, entry) for r in recorded.run_ids]
    assert guard.refused == [], f"replay tried to connect to {guard.refused}"
    return reports


# What the views and the topic hold ------------------------------------------------------


def llm_calls_by_run(engine: Engine, run_ids: list[str]) -> dict[str, int]:
    """How many ``llm.call`` events the views hold per run."""
    return _counted(engine, run_ids, "llm.call")


def tool_calls_by_run(engine: Engine, run_ids: list[str]) -> dict[str, int]:
    """How many ``tool.call`` events the views hold per run."""
    return _counted(engine, run_ids, "tool.call")


def _counted(engine: Engine, run_ids: list[str], event_type: str) -> dict[str, int]:
    query = (
        select(events_index.c.run_id, func.count())
        .where(events_index.c.event_type == event_type, events_index.c.run_id.in_(run_ids))
        .group_by(events_index.c.run_id)
    )
    with engine.connect() as conn:
        found = {row[0]: int(row[1]) for row in conn.execute(query)}
    return {run_id: found.get(run_id, 0) for run_id in run_ids}


def attributes_by_run(
    engine: Engine, run_ids: list[str], event_type: str, *keys: str
) -> dict[str, list[tuple[Any, ...]]]:
    """The ``keys`` attributes (None where unset) of each ``event_type`` event per run, in
    sequence order, as the views' events index holds them."""
    query = (
        select(events_index.c.run_id, events_index.c.attributes)
        .where(events_index.c.event_type == event_type, events_index.c.run_id.in_(run_ids))
        .order_by(events_index.c.run_id, events_index.c.sequence)
    )
    found: dict[str, list[tuple[Any, ...]]] = {run_id: [] for run_id in run_ids}
    with engine.connect() as conn:
        for run_id, attributes in conn.execute(query):
            found[run_id].append(tuple((attributes or {}).get(key) for key in keys))
    return found


def finished_attributes(engine: Engine, run_ids: list[str]) -> dict[str, dict[str, Any]]:
    """The attributes of each run's ``run.finished`` event, from the views."""
    query = select(events_index.c.run_id, events_index.c.attributes).where(
        events_index.c.event_type == "run.finished", events_index.c.run_id.in_(run_ids)
    )
    with engine.connect() as conn:
        return {row[0]: dict(row[1] or {}) for row in conn.execute(query)}


def runs_in_views(engine: Engine, run_ids: list[str]) -> dict[str, tuple[str, int | None]]:
    """Each run's status and count of unrecorded calls, from the runs view."""
    columns = (runs_view.c.run_id, runs_view.c.status, runs_view.c.unrecorded_calls)
    query = select(*columns).where(runs_view.c.run_id.in_(run_ids))
    with engine.connect() as conn:
        return {row[0]: (row[1], row[2]) for row in conn.execute(query)}


def events_of(settings: Settings, engine: Engine, run_id: str, event_type: str) -> list[Envelope]:
    """A run's events of one type, read back from Kafka."""
    source = KafkaRunSource(settings, ViewRunIndex(engine), run_id)
    return [e for e in source if e.event_type == event_type]


def bodies_of(settings: Settings, engine: Engine, run_id: str, event_type: str) -> list[Any]:
    """The bodies of a run's events of one type, read back from Kafka."""
    pipeline = PayloadPipeline()
    return [pipeline.unpack(e) for e in events_of(settings, engine, run_id, event_type)]


def assert_recorded_whole(
    engine: Engine,
    recorded: Recorded,
    *,
    answered: Callable[[Any, Any], bool],
    llm_calls: int,
    tool_calls: int,
) -> None:
    """Every run gave an output ``answered(input, output)`` accepts, holds ``llm_calls``
    model calls and ``tool_calls`` tool calls in the views, succeeded, and reported no
    call that went out unrecorded."""
    for given, output in recorded.runs.values():
        assert answered(given, output), (given, output)
    run_ids = recorded.run_ids
    assert llm_calls_by_run(engine, run_ids) == dict.fromkeys(run_ids, llm_calls)
    assert tool_calls_by_run(engine, run_ids) == dict.fromkeys(run_ids, tool_calls)
    assert runs_in_views(engine, run_ids) == dict.fromkeys(run_ids, ("succeeded", None))


def assert_all_passed(reports: list[ReplayReport]) -> None:
    """Every replay passed; the message names each divergence or error."""
    failed = [r.divergence.describe() if r.divergence else r.error for r in reports if not r.passed]
    assert failed == [], failed


@contextmanager
def instrumented() -> Iterator[None]:
    """``agent_blackbox.instrument()`` for the block, undone after it (tests share a
    process; an application calls it once and leaves it)."""
    import agent_blackbox as bb

    bb.instrument()
    try:
        yield
    finally:
        bb.uninstrument()
