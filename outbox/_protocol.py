"""The surface agent code programs against, whatever the mode."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Protocol, TypeVar

from agent_blackbox.outbox._effects import EffectOutcome, EffectReceipt

T = TypeVar("T")


class AgentRun(Protocol):
    """The boundaries of a run. Agent code takes one of these and calls nothing else
    that reaches outside: in record mode the Recorder's :class:`~agent_blackbox.outbox.Run` provides
    it, in replay mode the replayer's run does, so the same code runs in both.

    Both inherit these boundaries from one surface (``_surface.Boundaries``); a test
    checks this protocol against it, parameter for parameter."""

    @property
    def run_id(self) -> str: ...

    def call(self, tool: str, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T: ...

    def llm(
        self,
        send: Callable[[Mapping[str, Any]], Mapping[str, Any]],
        request: Mapping[str, Any],
        *,
        provider: str,
        model: str | None = None,
    ) -> Mapping[str, Any]: ...

    def retrieve(
        self,
        index: str,
        search: Callable[..., Any],
        query: Any,
        *,
        index_version: str,
        filters: Mapping[str, Any] | None = None,
        top_k: int | None = None,
    ) -> list[Any]: ...

    def now(self) -> datetime: ...

    def monotonic(self) -> float: ...

    def random(self) -> float: ...

    def randint(self, low: int, high: int) -> int: ...

    def uuid(self) -> uuid.UUID: ...

    def effect(
        self,
        effect: str,
        perform: Callable[[str], EffectOutcome | Mapping[str, Any] | None],
        *,
        arguments: Mapping[str, Any],
        key: str | None = None,
    ) -> EffectReceipt: ...

    def transition(
        self, to_state: str, *, state: Any, reason: str | None = None, connection: Any = None
    ) -> Any: ...
