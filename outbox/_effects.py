"""How a recording run reaches tools and effects: live, or kept from the world.

Production runs use the live policies. A fork (a re-execution from a recorded input
snapshot, see :mod:`agent_blackbox.replayer`) answers tools from the parent's recording
where it can and keeps effects away from the world: refused, or sent to a sandbox that
only takes note.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from agent_blackbox.outbox._errors import EffectRejected


@dataclass(frozen=True, slots=True)
class EffectOutcome:
    """What an effect's ``perform`` returns: the external system's id and answer."""

    external_id: str | None = None
    result: Any = None


@dataclass(frozen=True, slots=True)
class EffectReceipt:
    """The recorded receipt of a side effect."""

    effect: str
    idempotency_key: str
    status: str
    external_id: str | None
    result: Any


class ToolPolicy(Protocol):
    """Decides how a tool call is answered."""

    def call(
        self, tool: str, args: tuple[Any, ...], kwargs: Mapping[str, Any], fn: Callable[..., Any]
    ) -> Any:
        """The tool's result (or its exception)."""
        ...


class EffectPolicy(Protocol):
    """Decides what happens to a side effect once its intent is recorded."""

    def perform(
        self,
        effect: str,
        idempotency_key: str,
        arguments: Mapping[str, Any],
        perform: Callable[[str], Any],
    ) -> Any:
        """What the effect's ``perform`` would return (or raise)."""
        ...


class LiveTools:
    """Calls the tool: production."""

    def call(
        self, tool: str, args: tuple[Any, ...], kwargs: Mapping[str, Any], fn: Callable[..., Any]
    ) -> Any:
        return fn(*args, **kwargs)


class LiveEffects:
    """Calls the external system: production."""

    def perform(
        self,
        effect: str,
        idempotency_key: str,
        arguments: Mapping[str, Any],
        perform: Callable[[str], Any],
    ) -> Any:
        return perform(idempotency_key)


class EffectRefused(EffectRejected):
    """A re-execution refused to cause a side effect."""


class RefuseEffects:
    """Every effect is refused; the receipt says ``failed`` and the agent sees the error."""

    def perform(
        self,
        effect: str,
        idempotency_key: str,
        arguments: Mapping[str, Any],
        perform: Callable[[str], Any],
    ) -> Any:
        raise EffectRefused(f"effect {effect} refused: side effects are off in this re-execution")


@dataclass
class SandboxEffects:
    """Effects are confirmed by a sandbox that only writes them down."""

    sent: list[dict[str, Any]] = field(default_factory=list)

    def perform(
        self,
        effect: str,
        idempotency_key: str,
        arguments: Mapping[str, Any],
        perform: Callable[[str], Any],
    ) -> Any:
        self.sent.append({"effect": effect, "key": idempotency_key, "arguments": dict(arguments)})
        return EffectOutcome(external_id=f"sandbox:{idempotency_key}", result={"sandbox": True})
