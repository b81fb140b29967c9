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

import asyncio
import functools
import inspect
import json
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn, Protocol, TypeVar

from agent_blackbox.outbox import (
    EffectOutcome,
    EffectReceipt,
    EffectRejected,
    RecordedError,
    ValueNotRestorable,
    describe_error,
    rebuild_error,
    recorded_value,
)
from agent_blackbox.outbox.contract import (
    BRANCH,
    STARTED,
    Ask,
    Contract,
    Hole,
    Place,
    Placement,
    Scrub,
    UnrecordedCall,
    agent_file,
    branch_of,
    crossing,
    default_idempotency_key,
    enter_crossing,
    installed_file,
    leave_crossing,
    recorded,
    recorded_input,
    started_of,
    stdlib_file,
)
from agent_blackbox.schemas import (
    GENESIS_CHAIN_HASH,
    HMAC_PREFIX,
    NEW_RUNS,
    BlackboxError,
    Digester,
    Envelope,
    EventType,
    KeyUnavailable,
    NotSerialisable,
    PayloadPipeline,
    PlainDigest,
    SealedRunGuard,
    UnknownSchemaVersion,
    canonical_text,
    digest_bytes,
    is_plaintext,
)

T = TypeVar("T")
_FINISHED = EventType.RUN_FINISHED
_LLM = EventType.LLM_CALL
# Frames of these modules are never the agent's: the call site is the innermost other one.
_NOT_AGENT = (
    "agent_blackbox.",
    "asyncio",
    "concurrent.",
    "threading",
    "contextlib",
    "functools",
    "click.",
    "runpy",
)
_EXAMPLES = "agent_blackbox.examples."
_DRIVER = "agent_blackbox.replayer._driver"
"""The module that calls the agent's entry: no frame of the agent's is below it."""
_OPENING = Place(1)
"""The place of ``run.started``."""
_SEQUENTIAL = Place(0)
"""The place of a call while the log shows no concurrent work: the run's own branch."""
_ENDING = Place(0)
"""The place of ``run.finished``, taken by the driver in whatever thread it runs."""


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
    CONCURRENCY_MISMATCH = "concurrency_mismatch"
    """The code started a different set of concurrent children than was recorded: an
    event others wait behind (results go back in recorded completion order) was never
    asked for."""
    UNRECORDED_CALL = "unrecorded_call"
    """The code tried to reach outside the process through no boundary (a connection, a
    request the recording has no event for): replay never goes online, so it was refused."""


LEVELS = {
    DivergenceKind.TYPE_MISMATCH: "control_flow",
    DivergenceKind.ARGUMENT_MISMATCH: "control_flow",
    DivergenceKind.MISSING_EVENT: "control_flow",
    DivergenceKind.UNCONSUMED_EVENTS: "control_flow",
    DivergenceKind.SEQUENCE_GAP: "control_flow",
    DivergenceKind.CONCURRENCY_MISMATCH: "control_flow",
    DivergenceKind.UNRECORDED_CALL: "control_flow",
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
    library: CallSite | None = None
    """The innermost frame of an installed library (a framework, an SDK) between the
    agent's frame and the boundary, when a library crossed it on the agent's behalf."""

    def __str__(self) -> str:
        return f"{self.function} ({self.file}:{self.line})"


@dataclass(frozen=True, slots=True)
class Change:
    """One path where the code's input differs from the recorded one; the values only
    when the replay was asked to reveal them."""

    path: str
    expected: Any = None
    actual: Any = None

    def describe(self, revealed: bool) -> str:
        if not revealed:
            return self.path
        return f"{self.path} (expected {self.expected!r}, got {self.actual!r})"


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
    expected_name: str | None = None
    """What the recorded boundary names: its tool, model, effect, clock, draw or state."""
    actual_name: str | None = None
    """What the code's call names, of the same kinds."""
    changes: tuple[Change, ...] = ()
    """For an argument mismatch, the input paths that differ (when the body was readable)."""
    revealed: bool = False
    """Whether :attr:`changes` carry values (an explicit choice of the replay's caller)."""

    @property
    def level(self) -> str:
        """``control_flow``, ``state`` or ``content``."""
        return LEVELS[self.kind]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form."""
        values = asdict(self)
        values["kind"] = str(self.kind)
        values["level"] = self.level
        values["changes"] = [asdict(c) if self.revealed else {"path": c.path} for c in self.changes]
        return values

    def describe(self) -> str:
        """One line for people."""
        where = f" at {self.call_site}" if self.call_site else ""
        if self.call_site is not None and self.call_site.library is not None:
            where += f" through {self.call_site.library}"
        digests = ""
        if self.expected_digest or self.actual_digest:
            digests = f"; expected {self.expected_digest}, got {self.actual_digest}"
        expected = _boundary(self.expected_type, self.expected_name) or "no event"
        actual = _boundary(self.actual_type, self.actual_name) or "no call"
        changed = ""
        if self.changes:
            changed = "; changed: " + ", ".join(c.describe(self.revealed) for c in self.changes)
        return (
            f"{self.kind} at sequence {self.sequence} of run {self.run_id}: expected "
            f"{expected}, got {actual}{where}{changed}{digests}"
            f"{'; ' + self.detail if self.detail else ''}"
        )


def _boundary(event_type: str | None, name: str | None) -> str | None:
    if event_type is None:
        return None
    return f"{event_type} {name}" if name else event_type


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
    this release cannot read, a plaintext body in a run that has a data key. Never a
    divergence; the replay reports it as an error."""


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
    tenant's keyed digest, over the canonicalisation the envelope names.

    Raises:
        KeyUnavailable: the run is keyed and no ``digests`` were given.
        UnknownCanonicalisation: the envelope names a canonicalisation this release
            does not know.
    """
    if first is None:
        return NEW_RUNS.digest
    canonical = first.canonicalisation
    if not first.output_digest.startswith(HMAC_PREFIX):
        return canonical.digest
    if digests is None:
        raise KeyUnavailable(
            f"run {first.run_id} of tenant {first.tenant_id} was digested under the "
            "tenant's key; replay it with a key store (BLACKBOX_KEK_FILE) and a purpose"
        )
    return digests.tenant_digest(first.tenant_id).under(canonical)


class ReplayRun:
    """An :class:`~agent_blackbox.outbox.AgentRun` that answers from a recorded run.

    Every input it compares is built by the same boundary contract as record mode's
    (:mod:`agent_blackbox.outbox.contract`), under the redaction rules the run was
    recorded with.

    Concurrent work replays. Each call is matched to the next recorded event of its
    branch (the asyncio task or thread it runs in, numbered as record mode numbers them:
    see :class:`~agent_blackbox.outbox.contract.Placement`), so a task that starts its
    children in another order, or another set of children, diverges. Threads of a pool
    pick up work in no repeatable order: a call from the sync run whose branch has not
    recorded it takes the next event of another branch that asks the same thing.
    Results are handed back in the recorded completion order: a call whose event
    completed later waits until every earlier one was handed back. If the code never
    asks for an event others wait behind (it left out a child), the replay reports
    ``concurrency_mismatch`` after ``stall_timeout`` seconds.

    Args:
        events: the run's envelopes in sequence order, from sequence 1 (streamed; the
            run may be longer than memory).
        pipeline: opens payloads (the sealing adapter for encrypted runs).
        blobs: reads bodies stored out of line.
        digests: the tenants' keyed digests, for runs digested under a key.
        entry: the agent's entry point; a divergence found after it returned (a
            different output, events left over) names it as the call site.
        stall_timeout: how long a call waits for its turn before the replay decides the
            code will never ask for the event before it.
        reveal_values: a divergence in a boundary's arguments lists the changed values
            (not only their paths). Off by default: reports carry digests and paths.
        allow_network: let the code's own connections (through no boundary) go out,
            noted as limitations of the replay, instead of refusing them as an
            ``unrecorded_call`` divergence (the default: replay never goes online).
    """

    replaying = True
    """A replay run (a record-mode run says False): integrations answer from the log."""

    def __init__(
        self,
        events: Iterable[Envelope],
        *,
        pipeline: PayloadPipeline | None = None,
        blobs: BlobReader | None = None,
        digests: DigestKeys | None = None,
        entry: Callable[..., Any] | None = None,
        stall_timeout: float = 10.0,
        reveal_values: bool = False,
        allow_network: bool = False,
    ) -> None:
        self._allow_network = allow_network
        self._events: Iterator[Envelope] = self._guarded(events)
        self._pipeline = pipeline or PayloadPipeline()
        self._blobs = blobs
        self._own: deque[Envelope] = deque()
        self._lanes: dict[int, deque[Envelope]] = {0: self._own}
        """Events read from the log and not yet asked for, by branch, in sequence order
        (``_own`` is branch 0's: the run's own)."""
        self._finished: Envelope | None = None
        """``run.finished``, once read (the driver takes it, from whatever thread)."""
        self._finished_read = False
        """Whether the log was read up to ``run.finished`` (or its end)."""
        self.recorded_status: str | None = None
        """How the recorded run ended (``run.finished``'s status: ``succeeded``,
        ``failed``, ...), once the replay read that far."""
        self.recorded_error: str | None = None
        """The type of the error the recorded run failed with, once read."""
        self._read = 0
        self._released = 0
        """The last sequence handed back to the code: results go back in this order."""
        self._chain = GENESIS_CHAIN_HASH
        self._placement = Placement()
        self._bound: dict[int, tuple[int, int]] = {}
        """For threads: the recorded branch each follows, and the last sequence it took."""
        self._concurrent = False
        """Whether an event read so far ran concurrently with others."""
        self._lock = threading.RLock()
        self._turn = threading.Condition(self._lock)
        """Waits for a turn; ``with self._lock`` holds it (cheaper than the condition's own)."""
        self._waiting: dict[int, asyncio.Future[None]] = {}
        """Tasks waiting for their turn, by the sequence they wait to hand back."""
        self._watchdog: asyncio.TimerHandle | None = None
        self._watched = -1
        self._sleepers = 0
        """Threads waiting for their turn."""
        self._fatal: ReplayDivergence | None = None
        self._state: str | None = None
        self._state_digest: str | None = None
        self.consumed = 0
        self.stall_timeout = stall_timeout
        self._reveal = reveal_values
        self._entry_site = _entry_site(entry)
        self._aliases = _stand_ins(entry)
        """Which imported module stands in for a module the recording names."""
        self._ending = False
        self._end_site: CallSite | None = None
        """Past the entry's return, the stack is the caller's: the site is where the
        code raised what ended the run, else the entry's definition."""
        self._found: dict[str, Divergence] = {}
        """The first state and content divergence, by level; replay went on past them."""
        # An event no release of ours can read stops the replay for good, also when the
        # agent code catches the error: nothing after it can be checked.
        self._unreadable: BlackboxError | None = None
        self.setup_error: BlackboxError | None = None
        """Why the replay could not go on, kept also when the agent's code caught it."""
        self.limitations: list[tuple[int, str]] = []
        """Events checked only in part, as (sequence, note): LLM calls recorded truncated
        over the ceiling, whose reduced response was handed back unchecked."""
        self._run_id = "unknown"
        with self._lock:
            first = self._head(0)
        self._digest = run_digest(first, digests)
        started, body, _ = self._take(EventType.RUN_STARTED, None, place=_OPENING)
        self._run_id = started.run_id
        # The rules the run was recorded under: what the code hands over now is
        # scrubbed the same way before its digest is compared.
        self._contract = Contract(Scrub.recorded_in(started.attributes), self._digest)
        self.snapshot_body = body
        """The recorded ``run.started`` body: the run's input snapshot."""

    def _guarded(self, events: Iterable[Envelope]) -> Iterator[Envelope]:
        """The log's events as read, in sequence order. A plaintext body in a run that
        has a data key (an event someone else appended) stops the replay for good, with
        an error naming the event: the run cannot be checked, and that is not the
        code's fault."""
        guard = SealedRunGuard()
        for envelope in _read_as_own(events):
            if guard.key_id is None or is_plaintext(envelope):
                refusal = guard.refusal(envelope)
                if refusal is not None:
                    error = ReplaySetupError(str(refusal))
                    self._unreadable = error
                    raise self._setup(error) from refusal
            yield envelope

    @property
    def run_id(self) -> str:
        """The id of the recorded run."""
        return self._run_id

    @property
    def input(self) -> Any:
        """The recorded input of the run, with its types."""
        body = self.snapshot_body
        return self._typed(json.loads(body["input_json"]), body.get("input_codec"))

    @property
    def last_sequence(self) -> int:
        """The sequence of the last recorded event handed back."""
        return self._released

    def drives_here(self) -> None:
        """The current task or thread drives the agent's entry: it is the run's own
        branch, as it was in record mode (see ``Placement.root``)."""
        self._placement.root()

    def unrecorded(self, hole: Hole) -> None:
        """The code tried to reach outside the process through no boundary: refused, and
        the replay's ``unrecorded_call`` divergence (or, when the network is allowed, let
        through and noted as a limitation).

        Raises:
            UnrecordedCall: the call is refused (a connection error, for the client).
        """
        if self._allow_network:
            self.limitations.append((self._released, f"went online: {hole.describe()}"))
            return
        with self._lock:
            head = None
            if self._fatal is None and self._unreadable is None:
                # The next recorded event: the run's own, else its end (run.finished is
                # kept apart from the branches once read).
                head = self._head(0) or self._finished
        try:
            self._diverge(
                DivergenceKind.UNRECORDED_CALL,
                self._released + 1,
                expected=_named(head) if head is not None else (None, None, None),
                actual=("network", None, f"{hole.what} to {_target(hole)}"),
                detail="replay never goes online: record the call through the run, or "
                "replay with --allow-network",
                fatal=True,
                site=_site_of(hole),
            )
        except ReplayDivergence as exc:
            raise UnrecordedCall(hole, "replay never goes online") from exc

    # Boundaries -----------------------------------------------------------------

    def call(self, tool: str, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """The recorded result of tool ``tool``, with its type; ``fn`` is not called."""
        ask = self._contract.tool(tool, args, kwargs)
        _, body, output = self._take(ask.event_type, ask.input_digest, ask)
        result: T = self._tool_result(body, output)
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
        return self._llm_answer(self._cross(self._contract.llm(provider, model, request)))

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
        """The recorded hits of the search; ``search`` is not called."""
        ask = self._contract.retrieval(index, index_version, query, filters, top_k)
        _, body, output = self._take(ask.event_type, ask.input_digest, ask)
        return self._hits(body, output)

    def flush(self) -> None:
        """Nothing is buffered in replay: the recording run's group-commit flush, kept so
        that agent code calling it replays unchanged."""

    def now(self) -> datetime:
        """The recorded wall-clock reading."""
        return datetime.fromtimestamp(
            self._cross(self._contract.clock("wall"))["value_us"] / 1e6, UTC
        )

    def monotonic(self) -> float:
        """The recorded monotonic-clock reading."""
        return _seconds(self._cross(self._contract.clock("monotonic")))

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
        place = self._placement.begin()
        intent = self._intent(effect, arguments, key, place)
        self._take(intent.event_type, intent.input_digest, intent, place=place)
        key = intent.input["idempotency_key"]
        receipt = self._contract.receipt(effect, key)
        _, body, output = self._take(receipt.event_type, receipt.input_digest, receipt)
        return self._receipt(effect, key, body, output)

    def transition(
        self,
        to_state: str,
        *,
        state: Any,
        reason: str | None = None,
        connection: Any = None,
    ) -> Any:
        """Check the transition against the recorded one, state included.

        ``connection`` is accepted and never touched: in replay, the agent's business
        writes are its own concern (see docs/guides/replay.md on skipping them)."""
        ask = self._contract.transition(self._state, to_state, state, reason)
        self._transitioned(ask, to_state, self._take(ask.event_type, ask.input_digest, ask))
        return None

    @contextmanager
    def joined(self, connection: Any) -> Iterator[ReplayRun]:
        """Record mode appends inside the caller's transaction; replay writes nothing."""
        yield self

    # The end of the run -------------------------------------------------------------

    def finish(
        self, *, output: Any = None, error: BaseException | None = None, connection: Any = None
    ) -> None:
        """Check the recorded ``run.finished`` against how the code ended, then that
        every recorded event was consumed."""
        self._check_readable()
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self._fatal is not None:
            raise self._fatal  # the agent's code caught it; the run diverged all the same
        ending = self._contract.ending(output, error, self._state_digest)
        self._ending = True
        self._end_site = _raised_at(error) or self._entry_site
        how = _how_it_ended(error, self._reveal)
        with self._lock:
            self._head(-1)  # reads up to run.finished
            left = self._left()
            if left is not None:
                self._diverge(
                    DivergenceKind.UNCONSUMED_EVENTS,
                    left.sequence,
                    expected=_named(left),
                    actual=(EventType.RUN_FINISHED, None, None),
                    detail=f"the code ended{how} before consuming every recorded event",
                )
            envelope, _, recorded_end = self._take_locked(
                EventType.RUN_FINISHED, ending.ask.input_digest, ending.ask, _ENDING, True
            )
        if recorded_end["final_state_digest"] != self._state_digest:
            self._diverge(
                DivergenceKind.STATE_MISMATCH,
                envelope.sequence,
                expected=(envelope.event_type, recorded_end["final_state_digest"], None),
                actual=(EventType.RUN_FINISHED, self._state_digest, None),
                detail="final state",
            )
        named = _as_recorded(error, recorded_end["error"], self._aliases)
        if named is not error:
            ending = self._contract.ending(output, named, self._state_digest)
        actual = self._contract.output_digest(ending, version=envelope.body_version)
        if actual != envelope.output_digest:
            self._diverge(
                DivergenceKind.OUTPUT_MISMATCH,
                envelope.sequence,
                expected=(envelope.event_type, envelope.output_digest, None),
                actual=(EventType.RUN_FINISHED, actual, None),
                detail=f"the code ended{how}" if how else "",
            )
        self._after_end()
        if self._found:
            found = self.divergences
            raise ReplayDivergence(found[0], found)

    @property
    def divergences(self) -> tuple[Divergence, ...]:
        """The state and content divergences found so far, the first of each level."""
        return tuple(sorted(self._found.values(), key=lambda d: d.sequence))

    # What each boundary builds and hands back --------------------------------------

    def _llm_answer(self, output: Any) -> Mapping[str, Any]:
        self._raise_recorded(output["error"])
        response: Mapping[str, Any] = output["response"]
        return response

    def _tool_result(self, body: Mapping[str, Any], output: Any) -> Any:
        if output["error"] is not None:
            self._raise_recorded(output["error"])
        return self._typed(output["result"], body.get("result_codec"))

    def _hits(self, body: Mapping[str, Any], output: Any) -> list[Any]:
        if output["error"] is not None:
            self._raise_recorded(output["error"])
        hits: list[Any] = self._typed(output["hits"], body.get("hits_codec"))
        return hits

    def _receipt(
        self, effect: str, key: str, body: Mapping[str, Any], output: Any
    ) -> EffectReceipt:
        status = output["status"]
        if status == "failed":
            raise EffectRejected(
                (output["error"] or {}).get("message", "rejected"),
                external_id=output["external_id"],
            )
        if status == "unknown" or output["error"] is not None:  # or a result not recorded
            self._raise_recorded(output["error"])
        result = self._typed(output["result"], body.get("result_codec"))
        return EffectReceipt(effect, key, status, output["external_id"], result)

    def _typed(self, value: Any, codec: str | None) -> Any:
        """A recorded value with its type again (plain JSON, recorded without a codec,
        is its own value)."""
        if codec is None:
            return value
        try:
            return recorded_value(value, codec, aliases=self._aliases)
        except ValueNotRestorable as exc:  # this process lacks a class: not the code's fault
            raise self._setup(ReplaySetupError(f"run {self._run_id}: {exc}")) from exc

    def _raise_recorded(self, error: Mapping[str, str] | None) -> None:
        if error is not None:
            raise rebuild_error(error, aliases=self._aliases)

    def _intent(
        self, effect: str, arguments: Mapping[str, Any], key: str | None, place: Place
    ) -> Ask:
        """The intent the code asks for. Without a key of its own, record mode keyed it
        by the intent's start number: the next recorded event of the branch says which."""
        if key is None:
            with self._lock:
                head = self._head(place.branch)
            started = self._released + 1
            if head is not None and head.event_type == EventType.EFFECT_INTENT:
                started = started_of(head.attributes, head.sequence)
            key = default_idempotency_key(self._run_id, started)
        return self._contract.intent(effect, key, arguments)

    def _transitioned(
        self, ask: Ask, to_state: str, taken: tuple[Envelope, dict[str, Any], Any]
    ) -> None:
        envelope, _, output = taken
        actual = self._contract.state_digest(ask, to_state)
        if actual != envelope.output_digest:
            self._diverge(
                DivergenceKind.STATE_MISMATCH,
                envelope.sequence,
                expected=(envelope.event_type, envelope.output_digest, to_state),
                actual=(EventType.STATE_TRANSITION, actual, to_state),
            )
        self._state = to_state
        self._state_digest = self._digest.canonical.digest(output["state"])

    def _after_end(self) -> None:
        """Notes of redaction may follow the end (chained); anything else may not."""
        with self._lock:
            while True:
                extra = next(self._events, None)
                if extra is None:
                    return
                self._admit(extra, after_end=True)
                if extra.event_type != EventType.RUN_REDACTED:
                    self._diverge(
                        DivergenceKind.UNCONSUMED_EVENTS,
                        extra.sequence,
                        expected=_named(extra),
                        actual=(None, None, None),
                        detail="events recorded after run.finished",
                    )
                self._open(extra)
                self._release(extra)

    # Taking events ----------------------------------------------------------------

    def _cross(self, ask: Ask) -> Any:
        """The recorded output of the event ``ask`` asks for."""
        return self._take(ask.event_type, ask.input_digest, ask)[2]

    async def _cross_async(self, ask: Ask) -> Any:
        """:meth:`_cross` for a coroutine: waits for its turn without blocking the loop."""
        return (await self._take_async(ask))[2]

    async def _take_async(
        self, ask: Ask, place: Place | None = None
    ) -> tuple[Envelope, dict[str, Any], Any]:
        """:meth:`_take` for a coroutine: tasks start in a repeatable order, so every
        call must find its event in its own branch."""
        if place is None:
            place = self._placement.begin()
        with self._lock:
            envelope = self._claim(ask.event_type, ask.input_digest, ask, place, True)
            body, output = self._open(envelope)
            waiting = None
            if envelope.sequence != self._released + 1:
                waiting = asyncio.get_running_loop().create_future()
                self._waiting[envelope.sequence] = waiting
        if waiting is not None:
            self._watch(waiting.get_loop())
            try:
                await waiting
            except _Stalled:
                with self._lock:
                    self._stalled(envelope)
        with self._lock:
            if self._fatal is not None:
                raise self._fatal
            self._release(envelope)
        return envelope, body, output

    def _take(
        self,
        event_type: EventType,
        actual: str | None,
        ask: Ask | None = None,
        *,
        place: Place | None = None,
    ) -> tuple[Envelope, dict[str, Any], Any]:
        with self._lock:
            if place is None and not (self._concurrent or self._own or self._finished_read):
                # Most runs cross one boundary at a time, and most calls ask for what was
                # recorded next: take it straight from the log. Anything else (another
                # boundary, concurrent work, the end) goes the general way below.
                envelope = next(self._events, None)
                if envelope is None:
                    self._finished_read = True
                elif (
                    envelope.sequence == self._read + 1
                    and envelope.event_type == event_type
                    and (actual is None or actual == envelope.input_digest)
                    and STARTED not in envelope.attributes
                    and BRANCH not in envelope.attributes
                    and self._fatal is None
                    and self._unreadable is None
                ):
                    self._read = envelope.sequence
                    body, output = self._open(envelope)
                    self._release(envelope)
                    return envelope, body, output
                else:
                    self._admit(envelope)
            if place is None:
                # Until the log shows concurrent work, every call is the run's own
                # branch's (see ``_claim``).
                place = self._placement.begin() if self._concurrent else _SEQUENTIAL
            return self._take_locked(event_type, actual, ask, place, False)

    def _take_locked(
        self,
        event_type: EventType,
        actual: str | None,
        ask: Ask | None,
        place: Place,
        strict: bool,
    ) -> tuple[Envelope, dict[str, Any], Any]:
        """The event the code asks for, checked in the order that names the most precise
        cause: sequence, type, input digest (``actual``, None to leave unchecked), body
        against output digest, then (when its turn comes) the chain hash."""
        envelope = self._claim(event_type, actual, ask, place, strict)
        body, output = self._open(envelope)
        if envelope.sequence != self._released + 1:
            self._await_turn(envelope)
        self._release(envelope)
        return envelope, body, output

    def _claim(
        self,
        event_type: EventType,
        actual: str | None,
        ask: Ask | None,
        place: Place,
        strict: bool,
    ) -> Envelope:
        """The recorded event the call of ``place`` stands for, checked against what it
        asks, and taken out of the events read ahead (held: ``self._lock``)."""
        if self._unreadable is not None:
            raise self._unreadable
        if self._fatal is not None:
            raise self._fatal
        if place is _ENDING:  # finish() read the log up to run.finished
            envelope = self._finished
            lane = None
        else:
            if place is _SEQUENTIAL:
                lane = self._own
                envelope = lane[0] if lane else self._head(0)
                if self._concurrent:  # reading ahead found concurrent work: place the call
                    place = self._placement.begin()
                    envelope = self._head(place.branch)
                    lane = self._lanes.get(place.branch)
            else:
                envelope = self._head(place.branch)
                lane = self._lanes.get(place.branch)
            if (
                not strict
                and place.branch
                and self._concurrent
                and (found := self._threaded(place.branch, event_type, actual)) is not None
            ):
                envelope, lane = found
        if envelope is None or (envelope.event_type == _FINISHED and event_type != _FINISHED):
            where = f" of branch {place.branch}" if place.branch else ""
            self._diverge(
                DivergenceKind.MISSING_EVENT,
                self._released + 1,
                expected=(None, None, None),
                actual=_asked(event_type, actual, ask),
                detail=f"the recorded run has no more boundary events{where}",
            )
        assert envelope is not None
        if envelope.event_type != event_type:
            self._diverge(
                DivergenceKind.TYPE_MISMATCH,
                envelope.sequence,
                expected=_named(envelope),
                actual=_asked(event_type, actual, ask),
            )
        if actual is not None and actual != envelope.input_digest:
            self._diverge(
                DivergenceKind.ARGUMENT_MISMATCH,
                envelope.sequence,
                expected=_named(envelope),
                actual=_asked(event_type, actual, ask),
                changes=self._changes(envelope, ask),
            )
        if lane is None:
            self._finished = None
        elif lane[0] is envelope:
            lane.popleft()
        else:
            del lane[next(i for i, e in enumerate(lane) if e is envelope)]
        if lane is not None and not lane and lane is not self._own:
            # A child's branch is often done: forget it (read ahead, it comes back).
            # Lanes are keyed by the recorded branch of the events they hold.
            self._lanes.pop(branch_of(envelope.attributes), None)
        return envelope

    def _head(self, branch: int) -> Envelope | None:
        """The next recorded event of ``branch`` not yet asked for, reading ahead for it
        up to ``run.finished``; None when the branch has no more (-1: just read up to
        ``run.finished``)."""
        lane = self._lanes.get(branch)
        if lane:
            return lane[0]
        while not lane:
            if self._finished_read:
                return None
            envelope = next(self._events, None)
            if envelope is None:
                self._finished_read = True
                return None
            self._admit(envelope)
            lane = self._lanes.get(branch)
        return lane[0]

    def _admit(self, envelope: Envelope, *, after_end: bool = False) -> None:
        """Take an event read from the log into the events read ahead."""
        expected = self._read + 1
        if envelope.sequence != expected:
            self._diverge(
                DivergenceKind.SEQUENCE_GAP,
                expected,
                expected=(None, None, None),
                actual=(envelope.event_type, None, None),
                detail=f"the log holds sequence {envelope.sequence} where {expected} belongs",
            )
        self._read = envelope.sequence
        if after_end:
            return
        if envelope.event_type == _FINISHED:
            self._finished = envelope
            self._finished_read = True
            self.recorded_status = envelope.attributes.get("status")
            self.recorded_error = envelope.attributes.get("error")
            return
        attributes = envelope.attributes
        if STARTED not in attributes and BRANCH not in attributes:
            self._own.append(envelope)  # one boundary at a time, as most runs go
            return
        self._concurrent = True
        branch = branch_of(attributes)
        lane = self._lanes.get(branch)
        if lane is None:
            lane = self._lanes[branch] = deque()
        lane.append(envelope)

    def _threaded(
        self, branch: int, event_type: EventType, actual: str | None
    ) -> tuple[Envelope, deque[Envelope]] | None:
        """The event a call from a thread of the sync run stands for.

        Threads of a pool take up work in no repeatable order, so a thread's recorded
        branch says little: a thread follows the recorded branch where it last found its
        call (the next event there, if it answers), else takes the earliest event of any
        thread's branch that asks the same thing, and follows that branch from there.
        Work whose first call asks exactly what other work asks (a draw, a clock) may be
        matched to either; start such work with a call that tells it apart.
        """
        self._head(-1)  # the whole run is read: any branch may hold the call
        bound = self._bound.get(branch)
        if bound is not None:
            lane = self._lanes.get(bound[0], deque())
            following = next((e for e in lane if e.sequence > bound[1]), None)
            if following is not None and _answers(following, event_type, actual):
                self._bound[branch] = (bound[0], following.sequence)
                return following, lane
        best: tuple[Envelope, int] | None = None
        for key, lane in self._lanes.items():
            if key == 0:
                continue  # the run's own branch is not a pool thread's
            first = next((e for e in lane if _answers(e, event_type, actual)), None)
            if first is not None and (best is None or first.sequence < best[0].sequence):
                best = (first, key)
        if best is None:
            return None
        self._bound[branch] = (best[1], best[0].sequence)
        return best[0], self._lanes[best[1]]

    def _left(self) -> Envelope | None:
        """The earliest recorded boundary event nobody asked for."""
        heads = [lane[0] for lane in self._lanes.values() if lane]
        return min(heads, key=lambda e: e.sequence, default=None)

    def _await_turn(self, envelope: Envelope) -> None:
        """Block this thread until every event recorded before ``envelope`` was handed
        back (held: ``self._lock``)."""
        deadline = time.monotonic() + self.stall_timeout
        while envelope.sequence != self._released + 1:
            if self._fatal is not None:
                raise self._fatal
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._stalled(envelope)
            self._sleepers += 1
            try:
                self._turn.wait(remaining)
            finally:
                self._sleepers -= 1

    def _release(self, envelope: Envelope) -> None:
        """Hand ``envelope`` back (its turn has come): check its chain link, then wake
        whoever waits for the next one."""
        expected_chain = envelope.expected_chain_hash(self._chain)
        if envelope.chain_hash != expected_chain:
            self._diverge(
                DivergenceKind.BROKEN_CHAIN,
                envelope.sequence,
                expected=(envelope.event_type, expected_chain, None),
                actual=(envelope.event_type, envelope.chain_hash, None),
            )
        self._chain = envelope.chain_hash
        self._released = envelope.sequence
        self.consumed += 1
        if self._concurrent:
            if self._sleepers:
                self._turn.notify_all()
            waiting = self._waiting.pop(self._released + 1, None)
            if waiting is not None:
                _wake_soon(waiting, None)

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Make sure one timer watches the waiting tasks: if nothing was handed back for
        ``stall_timeout`` while some wait, the earliest of them stalls (one timer per
        period, not one per wait)."""
        if self._watchdog is None:
            self._watched = self._released
            self._watchdog = loop.call_later(self.stall_timeout, self._check, loop)

    def _check(self, loop: asyncio.AbstractEventLoop) -> None:
        self._watchdog = None
        if not self._waiting:
            return
        if self._released != self._watched:
            self._watch(loop)  # progress since the last look: look again later
            return
        earliest = min(self._waiting)
        _wake(self._waiting.pop(earliest), _STALLED)

    def _stalled(self, waiting: Envelope) -> NoReturn:
        """A call waited ``stall_timeout`` for an event the code never asked for."""
        sequence = self._released + 1
        missing = self._left()
        self._diverge(
            DivergenceKind.CONCURRENCY_MISMATCH,
            sequence,
            expected=_named(missing) if missing is not None else (None, None, None),
            actual=(None, None, None),
            detail=(
                f"the code never asked for sequence {sequence} "
                f"({_branch_label(missing)}) while sequence {waiting.sequence} waited "
                f"{self.stall_timeout:g}s for it: it started a different set of "
                "concurrent children than was recorded"
            ),
            fatal=True,
        )
        raise AssertionError("unreachable")  # pragma: no cover

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
            with crossing():  # the replay's own reading, not the agent's I/O
                data = self._blobs.read(envelope.payload_ref)
        try:
            body = self._pipeline.unpack(envelope, data)
        except UnknownSchemaVersion as exc:
            if envelope.sequence == self._released + 1:
                expected_chain = envelope.expected_chain_hash(self._chain)
                if envelope.chain_hash != expected_chain:
                    self._diverge(
                        DivergenceKind.BROKEN_CHAIN,
                        envelope.sequence,
                        expected=(envelope.event_type, expected_chain, None),
                        actual=(envelope.event_type, envelope.chain_hash, None),
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
                expected=(envelope.event_type, envelope.output_digest, None),
                actual=(envelope.event_type, None, None),
                detail=f"the body does not open: {type(exc).__name__}",
                fatal=True,  # there is no recorded output to go on with
            )
        output, material = recorded(envelope.event_type, body)
        if envelope.event_type == _LLM and _reduced(body):
            note = _reduced_note(envelope, body["body_truncated"])
            self.limitations.append((envelope.sequence, note))
            return body, output  # the whole response is gone: its digest cannot be checked
        actual = None
        if material is not None and type(self._digest) is PlainDigest:
            actual = digest_bytes(material)
        if actual != envelope.output_digest:
            # No fast path, or the body's texts are not canonical: a result or hits
            # stored in their own key order (bodies since ordered JSON). The value is
            # what the digest was taken of.
            actual = self._value_digest(output)
        if actual != envelope.output_digest:
            self._diverge(
                DivergenceKind.TAMPERED_OUTPUT,
                envelope.sequence,
                expected=(envelope.event_type, envelope.output_digest, None),
                actual=(envelope.event_type, actual, None),
            )
        return body, output

    def _value_digest(self, output: Any) -> str | None:
        """The digest of an output read from a body; None when canonical JSON refuses
        it (NaN, an infinity, nested too deep): the recorder digested every output it
        wrote, so such a body is not the one recorded."""
        try:
            return self._digest(output)
        except NotSerialisable:
            return None

    def _changes(self, envelope: Envelope, ask: Ask | None) -> tuple[Change, ...]:
        """What differs between the recorded input of ``envelope`` and ``ask``'s, path by
        path (values only when revealing them); nothing when the body cannot be read."""
        if ask is None:
            return ()
        try:
            data = None
            if envelope.payload_ref is not None:
                if self._blobs is None:
                    return ()
                data = self._blobs.read(envelope.payload_ref)
            before = recorded_input(envelope.event_type, self._pipeline.unpack(envelope, data))
        except BlackboxError:
            return ()
        if before is None:
            return ()
        after = json.loads(canonical_text(ask.input))
        return tuple(
            Change(path, old, new) if self._reveal else Change(path)
            for path, old, new in _differences(before, after, "")
        )

    def _setup(self, exc: BlackboxError) -> BlackboxError:
        """Keep ``exc`` as the reason the replay stops, and give it back to raise."""
        if self.setup_error is None:
            self.setup_error = exc
        return exc

    def _check_readable(self) -> None:
        if self._unreadable is not None:
            raise self._unreadable

    def _diverge(
        self,
        kind: DivergenceKind,
        sequence: int,
        *,
        expected: tuple[str | None, str | None, str | None],
        actual: tuple[str | None, str | None, str | None],
        detail: str = "",
        fatal: bool = False,
        changes: tuple[Change, ...] = (),
        site: CallSite | None = None,
    ) -> None:
        """Raise a control-flow (or ``fatal``) divergence; note the first state or
        content one of its level and return, so the replay goes on.

        ``expected`` and ``actual`` are (event type, digest, boundary name); ``site`` is
        the call site when the caller knows it better than the stack does."""
        divergence = Divergence(
            kind=kind,
            run_id=self._run_id,
            sequence=sequence,
            expected_type=expected[0],
            actual_type=actual[0],
            expected_digest=expected[1],
            actual_digest=actual[1],
            # Past the entry's return, the stack is the caller's: the entry is the site.
            call_site=site or (self._ending and self._end_site) or _call_site() or self._entry_site,
            detail=detail,
            expected_name=expected[2],
            actual_name=actual[2],
            changes=changes,
            revealed=self._reveal,
        )
        if fatal or divergence.level == "control_flow":
            found = tuple(sorted([*self._found.values(), divergence], key=lambda d: d.sequence))
            self._fatal = ReplayDivergence(found[0], found)
            self._wake_all()
            raise self._fatal
        known = self._found.get(divergence.level)
        if known is None or divergence.sequence < known.sequence:
            self._found[divergence.level] = divergence

    def _wake_all(self) -> None:
        """A fatal divergence: every call waiting for its turn raises it too."""
        if not self._concurrent:
            return
        with self._lock:
            self._turn.notify_all()
        for waiting in self._waiting.values():
            _wake_soon(waiting, self._fatal)
        self._waiting.clear()


class AsyncReplayRun:
    """The asyncio twin of :class:`ReplayRun` (what an ``async`` agent entry gets in
    replay): the same checks, with boundaries to ``await``; concurrent tasks wait for
    their turn without blocking the loop."""

    replaying = True
    """A replay run: integrations answer from the log."""

    def __init__(self, replay: ReplayRun) -> None:
        self.replay = replay

    @property
    def run_id(self) -> str:
        """The id of the recorded run."""
        return self.replay.run_id

    def unrecorded(self, hole: Hole) -> None:
        """See :meth:`ReplayRun.unrecorded`."""
        self.replay.unrecorded(hole)

    @property
    def input(self) -> Any:
        """The recorded input of the run."""
        return self.replay.input

    @property
    def last_sequence(self) -> int:
        """The sequence of the last recorded event handed back."""
        return self.replay.last_sequence

    async def call(self, tool: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """The recorded result of tool ``tool``, with its type; ``fn`` is not called."""
        replay = self.replay
        _, body, output = await replay._take_async(replay._contract.tool(tool, args, kwargs))
        return replay._tool_result(body, output)

    async def llm(
        self,
        send: Callable[[Mapping[str, Any]], Any],
        request: Mapping[str, Any],
        *,
        provider: str,
        model: str | None = None,
    ) -> Mapping[str, Any]:
        """The recorded response to ``request``; ``send`` is not called."""
        replay = self.replay
        return replay._llm_answer(
            await replay._cross_async(replay._contract.llm(provider, model, request))
        )

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
        """The recorded hits of the search; ``search`` is not called."""
        replay = self.replay
        ask = replay._contract.retrieval(index, index_version, query, filters, top_k)
        _, body, output = await replay._take_async(ask)
        return replay._hits(body, output)

    async def flush(self) -> None:
        """Nothing is buffered in replay (see :meth:`ReplayRun.flush`)."""

    async def now(self) -> datetime:
        """The recorded wall-clock reading."""
        return _wall(await self.replay._cross_async(self.replay._contract.clock("wall")))

    async def monotonic(self) -> float:
        """The recorded monotonic-clock reading."""
        return _seconds(await self.replay._cross_async(self.replay._contract.clock("monotonic")))

    async def random(self) -> float:
        """The recorded random float."""
        drawn = await self.replay._cross_async(self.replay._contract.random("random"))
        return float(drawn["value"])

    async def randint(self, low: int, high: int) -> int:
        """The recorded random integer."""
        ask = self.replay._contract.random("randint", {"low": low, "high": high})
        return int((await self.replay._cross_async(ask))["value"])

    async def uuid(self) -> uuid.UUID:
        """The recorded random UUID."""
        drawn = await self.replay._cross_async(self.replay._contract.random("uuid4"))
        return uuid.UUID(drawn["value"])

    async def effect(
        self,
        effect: str,
        perform: Callable[[str], Any],
        *,
        arguments: Mapping[str, Any],
        key: str | None = None,
    ) -> EffectReceipt:
        """The recorded receipt of the effect; ``perform`` is never called."""
        replay = self.replay
        place = replay._placement.begin()
        intent = replay._intent(effect, arguments, key, place)
        await replay._take_async(intent, place)
        key = intent.input["idempotency_key"]
        _, body, output = await replay._take_async(replay._contract.receipt(effect, key))
        return replay._receipt(effect, key, body, output)

    async def transition(
        self,
        to_state: str,
        *,
        state: Any,
        reason: str | None = None,
        connection: Any = None,
    ) -> Any:
        """Check the transition against the recorded one; ``connection`` is not touched."""
        replay = self.replay
        ask = replay._contract.transition(replay._state, to_state, state, reason)
        replay._transitioned(ask, to_state, await replay._take_async(ask))
        return None

    async def finish(
        self, *, output: Any = None, error: BaseException | None = None, connection: Any = None
    ) -> None:
        """See :meth:`ReplayRun.finish`."""
        self.replay.finish(output=output, error=error)


# Answers ----------------------------------------------------------------------------


def _wall(output: Any) -> datetime:
    return datetime.fromtimestamp(output["value_us"] / 1e6, UTC)


def _seconds(output: Any) -> float:
    return float(output["value_us"]) / 1e6


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


def _read_as_own(events: Iterable[Envelope]) -> Iterator[Envelope]:
    """``events``, each read as the replay's own I/O (an archive in object storage is
    read over the network while the agent's code runs), not as the agent's."""
    iterator = iter(events)
    while True:
        inside = enter_crossing()
        try:
            envelope = next(iterator, None)
        finally:
            leave_crossing(inside)
        if envelope is None:
            return
        yield envelope


def _site_of(hole: Hole) -> CallSite | None:
    site, library = hole.site, hole.library
    through = None if library is None else CallSite(library.function, library.file, library.line)
    return None if site is None else CallSite(site.function, site.file, site.line, through)


def _target(hole: Hole) -> str:
    return hole.host if hole.port is None else f"{hole.host}:{hole.port}"


class _Stalled(Exception):
    """A call waited ``stall_timeout`` for its turn."""


_STALLED = _Stalled()


def _wake_soon(waiting: asyncio.Future[None], error: BaseException | None) -> None:
    """Wake a task waiting for its turn: at once from its own loop's thread, else through
    its loop."""
    loop = waiting.get_loop()
    if asyncio.events._get_running_loop() is loop:
        _wake(waiting, error)
    else:
        loop.call_soon_threadsafe(_wake, waiting, error)


def _wake(waiting: asyncio.Future[None], error: BaseException | None) -> None:
    if waiting.done():
        return
    if error is None:
        waiting.set_result(None)
    else:
        waiting.set_exception(error)


# What divergences say ---------------------------------------------------------------


def _answers(envelope: Envelope | None, event_type: str, actual: str | None) -> bool:
    return (
        envelope is not None
        and envelope.event_type == event_type
        and (actual is None or actual == envelope.input_digest)
    )


_NAME_ATTRIBUTE = {
    EventType.TOOL_CALL: "tool",
    EventType.LLM_CALL: "model",
    EventType.EFFECT_INTENT: "effect",
    EventType.EFFECT_RECEIPT: "effect",
    EventType.CLOCK_READ: "clock",
    EventType.RANDOM_DRAW: "kind",
    EventType.RETRIEVAL: "index",
    EventType.STATE_TRANSITION: "to_state",
}
"""The attribute (recorded) or input field (asked) that names a boundary of each kind."""


def _named(envelope: Envelope) -> tuple[str | None, str | None, str | None]:
    field = _NAME_ATTRIBUTE.get(envelope.event_type)  # type: ignore[call-overload]
    name = envelope.attributes.get(field) if field else None
    return envelope.event_type, envelope.input_digest, name


def _asked(
    event_type: str, actual: str | None, ask: Ask | None
) -> tuple[str | None, str | None, str | None]:
    field = _NAME_ATTRIBUTE.get(event_type)  # type: ignore[call-overload]
    name = None
    if field and ask is not None and isinstance(ask.input, Mapping):
        value = ask.input.get(field)
        name = None if value is None else str(value)
    return event_type, actual, name


def _branch_label(envelope: Envelope | None) -> str:
    if envelope is None:
        return "not read"
    return (
        f"branch {branch_of(envelope.attributes)}, "
        f"started {started_of(envelope.attributes, envelope.sequence)}"
    )


def _differences(before: Any, after: Any, path: str) -> Iterator[tuple[str, Any, Any]]:
    """The leaf paths where two JSON values differ (``kwargs.amount``, ``args[0]``)."""
    if isinstance(before, dict) and isinstance(after, dict):
        for key in sorted(set(before) | set(after)):
            inner = f"{path}.{key}" if path else str(key)
            if key not in before:
                yield inner, None, after[key]
            elif key not in after:
                yield inner, before[key], None
            else:
                yield from _differences(before[key], after[key], inner)
    elif isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        for index, (old, new) in enumerate(zip(before, after, strict=True)):
            yield from _differences(old, new, f"{path}[{index}]")
    elif before != after or type(before) is not type(after):
        yield path or "(the whole input)", before, after


def _call_site() -> CallSite | None:
    """The innermost frame of the agent's code on the stack: the one that crossed the
    boundary, with the library frame it called (the framework's function that crossed
    the boundary on the agent's behalf, several frames down). The project's own frames
    (but its examples'), the event loop's, threads', the CLI framework's, the standard
    library's and installed libraries' are never it; nor is anything below the driver
    that called the entry (whoever called the replay).

    When a task runs the boundary's coroutine itself (``gather(run.call(...), ...)``), no
    agent frame is on its stack: then it is the place that made the coroutine, as the
    coroutine's origin says (the driver turns origin tracking on while an async entry
    replays). Without an agent frame at all, the library frame is the site.
    """
    library = None
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        module = str(frame.f_globals.get("__name__", ""))
        if module == _DRIVER:
            break
        code = frame.f_code
        if _agent_frame(module, code.co_filename):
            return CallSite(code.co_name, code.co_filename, frame.f_lineno, library)
        if _library_frame(module, code.co_filename):  # the outermost: what the agent called
            library = CallSite(code.co_name, code.co_filename, frame.f_lineno)
        frame = frame.f_back
    origin = _origin()
    if origin is None or origin.library is not None or library is None:
        return origin or library
    return replace(origin, library=library)


def _agent_frame(module: str, filename: str) -> bool:
    """Whether a frame of ``module`` is the agent's: not the project's (but its
    examples'), the event loop's, threads' or the CLI framework's, nor one of a file
    of the standard library or an installed library."""
    if module.startswith(_EXAMPLES):
        return True
    if module.startswith(_NOT_AGENT):
        return False
    return not stdlib_file(filename) and not installed_file(filename)


def _library_frame(module: str, filename: str) -> bool:
    """Whether a frame of ``module`` is an installed library's (not the project's)."""
    return not module.startswith(_NOT_AGENT) and installed_file(filename)


def _raised_at(error: BaseException | None) -> CallSite | None:
    """The innermost frame of the agent's code that ``error`` passed through, with the
    innermost library frame it passed through after it (or the library frame alone,
    when no frame was the agent's)."""
    found, library = None, None
    traceback = error.__traceback__ if error is not None else None
    while traceback is not None:
        code = traceback.tb_frame.f_code
        module = str(traceback.tb_frame.f_globals.get("__name__", ""))
        here = CallSite(code.co_name, code.co_filename, traceback.tb_lineno)
        if _agent_frame(module, code.co_filename):
            found, library = here, None
        elif library is None and _library_frame(module, code.co_filename):
            library = here  # the first after the agent's frame: what the agent called
        traceback = traceback.tb_next
    if found is None:
        return library
    return replace(found, library=library)


def _as_recorded(
    error: BaseException | None, recorded: Mapping[str, str] | None, aliases: Mapping[str, str]
) -> BaseException | None:
    """``error`` as the recording named its class, when the module it named stands in
    for the class's own (a script's ``__main__`` replayed by module): the same class,
    under its recorded name. Otherwise ``error`` itself."""
    if error is None or recorded is None or hasattr(error, "recorded_error"):
        return error
    info = describe_error(error)
    module = recorded.get("module")
    if module is None or aliases.get(module) != info["module"] or recorded["type"] != info["type"]:
        return error
    named = RecordedError(info["type"], info["message"], module=module)
    named.recorded_error = {**info, "module": module}
    return named


def _how_it_ended(error: BaseException | None, reveal: bool) -> str:
    """`` (raising KeyError: ...)`` for a run the code ended with an exception (its
    message only when values may be shown: it may hold data)."""
    if error is None:
        return ""
    message = f": {error}" if reveal and str(error) else ""
    return f" raising {type(error).__name__}{message}"


def _origin() -> CallSite | None:
    """Where the running task's coroutine was made, in the agent's code (with the
    library frame it called), else in a library's."""
    if asyncio.events._get_running_loop() is None:
        return None
    task = asyncio.current_task()
    origin = getattr(task.get_coro(), "cr_origin", None) if task is not None else None
    library = None
    for filename, line, function in origin or ():
        if agent_file(filename):
            return CallSite(function, filename, line, library)
        if installed_file(filename):  # the outermost: what the agent's line called
            library = CallSite(function, filename, line)
    return library


def _stand_ins(entry: Callable[..., Any] | None) -> dict[str, str]:
    """Which imported module stands in for a module a recording names, judged by the
    module of the agent's ``entry``: a script recorded as ``python agent.py`` named its
    classes ``__main__.X``, and replayed by module they are the entry module's; an entry
    replayed in a script (``__main__``) has the classes recorded under the script's
    module name (``agent`` for ``agent.py`` or ``python -m agent``). Nothing is imported.
    """
    target = inspect.unwrap(entry) if entry is not None else None
    while isinstance(target, functools.partial):
        target = inspect.unwrap(target.func)
    module = getattr(target, "__module__", None)
    if not isinstance(module, str):
        return {}
    if module != "__main__":
        return {"__main__": module}
    script = sys.modules.get("__main__")
    spec = getattr(script, "__spec__", None)
    name = spec.name if spec is not None else Path(getattr(script, "__file__", "") or "").stem
    return {name: "__main__"} if name and name != "__main__" else {}


def _entry_site(entry: Callable[..., Any] | None) -> CallSite | None:
    """Where the agent's entry point is defined: the call site of what is found after it
    returned (its output, events it left)."""
    target = inspect.unwrap(entry) if entry is not None else None
    code = getattr(target, "__code__", None) or getattr(type(target).__call__, "__code__", None)
    if code is None:
        return None
    return CallSite(code.co_name, code.co_filename, code.co_firstlineno)
