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

from agent_blackbox.outbox._boundaries import Crossing
from agent_blackbox.outbox._core import (
    APPEND_ATTEMPTS,
    Outcome,
    ReceiptBuilder,
    RecorderBase,
    RunCore,
    RunSnapshot,
    fresh_event_id,
    plan_start,
)
from agent_blackbox.outbox._effects import EffectReceipt
from agent_blackbox.outbox._recorder import TRANSIENT_RETRIES, _since, _transient, _unavailable
from agent_blackbox.outbox._writer import (
    PreparedEvent,
    append_txn_async,
    load_cursor_txn_async,
)
from agent_blackbox.schemas import Digester, Envelope, Settings

T = TypeVar("T")


async def _resolve(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class AsyncRecorder(RecorderBase[AsyncEngine]):
    """Records runs of asyncio agents; the async twin of
    :class:`~agent_blackbox.outbox.Recorder`."""

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
            keys=self.keys,
            digest=await self._digest_for(tenant_id, classification),
            scrub=self.scrub,
        )
        run = AsyncRun(self, plan.core)

        async def create(conn: AsyncConnection) -> Envelope:
            statement, params = plan.insert
            try:
                await conn.execute(statement, params)
            except IntegrityError as exc:
                raise plan.exists() from exc
            if plan.store_key is not None:
                await conn.execute(*plan.store_key)
            return await run.append_in(conn, plan.crossing, plan.event_id, first=plan.first)

        await self.transact(create, connection)
        return run

    async def _digest_for(self, tenant_id: str, classification: str) -> Digester:
        known = self.cached_digest(tenant_id, classification)
        if known is not None:
            return known
        assert self.keys is not None  # cached_digest raised otherwise
        store = self.keys

        async def fetch(conn: AsyncConnection) -> Digester:
            return await conn.run_sync(lambda sync: store.tenant_digest_txn(sync, tenant_id))

        return self.remember_digest(tenant_id, await self.transact(fetch, None))

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
    """One agent run in record mode for asyncio code; mirrors :class:`~agent_blackbox.outbox.Run`.

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
        outcome = self.core.tool_outcome(tool, args, kwargs)
        tools = self._recorder.tools
        return await self._observed(lambda: tools.call(tool, args, kwargs, fn), outcome)

    async def llm(
        self,
        send: Callable[[Mapping[str, Any]], Any],
        request: Mapping[str, Any],
        *,
        provider: str,
        model: str | None = None,
    ) -> Mapping[str, Any]:
        """Send ``request`` through ``send`` (sync or async) and record ``llm.call``."""
        outcome = self.core.llm_outcome(provider, model, request)
        response: Mapping[str, Any] = await self._observed(lambda: send(request), outcome)
        return response

    async def now(self) -> datetime:
        """The wall clock, UTC, recorded as ``clock.read``."""
        crossing = self.core.wall_clock()
        await self._append(crossing)
        return datetime.fromtimestamp(crossing.body["value_us"] / 1e6, UTC)

    async def monotonic(self) -> float:
        """A monotonic clock in seconds, recorded as ``clock.read``."""
        crossing = self.core.monotonic_clock()
        await self._append(crossing)
        return float(crossing.body["value_us"]) / 1e6

    async def random(self) -> float:
        """A float in [0, 1), recorded as ``random.draw``."""
        value = self._random.random()
        await self._append(self.core.random_float(value))
        return value

    async def randint(self, low: int, high: int) -> int:
        """An integer in [low, high], recorded as ``random.draw``."""
        value = self._random.randint(low, high)
        await self._append(self.core.random_int(low, high, value))
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
        await self._append(intent)  # committed before the external call, by design
        receipt = ReceiptBuilder.of(intent, self.core.scrub)
        key = intent.body["idempotency_key"]
        policy = self._recorder.effects
        await self._observed(
            lambda: policy.perform(effect, key, arguments, perform), receipt.crossing
        )
        return receipt.receipt

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

    async def _observed(self, perform: Callable[[], Any], outcome: Outcome) -> Any:
        """Run ``perform`` (awaiting what it returns) and record what came of it."""
        started = time.perf_counter()
        try:
            result = await _resolve(perform())
        except Exception as exc:
            await self._append(outcome(None, exc, _since(started)))
            raise
        await self._append(outcome(result, None, _since(started)))
        return result

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
