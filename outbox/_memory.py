"""Recorders that keep events in memory: for agent unit tests and tools, no database.

The envelopes are the same bytes-for-bytes format as the Postgres recorders' (digests,
chain, sealing), so what they record replays, archives and verifies like a production
run; they keep the run rows and effects too, so ``resume`` and ``unresolved_effects``
behave as they do against Postgres.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Unpack

from agent_blackbox.keystore import DataKeyStore, KeystoreError
from agent_blackbox.outbox._async import AsyncRunLogRecorder
from agent_blackbox.outbox._boundaries import Crossing
from agent_blackbox.outbox._core import RecorderConfig, RunCore, StartPlan
from agent_blackbox.outbox._errors import RunNotActive
from agent_blackbox.outbox._group import Batch
from agent_blackbox.outbox._recorder import RunLogRecorder
from agent_blackbox.outbox._recovery import PendingEffect, StoredRun
from agent_blackbox.outbox._writer import Cursor, PreparedEvent, RunIdentity
from agent_blackbox.schemas import BlackboxError, DataKey, Digester, Envelope, Settings


@dataclass(slots=True)
class _RunRow:
    identity: RunIdentity
    cursor: Cursor
    status: str = "running"
    state: str | None = None


class MemoryLog:
    """The event log of the memory recorders: envelopes in a list (or a sink of the
    caller's), bodies stored out of line in a dict, runs and effects as the Postgres log
    keeps them.

    Args:
        sink: receives every envelope as it is recorded (default: :attr:`events`).
    """

    def __init__(self, sink: Callable[[Envelope], None] | None = None) -> None:
        self.events: list[Envelope] = []
        self.blobs: dict[str, bytes] = {}
        self._sink = sink or self.events.append
        self._runs: dict[str, _RunRow] = {}
        self._effects: dict[tuple[str, str], PendingEffect] = {}

    def create(self, start: StartPlan, connection: Any) -> Envelope:
        _refuse_transaction(connection)
        if start.core.run_id in self._runs:
            raise start.exists()
        self._runs[start.core.run_id] = _RunRow(start.core.identity, Cursor())
        return self._store(start.core, start.first)

    def append(self, core: RunCore, crossing: Crossing, event_id: str, connection: Any) -> Envelope:
        _refuse_transaction(connection)
        return self._store(core, core.prepare(crossing, event_id))

    def flush(self, core: RunCore, batch: Batch) -> None:
        for event in batch.events:  # prepared in order already: the cursor stays
            self._keep(event)

    def resume(
        self, run_id: str, *, shards: int, keys: DataKeyStore | None
    ) -> tuple[StoredRun, DataKey | None]:
        row = self._runs.get(run_id)
        if row is None:
            raise RunNotActive(f"run {run_id} does not exist; nothing to resume")
        identity = replace(row.identity, data_key=None)
        return StoredRun(identity, row.cursor, row.status, row.state), None

    def unresolved_effects(self, *, run_id: str | None, limit: int) -> list[PendingEffect]:
        open_ = [
            effect
            for effect in self._effects.values()
            if effect.status in ("pending", "unknown") and run_id in (None, effect.run_id)
        ]
        open_.sort(key=lambda e: (e.created_at, e.run_id, e.intent_sequence))
        return open_[:limit]

    def tenant_digest(self, keys: DataKeyStore, tenant_id: str) -> Digester:
        raise KeystoreError("a memory recorder keeps no tenant keys; record keyed runs in Postgres")

    def read(self, ref: str) -> bytes:
        """The body stored out of line under ``ref`` (a blob reader of the replayer)."""
        return self.blobs[ref]

    def _store(self, core: RunCore, event: PreparedEvent) -> Envelope:
        self._keep(event)
        return core.advanced(event)

    def _keep(self, event: PreparedEvent) -> None:
        if event.blob is not None:
            self.blobs[event.blob[0]] = event.blob[1]
        self._sink(event.envelope)
        self._note(event.envelope, event)

    def _note(self, envelope: Envelope, event: PreparedEvent) -> None:
        """Keep the run row and the effects as the Postgres log's statements do."""
        row = self._runs[envelope.run_id]
        row.cursor = Cursor(envelope.sequence, envelope.chain_hash)
        row.status = event.status or row.status
        attributes = event.given_attributes
        if envelope.event_type == "state.transition":
            row.state = attributes["to_state"]
        elif envelope.event_type == "effect.intent":
            key = (envelope.run_id, attributes["idempotency_key"])
            self._effects[key] = PendingEffect(
                envelope.run_id,
                attributes["idempotency_key"],
                attributes["effect"],
                envelope.sequence,
                "pending",
                envelope.recorded_at,
            )
        elif envelope.event_type == "effect.receipt":
            key = (envelope.run_id, attributes["idempotency_key"])
            if key in self._effects:
                self._effects[key] = replace(self._effects[key], status=attributes["status"])


class AsyncMemoryLog:
    """:class:`MemoryLog` behind the async log's interface."""

    def __init__(self, log: MemoryLog) -> None:
        self._log = log

    async def create(self, start: StartPlan, connection: Any) -> Envelope:
        return self._log.create(start, connection)

    async def append(
        self, core: RunCore, crossing: Crossing, event_id: str, connection: Any
    ) -> Envelope:
        return self._log.append(core, crossing, event_id, connection)

    async def flush(self, core: RunCore, batch: Batch) -> None:
        self._log.flush(core, batch)

    async def resume(
        self, run_id: str, *, shards: int, keys: DataKeyStore | None
    ) -> tuple[StoredRun, DataKey | None]:
        return self._log.resume(run_id, shards=shards, keys=keys)

    async def unresolved_effects(self, *, run_id: str | None, limit: int) -> list[PendingEffect]:
        return self._log.unresolved_effects(run_id=run_id, limit=limit)

    async def tenant_digest(self, keys: DataKeyStore, tenant_id: str) -> Digester:
        return self._log.tenant_digest(keys, tenant_id)


def _refuse_transaction(connection: Any) -> None:
    if connection is not None:
        raise BlackboxError("a memory recorder has no database transaction to join")


def _memory_config(config: RecorderConfig) -> RecorderConfig:
    if config.get("keys") is not None:
        raise KeystoreError(
            "a memory recorder keeps no data keys; seal with a pipeline of your own, or "
            "record encrypted runs with Recorder"
        )
    # Not the environment's settings (nor its group commit mode): a test's recorder
    # should not depend on it.
    return {
        **config,
        "settings": config.get("settings") or Settings(),
        "group_commit": config.get("group_commit"),
    }


class _InMemory:
    """What both memory recorders show of what they recorded."""

    log: MemoryLog

    @property
    def events(self) -> list[Envelope]:
        """Every envelope recorded (unless a sink took them)."""
        return self.log.events

    @property
    def blobs(self) -> dict[str, bytes]:
        """Bodies stored out of line, by content address."""
        return self.log.blobs

    def read(self, ref: str) -> bytes:
        """The body stored out of line under ``ref`` (a blob reader of the replayer)."""
        return self.log.read(ref)


class MemoryRecorder(_InMemory, RunLogRecorder):
    """Records runs exactly as :class:`~agent_blackbox.outbox.Recorder` does, into a list.

    Args:
        sink: receives every envelope as it is recorded (default: :attr:`events`).
        config: see :class:`~agent_blackbox.outbox._core.RecorderConfig` (no ``keys``;
            settings default to :class:`~agent_blackbox.schemas.Settings`'s defaults,
            and group commit is off unless ``group_commit`` is given).
    """

    def __init__(
        self,
        *,
        sink: Callable[[Envelope], None] | None = None,
        **config: Unpack[RecorderConfig],
    ) -> None:
        self.log = MemoryLog(sink)
        super().__init__(self.log, **_memory_config(config))


class AsyncMemoryRecorder(_InMemory, AsyncRunLogRecorder):
    """The async twin of :class:`MemoryRecorder`, for asyncio agents' unit tests."""

    def __init__(
        self,
        *,
        sink: Callable[[Envelope], None] | None = None,
        **config: Unpack[RecorderConfig],
    ) -> None:
        self.log = MemoryLog(sink)
        super().__init__(AsyncMemoryLog(self.log), **_memory_config(config))
