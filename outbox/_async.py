"""The Recorder in record mode, for asyncio agents."""

from __future__ import annotations

import asyncio
import inspect
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, TypeVar

from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from outbox._boundaries import Crossing
from outbox._core import (
    APPEND_ATTEMPTS,
    EffectOutcome,
    EffectReceipt,
    RunCore,
    RunSnapshot,
    as_outcome,
    fresh_event_id,
    receipt_crossing,
    start_crossing,
)
from outbox._errors import RunNotActive
from outbox._recorder import TRANSIENT_RETRIES, _since, _transient, _unavailable, utc_now
from outbox._writer import (
    EventFactory,
    PreparedEvent,
    RunIdentity,
    append_txn_async,
    insert_run_plan,
    load_cursor_txn_async,
    shard_of,
)
from schemas import Envelope, EnvelopeCodec, PayloadPipeline, Settings

T = TypeVar("T")


async def _resolve(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class AsyncRecorder:
    """Records runs of asyncio agents; the async twin of :class:`~outbox.Recorder`."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        settings: Settings | None = None,
        pipeline: PayloadPipeline | None = None,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self.engine = engine
        self.settings = settings or Settings.from_env()
        self._factory = EventFactory(
            settings=self.settings,
            pipeline=pipeline or PayloadPipeline(),
            codec=EnvelopeCodec(),
            clock=clock,
        )

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> AsyncRecorder:
        """A recorder with its own async engine for ``settings.database_url``."""
        settings = settings or Settings.from_env()
        return cls(create_async_engine(settings.database_url, pool_size=10), settings=settings)

    async def start_run(
        self,
        snapshot: RunSnapshot,
        *,
        agent_id: str,
        tenant_id: str = "default",
        subject_ids: tuple[str, ...] = (),
        run_id: str | None = None,
        classification: str = "internal",
        retention_class: str = "standard",
        connection: AsyncConnection | None = None,
    ) -> AsyncRun:
        """Create the run and record ``run.started``; see :meth:`Recorder.start_run`."""
        run_id = run_id or str(uuid.uuid4())
        identity = RunIdentity(
            run_id=run_id,
            tenant_id=tenant_id,
            agent_id=agent_id,
            shard=shard_of(run_id, self.settings.outbox_shards),
            subject_ids=tuple(subject_ids),
            classification=classification,
            retention_class=retention_class,
        )
        run = AsyncRun(self, RunCore(identity, self._factory))
        crossing = start_crossing(snapshot)
        statement, params = insert_run_plan(
            identity, parent_run_id=snapshot.parent_run_id, code_version=snapshot.code_version
        )
        event_id = fresh_event_id()
        first = run.core.prepare(crossing, event_id)

        async def create(conn: AsyncConnection) -> Envelope:
            try:
                await conn.execute(statement, params)
            except IntegrityError as exc:
                raise RunNotActive(f"a run with id {run_id} exists already") from exc
            return await run.append_in(conn, crossing, event_id, first=first)

        await self.transact(create, connection)
        return run

    async def transact(
        self,
        work: Callable[[AsyncConnection], Awaitable[T]],
        connection: AsyncConnection | None,
    ) -> T:
        """Run ``work`` in the caller's transaction, or a new one with retries."""
        try:
            if connection is not None:
                return await work(connection)
            for attempt in range(TRANSIENT_RETRIES):
                try:
                    async with self.engine.begin() as conn:
                        return await work(conn)
                except DBAPIError as exc:
                    if not _transient(exc) or attempt == TRANSIENT_RETRIES - 1:
                        raise
                    await asyncio.sleep(0.05 * 2**attempt)  # back off before retrying
        except SQLAlchemyError as exc:
            raise _unavailable(exc) from exc
        raise AssertionError("unreachable")


class AsyncRun:
    """One agent run in record mode for asyncio code; mirrors :class:`~outbox.Run`.

    Agent functions handed to it may be plain or ``async``.
    """

    def __init__(self, recorder: AsyncRecorder, core: RunCore) -> None:
        self._recorder = recorder
        self.core = core
        self._lock = asyncio.Lock()
        self._random = random.Random()

    @property
    def run_id(self) -> str:
        """The id of this run."""
        return self.core.run_id

    async def __aenter__(self) -> AsyncRun:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.core.finished:
            return
        if exc is None:
            await self.finish()
        else:
            await self.finish(status="failed", error=exc)

    async def call(self, tool: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Call tool ``fn`` (sync or async) and record ``tool.call``."""
        self.core.tool_inputs(tool, args, kwargs)
        started = time.perf_counter()
        try:
            result = await _resolve(fn(*args, **kwargs))
        except Exception as exc:
            await self._append(
                self.core.tool_call(
                    tool=tool,
                    args=args,
                    kwargs=kwargs,
                    result=None,
                    error=exc,
                    latency_ms=_since(started),
                )
            )
            raise
        await self._append(
            self.core.tool_call(
                tool=tool,
                args=args,
                kwargs=kwargs,
                result=result,
                error=None,
                latency_ms=_since(started),
            )
        )
        return result

    async def llm(
        self,
        send: Callable[[Mapping[str, Any]], Any],
        request: Mapping[str, Any],
        *,
        provider: str,
        model: str | None = None,
    ) -> Mapping[str, Any]:
        """Send ``request`` through ``send`` (sync or async) and record ``llm.call``."""
        model = model or str(request.get("model", "unknown"))
        self.core.llm_inputs(provider, model, request)
        started = time.perf_counter()
        try:
            response: Mapping[str, Any] = await _resolve(send(request))
        except Exception as exc:
            await self._append(
                self.core.llm_call(
                    provider=provider,
                    model=model,
                    request=request,
                    response=None,
                    error=exc,
                    latency_ms=_since(started),
                )
            )
            raise
        await self._append(
            self.core.llm_call(
                provider=provider,
                model=model,
                request=request,
                response=response,
                error=None,
                latency_ms=_since(started),
            )
        )
        return response

    async def now(self) -> datetime:
        """The wall clock, UTC, recorded as ``clock.read``."""
        crossing = self.core.wall_clock()
        await self._append(crossing)
        return datetime.fromtimestamp(crossing.body["value_us"] / 1e6, UTC)

    async def random(self) -> float:
        """A float in [0, 1), recorded as ``random.draw``."""
        value = self._random.random()
        await self._append(self.core.random_float(value))
        return value

    async def uuid(self) -> uuid.UUID:
        """A random UUID, recorded as ``random.draw``."""
        value, crossing = self.core.random_uuid()
        await self._append(crossing)
        return value

    async def effect(
        self,
        effect: str,
        perform: Callable[[str], Any],
        *,
        arguments: Mapping[str, Any],
        key: str | None = None,
    ) -> EffectReceipt:
        """Cause a side effect with intent before and receipt after; see ``Run.effect``."""
        intent = self.core.effect_intent(effect, arguments, key)
        await self._append(intent)
        started = time.perf_counter()
        try:
            outcome: EffectOutcome | None = as_outcome(
                await _resolve(perform(intent.body["idempotency_key"]))
            )
        except Exception as exc:
            _, crossing = receipt_crossing(intent, None, exc, _since(started))
            await self._append(crossing)
            raise
        receipt, crossing = receipt_crossing(intent, outcome, None, _since(started))
        await self._append(crossing)
        return receipt

    async def transition(
        self,
        to_state: str,
        *,
        state: Any,
        reason: str | None = None,
        connection: AsyncConnection | None = None,
    ) -> Envelope:
        """Record ``state.transition``, optionally in the caller's transaction."""
        crossing = self.core.transition(to_state, state, reason)
        envelope = await self._append(crossing, connection)
        self.core.transitioned(crossing)
        return envelope

    async def finish(
        self,
        *,
        status: str = "succeeded",
        output: Any = None,
        error: BaseException | None = None,
        connection: AsyncConnection | None = None,
    ) -> Envelope:
        """Record ``run.finished``; afterwards the run takes no more events."""
        envelope = await self._append(self.core.finish(status, output, error), connection)
        self.core.finished = True
        return envelope

    async def _append(
        self, crossing: Crossing, connection: AsyncConnection | None = None
    ) -> Envelope:
        async with self._lock:
            self.core.check_active()
            event_id = fresh_event_id()
            return await self._recorder.transact(
                lambda conn: self.append_in(conn, crossing, event_id), connection
            )

    async def append_in(
        self,
        conn: AsyncConnection,
        crossing: Crossing,
        event_id: str,
        *,
        first: PreparedEvent | None = None,
    ) -> Envelope:
        """Append ``crossing`` on ``conn``, re-reading the run when its guard fails."""
        event = first or self.core.prepare(crossing, event_id)
        for _ in range(APPEND_ATTEMPTS):
            if await append_txn_async(conn, self.core.identity, event):
                return self.core.advanced(event)
            if self.core.stale(event, await load_cursor_txn_async(conn, self.run_id)):
                return event.envelope
            event = self.core.prepare(crossing, event_id)
        raise self.core.conflict()
