"""What a recording run knows and decides, shared by the sync and async APIs.

The sync :class:`~outbox._recorder.Run` and the async
:class:`~outbox._async.AsyncRun` differ only in how they call agent functions and
talk to the database; everything else (crossings, cursor, lifecycle) lives here.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from outbox import _boundaries as b
from outbox._errors import ConcurrentRunWriter, EffectRejected, RunNotActive
from outbox._llm import llm_call, llm_input
from outbox._writer import Cursor, EventFactory, PreparedEvent, RunIdentity, new_event_id
from schemas import Envelope, digest

APPEND_ATTEMPTS = 3


@dataclass(frozen=True, slots=True)
class RunSnapshot:
    """The input snapshot of a run, recorded in ``run.started``.

    It names everything outside the agent's code that decides what the run does, so a
    fork can start again from it with one thing changed.
    """

    code_version: str
    input: Any = None
    prompt_templates: Mapping[str, str] = field(default_factory=dict)
    """Template id → digest of the template text."""
    tool_schemas: Mapping[str, str] = field(default_factory=dict)
    """Tool name → schema version."""
    model_ids: tuple[str, ...] = ()
    flags: Mapping[str, str] = field(default_factory=dict)
    permissions: tuple[str, ...] = ()
    parent_run_id: str | None = None
    changes: Mapping[str, str] = field(default_factory=dict)
    """What a fork changed relative to its parent."""


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


class RunCore:
    """Identity, cursor and lifecycle of one run in record mode."""

    def __init__(self, identity: RunIdentity, factory: EventFactory) -> None:
        self.identity = identity
        self.cursor = Cursor()
        self.factory = factory
        self.state: str | None = None
        self.state_digest: str | None = None
        self.finished = False
        self.effects = 0

    @property
    def run_id(self) -> str:
        return self.identity.run_id

    def check_active(self) -> None:
        if self.finished:
            raise RunNotActive(
                f"run {self.run_id} is finished; start a new run to record more events"
            )

    def prepare(self, crossing: b.Crossing, event_id: str) -> PreparedEvent:
        return self.factory.prepare(self.identity, self.cursor, crossing, event_id=event_id)

    def stale(self, event: PreparedEvent, committed: Cursor | None) -> bool:
        """Adopt the committed cursor after a failed guard; True when ``event`` is in it.

        A retried transaction whose first attempt did commit finds its own chain hash
        at the head of the run, and must not append the event a second time.
        """
        if committed is None:
            raise RunNotActive(f"run {self.run_id} does not exist in the database")
        self.cursor = committed
        return committed.chain_head == event.envelope.chain_hash

    def advanced(self, event: PreparedEvent) -> Envelope:
        self.cursor = event.cursor
        return event.envelope

    def conflict(self) -> ConcurrentRunWriter:
        return ConcurrentRunWriter(
            f"run {self.run_id} kept moving under this writer after {APPEND_ATTEMPTS} "
            "attempts; a run must have one writer at a time"
        )

    # Crossings. Inputs are checked before the agent's function is called, so a value
    # that cannot be recorded fails before any external call happens.

    def tool_inputs(self, tool: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
        self.check_active()
        digest(b.tool_input(tool, args, kwargs), path=f"{tool}.arguments")

    def llm_inputs(self, provider: str, model: str, request: Mapping[str, Any]) -> None:
        self.check_active()
        digest(llm_input(provider, model, request), path="llm.request")

    tool_call = staticmethod(b.tool_call)
    llm_call = staticmethod(llm_call)

    def wall_clock(self) -> b.Crossing:
        return b.clock_read(clock="wall", value_us=time.time_ns() // 1000)

    def monotonic_clock(self) -> b.Crossing:
        return b.clock_read(clock="monotonic", value_us=time.monotonic_ns() // 1000)

    def random_float(self, value: float) -> b.Crossing:
        return b.random_draw(kind="random", arguments={}, value=value)

    def random_int(self, low: int, high: int, value: int) -> b.Crossing:
        return b.random_draw(kind="randint", arguments={"low": low, "high": high}, value=value)

    def random_uuid(self) -> tuple[uuid.UUID, b.Crossing]:
        value = uuid.uuid4()
        return value, b.random_draw(kind="uuid4", arguments={}, value=str(value))

    def effect_intent(
        self, effect: str, arguments: Mapping[str, Any], key: str | None
    ) -> b.Crossing:
        self.check_active()
        self.effects += 1
        # The default key is the intent's own position in the run: stable across a
        # crash and a recovery, unique across runs.
        idempotency_key = key or f"{self.run_id}:{self.cursor.sequence + 1}"
        return b.effect_intent(effect=effect, idempotency_key=idempotency_key, arguments=arguments)

    def transition(self, to_state: str, state: Any, reason: str | None) -> b.Crossing:
        self.check_active()
        return b.state_transition(
            from_state=self.state, to_state=to_state, state=state, reason=reason
        )

    def transitioned(self, crossing: b.Crossing) -> None:
        self.state = crossing.attributes["to_state"]
        self.state_digest = digest(crossing.output["state"])

    def finish(self, status: str, output: Any, error: BaseException | None) -> b.Crossing:
        self.check_active()
        return b.run_finished(
            status=status, output=output, error=error, final_state_digest=self.state_digest
        )


def start_crossing(snapshot: RunSnapshot) -> b.Crossing:
    """The ``run.started`` crossing of ``snapshot``."""
    return b.run_started(
        code_version=snapshot.code_version,
        input=snapshot.input,
        prompt_templates=snapshot.prompt_templates,
        tool_schemas=snapshot.tool_schemas,
        model_ids=snapshot.model_ids,
        flags=snapshot.flags,
        permissions=snapshot.permissions,
        parent_run_id=snapshot.parent_run_id,
        changes=snapshot.changes,
    )


def receipt_crossing(
    intent: b.Crossing,
    outcome: EffectOutcome | None,
    error: BaseException | None,
    latency_ms: float,
) -> tuple[EffectReceipt, b.Crossing]:
    """The receipt for ``intent``: confirmed, failed (rejected for sure) or unknown."""
    effect = intent.body["effect"]
    key = intent.body["idempotency_key"]
    if error is None:
        status, external_id, result = (
            "confirmed",
            outcome.external_id if outcome else None,
            (outcome.result if outcome else None),
        )
    elif isinstance(error, EffectRejected):
        status, external_id, result = "failed", error.external_id, None
    else:
        status, external_id, result = "unknown", None, None
    crossing = b.effect_receipt(
        effect=effect,
        idempotency_key=key,
        status=status,
        external_id=external_id,
        result=result,
        error=error,
        latency_ms=latency_ms,
    )
    return EffectReceipt(effect, key, status, external_id, result), crossing


def as_outcome(value: EffectOutcome | Mapping[str, Any] | None) -> EffectOutcome | None:
    """Accept an :class:`EffectOutcome`, a mapping with ``external_id``/``result``, or None."""
    if value is None or isinstance(value, EffectOutcome):
        return value
    return EffectOutcome(external_id=value.get("external_id"), result=value.get("result"))


def fresh_event_id() -> str:
    return new_event_id()
