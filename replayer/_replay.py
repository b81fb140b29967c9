"""Replay mode: the same agent code, driven from a recorded run.

Nothing is called: every boundary takes the next recorded event, checks that the code
asks for the same kind of thing with the same input (by digest), checks the recorded
body against its output digest, and hands back the recorded output. Divergences name
the sequence, the expected and actual type and digests, and the call site; never a
payload.

The three levels are checked separately. A control-flow divergence (another boundary,
other arguments, a missing or extra event) raises :class:`ReplayDivergence` at once:
past it, recorded events no longer line up with the code's calls. A state or content
divergence (another state, another final output, a body that does not match its
digest, a broken chain) is noted and the replay goes on with the recorded values, so
control flow is still checked to the end; ``finish`` then raises naming the first one.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Protocol, TypeVar

from agent_blackbox.outbox import EffectOutcome, EffectReceipt, EffectRejected, RecordedError
from agent_blackbox.outbox.contract import (
    Ask,
    Contract,
    Scrub,
    default_idempotency_key,
    recorded,
)
from agent_blackbox.schemas import (
    GENESIS_CHAIN_HASH,
    HMAC_PREFIX,
    BlackboxError,
    Digester,
    Envelope,
    EventType,
    KeyUnavailable,
    PayloadPipeline,
    UnknownSchemaVersion,
    digest,
    digest_bytes,
)

T = TypeVar("T")
_FINISHED = EventType.RUN_FINISHED
_LLM = EventType.LLM_CALL
# Frames of these packages are the recorder's own; the call site is the first other one.
_OWN_MODULES = ("agent_blackbox.outbox.", "agent_blackbox.replayer.")


class DivergenceKind(StrEnum):
    """Why a replay stopped."""

    TYPE_MISMATCH = "type_mismatch"
    """The code crossed a different kind of boundary than was recorded."""
    ARGUMENT_MISMATCH = "argument_mismatch"
    """Same kind of boundary, different input (arguments, request, key)."""
    STATE_MISMATCH = "state_mismatch"
    """A state transition (or the final state) differs from the recorded one."""
    OUTPUT_MISMATCH = "output_mismatch"
    """The run ended with a different output or error than was recorded."""
    TAMPERED_OUTPUT = "tampered_output"
    """A recorded body does not match its own output digest."""
    MISSING_EVENT = "missing_event"
    """The code made a call the log has no event for (the log is exhausted)."""
    UNCONSUMED_EVENTS = "unconsumed_events"
    """The code finished while recorded events were left (it ended early)."""
    BROKEN_CHAIN = "broken_chain"
    """An envelope's chain hash does not follow from the one before it."""
    SEQUENCE_GAP = "sequence_gap"
    """Sequences are not contiguous from 1: an event is missing or out of order."""


LEVELS = {
    DivergenceKind.TYPE_MISMATCH: "control_flow",
    DivergenceKind.ARGUMENT_MISMATCH: "control_flow",
    DivergenceKind.MISSING_EVENT: "control_flow",
    DivergenceKind.UNCONSUMED_EVENTS: "control_flow",
    DivergenceKind.SEQUENCE_GAP: "control_flow",
    DivergenceKind.STATE_MISMATCH: "state",
    DivergenceKind.OUTPUT_MISMATCH: "content",
    DivergenceKind.TAMPERED_OUTPUT: "content",
    DivergenceKind.BROKEN_CHAIN: "content",
}
"""Which of the three levels (control flow, state, content) each kind breaks."""


@dataclass(frozen=True, slots=True)
class CallSite:
    """Where in the agent's code the diverging boundary was crossed."""

    function: str
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.function} ({self.file}:{self.line})"


@dataclass(frozen=True, slots=True)
class Divergence:
    """The first point where replay and record disagree. Carries digests, never bodies."""

    kind: DivergenceKind
    run_id: str
    sequence: int
    expected_type: str | None
    actual_type: str | None
    expected_digest: str | None = None
    actual_digest: str | None = None
    call_site: CallSite | None = None
    detail: str = ""

    @property
    def level(self) -> str:
        """``control_flow``, ``state`` or ``content``."""
        return LEVELS[self.kind]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form."""
        values = asdict(self)
        values["kind"] = str(self.kind)
        values["level"] = self.level
        return values

    def describe(self) -> str:
        """One line for people."""
        where = f" at {self.call_site}" if self.call_site else ""
        digests = ""
        if self.expected_digest or self.actual_digest:
            digests = f"; expected {self.expected_digest}, got {self.actual_digest}"
        return (
            f"{self.kind} at sequence {self.sequence} of run {self.run_id}: expected "
            f"{self.expected_type or 'no event'}, got {self.actual_type or 'no call'}"
            f"{where}{digests}{'; ' + self.detail if self.detail else ''}"
        )


class ReplayDivergence(BlackboxError):
    """Replay found where today's code (or the log) goes another way.

    ``divergence`` is the first one; ``divergences`` the first of each level found,
    in sequence order (it holds ``divergence``).
    """

    def __init__(
        self, divergence: Divergence, divergences: tuple[Divergence, ...] | None = None
    ) -> None:
        self.divergence = divergence
        self.divergences = divergences or (divergence,)
        super().__init__(divergence.describe())


class ReplaySetupError(BlackboxError):
    """Replay could not check the run, through no fault of the agent's code: a body
    stored out of line without a blob reader, a sealed run without its key, an event
    this release cannot read. Never a divergence; the replay reports it as an error."""


class DigestKeys(Protocol):
    """Finds the keyed digest of a tenant whose sensitive runs are digested under a key."""

    def tenant_digest(self, tenant_id: str) -> Digester:
        """The tenant's keyed digest (unwrapping its key, audited)."""
        ...


class BlobReader(Protocol):
    """Reads a body stored out of line by its content address."""

    def read(self, ref: str) -> bytes:
        """The bytes stored under ``ref``."""
        ...


def run_digest(first: Envelope | None, digests: DigestKeys | None) -> Digester:
    """The digest a run was recorded with, judged by its first envelope: SHA-256, or the
    tenant's keyed digest.

    Raises:
        KeyUnavailable: the run is keyed and no ``digests`` were given.
    """
    if first is None or not first.output_digest.startswith(HMAC_PREFIX):
        return digest
    if digests is None:
        raise KeyUnavailable(
            f"run {first.run_id} of tenant {first.tenant_id} was digested under the "
            "tenant's key; replay it with a key store (BLACKBOX_KEK_FILE) and a purpose"
        )
    return digests.tenant_digest(first.tenant_id)


class ReplayRun:
    """An :class:`~agent_blackbox.outbox.AgentRun` that answers from a recorded run.

    Every input it compares is built by the same boundary contract as record mode's
    (:mod:`agent_blackbox.outbox.contract`), under the redaction rules the run was
    recorded with.

    Args:
        events: the run's envelopes in sequence order, from sequence 1 (streamed; the
            run may be longer than memory).
        pipeline: opens payloads (the sealing adapter for encrypted runs).
        blobs: reads bodies stored out of line.
    """

    def __init__(
        self,
        events: Iterable[Envelope],
        *,
        pipeline: PayloadPipeline | None = None,
        blobs: BlobReader | None = None,
        digests: DigestKeys | None = None,
    ) -> None:
        self._events: Iterator[Envelope] = iter(events)
        self._pipeline = pipeline or PayloadPipeline()
        self._blobs = blobs
        self._peeked: Envelope | None = None
        self._sequence = 0
        self._chain = GENESIS_CHAIN_HASH
        self._state: str | None = None
        self._state_digest: str | None = None
        self.consumed = 0
        self._found: dict[str, Divergence] = {}
        """The first state and content divergence, by level; replay went on past them."""
        # An event no release of ours can read stops the replay for good, also when the
        # agent code catches the error: nothing after it can be checked.
        self._unreadable: UnknownSchemaVersion | None = None
        self.setup_error: BlackboxError | None = None
        """Why the replay could not go on, kept also when the agent's code caught it."""
        self.limitations: list[tuple[int, str]] = []
        """Events checked only in part, as (sequence, note): LLM calls recorded truncated
        over the ceiling, whose reduced response was handed back unchecked."""
        self._digest = run_digest(self._peek(), digests)
        started, body, _ = self._take(EventType.RUN_STARTED, None)
        self._run_id = started.run_id
        # The rules the run was recorded under: what the code hands over now is
        # scrubbed the same way before its digest is compared.
        self._contract = Contract(Scrub.recorded_in(started.attributes), self._digest)
        self.snapshot_body = body
        """The recorded ``run.started`` body: the run's input snapshot."""

    @property
    def run_id(self) -> str:
        """The id of the recorded run."""
        return self._run_id

    @property
    def input(self) -> Any:
        """The recorded input of the run."""
        return json.loads(self.snapshot_body["input_json"])

    # Boundaries -----------------------------------------------------------------

    def call(self, tool: str, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """The recorded result of tool ``tool``; ``fn`` is not called."""
        output = self._cross(self._contract.tool(tool, args, kwargs))
        _raise_recorded(output["error"])
        result: T = output["result"]
        return result

    def llm(
        self,
        send: Callable[[Mapping[str, Any]], Mapping[str, Any]],
        request: Mapping[str, Any],
        *,
        provider: str,
        model: str | None = None,
    ) -> Mapping[str, Any]:
        """The recorded response to ``request``; ``send`` is not called."""
        output = self._cross(self._contract.llm(provider, model, request))
        _raise_recorded(output["error"])
        response: Mapping[str, Any] = output["response"]
        return response

    def now(self) -> datetime:
        """The recorded wall-clock reading."""
        value = self._cross(self._contract.clock("wall"))["value_us"]
        return datetime.fromtimestamp(value / 1e6, UTC)

    def monotonic(self) -> float:
        """The recorded monotonic-clock reading."""
        return float(self._cross(self._contract.clock("monotonic"))["value_us"]) / 1e6

    def random(self) -> float:
        """The recorded random float."""
        return float(self._cross(self._contract.random("random"))["value"])

    def randint(self, low: int, high: int) -> int:
        """The recorded random integer."""
        bounds = {"low": low, "high": high}
        return int(self._cross(self._contract.random("randint", bounds))["value"])

    def uuid(self) -> uuid.UUID:
        """The recorded random UUID."""
        return uuid.UUID(self._cross(self._contract.random("uuid4"))["value"])

    def effect(
        self,
        effect: str,
        perform: Callable[[str], EffectOutcome | Mapping[str, Any] | None],
        *,
        arguments: Mapping[str, Any],
        key: str | None = None,
    ) -> EffectReceipt:
        """The recorded receipt of the effect; ``perform`` is never called."""
        idempotency_key = key or default_idempotency_key(self._run_id, self._sequence + 1)
        self._cross(self._contract.intent(effect, idempotency_key, arguments))
        output = self._cross(self._contract.receipt(effect, idempotency_key))
        status = output["status"]
        if status == "failed":
            raise EffectRejected(
                (output["error"] or {}).get("message", "rejected"),
                external_id=output["external_id"],
            )
        if status == "unknown":
            _raise_recorded(output["error"])
        return EffectReceipt(
            effect, idempotency_key, status, output["external_id"], output["result"]
        )

    def transition(self, to_state: str, *, state: Any, reason: str | None = None) -> Any:
        """Check the transition against the recorded one, state included."""
        ask = self._contract.transition(self._state, to_state, state, reason)
        envelope, _, output = self._take(EventType.STATE_TRANSITION, ask.input_digest)
        actual = self._contract.state_digest(ask, to_state)
        if actual != envelope.output_digest:
            self._diverge(
                DivergenceKind.STATE_MISMATCH,
                envelope.sequence,
                expected=(envelope.event_type, envelope.output_digest),
                actual=(EventType.STATE_TRANSITION, actual),
            )
        self._state = to_state
        self._state_digest = digest(output["state"])
        return None

    # The end of the run -------------------------------------------------------------

    def finish(self, *, output: Any = None, error: BaseException | None = None) -> None:
        """Check the recorded ``run.finished`` against how the code ended, then that
        every recorded event was consumed."""
        self._check_readable()
        ending = self._contract.ending(output, error, self._state_digest)
        upcoming = self._peek()
        if upcoming is not None and upcoming.event_type != EventType.RUN_FINISHED:
            self._diverge(
                DivergenceKind.UNCONSUMED_EVENTS,
                upcoming.sequence,
                expected=(upcoming.event_type, upcoming.input_digest),
                actual=(EventType.RUN_FINISHED, None),
                detail="the code ended before consuming every recorded event",
            )
        envelope, _, recorded_end = self._take(EventType.RUN_FINISHED, ending.ask.input_digest)
        if recorded_end["final_state_digest"] != self._state_digest:
            self._diverge(
                DivergenceKind.STATE_MISMATCH,
                envelope.sequence,
                expected=(envelope.event_type, recorded_end["final_state_digest"]),
                actual=(EventType.RUN_FINISHED, self._state_digest),
                detail="final state",
            )
        actual = self._contract.output_digest(ending)
        if actual != envelope.output_digest:
            self._diverge(
                DivergenceKind.OUTPUT_MISMATCH,
                envelope.sequence,
                expected=(envelope.event_type, envelope.output_digest),
                actual=(EventType.RUN_FINISHED, actual),
            )
        extra = self._peek()
        while extra is not None and extra.event_type == EventType.RUN_REDACTED:
            self._take(EventType.RUN_REDACTED, None)  # a note after the end, chained
            extra = self._peek()
        if extra is not None:
            self._diverge(
                DivergenceKind.UNCONSUMED_EVENTS,
                extra.sequence,
                expected=(extra.event_type, extra.input_digest),
                actual=(None, None),
                detail="events recorded after run.finished",
            )
        if self._found:
            found = self.divergences
            raise ReplayDivergence(found[0], found)

    @property
    def divergences(self) -> tuple[Divergence, ...]:
        """The state and content divergences found so far, the first of each level."""
        return tuple(sorted(self._found.values(), key=lambda d: d.sequence))

    # Taking events ----------------------------------------------------------------

    def _cross(self, ask: Ask) -> Any:
        """The recorded output of the next event, which must be what ``ask`` asks for."""
        return self._take(ask.event_type, ask.input_digest)[2]

    def _take(
        self, event_type: EventType, actual: str | None
    ) -> tuple[Envelope, dict[str, Any], Any]:
        """The next event, checked in the order that names the most precise cause:
        sequence, type, input digest (``actual``, None to leave unchecked), body against
        output digest, chain hash."""
        if self._unreadable is not None:
            raise self._unreadable
        envelope = self._peeked
        if envelope is None:
            envelope = next(self._events, None)
        else:
            self._peeked = None
        expected_seq = self._sequence + 1
        if envelope is None or (envelope.event_type == _FINISHED and event_type != _FINISHED):
            self._diverge(
                DivergenceKind.MISSING_EVENT,
                expected_seq,
                expected=(None, None),
                actual=(event_type, actual),
                detail="the recorded run has no more boundary events",
            )
        assert envelope is not None
        if envelope.sequence != expected_seq:
            self._diverge(
                DivergenceKind.SEQUENCE_GAP,
                expected_seq,
                expected=(None, None),
                actual=(envelope.event_type, None),
                detail=f"the log holds sequence {envelope.sequence} where {expected_seq} belongs",
            )
        if envelope.event_type != event_type:
            self._diverge(
                DivergenceKind.TYPE_MISMATCH,
                envelope.sequence,
                expected=(envelope.event_type, envelope.input_digest),
                actual=(event_type, actual),
            )
        if actual is not None and actual != envelope.input_digest:
            self._diverge(
                DivergenceKind.ARGUMENT_MISMATCH,
                envelope.sequence,
                expected=(envelope.event_type, envelope.input_digest),
                actual=(event_type, actual),
            )
        body, output = self._open(envelope)
        expected_chain = envelope.expected_chain_hash(self._chain)
        if envelope.chain_hash != expected_chain:
            self._diverge(
                DivergenceKind.BROKEN_CHAIN,
                envelope.sequence,
                expected=(envelope.event_type, expected_chain),
                actual=(envelope.event_type, envelope.chain_hash),
            )
        self._sequence = envelope.sequence
        self._chain = envelope.chain_hash
        self.consumed += 1
        return envelope, body, output

    def _open(self, envelope: Envelope) -> tuple[dict[str, Any], Any]:
        data = None
        if envelope.payload_ref is not None:
            if self._blobs is None:
                raise self._setup(
                    ReplaySetupError(
                        f"run {envelope.run_id} sequence {envelope.sequence}: the body is "
                        f"stored out of line ({envelope.payload_ref}) and no blob reader was "
                        "given; pass blobs= (PostgresBlobs on the write side's engine)"
                    )
                )
            data = self._blobs.read(envelope.payload_ref)
        try:
            body = self._pipeline.unpack(envelope, data)
        except UnknownSchemaVersion as exc:
            expected_chain = envelope.expected_chain_hash(self._chain)
            if envelope.chain_hash != expected_chain:
                self._diverge(
                    DivergenceKind.BROKEN_CHAIN,
                    envelope.sequence,
                    expected=(envelope.event_type, expected_chain),
                    actual=(envelope.event_type, envelope.chain_hash),
                    detail=f"the altered envelope names body version {envelope.body_version}",
                    fatal=True,
                )
            # An intact envelope of a version this release cannot read is not tampering:
            # it was written by a newer release (or needs a migrator). Stop.
            self._unreadable = exc
            raise self._setup(exc) from None
        except KeyUnavailable as exc:
            # Not the log's fault: without the key nothing can be said of the bytes.
            raise self._setup(exc) from None
        except BlackboxError as exc:
            if envelope.key_id is not None and not self._pipeline.seals:
                raise self._setup(
                    ReplaySetupError(
                        f"run {envelope.run_id} is encrypted (sequence {envelope.sequence} "
                        f"is sealed under data key {envelope.key_id}) and the replay has no "
                        "key store; set BLACKBOX_KEK_FILE (or BLACKBOX_KEK) and a purpose"
                    )
                ) from None
            self._diverge(
                DivergenceKind.TAMPERED_OUTPUT,
                envelope.sequence,
                expected=(envelope.event_type, envelope.output_digest),
                actual=(envelope.event_type, None),
                detail=f"the body does not open: {type(exc).__name__}",
                fatal=True,  # there is no recorded output to go on with
            )
        output, material = recorded(envelope.event_type, body)
        if envelope.event_type == _LLM and _reduced(body):
            note = _reduced_note(envelope, body["body_truncated"])
            self.limitations.append((envelope.sequence, note))
            return body, output  # the whole response is gone: its digest cannot be checked
        if material is not None and self._digest is digest:
            actual = digest_bytes(material)
        else:
            actual = self._digest(output)
        if actual != envelope.output_digest:
            self._diverge(
                DivergenceKind.TAMPERED_OUTPUT,
                envelope.sequence,
                expected=(envelope.event_type, envelope.output_digest),
                actual=(envelope.event_type, actual),
            )
        return body, output

    def _setup(self, exc: BlackboxError) -> BlackboxError:
        """Keep ``exc`` as the reason the replay stops, and give it back to raise."""
        if self.setup_error is None:
            self.setup_error = exc
        return exc

    def _check_readable(self) -> None:
        if self._unreadable is not None:
            raise self._unreadable

    def _peek(self) -> Envelope | None:
        if self._peeked is None:
            self._peeked = next(self._events, None)
        return self._peeked

    def _diverge(
        self,
        kind: DivergenceKind,
        sequence: int,
        *,
        expected: tuple[str | None, str | None],
        actual: tuple[str | None, str | None],
        detail: str = "",
        fatal: bool = False,
    ) -> None:
        """Raise a control-flow (or ``fatal``) divergence; note the first state or
        content one of its level and return, so the replay goes on."""
        divergence = Divergence(
            kind=kind,
            run_id=getattr(self, "_run_id", None) or "unknown",
            sequence=sequence,
            expected_type=expected[0],
            actual_type=actual[0],
            expected_digest=expected[1],
            actual_digest=actual[1],
            call_site=_call_site(),
            detail=detail,
        )
        if fatal or divergence.level == "control_flow":
            found = tuple(sorted([*self._found.values(), divergence], key=lambda d: d.sequence))
            raise ReplayDivergence(found[0], found)
        self._found.setdefault(divergence.level, divergence)


def _reduced(body: Mapping[str, Any]) -> bool:
    """Whether an ``llm.call`` body was recorded truncated without its response."""
    truncated = body.get("body_truncated")
    return (
        truncated is not None
        and body["raw_response_json"] is None
        and truncated["response_sha256"] is not None
    )


def _reduced_note(envelope: Envelope, truncated: Mapping[str, Any]) -> str:
    return (
        f"sequence {envelope.sequence} ({envelope.event_type}) was recorded truncated "
        f"(body {truncated['body_bytes']} bytes, over the ceiling of "
        f"{truncated['ceiling_bytes']}): its response was handed back reduced (long texts "
        "cut short) and not checked against its output digest"
    )


def _raise_recorded(error: Mapping[str, str] | None) -> None:
    if error is not None:
        raise RecordedError(error["type"], error["message"])


def _call_site() -> CallSite | None:
    """The first frame outside the recorder: the agent code that crossed the boundary."""
    frame = sys._getframe(1)
    while frame is not None:
        module = str(frame.f_globals.get("__name__", ""))
        if not module.startswith(_OWN_MODULES):
            return CallSite(frame.f_code.co_name, frame.f_code.co_filename, frame.f_lineno)
        frame = frame.f_back  # type: ignore[assignment]
    return None
