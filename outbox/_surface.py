"""The boundaries agent code calls, written once per flavour: sync and async.

:class:`Boundaries` is the surface of every sync run, :class:`AsyncBoundaries` of every
async one, in record mode (the Recorder's ``Run`` and ``AsyncRun``) and in replay mode
(the replayer's ``ReplayRun`` and ``AsyncReplayRun``) alike. Each method builds its
boundary's step generator (``_steps.py``) and hands it to the run's driver: record mode
calls and appends, replay mode answers from the log. A run class adds its driver and what
only its mode has (a recording run's open crossings and recovery, a replay's report).

The async surface is the sync one awaited, method for method: a test compares the two
(names, parameters, docstrings, and each body with its ``await`` taken out), the check
psycopg's generated sync twin gets in its CI.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from agent_blackbox.outbox import _steps as steps
from agent_blackbox.outbox._effects import EffectOutcome, EffectPolicy, EffectReceipt, ToolPolicy
from agent_blackbox.outbox._steps import BoundaryCore, Draws, Steps

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

    from agent_blackbox.outbox._postgres import Joinable
    from agent_blackbox.schemas import Envelope

T = TypeVar("T")


class Boundaries:
    """The boundaries of a run, for sync agent code (see :class:`~agent_blackbox.outbox.AgentRun`).

    In record mode each calls the agent's function (or reads the clock, draws) and
    records the crossing; in replay mode nothing is called: the crossing's recorded event
    is taken, checked against what the code asks (by digest), and what came of the call
    is handed back, value with its type or exception with its class.
    """

    core: BoundaryCore
    """What the boundaries need of the run: its id, contract and state."""
    _tools: ToolPolicy
    _effects: EffectPolicy
    _draws: Draws

    def _drive(self, boundary: Steps[T]) -> T:
        """Do one boundary's steps (the run's driver: record or replay)."""
        raise NotImplementedError

    def call(self, tool: str, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Call tool ``fn(*args, **kwargs)`` as ``tool.call``: its result, or its exception.

        The arguments are checked before ``fn`` runs; what ``fn`` raises is recorded and
        raised again. In replay ``fn`` is not called: the recorded result comes back.

        Raises:
            NotSerialisable: an argument or the result is not JSON.
        """
        boundary = steps.tool_call(self.core, self._tools, tool, fn, args, kwargs)
        result: T = self._drive(boundary)
        return result

    def llm(
        self,
        send: Callable[[Mapping[str, Any]], Mapping[str, Any]],
        request: Mapping[str, Any],
        *,
        provider: str,
        model: str | None = None,
    ) -> Mapping[str, Any]:
        """Send ``request`` to a model through ``send`` as ``llm.call``: the response.

        ``send`` takes the raw request JSON and returns the raw response JSON of an
        OpenAI-compatible chat completion. Errors are recorded and raised again. In
        replay ``send`` is not called: the recorded response comes back.
        """
        boundary = steps.llm_call(self.core, send, request, provider, model)
        response: Mapping[str, Any] = self._drive(boundary)
        return response

    def retrieve(
        self,
        index: str,
        search: Callable[..., Any],
        query: Any,
        *,
        index_version: str,
        filters: Mapping[str, Any] | None = None,
        top_k: int | None = None,
    ) -> list[Any]:
        """Search ``index`` (at ``index_version``) through ``search`` as ``retrieval``: the
        query, filters and top-k, and the hits (document ids, chunk versions, scores, and
        whatever else each hit carries).

        ``search(query, filters=..., top_k=...)`` is the agent's own search (sync or
        async) and returns hits: mappings with at least ``"id"`` and a numeric
        ``"score"`` (and ``"chunk_version"`` when the index is chunked). The query is
        checked before the search runs; hits that are not hits, or cannot be recorded,
        are recorded as the retrieval's error and raised. In replay ``search`` is not
        called: the recorded hits come back.
        """
        boundary = steps.retrieve(self.core, search, index, query, index_version, filters, top_k)
        hits: list[Any] = self._drive(boundary)
        return hits

    def now(self) -> datetime:
        """The wall clock, UTC, as ``clock.read``."""
        return self._drive(steps.now(self.core))

    def monotonic(self) -> float:
        """A monotonic clock in seconds, as ``clock.read``."""
        return self._drive(steps.monotonic(self.core))

    def random(self) -> float:
        """A float in [0, 1), as ``random.draw``."""
        return self._drive(steps.random_float(self.core, self._draws))

    def randint(self, low: int, high: int) -> int:
        """An integer in [low, high], as ``random.draw``."""
        return self._drive(steps.random_int(self.core, self._draws, low, high))

    def uuid(self) -> uuid.UUID:
        """A random UUID, as ``random.draw``."""
        return self._drive(steps.random_uuid(self.core))

    def effect(
        self,
        effect: str,
        perform: Callable[[str], EffectOutcome | Mapping[str, Any] | None],
        *,
        arguments: Mapping[str, Any],
        key: str | None = None,
    ) -> EffectReceipt:
        """Cause a side effect: ``effect.intent`` commits, then ``perform(key)``, then
        ``effect.receipt``.

        ``perform`` receives the idempotency key and should hand it to the external
        system. It raises :class:`EffectRejected` when the system refused for sure;
        any other exception leaves the receipt ``unknown`` and is raised again. In
        replay ``perform`` is never called: the recorded receipt comes back.
        """
        boundary = steps.effect(self.core, self._effects, effect, perform, arguments, key)
        return self._drive(boundary)

    def transition(
        self,
        to_state: str,
        *,
        state: Any,
        reason: str | None = None,
        connection: Joinable | None = None,
    ) -> Envelope:
        """Record ``state.transition``; with ``connection``, in the caller's transaction
        so the business state change and the event commit together. In replay the
        state is checked against the recorded one, ``connection`` is not touched (the
        agent's business writes are its own concern) and the recorded envelope comes
        back."""
        boundary = steps.transition(self.core, to_state, state, reason, connection)
        envelope: Envelope = self._drive(boundary)
        return envelope

    def finish(
        self,
        *,
        status: str = "succeeded",
        output: Any = None,
        error: BaseException | None = None,
        connection: Joinable | None = None,
    ) -> Envelope:
        """Record ``run.finished``; afterwards the run takes no more events. In replay,
        check the recorded end against this one (status, output, error, final state),
        then that every recorded event was consumed.

        Raises:
            ReplayDivergence: (replay) the first divergence of each level found.
        """
        boundary = steps.finish(self.core, status, output, error, connection)
        envelope: Envelope = self._drive(boundary)
        return envelope


class AsyncBoundaries:
    """The boundaries of a run, for asyncio agent code: :class:`Boundaries`, awaited.
    Agent functions handed to them may be plain or ``async``."""

    core: BoundaryCore
    """What the boundaries need of the run: its id, contract and state."""
    _tools: ToolPolicy
    _effects: EffectPolicy
    _draws: Draws

    async def _drive(self, boundary: Steps[T]) -> T:
        """Do one boundary's steps (the run's driver: record or replay)."""
        raise NotImplementedError

    async def call(self, tool: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Call tool ``fn(*args, **kwargs)`` as ``tool.call``: its result, or its exception.

        The arguments are checked before ``fn`` runs; what ``fn`` raises is recorded and
        raised again. In replay ``fn`` is not called: the recorded result comes back.

        Raises:
            NotSerialisable: an argument or the result is not JSON.
        """
        boundary = steps.tool_call(self.core, self._tools, tool, fn, args, kwargs)
        result: Any = await self._drive(boundary)
        return result

    async def llm(
        self,
        send: Callable[[Mapping[str, Any]], Any],
        request: Mapping[str, Any],
        *,
        provider: str,
        model: str | None = None,
    ) -> Mapping[str, Any]:
        """Send ``request`` to a model through ``send`` as ``llm.call``: the response.

        ``send`` takes the raw request JSON and returns the raw response JSON of an
        OpenAI-compatible chat completion. Errors are recorded and raised again. In
        replay ``send`` is not called: the recorded response comes back.
        """
        boundary = steps.llm_call(self.core, send, request, provider, model)
        response: Mapping[str, Any] = await self._drive(boundary)
        return response

    async def retrieve(
        self,
        index: str,
        search: Callable[..., Any],
        query: Any,
        *,
        index_version: str,
        filters: Mapping[str, Any] | None = None,
        top_k: int | None = None,
    ) -> list[Any]:
        """Search ``index`` (at ``index_version``) through ``search`` as ``retrieval``: the
        query, filters and top-k, and the hits (document ids, chunk versions, scores, and
        whatever else each hit carries).

        ``search(query, filters=..., top_k=...)`` is the agent's own search (sync or
        async) and returns hits: mappings with at least ``"id"`` and a numeric
        ``"score"`` (and ``"chunk_version"`` when the index is chunked). The query is
        checked before the search runs; hits that are not hits, or cannot be recorded,
        are recorded as the retrieval's error and raised. In replay ``search`` is not
        called: the recorded hits come back.
        """
        boundary = steps.retrieve(self.core, search, index, query, index_version, filters, top_k)
        hits: list[Any] = await self._drive(boundary)
        return hits

    async def now(self) -> datetime:
        """The wall clock, UTC, as ``clock.read``."""
        return await self._drive(steps.now(self.core))

    async def monotonic(self) -> float:
        """A monotonic clock in seconds, as ``clock.read``."""
        return await self._drive(steps.monotonic(self.core))

    async def random(self) -> float:
        """A float in [0, 1), as ``random.draw``."""
        return await self._drive(steps.random_float(self.core, self._draws))

    async def randint(self, low: int, high: int) -> int:
        """An integer in [low, high], as ``random.draw``."""
        return await self._drive(steps.random_int(self.core, self._draws, low, high))

    async def uuid(self) -> uuid.UUID:
        """A random UUID, as ``random.draw``."""
        return await self._drive(steps.random_uuid(self.core))

    async def effect(
        self,
        effect: str,
        perform: Callable[[str], Any],
        *,
        arguments: Mapping[str, Any],
        key: str | None = None,
    ) -> EffectReceipt:
        """Cause a side effect: ``effect.intent`` commits, then ``perform(key)``, then
        ``effect.receipt``.

        ``perform`` receives the idempotency key and should hand it to the external
        system. It raises :class:`EffectRejected` when the system refused for sure;
        any other exception leaves the receipt ``unknown`` and is raised again. In
        replay ``perform`` is never called: the recorded receipt comes back.
        """
        boundary = steps.effect(self.core, self._effects, effect, perform, arguments, key)
        return await self._drive(boundary)

    async def transition(
        self,
        to_state: str,
        *,
        state: Any,
        reason: str | None = None,
        connection: AsyncConnection | None = None,
    ) -> Envelope:
        """Record ``state.transition``; with ``connection``, in the caller's transaction
        so the business state change and the event commit together. In replay the
        state is checked against the recorded one, ``connection`` is not touched (the
        agent's business writes are its own concern) and the recorded envelope comes
        back."""
        boundary = steps.transition(self.core, to_state, state, reason, connection)
        envelope: Envelope = await self._drive(boundary)
        return envelope

    async def finish(
        self,
        *,
        status: str = "succeeded",
        output: Any = None,
        error: BaseException | None = None,
        connection: AsyncConnection | None = None,
    ) -> Envelope:
        """Record ``run.finished``; afterwards the run takes no more events. In replay,
        check the recorded end against this one (status, output, error, final state),
        then that every recorded event was consumed.

        Raises:
            ReplayDivergence: (replay) the first divergence of each level found.
        """
        boundary = steps.finish(self.core, status, output, error, connection)
        envelope: Envelope = await self._drive(boundary)
        return envelope
