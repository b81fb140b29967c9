"""The Recorder in record mode, for synchronous agents.

:class:`RunLogRecorder` is the API (start, record, resume, recover); what it appends to is
an event log, Postgres for :class:`Recorder` and a list for
:class:`~agent_blackbox.outbox.MemoryRecorder`. :class:`Run` is the agent's door to the
world; each of its boundaries is a step generator of ``_steps.py`` driven in sync code.
"""

from __future__ import annotations

import queue
import random
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import Token
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, Unpack

from sqlalchemy import Engine

from agent_blackbox.keystore import DataKeyStore
from agent_blackbox.outbox import _steps as steps
from agent_blackbox.outbox._boundaries import Crossing
from agent_blackbox.outbox._context import in_force, put_in_force, take_out
from agent_blackbox.outbox._core import (
    RecorderBase,
    RecorderConfig,
    RunCore,
    RunFields,
    RunOptions,
    RunSnapshot,
    StartPlan,
)
from agent_blackbox.outbox._crossings import Done
from agent_blackbox.outbox._effects import EffectOutcome, EffectReceipt
from agent_blackbox.outbox._errors import NotSerialisable
from agent_blackbox.outbox._group import IDLE_S, Batch, Flusher, RunBuffer, buffered
from agent_blackbox.outbox._network import Hole
from agent_blackbox.outbox._postgres import PostgresLog
from agent_blackbox.outbox._recording import drive
from agent_blackbox.outbox._recovery import PendingEffect, StoredRun
from agent_blackbox.outbox._surface import Boundaries
from agent_blackbox.outbox._writer import new_event_id
from agent_blackbox.schemas import BlackboxError, DataKey, Digester, Envelope, Settings
from agent_blackbox.wiring import AGENT_POOL

if TYPE_CHECKING:
    from agent_blackbox.outbox._postgres import Joinable

T = TypeVar("T")


class RunLog(Protocol):
    """Where a sync recorder's runs go (Postgres, or memory), and where it finds them
    again after a crash."""

    def create(self, start: StartPlan, connection: Any) -> Envelope:
        """Create the run and append its ``run.started``."""
        ...

    def append(self, core: RunCore, crossing: Crossing, event_id: str, connection: Any) -> Envelope:
        """Append the next event of the run of ``core``."""
        ...

    def flush(self, core: RunCore, batch: Batch) -> None:
        """Append the buffered events of ``batch`` (group commit), all or none."""
        ...

    def resume(
        self, run_id: str, *, shards: int, keys: DataKeyStore | None
    ) -> tuple[StoredRun, DataKey | None]:
        """The stored run, and a new data key for the writer that carries it on."""
        ...

    def unresolved_effects(self, *, run_id: str | None, limit: int) -> list[PendingEffect]:
        """Effects whose intent committed but whose receipt is missing or unknown."""
        ...

    def tenant_digest(self, keys: DataKeyStore, tenant_id: str) -> Digester:
        """The keyed digest of ``tenant_id`` (fetched once per recorder)."""
        ...


class RunLogRecorder(RecorderBase):
    """Records agent runs into a :class:`RunLog`: the API :class:`Recorder` (Postgres) and
    :class:`~agent_blackbox.outbox.MemoryRecorder` share. Not public: users construct one
    of those two, and annotate with ``Recorder | MemoryRecorder`` where either will do."""

    def __init__(self, log: RunLog, **config: Unpack[RecorderConfig]) -> None:
        super().__init__(**config)
        self._log = log
        self.flusher = Flusher()

    def start_run(
        self,
        snapshot: RunSnapshot,
        options: RunOptions | None = None,
        *,
        connection: Joinable | None = None,
        **fields: Unpack[RunFields],
    ) -> Run:
        """Create the run and record ``run.started``, in one transaction.

        ``options`` (or its fields as keywords: ``agent_id=...``) say who the run
        belongs to. With ``connection``, the run is created in the caller's transaction
        and exists only if the caller commits.

        Raises:
            NotSerialisable: the snapshot's input is not JSON.
            RunNotActive: a run with ``run_id`` exists already.
            DatabaseUnavailable: Postgres could not be reached.
        """
        chosen = RunOptions.of(options, fields)
        digest = self._digest_for(chosen)
        with self.crossing_span() as seen:
            start = self.plan(snapshot, chosen, digest)  # run.started takes the span's ids
            seen(self._log.create(start, connection), start.crossing)
        return Run(self, start.core)

    def record(
        self,
        entry: Callable[[Run, Any], T],
        snapshot: RunSnapshot,
        options: RunOptions | None = None,
        **fields: Unpack[RunFields],
    ) -> tuple[Run, T]:
        """Run ``entry(run, snapshot.input)`` as a recorded run; its return value is the
        run's recorded output, so a replay can check it.

        An exception from ``entry`` is recorded as the run's failure and re-raised.
        Returns the finished run and the output.
        """
        run = self.start_run(snapshot, options, **fields)
        run.core.watch_entry(entry)
        return run, run.drive(entry, snapshot.input)

    def resume(self, run_id: str) -> Run:
        """A writer for a run that is still ``running`` (its first writer died).

        Raises:
            RunNotActive: the run does not exist or has finished.
        """
        stored, data_key = self._log.resume(
            run_id, shards=self.settings.outbox_shards, keys=self.keys
        )
        return Run(self, self.resumed(stored, data_key))

    def unresolved_effects(
        self, *, run_id: str | None = None, limit: int = 1_000
    ) -> list[PendingEffect]:
        """Side effects whose intent committed but whose receipt is missing or unknown.

        After a crash, resolve each with :meth:`Run.resolve_effect` on the run from
        :meth:`resume`, asking the external system; never by calling it again blindly.
        """
        return self._log.unresolved_effects(run_id=run_id, limit=limit)

    def append(self, core: RunCore, crossing: Crossing, event_id: str, connection: Any) -> Envelope:
        """Append one event of the run of ``core``, in its own transaction or the caller's."""
        return self._log.append(core, crossing, event_id, connection)

    def flush(self, core: RunCore, batch: Batch) -> None:
        """Append a run's buffered events (group commit) in one transaction."""
        self._log.flush(core, batch)

    def _digest_for(self, options: RunOptions) -> Digester:
        known = self.cached_digest(options.tenant_id, options.classification)
        if known is not None:
            return known
        assert self.keys is not None  # cached_digest raised otherwise
        keyed = self._log.tenant_digest(self.keys, options.tenant_id)
        return self.remember_digest(options.tenant_id, keyed)


class Recorder(RunLogRecorder):
    """Records agent runs into the Postgres outbox.

    Args:
        engine: the write side's database.
        config: see :class:`~agent_blackbox.outbox._core.RecorderConfig` (settings,
            pipeline, clock, tools, effects, keys, redaction).
    """

    def __init__(self, engine: Engine, **config: Unpack[RecorderConfig]) -> None:
        super().__init__(PostgresLog(engine), **config)
        self.engine = engine

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> Recorder:
        """A recorder with its own engine for ``settings.database_url``; runs are
        encrypted when key-encryption keys are configured: ``BLACKBOX_KEK_PUBLIC_FILE``
        on agent hosts (wrap-only), or ``BLACKBOX_KEK_FILE`` / ``BLACKBOX_KEK``."""
        settings = settings or Settings.from_env()
        engine = AGENT_POOL.engine(settings.database_url)
        return cls(engine, settings=settings, keys=DataKeyStore.from_env())


class Run(Boundaries):
    """One agent run in record mode: the only door between agent code and the world.

    Use it as a context manager: leaving the block records ``run.finished``, as
    ``failed`` when an exception escapes. A run has one writer at a time; its methods
    are safe to call from several threads of that writer.

    When its recorder is in group commit mode
    (:class:`~agent_blackbox.outbox.GroupCommit`), clock reads, random draws, tool and
    LLM calls and retrievals are buffered and written many to a transaction, behind the
    run by a writer thread of its own; a crash loses those not yet committed (at most
    2 × ``max_events``: a batch in flight and the buffer), never an effect's intent or
    receipt.
    """

    core: RunCore

    def __init__(self, recorder: RunLogRecorder, core: RunCore) -> None:
        self._recorder = recorder
        self.core = core
        self._lock = threading.RLock()
        self._written = threading.Condition(self._lock)
        """Notified when a batch written behind the run is done (group commit)."""
        self._behind: threading.Thread | None = None
        self._handed: queue.SimpleQueue[Batch] = queue.SimpleQueue()
        """Batches handed to the writer thread. It takes them from this queue, not under
        the run's lock: the agent's thread holds that lock through every crossing, and a
        writer waking on it was starved for milliseconds a batch (the run then waited
        for a batch that had not started)."""
        self._joined: Joinable | None = None
        self._tools = recorder.tools
        self._effects = recorder.effects
        self._draws = random.Random()
        group = recorder.group_commit
        self._buffer = None if group is None else RunBuffer(group)
        self._in_force: Token[Any] | None = None

    replaying = False
    """A run in record mode (a replay run says True)."""

    @property
    def run_id(self) -> str:
        """The id of this run."""
        return self.core.run_id

    @property
    def last_sequence(self) -> int:
        """The sequence of the last event this writer appended (in group commit mode,
        buffered ones included)."""
        return self.core.cursor.sequence

    def __enter__(self) -> Run:
        # In force inside the block (see _context): integrations with no run handed to
        # them record into it, and connections it opens through no boundary are holes.
        self._in_force = put_in_force(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if self.core.finished:
                return
            if exc is None:
                self.finish()
            else:
                self.finish(status="failed", error=exc)
        finally:
            take_out(self, self._in_force)

    def drive(self, entry: Callable[[Run, Any], T], input: Any) -> T:
        """Run ``entry(self, input)`` and finish the run with its output or its error (an
        interruption too: Ctrl-C ends the run ``failed``, and goes on)."""
        self.core.placement.root()
        try:
            with in_force(self):
                output = entry(self, input)
        except BaseException as exc:  # an interruption too (Ctrl-C, a cancelled task)
            self.finish(status="failed", error=exc)
            exc.add_note(f"agent-blackbox: recorded as run {self.run_id} (failed)")
            raise
        try:
            self.finish(output=output)
        except NotSerialisable as refused:  # the output: the run was ended failed with it
            if not self.core.finished:  # a call settled at the end: end it failed with that
                self.finish(status="failed", error=refused)
            refused.add_note(f"agent-blackbox: recorded as run {self.run_id} (failed)")
            raise
        return output

    @contextmanager
    def joined(self, connection: Joinable) -> Iterator[Run]:
        """Append every event inside the block in the caller's transaction."""
        with self._lock:
            previous, self._joined = self._joined, connection
            try:
                yield self
            finally:
                self._joined = previous

    # What only a recording run has ------------------------------------------------

    def resolve_effect(
        self,
        pending: PendingEffect,
        lookup: Callable[[str], EffectOutcome | Mapping[str, Any] | None],
    ) -> EffectReceipt:
        """Record the receipt of an effect left open by a crash, by asking the external
        system what became of it.

        ``lookup`` gets the idempotency key and returns what the external system knows
        (``confirmed``), ``None`` when it has no record (``failed``: the call never took
        effect, and the agent may now decide to try again), or raises when it cannot
        tell (the receipt says ``unknown`` and the exception propagates).
        """
        return self._drive(steps.resolve_effect(self.core, pending, lookup))

    # Crossings whose work the agent's code finishes -------------------------------

    def open_llm(
        self, request: Mapping[str, Any], *, provider: str, model: str | None = None
    ) -> OpenCrossing:
        """Begin an ``llm.call`` for a request on its way (a recording transport's):
        the call takes its place now; the request is checked and the event appended
        when :meth:`OpenCrossing.close` says how it ended (a stream: once read).

        Raises:
            RunNotActive: the run is finished.
        """
        outcome, place = steps.llm_opened(self.core, request, provider, model)
        return OpenCrossing(lambda done: self._drive(steps.settled(outcome, place, done)))

    def open_tool(
        self, tool: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> OpenCrossing:
        """Begin a ``tool.call`` whose function the agent's code runs itself (an async
        tool in a sync run); see :meth:`open_llm`."""
        outcome, place = steps.tool_opened(self.core, tool, args, kwargs)
        return OpenCrossing(lambda done: self._drive(steps.settled(outcome, place, done)))

    def unrecorded(self, hole: Hole) -> None:
        """A call left the process from this run's code without crossing a boundary
        (see :mod:`agent_blackbox.outbox._network`)."""
        self.core.unrecorded(hole)

    # Appending --------------------------------------------------------------------

    def _drive(self, boundary: steps.Steps[T]) -> T:
        spans = self._recorder.spans
        if spans is None:
            return drive(boundary, self.core, self._append)
        with spans.crossing(self.core.scrub) as seen:

            def append(crossing: Crossing, connection: Any) -> Envelope:
                return seen(self._append(crossing, connection), crossing)

            return drive(boundary, self.core, append)

    def flush(self) -> None:
        """Write the events this run buffered (group commit mode) now; nothing to do in
        per-event mode.

        Raises:
            EventsNotRecorded: the flush failed; the events stay buffered.
        """
        with self._lock:
            self._flush()

    def _append(self, crossing: Crossing, connection: Joinable | None) -> Envelope:
        with self._lock:
            self.core.check_active()
            target = connection if connection is not None else self._joined
            if self._buffer is not None:
                if target is None and buffered(crossing):
                    return self._buffered(self._buffer, crossing)
                self._flush()  # everything before an effect, a transition, a joined event
            return self._recorder.append(self.core, crossing, new_event_id(), target)

    def _buffered(self, buffer: RunBuffer, crossing: Crossing) -> Envelope:
        if buffer.full:
            self._settle(buffer)
            self.core.check_active()  # the batch in flight failed: raised at this boundary
            if buffer.stale:
                self._flush()
            elif buffer.full:  # (unless another thread of the run handed it off meanwhile)
                self._hand_off(buffer)
        envelope = buffer.add(self.core, crossing, new_event_id())
        if buffer.in_flight is None:  # else the writer schedules the buffer once done
            self._recorder.flusher.schedule(self, buffer.deadline, self._flush_due)
        return envelope

    def _flush(self) -> None:
        """Write the buffer, after the batch in flight (under the run's lock)."""
        buffer = self._buffer
        if buffer is None:
            return
        self._settle(buffer)
        if not len(buffer):
            return
        self._recorder.flusher.cancel(self)
        try:
            self._recorder.flush(self.core, buffer.batch)
        except BlackboxError as exc:
            self.core.forget_unwritten()  # this error names the same events, and more
            raise buffer.failed(self.run_id, exc) from exc
        buffer.flushed()
        self.core.forget_unwritten()  # those events are written now: nothing to report

    def _flush_due(self) -> None:
        """The timer's flush: the buffer goes to the run's writer thread; a failure is
        raised at the run's next boundary."""
        with self._lock:
            buffer = self._buffer
            if buffer is None or buffer.in_flight is not None or not len(buffer):
                return  # (a writer that is done schedules what was buffered meanwhile)
            if not buffer.stale:
                self._hand_off(buffer)
                return
            try:
                self._flush()
            except Exception as exc:  # the agent's thread gets it, not this one
                self.core.unreported = exc

    # Writing behind the run (group commit) ----------------------------------------------

    def _settle(self, buffer: RunBuffer) -> None:
        """Wait for the batch in flight (under the run's lock, which the wait releases)."""
        while buffer.in_flight is not None:
            self._written.wait()

    def _hand_off(self, buffer: RunBuffer) -> None:
        """Give the buffer to the run's writer thread; nothing is in flight (under the
        run's lock)."""
        self._recorder.flusher.cancel(self)
        self._handed.put(buffer.take())
        if self._behind is None:
            self._behind = threading.Thread(
                target=self._write_behind, args=(buffer,), name="blackbox-write-behind", daemon=True
            )
            self._behind.start()

    def _write_behind(self, buffer: RunBuffer) -> None:
        """The run's writer thread: writes each batch handed to it while the run buffers
        the next; ends once none came for :data:`IDLE_S` or the run finished."""
        while (batch := self._next_behind()) is not None:
            error: Exception | None = None
            try:
                self._recorder.flush(self.core, batch)
            except Exception as exc:  # the agent's thread gets it, at its next boundary
                error = exc
            with self._lock:
                self._written_behind(buffer, batch, error)

    def _next_behind(self) -> Batch | None:
        """The next batch handed over; None (the thread ends) once none came for
        :data:`IDLE_S`. Ending is decided under the run's lock, under which batches are
        handed over, so a batch handed over later starts a new thread."""
        while True:
            try:
                return self._handed.get(timeout=IDLE_S)
            except queue.Empty:
                with self._lock:
                    if self._handed.empty():
                        self._behind = None
                        return None

    def _written_behind(self, buffer: RunBuffer, batch: Batch, error: Exception | None) -> None:
        """The batch in flight is done (under the run's lock): written, or back at the head
        of the buffer, unwritten, with its failure for the run's next boundary."""
        buffer.in_flight = None
        if error is None and not batch.moved:
            self.core.forget_unwritten()  # those events are written now
        else:
            buffer.returned(batch)  # (moved: the run prepares it again, and writes it)
            if isinstance(error, BlackboxError):
                self.core.unreported = buffer.failed(self.run_id, error)
            elif error is not None:
                self.core.unreported = error
        if len(buffer) and error is None and not self.core.finished:
            self._recorder.flusher.schedule(self, buffer.deadline, self._flush_due)
        self._written.notify_all()


class OpenCrossing:
    """A crossing begun and not yet recorded: :meth:`close` says how its work ended and
    appends its event (in the run's place taken when it began)."""

    def __init__(self, settle: Callable[[Done], Any]) -> None:
        self._settle = settle
        self.closed = False

    def close(self, value: Any = None, *, error: Exception | None = None, latency_ms: float) -> Any:
        """Record the result ``value`` (or ``error``, raised on once recorded); only the
        first close counts.

        Raises:
            Exception: ``error``, once recorded; a recorder error when appending failed.
        """
        if self.closed:
            return value
        self.closed = True
        return self._settle(Done(value, error, latency_ms))
