"""The Recorder in record mode, for asyncio agents: the async twin of ``_recorder.py``.

The boundaries are the same step generators as the sync run's (``_steps.py``), driven
with ``await``; the Postgres log runs the same plans, awaiting each statement. Agent
functions handed to an :class:`AsyncRun` may be plain or ``async``.
"""

from __future__ import annotations

import asyncio
import inspect
import random
from collections.abc import Awaitable, Callable, Mapping
from contextvars import Token
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, Unpack

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
from agent_blackbox.outbox._effects import EffectReceipt
from agent_blackbox.outbox._errors import NotSerialisable
from agent_blackbox.outbox._group import Batch, RunBuffer, buffered
from agent_blackbox.outbox._network import Hole
from agent_blackbox.outbox._postgres import AsyncPostgresLog
from agent_blackbox.outbox._recording import drive_async
from agent_blackbox.outbox._recovery import PendingEffect, StoredRun
from agent_blackbox.outbox._surface import AsyncBoundaries
from agent_blackbox.outbox._writer import new_event_id
from agent_blackbox.schemas import BlackboxError, DataKey, Digester, Envelope, Settings
from agent_blackbox.wiring import AGENT_POOL

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

T = TypeVar("T")


class AsyncRunLog(Protocol):
    """Where an async recorder's runs go; the async twin of
    :class:`~agent_blackbox.outbox._recorder.RunLog`."""

    async def create(self, start: StartPlan, connection: Any) -> Envelope:
        """Create the run and append its ``run.started``."""
        ...

    async def append(
        self, core: RunCore, crossing: Crossing, event_id: str, connection: Any
    ) -> Envelope:
        """Append the next event of the run of ``core``."""
        ...

    async def flush(self, core: RunCore, batch: Batch) -> None:
        """Append the buffered events of ``batch`` (group commit), all or none."""
        ...

    async def resume(
        self, run_id: str, *, shards: int, keys: DataKeyStore | None
    ) -> tuple[StoredRun, DataKey | None]:
        """The stored run, and a new data key for the writer that carries it on."""
        ...

    async def unresolved_effects(self, *, run_id: str | None, limit: int) -> list[PendingEffect]:
        """Effects whose intent committed but whose receipt is missing or unknown."""
        ...

    async def tenant_digest(self, keys: DataKeyStore, tenant_id: str) -> Digester:
        """The keyed digest of ``tenant_id`` (fetched once per recorder)."""
        ...


class AsyncRunLogRecorder(RecorderBase):
    """Records runs of asyncio agents into an :class:`AsyncRunLog`: the API
    :class:`AsyncRecorder` and :class:`~agent_blackbox.outbox.AsyncMemoryRecorder` share,
    method for method that of the sync recorders. Not public: users construct one of those
    two, and annotate with ``AsyncRecorder | AsyncMemoryRecorder`` where either will do."""

    def __init__(self, log: AsyncRunLog, **config: Unpack[RecorderConfig]) -> None:
        super().__init__(**config)
        self._log = log

    async def start_run(
        self,
        snapshot: RunSnapshot,
        options: RunOptions | None = None,
        *,
        connection: AsyncConnection | None = None,
        **fields: Unpack[RunFields],
    ) -> AsyncRun:
        """Create the run and record ``run.started``; see
        :meth:`~agent_blackbox.outbox.Recorder.start_run`."""
        chosen = RunOptions.of(options, fields)
        digest = await self._digest_for(chosen)
        with self.crossing_span() as seen:
            start = self.plan(snapshot, chosen, digest)  # run.started takes the span's ids
            seen(await self._log.create(start, connection), start.crossing)
        return AsyncRun(self, start.core)

    async def record(
        self,
        entry: Callable[[AsyncRun, Any], Awaitable[T] | T],
        snapshot: RunSnapshot,
        options: RunOptions | None = None,
        **fields: Unpack[RunFields],
    ) -> tuple[AsyncRun, T]:
        """Run ``entry(run, snapshot.input)`` (a coroutine function or a plain one) as a
        recorded run; see :meth:`~agent_blackbox.outbox.Recorder.record`."""
        run = await self.start_run(snapshot, options, **fields)
        run.core.watch_entry(entry)
        return run, await run.drive(entry, snapshot.input)

    async def resume(self, run_id: str) -> AsyncRun:
        """A writer for a run that is still ``running``; see
        :meth:`~agent_blackbox.outbox.Recorder.resume`."""
        stored, data_key = await self._log.resume(
            run_id, shards=self.settings.outbox_shards, keys=self.keys
        )
        return AsyncRun(self, self.resumed(stored, data_key))

    async def unresolved_effects(
        self, *, run_id: str | None = None, limit: int = 1_000
    ) -> list[PendingEffect]:
        """Side effects left open by a crash; see
        :meth:`~agent_blackbox.outbox.Recorder.unresolved_effects`."""
        return await self._log.unresolved_effects(run_id=run_id, limit=limit)

    async def append(
        self, core: RunCore, crossing: Crossing, event_id: str, connection: Any
    ) -> Envelope:
        """Append one event of the run of ``core``, in its own transaction or the caller's."""
        return await self._log.append(core, crossing, event_id, connection)

    async def flush(self, core: RunCore, batch: Batch) -> None:
        """Append a run's buffered events (group commit) in one transaction."""
        await self._log.flush(core, batch)

    async def _digest_for(self, options: RunOptions) -> Digester:
        known = self.cached_digest(options.tenant_id, options.classification)
        if known is not None:
            return known
        assert self.keys is not None  # cached_digest raised otherwise
        keyed = await self._log.tenant_digest(self.keys, options.tenant_id)
        return self.remember_digest(options.tenant_id, keyed)


class AsyncRecorder(AsyncRunLogRecorder):
    """Records runs of asyncio agents into the Postgres outbox; the async twin of
    :class:`~agent_blackbox.outbox.Recorder`.

    Args:
        engine: the write side's database, as an ``AsyncEngine``.
        config: see :class:`~agent_blackbox.outbox._core.RecorderConfig`.
    """

    def __init__(self, engine: AsyncEngine, **config: Unpack[RecorderConfig]) -> None:
        super().__init__(AsyncPostgresLog(engine), **config)
        self.engine = engine

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> AsyncRecorder:
        """A recorder with its own async engine for ``settings.database_url``; runs are
        encrypted when key-encryption keys are configured, as with
        :meth:`~agent_blackbox.outbox.Recorder.from_settings`."""
        settings = settings or Settings.from_env()
        engine = AGENT_POOL.async_engine(settings.database_url)
        return cls(engine, settings=settings, keys=DataKeyStore.from_env())


class AsyncRun(AsyncBoundaries):
    """One agent run in record mode for asyncio code; mirrors
    :class:`~agent_blackbox.outbox.Run`, method for method."""

    core: RunCore

    def __init__(self, recorder: AsyncRunLogRecorder, core: RunCore) -> None:
        self._recorder = recorder
        self.core = core
        self._lock = asyncio.Lock()
        self._tools = recorder.tools
        self._effects = recorder.effects
        self._draws = random.Random()
        group = recorder.group_commit
        self._buffer = None if group is None else RunBuffer(group)
        self._timer: asyncio.Task[None] | None = None
        self.loop = asyncio.get_running_loop()
        """The event loop the run records from; sync code in other threads (a tool a
        framework runs in an executor) records through it."""
        self._in_force: Token[Any] | None = None
        self.settling: set[asyncio.Task[Any]] = set()
        """Events appended by tasks of their own (a sync tool the agent called on the
        loop: ``_tool``), not yet written; the end of the run waits for them."""

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

    async def __aenter__(self) -> AsyncRun:
        # In force inside the block, in this task and the tasks it starts (see _context).
        self._in_force = put_in_force(self)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if self.core.finished:
                return
            if exc is None:
                await self.finish()
            else:
                await self.finish(status="failed", error=exc)
        finally:
            take_out(self, self._in_force)

    async def drive(self, entry: Callable[[AsyncRun, Any], Awaitable[T] | T], input: Any) -> T:
        """Run ``entry(self, input)`` (awaited when it is a coroutine) and finish the run
        with its output or its error (an interruption too: a cancelled task ends the run
        ``failed``, and the cancellation goes on)."""
        self.core.placement.root()
        try:
            with in_force(self):
                output = entry(self, input)
                if inspect.isawaitable(output):
                    output = await output
        except BaseException as exc:  # an interruption too (Ctrl-C, a cancelled task)
            await self.finish(status="failed", error=exc)
            exc.add_note(f"agent-blackbox: recorded as run {self.run_id} (failed)")
            raise
        try:
            await self.finish(output=output)
        except NotSerialisable as refused:  # the output: the run was ended failed with it
            if not self.core.finished:  # a call settled at the end: end it failed with that
                await self.finish(status="failed", error=refused)
            refused.add_note(f"agent-blackbox: recorded as run {self.run_id} (failed)")
            raise
        return output

    # What only a recording run has ------------------------------------------------

    async def resolve_effect(
        self,
        pending: PendingEffect,
        lookup: Callable[[str], Any],
    ) -> EffectReceipt:
        """Record the receipt of an effect left open by a crash; see
        ``Run.resolve_effect`` (``lookup`` may be a coroutine function)."""
        return await self._drive(steps.resolve_effect(self.core, pending, lookup))

    # Crossings whose work the agent's code finishes -------------------------------

    def open_llm(
        self, request: Mapping[str, Any], *, provider: str, model: str | None = None
    ) -> AsyncOpenCrossing:
        """Begin an ``llm.call`` for a request on its way; see ``Run.open_llm``.
        Closing it is awaited.

        Raises:
            RunNotActive: the run is finished.
        """
        outcome, place = steps.llm_opened(self.core, request, provider, model)
        return AsyncOpenCrossing(lambda done: self._drive(steps.settled(outcome, place, done)))

    def open_tool(
        self, tool: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> AsyncOpenCrossing:
        """Begin a ``tool.call`` whose function the agent's code runs itself; see
        ``Run.open_tool``."""
        outcome, place = steps.tool_opened(self.core, tool, args, kwargs)
        return AsyncOpenCrossing(lambda done: self._drive(steps.settled(outcome, place, done)))

    def unrecorded(self, hole: Hole) -> None:
        """A call left the process from this run's code without crossing a boundary."""
        self.core.unrecorded(hole)

    async def _drive(self, boundary: steps.Steps[T]) -> T:
        spans = self._recorder.spans
        if spans is None:
            return await drive_async(boundary, self.core, self._append, self.settling)
        with spans.crossing(self.core.scrub) as seen:

            async def append(crossing: Crossing, connection: Any) -> Envelope:
                return seen(await self._append(crossing, connection), crossing)

            return await drive_async(boundary, self.core, append, self.settling)

    async def flush(self) -> None:
        """Write the events this run buffered (group commit mode) now; see
        ``Run.flush``."""
        async with self._lock:
            await self._flush()

    async def _append(self, crossing: Crossing, connection: AsyncConnection | None) -> Envelope:
        async with self._lock:
            self.core.check_active()
            if self._buffer is not None:
                if connection is None and buffered(crossing):
                    return await self._buffered(self._buffer, crossing)
                await self._flush()  # everything before an effect, a transition, a joined event
            return await self._recorder.append(self.core, crossing, new_event_id(), connection)

    async def _buffered(self, buffer: RunBuffer, crossing: Crossing) -> Envelope:
        if buffer.full:
            await self._flush()
        envelope = buffer.add(self.core, crossing, new_event_id())
        if self._timer is None:
            self._timer = asyncio.get_running_loop().create_task(self._flush_later(buffer.delay_s))
        return envelope

    async def _flush(self) -> None:
        """Write the buffer (under the run's lock)."""
        buffer = self._buffer
        if buffer is None or not len(buffer):
            return
        if self._timer is not None:  # still sleeping: the buffer is written here
            self._timer.cancel()
            self._timer = None
        try:
            await self._recorder.flush(self.core, buffer.batch)
        except BlackboxError as exc:
            raise buffer.failed(self.run_id, exc) from exc
        buffer.flushed()
        self.core.forget_unwritten()  # those events are written now: nothing to report

    async def _flush_later(self, delay_s: float) -> None:
        """The timer's flush: a failure is raised at the run's next boundary."""
        await asyncio.sleep(delay_s)
        self._timer = None  # past its sleep, the timer is not cancelled any more
        async with self._lock:
            try:
                await self._flush()
            except Exception as exc:  # the agent's task gets it, not this one
                self.core.unreported = exc


class AsyncOpenCrossing:
    """The async twin of :class:`~agent_blackbox.outbox._recorder.OpenCrossing`."""

    def __init__(self, settle: Callable[[Done], Awaitable[Any]]) -> None:
        self._settle = settle
        self.closed = False

    async def close(
        self, value: Any = None, *, error: Exception | None = None, latency_ms: float
    ) -> Any:
        """Record the result ``value`` (or ``error``, raised on once recorded); only the
        first close counts."""
        if self.closed:
            return value
        self.closed = True
        return await self._settle(Done(value, error, latency_ms))
