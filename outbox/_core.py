"""What a recording run knows and decides, shared by the sync and async APIs.

The sync :class:`~agent_blackbox.outbox._recorder.Run` and the async
:class:`~agent_blackbox.outbox._async.AsyncRun` differ only in how they call agent functions and
talk to the database; everything else (crossings, cursor, lifecycle) lives here.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from sqlalchemy import TextClause

from agent_blackbox.keystore import AesGcmSealer, DataKeyStore, KeystoreError
from agent_blackbox.outbox import _boundaries as b
from agent_blackbox.outbox._effects import (
    EffectOutcome,
    EffectPolicy,
    EffectReceipt,
    LiveEffects,
    LiveTools,
    ToolPolicy,
)
from agent_blackbox.outbox._errors import ConcurrentRunWriter, EffectRejected, RunNotActive
from agent_blackbox.outbox._llm import llm_call, llm_input
from agent_blackbox.outbox._redaction import Redactor
from agent_blackbox.outbox._scrub import RULES_ATTRIBUTE, Scrub
from agent_blackbox.outbox._writer import (
    Cursor,
    EventFactory,
    PreparedEvent,
    RunIdentity,
    insert_run_plan,
    new_event_id,
    shard_of,
)
from agent_blackbox.schemas import (
    Digester,
    Envelope,
    EnvelopeCodec,
    PayloadPipeline,
    Settings,
    digest,
)

APPEND_ATTEMPTS = 3

Outcome = Callable[[Any, BaseException | None, float], b.Crossing]
"""Turns what a boundary call returned or raised, and its latency, into its crossing."""


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


class RunCore:
    """Identity, cursor and lifecycle of one run in record mode."""

    def __init__(
        self, identity: RunIdentity, factory: EventFactory, scrub: Scrub | None = None
    ) -> None:
        self.identity = identity
        self.scrub = scrub or Scrub(None)
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

    def tool_outcome(self, tool: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Outcome:
        """Check the arguments, then say how the tool's result or error becomes its
        ``tool.call`` crossing (carrying the input digest taken by the check)."""
        self.check_active()
        scrub, fired = self.scrub, set[str]()
        args, kwargs = scrub.arguments(args, kwargs, fired)
        inputs = b.tool_input(tool, args, kwargs)
        input_digest = self.identity.digest(inputs, path=f"{tool}.arguments")

        def crossing(result: Any, error: BaseException | None, latency_ms: float) -> b.Crossing:
            seen = set(fired)
            built = b.tool_call(
                tool=tool,
                args=args,
                kwargs=kwargs,
                result=scrub.value(result, seen),
                error=scrub.error(error, seen),
                latency_ms=latency_ms,
            )
            return scrub.mark(replace(built, input_digest=input_digest), seen)

        return crossing

    def llm_outcome(self, provider: str, model: str | None, request: Mapping[str, Any]) -> Outcome:
        """Check the request, then say how the response becomes its ``llm.call``."""
        self.check_active()
        chosen = model or str(request.get("model", "unknown"))
        scrub, fired = self.scrub, set[str]()
        request = scrub.value(dict(request), fired)
        inputs = llm_input(provider, chosen, request)
        input_digest = self.identity.digest(inputs, path="llm.request")

        def crossing(response: Any, error: BaseException | None, latency_ms: float) -> b.Crossing:
            seen = set(fired)
            built = llm_call(
                provider=provider,
                model=chosen,
                request=request,
                response=None if response is None else scrub.value(dict(response), seen),
                error=scrub.error(error, seen),
                latency_ms=latency_ms,
            )
            return scrub.mark(replace(built, input_digest=input_digest), seen)

        return crossing

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
        fired: set[str] = set()
        arguments = self.scrub.value(dict(arguments), fired)
        intent = b.effect_intent(
            effect=effect, idempotency_key=idempotency_key, arguments=arguments
        )
        return self.scrub.mark(intent, fired)

    def transition(self, to_state: str, state: Any, reason: str | None) -> b.Crossing:
        self.check_active()
        fired: set[str] = set()
        state = self.scrub.value(state, fired)
        moved = b.state_transition(
            from_state=self.state, to_state=to_state, state=state, reason=reason
        )
        return self.scrub.mark(moved, fired)

    def transitioned(self, crossing: b.Crossing) -> None:
        self.state = crossing.attributes["to_state"]
        self.state_digest = digest(crossing.output["state"])

    def finish(self, status: str, output: Any, error: BaseException | None) -> b.Crossing:
        self.check_active()
        fired: set[str] = set()
        output, error = self.scrub.value(output, fired), self.scrub.error(error, fired)
        finished = b.run_finished(
            status=status, output=output, error=error, final_state_digest=self.state_digest
        )
        return self.scrub.mark(finished, fired)


def utc_now() -> datetime:
    """The wall clock stamped on envelopes as ``recorded_at`` (informational only)."""
    return datetime.now(UTC)


E = TypeVar("E")


class RecorderBase(Generic[E]):
    """What the sync and the async recorder share: engine, settings, event factory.

    Args:
        engine: the write side's database.
        settings: shards, payload limits; read from the environment when omitted.
        pipeline: how bodies become payload bytes (plain Avro by default).
        clock: the source of ``recorded_at``.
        tools: how tool calls are answered (live by default; a fork answers from its
            parent's recording).
        effects: what happens to side effects (live by default; refused or sandboxed
            in a fork).
        keys: encrypts every run under its own data key, stored wrapped in the
            run's transaction; bodies are then sealed with AES-256-GCM (unless a
            ``pipeline`` is given, which then decides).
        redaction: the rules applied to every recorded value before it is written
            (``BLACKBOX_REDACTION_FILE``, else every detector). Credentials are
            removed whatever the rules say.
    """

    def __init__(
        self,
        engine: E,
        *,
        settings: Settings | None = None,
        pipeline: PayloadPipeline | None = None,
        clock: Callable[[], datetime] = utc_now,
        tools: ToolPolicy | None = None,
        effects: EffectPolicy | None = None,
        keys: DataKeyStore | None = None,
        redaction: Redactor | None = None,
    ) -> None:
        self.engine = engine
        self.scrub = Scrub(redaction or Redactor.from_env())
        self.settings = settings or Settings.from_env()
        self.keys = keys
        if pipeline is None and keys is not None:
            pipeline = PayloadPipeline(sealer=AesGcmSealer())
        self._factory = new_factory(self.settings, pipeline, clock)
        self._digests: dict[str, Digester] = {}
        self.tools: ToolPolicy = tools or LiveTools()
        self.effects: EffectPolicy = effects or LiveEffects()

    def cached_digest(self, tenant_id: str, classification: str) -> Digester | None:
        """The digest of runs of ``classification``: SHA-256, or the tenant's keyed digest
        once fetched; None when it must be fetched first (:meth:`remember_digest`).

        Raises:
            KeystoreError: the class takes keyed digests and this recorder has no keys.
        """
        if not self.settings.keyed_digests(classification):
            return digest
        if self.keys is None:
            raise KeystoreError(
                f"runs classified {classification!r} take keyed digests (HMAC under the "
                "tenant's key); give the recorder a key store (set BLACKBOX_KEK_FILE)"
            )
        return self._digests.get(tenant_id)

    def remember_digest(self, tenant_id: str, keyed: Digester) -> Digester:
        self._digests[tenant_id] = keyed
        return keyed


def new_factory(
    settings: Settings, pipeline: PayloadPipeline | None, clock: Callable[[], datetime]
) -> EventFactory:
    """The event factory a recorder builds its envelopes with."""
    return EventFactory(
        settings=settings,
        pipeline=pipeline or PayloadPipeline(),
        codec=EnvelopeCodec(),
        clock=clock,
    )


@dataclass(frozen=True, slots=True)
class StartPlan:
    """Everything a recorder needs to create a run and record its ``run.started``."""

    core: RunCore
    crossing: b.Crossing
    insert: tuple[TextClause, dict[str, Any]]
    event_id: str
    first: PreparedEvent
    store_key: tuple[TextClause, dict[str, Any]] | None = None
    """Stores the run's wrapped data key, in the transaction that creates the run."""

    def exists(self) -> RunNotActive:
        return RunNotActive(f"a run with id {self.core.run_id} exists already")


def plan_start(
    factory: EventFactory,
    settings: Settings,
    snapshot: RunSnapshot,
    *,
    agent_id: str,
    tenant_id: str,
    subject_ids: tuple[str, ...],
    run_id: str | None,
    classification: str,
    retention_class: str,
    keys: DataKeyStore | None = None,
    digest: Digester = digest,
    scrub: Scrub | None = None,
) -> StartPlan:
    """Identity, first event and run row of a new run (and its data key when ``keys``
    is given); nothing is written yet.

    Raises:
        NotSerialisable: the snapshot's input is not JSON.
    """
    run_id = run_id or str(uuid.uuid4())
    data_key, store_key = (None, None) if keys is None else keys.new_key(run_id, tenant_id)
    identity = RunIdentity(
        run_id=run_id,
        tenant_id=tenant_id,
        agent_id=agent_id,
        shard=shard_of(run_id, settings.outbox_shards),
        subject_ids=tuple(subject_ids),
        classification=classification,
        retention_class=retention_class,
        data_key=data_key,
        digest=digest,
    )
    core = RunCore(identity, factory, scrub)
    crossing = _start_crossing(snapshot, core.scrub)
    insert = insert_run_plan(
        identity, parent_run_id=snapshot.parent_run_id, code_version=snapshot.code_version
    )
    event_id = fresh_event_id()
    first = core.prepare(crossing, event_id)
    return StartPlan(core, crossing, insert, event_id, first, store_key)


def _start_crossing(snapshot: RunSnapshot, scrub: Scrub) -> b.Crossing:
    fired: set[str] = set()
    started = b.run_started(
        code_version=snapshot.code_version,
        input=scrub.value(snapshot.input, fired),
        prompt_templates=snapshot.prompt_templates,
        tool_schemas=snapshot.tool_schemas,
        model_ids=snapshot.model_ids,
        flags=snapshot.flags,
        permissions=snapshot.permissions,
        parent_run_id=snapshot.parent_run_id,
        changes=snapshot.changes,
    )
    rules = scrub.rules_text()
    if rules is not None:
        started = replace(started, attributes={**started.attributes, RULES_ATTRIBUTE: rules})
    return scrub.mark(started, fired)


class ReceiptBuilder:
    """Builds the receipt of an intent from what ``perform`` did, and keeps it."""

    def __init__(self, effect: str, idempotency_key: str, scrub: Scrub | None = None) -> None:
        self.effect = effect
        self.idempotency_key = idempotency_key
        self.scrub = scrub or Scrub(None)
        self.receipt = EffectReceipt(effect, idempotency_key, "unknown", None, None)

    @classmethod
    def of(cls, intent: b.Crossing, scrub: Scrub | None = None) -> ReceiptBuilder:
        """The builder for the receipt of ``intent``."""
        return cls(intent.body["effect"], intent.body["idempotency_key"], scrub)

    def crossing(self, value: Any, error: BaseException | None, latency_ms: float) -> b.Crossing:
        """The receipt crossing: confirmed, failed (rejected for sure) or unknown."""
        effect, key = self.effect, self.idempotency_key
        outcome = as_outcome(value)
        if error is None:
            status = "confirmed"
            external_id = outcome.external_id if outcome else None
            result = outcome.result if outcome else None
        elif isinstance(error, EffectRejected):
            status, external_id, result = "failed", error.external_id, None
        else:
            status, external_id, result = "unknown", None, None
        self.receipt = EffectReceipt(effect, key, status, external_id, result)
        fired: set[str] = set()
        receipt = b.effect_receipt(
            effect=effect,
            idempotency_key=key,
            status=status,
            external_id=external_id,
            result=self.scrub.value(result, fired),
            error=self.scrub.error(error, fired),
            latency_ms=latency_ms,
        )
        return self.scrub.mark(receipt, fired)


def as_outcome(value: EffectOutcome | Mapping[str, Any] | None) -> EffectOutcome | None:
    """Accept an :class:`EffectOutcome`, a mapping with ``external_id``/``result``, or None."""
    if value is None or isinstance(value, EffectOutcome):
        return value
    return EffectOutcome(external_id=value.get("external_id"), result=value.get("result"))


def fresh_event_id() -> str:
    return new_event_id()
