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
import socket
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, func, select, text
from sqlalchemy.ext.asyncio import create_async_engine

from agent_blackbox.consumers import ViewRunIndex, events_index
from agent_blackbox.outbox import AsyncRecorder, Recorder, RunSnapshot
from agent_blackbox.outbox.relay import Relay
from agent_blackbox.replayer import KafkaRunSource, ReplayReport, replay_run
from agent_blackbox.schemas import Settings
from tests.integration._views import build_views

RUNS = int(os.environ.get("BLACKBOX_FRAMEWORK_RUNS", "20"))

Entry = Callable[[Any, Any], Any]
"""An agent entry point: ``entry(run, input)``, sync or ``async``."""


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


def llm_calls_by_run(engine: Engine, run_ids: list[str]) -> dict[str, int]:
    """How many ``llm.call`` events the views hold per run."""
    query = (
        select(events_index.c.run_id, func.count())
        .where(events_index.c.event_type == "llm.call", events_index.c.run_id.in_(run_ids))
        .group_by(events_index.c.run_id)
    )
    with engine.connect() as conn:
        found = {row[0]: int(row[1]) for row in conn.execute(query)}
    return {run_id: found.get(run_id, 0) for run_id in run_ids}


# The socket guard ---------------------------------------------------------------------


class SocketGuard:
    """Refuses every connection the Python code opens except to ``allowed`` ports of the
    loopback, and keeps the addresses refused. Postgres and Kafka are reached through
    their C clients, which it does not see (nor need to)."""

    def __init__(self, allowed: set[int]) -> None:
        self.allowed = allowed
        self.refused: list[Any] = []
        self._saved: tuple[Any, Any] | None = None

    def __enter__(self) -> SocketGuard:
        self._saved = (socket.socket.connect, socket.socket.connect_ex)
        connect, connect_ex = self._saved
        guard = self

        def guarded_connect(sock: socket.socket, address: Any) -> None:
            guard.check(address)
            connect(sock, address)

        def guarded_connect_ex(sock: socket.socket, address: Any) -> int:
            guard.check(address)
            result: int = connect_ex(sock, address)
            return result

        socket.socket.connect = guarded_connect  # type: ignore[method-assign,assignment]
        socket.socket.connect_ex = guarded_connect_ex  # type: ignore[method-assign,assignment]
        return self

    def check(self, address: Any) -> None:
        loopback = ("127.0.0.1", "::1", "localhost")
        if isinstance(address, tuple) and address[0] in loopback and address[1] in self.allowed:
            return
        self.refused.append(address)
        raise ConnectionRefusedError(f"the socket guard refused a connection to {address!r}")

    def __exit__(self, *exc: object) -> None:
        assert self._saved is not None
        socket.socket.connect, socket.socket.connect_ex = self._saved  # type: ignore[method-assign]


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1].split("/", 1)[0])


def service_ports(settings: Settings) -> set[int]:
    """The ports of Postgres and Kafka: what a replay may reach."""
    database = settings.database_url.split("@", 1)[1].split("/", 1)[0]
    return {_port(database), *(_port(broker) for broker in settings.kafka_bootstrap.split(","))}


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
