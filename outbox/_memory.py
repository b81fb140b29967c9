"""A recorder that keeps events in memory: for agent unit tests and tools, no database."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from agent_blackbox.outbox._boundaries import Crossing
from agent_blackbox.outbox._core import RecorderBase, RunSnapshot, plan_start, utc_now
from agent_blackbox.outbox._effects import EffectPolicy, ToolPolicy
from agent_blackbox.outbox._recorder import Joinable, Run
from agent_blackbox.outbox._redaction import Redactor
from agent_blackbox.outbox._writer import PreparedEvent
from agent_blackbox.schemas import BlackboxError, Envelope, PayloadPipeline, Settings, digest

T = TypeVar("T")


class MemoryRecorder(RecorderBase[None]):
    """Records runs exactly as :class:`~agent_blackbox.outbox.Recorder` does, into a list.

    The envelopes are the same bytes-for-bytes format (digests, chain, sealing), so
    what it records replays, archives and verifies like a production run.

    Args:
        sink: receives every envelope as it is recorded (default: :attr:`events`).
    """

    def __init__(
        self,
        *,
        settings: Settings | None = None,
        pipeline: PayloadPipeline | None = None,
        clock: Callable[[], datetime] = utc_now,
        sink: Callable[[Envelope], None] | None = None,
        tools: ToolPolicy | None = None,
        effects: EffectPolicy | None = None,
        redaction: Redactor | None = None,
    ) -> None:
        super().__init__(
            None,
            settings=settings or Settings(),
            pipeline=pipeline,
            clock=clock,
            tools=tools,
            effects=effects,
            redaction=redaction,
        )
        self.events: list[Envelope] = []
        self.blobs: dict[str, bytes] = {}
        self._sink = sink or self.events.append

    def start_run(
        self,
        snapshot: RunSnapshot,
        *,
        agent_id: str,
        tenant_id: str = "default",
        subject_ids: tuple[str, ...] = (),
        run_id: str | None = None,
        classification: str = "internal",
        retention_class: str = "standard",
    ) -> Run:
        """Start a run and record ``run.started``."""
        plan = plan_start(
            self._factory,
            self.settings,
            snapshot,
            agent_id=agent_id,
            tenant_id=tenant_id,
            subject_ids=subject_ids,
            run_id=run_id,
            classification=classification,
            retention_class=retention_class,
            digest=self.cached_digest(tenant_id, classification) or digest,
            scrub=self.scrub,
        )
        run = Run(self, plan.core)
        self._store(run, plan.first)
        return run

    def record(
        self, entry: Callable[[Run, Any], T], snapshot: RunSnapshot, *, agent_id: str
    ) -> tuple[Run, T]:
        """Run ``entry(run, snapshot.input)`` as a recorded run; see ``Recorder.record``."""
        run = self.start_run(snapshot, agent_id=agent_id)
        return run, run.drive(entry, snapshot.input)

    def append(
        self, run: Run, crossing: Crossing, event_id: str, connection: Joinable | None
    ) -> Envelope:
        if connection is not None:
            raise BlackboxError("a MemoryRecorder has no database transaction to join")
        return self._store(run, run.core.prepare(crossing, event_id))

    def read(self, ref: str) -> bytes:
        """The body stored out of line under ``ref`` (a
        :class:`~agent_blackbox.outbox.BlobReader`)."""
        return self.blobs[ref]

    def _store(self, run: Run, event: PreparedEvent) -> Envelope:
        if event.blob is not None:
            self.blobs[event.blob[0]] = event.blob[1]
        self._sink(event.envelope)
        return run.core.advanced(event)
