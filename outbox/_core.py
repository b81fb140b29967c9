"""What a recording run knows and decides, whatever the flavour of its driver.

The sync :class:`~agent_blackbox.outbox.Run` and the async
:class:`~agent_blackbox.outbox.AsyncRun` differ only in how they call agent functions and
wait for their event log; the identity, cursor and lifecycle of a run live here (what
each crossing records is ``_crossings.py``'s, the same in replay), and so does what every
recorder is configured with.
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from agent_blackbox.keystore import AesGcmSealer, DataKeyStore, KeystoreError, LocalKeyProvider
from agent_blackbox.outbox import _boundaries as b
from agent_blackbox.outbox._asks import Contract
from agent_blackbox.outbox._effects import (
    EffectPolicy,
    LiveEffects,
    LiveTools,
    ToolPolicy,
)
from agent_blackbox.outbox._errors import (
    ConcurrentRunWriter,
    EventsNotRecorded,
    RunNotActive,
)
from agent_blackbox.outbox._group import GroupCommit
from agent_blackbox.outbox._network import (
    Hole,
    NetworkMode,
    UnrecordedCall,
    network_mode,
    note_hole,
    watch_connections,
)
from agent_blackbox.outbox._placement import Placement
from agent_blackbox.outbox._prefixes import RequestPrefixes
from agent_blackbox.outbox._recovery import StoredRun
from agent_blackbox.outbox._redaction import Redactor
from agent_blackbox.outbox._sandbox import NondeterminismMode, mode_from, watch_recording
from agent_blackbox.outbox._scrub import RULES_ATTRIBUTE, Scrub
from agent_blackbox.outbox._sites import Site
from agent_blackbox.outbox._spans import spans_from
from agent_blackbox.outbox._writer import (
    Cursor,
    EventFactory,
    PreparedEvent,
    RunIdentity,
    new_credential,
    new_event_id,
    shard_of,
)
from agent_blackbox.schemas import (
    NEW_RUNS,
    DataKey,
    Digester,
    Envelope,
    EnvelopeCodec,
    EventType,
    PayloadPipeline,
    Settings,
    check_run_id,
    check_tags,
    tag_attributes,
)

if TYPE_CHECKING:
    from sqlalchemy import TextClause

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
    tags: Mapping[str, str] = field(default_factory=dict)
    """Short labels analytics group by (``{"prompt_version": "v2"}``), carried unsealed
    on ``run.started`` (``tag.<name>`` attributes, after redaction): labels, not content.
    Checked when the snapshot is made (:class:`~agent_blackbox.schemas.InvalidTag`)."""

    def __post_init__(self) -> None:
        check_tags(self.tags)


class RunFields(TypedDict, total=False):
    """The fields of :class:`RunOptions`, as keywords of ``start_run`` and ``record``."""

    agent_id: str
    tenant_id: str
    subject_ids: tuple[str, ...]
    run_id: str | None
    classification: str
    retention_class: str
    session_id: str | None
    user_id: str | None


MAX_RUN_LABEL = 200
"""The longest session or user id a run takes (characters)."""
USER_ID_LABEL = "agent-blackbox user id"
"""What a user id's keyed digest is taken over with (``[label, 1, user id]``), so it
never equals the digest of a recorded value that happens to be the same string."""


@dataclass(frozen=True, slots=True)
class RunOptions:
    """Who a run belongs to and how it is kept: the identity every envelope repeats.

    Every recorder's ``start_run`` and ``record`` take one of these, or its fields as
    keywords (``agent_id=...``), or both (the keywords then replace the option's fields).
    """

    agent_id: str
    tenant_id: str = "default"
    subject_ids: tuple[str, ...] = ()
    """The data subjects the run concerns; a deletion request for one shreds the run."""
    run_id: str | None = None
    """A run id of the caller's choosing (a fresh UUID when None): 1 to 128 characters of
    ``A-Z a-z 0-9 _ . : -``, starting with a letter or a digit
    (:data:`~agent_blackbox.schemas.RUN_ID_RULE`); any other is refused with
    :class:`~agent_blackbox.schemas.InvalidRunId` and nothing is recorded."""
    classification: str = "internal"
    """How sensitive the run is; some classes take keyed digests."""
    retention_class: str = "standard"
    """Which retention policy applies to the run's bodies and metadata."""
    session_id: str | None = None
    """The conversation or session the run is one turn of (runs sharing it are listed
    together, in order, with their totals); recorded on ``run.started``."""
    user_id: str | None = None
    """The end user the run served; recorded on ``run.started``, as the tenant's keyed
    digest when the run's classification takes keyed digests (never in clear then)."""

    @classmethod
    def of(cls, options: RunOptions | None, keywords: RunFields) -> RunOptions:
        """``options`` with ``keywords`` applied, or the options ``keywords`` describe.

        Raises:
            TypeError: neither names the agent.
            ValueError: a field is empty or of the wrong kind.
            InvalidRunId: ``run_id`` breaks the run id rule (a ``ValueError`` too).
        """
        if options is not None:
            return replace(options, **keywords) if keywords else options
        if "agent_id" not in keywords:
            raise TypeError("a run needs its agent: pass agent_id=... or RunOptions(...)")
        return cls(**keywords)

    def __post_init__(self) -> None:
        for name in ("agent_id", "tenant_id", "classification", "retention_class"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"RunOptions.{name} must be a non-empty string")
        if isinstance(self.subject_ids, str):
            raise ValueError("RunOptions.subject_ids is a tuple of ids, not one string")
        if self.run_id is not None:
            check_run_id(self.run_id)  # shown in URLs, file names, terminals: one alphabet
        for name in ("session_id", "user_id"):
            value = getattr(self, name)
            if value is not None and not _run_label(value):
                raise ValueError(
                    f"RunOptions.{name} must be 1 to {MAX_RUN_LABEL} printable characters "
                    f"(or None), not {value!r:.60}"
                )
        object.__setattr__(self, "subject_ids", tuple(self.subject_ids))


def _run_label(value: object) -> bool:
    return (
        isinstance(value, str)
        and 0 < len(value) <= MAX_RUN_LABEL
        and value.isprintable()
        and value.strip() == value
    )


_EFFECT_IDS = ("idempotency_key", "external_id")
"""Attributes that carry values the agent chose (an effect's ids)."""


class RunCore:
    """Identity, cursor and lifecycle of one run in record mode."""

    def __init__(
        self, identity: RunIdentity, factory: EventFactory, scrub: Scrub | None = None
    ) -> None:
        self.identity = identity
        self.contract = Contract(scrub or Scrub(None), identity.digest)
        self.cursor = Cursor()
        self.factory = factory
        self.state: str | None = None
        self.state_digest: str | None = None
        self.finished = False
        self.placement = Placement()
        self.unwatch: Callable[[], None] | None = None
        """Stops watching the agent's code for unrecorded nondeterminism."""
        self.nondeterminism: NondeterminismMode = "off"
        self.unreported: Exception | None = None
        """A failure of a group flush made in the background, raised at the next boundary."""
        self.requests = RequestPrefixes(
            enabled=factory.settings.llm_request_references == "on",
            canonical=identity.digest.canonical,
        )
        """The run's latest LLM requests, that a new one may be stored against."""
        self.network: NetworkMode = "off"
        """What to do about a call that leaves the process without crossing a boundary."""
        self.holes: list[Hole] = []
        """Those calls, in the order they were seen (see ``_network``)."""
        self._hole_sites: set[Site | None] = set()

    @property
    def run_id(self) -> str:
        return self.identity.run_id

    @property
    def scrub(self) -> Scrub:
        """The redaction rules of this run."""
        return self.contract.scrub

    def watch_entry(self, entry: Callable[..., Any]) -> None:
        """Watch the package of ``entry``'s module for unrecorded nondeterminism (the
        recorder drives the entry: that is the agent's code, wherever ``record`` was
        called from)."""
        module = getattr(inspect.unwrap(entry), "__module__", None)
        if self.nondeterminism == "off" or not isinstance(module, str):
            return
        if self.unwatch is not None:
            self.unwatch()
        self.unwatch = watch_recording(self.nondeterminism, module)

    def unrecorded(self, hole: Hole) -> None:
        """A call left the process without crossing a boundary: kept for ``run.finished``,
        warned about, or (``fail`` mode) refused.

        Raises:
            UnrecordedCall: in ``fail`` mode.
        """
        if not self.finished:
            note_hole(self.holes, hole, mode=self.network, seen=self._hole_sites)

    def check_active(self) -> None:
        """Raise when the run takes no more events, or (once) the failure of a group
        flush made in the background since the last boundary."""
        if self.finished:
            raise RunNotActive(
                f"run {self.run_id} is finished; start a new run to record more events"
            )
        if self.unreported is not None:
            failure, self.unreported = self.unreported, None
            raise failure

    def forget_unwritten(self) -> None:
        """Drop a failed group flush's error kept for the next boundary: its events are
        written now, or a newer error names them too."""
        if isinstance(self.unreported, EventsNotRecorded):
            self.unreported = None

    def prepare(self, crossing: b.Crossing, event_id: str) -> PreparedEvent:
        sequence = self.cursor.sequence + 1
        parts = None
        if crossing.event_type == EventType.LLM_CALL and isinstance(crossing.input, Mapping):
            parts = self.contract.requests.parts_of(crossing.input.get("request"))
        crossing = self.requests.shortened(crossing, sequence, parts=parts)
        ids = {
            name: crossing.attributes[name] for name in _EFFECT_IDS if name in crossing.attributes
        }
        if not ids or self.scrub.version < 2:
            event = self.factory.prepare(self.identity, self.cursor, crossing, event_id=event_id)
            if event.blob is not None or "body_truncated" in event.envelope.attributes:
                # Not named by later requests: its request may not be stored whole, and
                # readers that show bodies in line (timeline, console) pass it over.
                self.requests.forget(sequence)
            return event
        # The clear attributes reach the topic and every copy of it, outside the sealed
        # body and beyond the reach of a later shredding: they carry the ids scrubbed.
        scrubbed = {**crossing.attributes, **self.scrub.value(ids, set())}
        clear = replace(crossing, attributes=scrubbed)
        event = self.factory.prepare(self.identity, self.cursor, clear, event_id=event_id)
        return replace(event, effect_ids=ids)

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

    def finish(self, status: str, output: Any, error: BaseException | None) -> b.Crossing:
        self.check_active()
        if self.unwatch is not None:
            self.unwatch()
        if self.holes and self.network == "fail" and status == "succeeded":
            # The agent caught the refusal and went on: the run still had a hole.
            status, error = "failed", UnrecordedCall(self.holes[0], "the run had a hole")
        ending = self.contract.finish(status, output, error, self.state_digest)
        finished = b.run_finished(
            status=ending.status,
            output=ending.output,
            error=ending.error,
            final_state_digest=self.state_digest,
        )
        if self.holes:
            first = self.holes[0].describe()
            finished = finished.with_attributes(
                {
                    **finished.attributes,
                    "unrecorded_calls": str(len(self.holes)),
                    "unrecorded_call": first if len(first) <= 300 else first[:299] + "…",
                }
            )
        marked = finished.with_input_digest(ending.ask.input_digest)
        return self.scrub.mark(marked, set(ending.fired)).raising(ending.refused)


def utc_now() -> datetime:
    """The wall clock stamped on envelopes as ``recorded_at`` (informational only)."""
    return datetime.now(UTC)


class RecorderConfig(TypedDict, total=False):
    """What every recorder is configured with (keywords of each recorder's constructor).

    Keys:
        settings: shards, payload limits; read from the environment when omitted.
        pipeline: how bodies become payload bytes (by default Avro compressed as
            ``settings.payload_compression`` says: zstd unless told).
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
        nondeterminism: ``off``, ``warn`` or ``fail``: what to do, from a run's start
            to its end, when the code that started it (its package) reads the clock,
            random, UUIDs or the environment directly (``NondeterminismWarning``, or
            ``UnrecordedNondeterminism`` raised at the read); default from
            ``BLACKBOX_RECORD_NONDETERMINISM``, else ``off``.
        group_commit: buffer each run's non-effect events and write them many to a
            transaction (:class:`~agent_blackbox.outbox.GroupCommit`); None for one
            transaction per event; when omitted, from ``BLACKBOX_GROUP_COMMIT``
            (off when unset). A crash loses the unflushed events of the crashing process.
        otel: emit an OpenTelemetry span (GenAI semantic conventions) around each
            boundary crossing, whose ids the event then carries; default from
            ``BLACKBOX_OTEL`` (off when unset). Spans hold no recorded content unless
            ``otel_content`` says so.
        otel_content: also put the crossing's content on its span (messages, the
            answer, tool arguments and results), as recorded, so after redaction;
            default from ``BLACKBOX_OTEL_CONTENT`` (off when unset). Needs ``otel``.
        network: ``off``, ``warn`` or ``fail``: what to do when a run's code opens a
            connection that does not cross a boundary (a client the run does not
            record): ``warn`` reports it on ``run.finished`` (``unrecorded_calls``) and
            warns (``UnrecordedCallWarning``), ``fail`` also refuses it
            (``UnrecordedCall``) and fails the run; default from
            ``BLACKBOX_RECORD_NETWORK``, else ``warn``.
    """

    settings: Settings | None
    pipeline: PayloadPipeline | None
    clock: Callable[[], datetime]
    tools: ToolPolicy | None
    effects: EffectPolicy | None
    keys: DataKeyStore | None
    redaction: Redactor | None
    nondeterminism: NondeterminismMode | None
    group_commit: GroupCommit | None
    otel: bool | None
    otel_content: bool | None
    network: NetworkMode | None


class RecorderBase:
    """What every recorder shares, whatever its mode and its event log: configuration
    (see :class:`RecorderConfig`), the event factory, the tenants' digests, planning new
    runs and resumed ones."""

    def __init__(self, **config: Unpack[RecorderConfig]) -> None:
        self.scrub = Scrub(config.get("redaction") or Redactor.from_env())
        self.settings = config.get("settings") or Settings.from_env()
        self.keys = keys = config.get("keys")
        self.scrub.check_key_store(present=keys is not None)
        pipeline = config.get("pipeline")
        if pipeline is None and keys is not None:
            pipeline = recording_pipeline(self.settings, sealed=True)
        self._factory = new_factory(self.settings, pipeline, config.get("clock", utc_now))
        self._digests: dict[str, Digester] = {}
        self.tools: ToolPolicy = config.get("tools") or LiveTools()
        self.effects: EffectPolicy = config.get("effects") or LiveEffects()
        self.nondeterminism = mode_from(config.get("nondeterminism"))
        self.group_commit = (
            config["group_commit"] if "group_commit" in config else GroupCommit.from_env()
        )
        self.spans = spans_from(config.get("otel"), content=config.get("otel_content"))
        self.network = network_mode(config.get("network"))
        if self.network != "off":
            watch_connections()

    @contextmanager
    def crossing_span(self) -> Iterator[Callable[[Envelope, b.Crossing], Envelope]]:
        """The span of one crossing when spans are on (see :class:`BoundarySpans`), else
        nothing: what it yields is given the crossing's event and gives it back."""
        if self.spans is None:
            yield lambda envelope, crossing: envelope
            return
        with self.spans.crossing(self.scrub) as seen:
            yield seen

    def cached_digest(self, tenant_id: str, classification: str) -> Digester | None:
        """The digest of runs of ``classification``: the tenant's keyed digest once fetched
        (every run of a recorder with keys, but classes opted out in
        ``Settings.plain_digest_classes``), else SHA-256; None when it must be fetched
        first (:meth:`remember_digest`).

        Raises:
            KeystoreError: the class takes keyed digests and this recorder has no keys.
        """
        # Every run of a recorder with keys takes keyed digests unless its class opted
        # out; pseudonyms are keyed by the tenant's key, so their runs take them too.
        encrypted = self.keys is not None
        keyed = self.settings.digest_keyed(classification, encrypted=encrypted)
        if not keyed and not self.scrub.pseudonymous:
            return self.settings.canonicalisation.digest
        if self.keys is None:
            raise KeystoreError(
                f"runs classified {classification!r} take keyed digests (HMAC under the "
                "tenant's key); give the recorder a key store (set BLACKBOX_KEK_FILE)"
            )
        return self._digests.get(tenant_id)

    def remember_digest(self, tenant_id: str, keyed: Digester) -> Digester:
        """Keep the tenant's keyed digest, over the canonicalisation of new runs."""
        keyed = self._digests[tenant_id] = keyed.under(self.settings.canonicalisation)
        return keyed

    def plan(self, snapshot: RunSnapshot, options: RunOptions, run_digest: Digester) -> StartPlan:
        """The new run of ``options`` (its data key when this recorder encrypts);
        nothing is written yet.

        Raises:
            NotSerialisable: the snapshot's input is not JSON.
        """
        start = plan_start(
            self._factory,
            self.settings,
            snapshot,
            options,
            keys=self.keys,
            digest=run_digest,
            scrub=self.scrub,
        )
        start.core.nondeterminism = self.nondeterminism
        start.core.unwatch = watch_recording(self.nondeterminism)
        start.core.network = self.network
        return start

    def resumed(self, stored: StoredRun, data_key: DataKey | None) -> RunCore:
        """The core of a writer that carries on recording ``stored`` (a crashed writer's
        run), under ``data_key`` when this recorder encrypts.

        Raises:
            RunNotActive: the run has finished.
        """
        if stored.status != "running":
            raise RunNotActive(
                f"run {stored.identity.run_id} is {stored.status}; only running runs resume"
            )
        # A run carries on in this recorder's canonicalisation: each event names its own.
        canonical = self.settings.canonicalisation
        identity = replace(stored.identity, digest=stored.identity.digest.under(canonical))
        if data_key is not None:
            identity = replace(identity, data_key=data_key)
        core = RunCore(identity, self._factory, self.scrub)
        core.cursor = stored.cursor
        core.placement = Placement(stored.cursor.sequence + 1)
        core.state = stored.state
        core.nondeterminism = self.nondeterminism
        core.unwatch = watch_recording(self.nondeterminism)
        core.network = self.network
        return core


def keys_from_env() -> DataKeyStore | None:
    """The data-key store of ``BLACKBOX_KEK_FILE`` / ``BLACKBOX_KEK``, when one is set:
    recorders built from settings then seal every run."""
    provider = LocalKeyProvider.from_env()
    return None if provider is None else DataKeyStore(provider)


def recording_pipeline(settings: Settings, *, sealed: bool) -> PayloadPipeline:
    """The pipeline a recorder packs bodies with: ``settings``' compression (and each
    tenant's, ``payload_compression_tenants``), sealed under the run's data key when
    ``sealed`` (compressed sealed bodies are then padded to size buckets)."""
    return PayloadPipeline(
        sealer=AesGcmSealer() if sealed else None,
        compression=settings.payload_compression,
        tenant_compression=settings.tenant_compressions(),
    )


def new_factory(
    settings: Settings, pipeline: PayloadPipeline | None, clock: Callable[[], datetime]
) -> EventFactory:
    """The event factory a recorder builds its envelopes with."""
    return EventFactory(
        settings=settings,
        pipeline=pipeline or recording_pipeline(settings, sealed=False),
        codec=EnvelopeCodec(),
        clock=clock,
    )


@dataclass(frozen=True, slots=True)
class StartPlan:
    """Everything a recorder needs to create a run and record its ``run.started``."""

    core: RunCore
    crossing: b.Crossing
    options: RunOptions
    parent_run_id: str | None
    code_version: str
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
    options: RunOptions,
    *,
    keys: DataKeyStore | None = None,
    digest: Digester = NEW_RUNS.digest,
    scrub: Scrub | None = None,
) -> StartPlan:
    """Identity and first event of a new run (and its data key when ``keys`` is given);
    nothing is written yet.

    Raises:
        NotSerialisable: the snapshot's input is not JSON.
    """
    run_id = options.run_id or str(uuid.uuid4())
    data_key, store_key = (None, None) if keys is None else keys.new_key(run_id, options.tenant_id)
    identity = RunIdentity(
        run_id=run_id,
        tenant_id=options.tenant_id,
        agent_id=options.agent_id,
        shard=shard_of(run_id, settings.outbox_shards),
        subject_ids=tuple(options.subject_ids),
        classification=options.classification,
        retention_class=options.retention_class,
        data_key=data_key,
        digest=digest,
        credential=new_credential(),
    )
    core = RunCore(identity, factory, scrub)
    fired: set[str] = set()
    labels = _run_labels(options, settings, digest, core.scrub, fired)
    crossing = _start_crossing(snapshot, core.scrub, labels, fired)
    crossing = replace(crossing, place=core.placement.opening())
    event_id = new_event_id()
    first = core.prepare(crossing, event_id)
    return StartPlan(
        core,
        crossing,
        options,
        snapshot.parent_run_id,
        crossing.attributes["code_version"],  # as recorded: scrubbed like the body
        event_id,
        first,
        store_key,
    )


def _run_labels(
    options: RunOptions, settings: Settings, digest: Digester, scrub: Scrub, fired: set[str]
) -> dict[str, str]:
    """The run's session and user ids, as ``run.started`` carries them unsealed.

    Both pass the redaction rules first, as tags do (an e-mail address used as a user
    id becomes its placeholder or pseudonym). A user id of a run whose classification
    takes keyed digests is recorded as the tenant's keyed digest of it, never in clear:
    the attribute travels through the topic and every copy of it, beyond a shredding's
    reach.
    """
    labels: dict[str, str] = {}
    if options.session_id is not None:
        labels["session_id"] = str(scrub.value(options.session_id, fired))
    if options.user_id is not None:
        if settings.keyed_digests(options.classification):
            labels["user_id"] = digest([USER_ID_LABEL, 1, options.user_id])
        else:
            labels["user_id"] = str(scrub.value(options.user_id, fired))
    return labels


def _start_crossing(
    snapshot: RunSnapshot, scrub: Scrub, labels: Mapping[str, str], fired: set[str]
) -> b.Crossing:
    started = b.run_started(
        input=scrub.encoded(snapshot.input, fired, path="input"),
        parent_run_id=snapshot.parent_run_id,
        **scrub.snapshot(snapshot, fired),
    )
    tags = {name: str(scrub.value(value, fired)) for name, value in snapshot.tags.items()}
    attributes = {**started.attributes, **tag_attributes(tags), **labels}
    started = replace(started, attributes=attributes)
    rules = scrub.rules_text()
    if rules is not None:
        started = replace(started, attributes={**started.attributes, RULES_ATTRIBUTE: rules})
    return scrub.mark(started, fired)
