"""What a crossing asks, as both modes build it: each boundary's input, scrubbed with the
run's redaction rules and digested with its digest (see :mod:`agent_blackbox.outbox.contract`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from agent_blackbox.outbox import _boundaries as b
from agent_blackbox.outbox._boundaries import error_info
from agent_blackbox.outbox._llm import llm_input
from agent_blackbox.outbox._request_memo import Expected, RequestMemo
from agent_blackbox.outbox._scrub import Scrub
from agent_blackbox.schemas import (
    BlackboxError,
    Digester,
    EventType,
    NotSerialisable,
    SplitRequest,
    canonical_text,
)

_NOTHING_FIRED: frozenset[str] = frozenset()
_TOOL = EventType.TOOL_CALL


class Ask(NamedTuple):
    """One crossing as the agent's code asks for it (a named tuple: replay builds one for
    every event it checks, and a tuple is the cheapest immutable value to build).

    ``input`` is the JSON the input digest is taken over (already scrubbed); ``value`` is
    what the crossing's body repeats of it (a tool's scrubbed arguments, the scrubbed
    request of an LLM call, an effect's scrubbed arguments); ``fired`` names the
    redaction rules that replaced something on the way.
    """

    event_type: EventType
    input: Any
    input_digest: str
    value: Any = None
    fired: frozenset[str] = _NOTHING_FIRED


@dataclass(frozen=True, slots=True)
class Ending:
    """How the agent's code ended a run: its output and error as recorded (scrubbed), and
    the JSON the ``run.finished`` output digest is taken over."""

    ask: Ask
    output: Any
    error: BaseException | None
    recorded_output: dict[str, Any]
    fired: frozenset[str]
    status: str
    """The status recorded: ``failed`` when the output could not be recorded."""
    refused: BaseException | None = None
    """The refusal of an output that could not be recorded (the run's error), raised to
    the caller once record mode appended the end."""
    digest: str | None = None
    """The output digest of ``run.finished``, when taken already (replay's end as given)."""


def default_idempotency_key(run_id: str, sequence: int) -> str:
    """The key of an effect whose code names none: the intent's own position in the run,
    stable across a crash and a recovery, unique across runs."""
    return f"{run_id}:{sequence}"


class Contract:
    """The boundary builders of one run.

    Args:
        scrub: the run's redaction rules (in replay, the rules it was recorded under).
        digest: the run's digest (SHA-256, or the tenant's keyed digest, which also
            keys the rules' pseudonyms).

    Raises:
        RedactionConfigError: the rules give pseudonyms and ``digest`` is not keyed.
    """

    def __init__(self, scrub: Scrub, digest: Digester) -> None:
        self.scrub = scrub.keyed(digest)  # pseudonyms take the run's tenant key
        self.digest = digest
        self.requests = RequestMemo(self.scrub, digest)
        """The parts of the run's latest LLM requests, which the next ones reuse."""
        self._expected: Callable[[], Expected | None] | None = None
        self._state_checked: tuple[Ask, str] | None = None
        """The last transition taken as given, and the state digest that matched."""
        # Inputs that never change are digested once per run, not once per call.
        self._clocks: dict[str, Ask] = {}
        self._draws: dict[str, Ask] = {}
        self._endings: dict[str, Ask] = {}

    def request_split(self, ask: Ask) -> SplitRequest | None:
        """The version 1 texts of the parts of an LLM call's scrubbed request (``ask``
        of :meth:`llm`), when the request memo built it; else None. Replay hands them
        to the reader of the recorded body: a recorded request made of the same texts
        need not be rebuilt from its reference."""
        parts = self.requests.parts_of(ask.value)
        return None if parts is None else parts.split()

    @property
    def expected(self) -> Callable[[], Expected | None] | None:
        """Replay's: the recorded event the code's next crossing (or the run's end) is
        compared with, when no redaction rule fired on it. Its input (the run's output)
        is then digested as the code gave it first, and scrubbed only when that misses
        the recorded digest (a crossing that matches is the recorded one, which the rules
        left alone). None in record mode."""
        return self._expected

    @expected.setter
    def expected(self, found: Callable[[], Expected | None] | None) -> None:
        self._expected = self.requests.expected = found

    def _recorded(self, event_type: EventType) -> Expected | None:
        """What replay knows of the next recorded event, when it is of ``event_type``
        and no rule fired on it (see :attr:`expected`)."""
        found = None if self._expected is None else self._expected()
        return found if found and not found.fired and found.event_type == event_type else None

    def _as_given(
        self, event_type: EventType, inputs: Any, *, path: str, value: Any, recorded: Expected
    ) -> Ask | None:
        """The ask of ``inputs`` as the code gave them, when their digest is the recorded
        one (else None: the whole way scrubs them, and names what is wrong with them)."""
        try:
            digest = self.digest(inputs, path=path)
        except BlackboxError:
            return None
        if digest != recorded.digest:
            return None
        return Ask(event_type, inputs, digest, value, _NOTHING_FIRED)

    def _ask(
        self, event_type: EventType, inputs: Any, *, path: str, value: Any = None, fired: set[str]
    ) -> Ask:
        digest = self.digest(inputs, path=path)
        return Ask(event_type, inputs, digest, value, frozenset(fired) if fired else _NOTHING_FIRED)

    def _fixed_ask(
        self, known: dict[str, Ask], key: str, event_type: EventType, inputs: Any
    ) -> Ask:
        """Digest ``inputs`` once and keep the ask under ``key`` (callers look there first,
        building ``inputs`` only when it is missing)."""
        ask = known[key] = self._ask(event_type, inputs, path=f"{event_type}.input", fired=set())
        return ask

    # Inputs ------------------------------------------------------------------------

    def tool(self, tool: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Ask:
        """A tool call; ``value`` is the scrubbed ``(args, kwargs)``.

        Raises:
            NotSerialisable: an argument is not JSON (before the tool is called).
        """
        path = f"{tool}.arguments"
        # Arguments the rules cannot fire on are handed back as they are: no need to ask.
        recorded = None if not kwargs and self.scrub.inert(args) else self._recorded(_TOOL)
        if recorded is not None:
            inputs = b.tool_input(tool, args, kwargs)
            given = self._as_given(
                EventType.TOOL_CALL, inputs, path=path, value=(args, kwargs), recorded=recorded
            )
            if given is not None:
                return given
        fired: set[str] = set()
        args, kwargs = self.scrub.arguments(args, kwargs, fired, path=path)
        inputs = b.tool_input(tool, args, kwargs)
        return self._ask(EventType.TOOL_CALL, inputs, path=path, value=(args, kwargs), fired=fired)

    def llm(self, provider: str, model: str | None, request: Mapping[str, Any]) -> Ask:
        """An LLM call; ``value`` is the scrubbed request. The model is the one named,
        else the request's own, else ``unknown``."""
        chosen = model or str(request.get("model", "unknown"))
        asked = self.requests.asked(provider, chosen, dict(request))
        if asked is not None:
            parts = asked.parts
            fired_parts = parts.fired or _NOTHING_FIRED
            return Ask(EventType.LLM_CALL, asked.input, asked.digest, parts.value, fired_parts)
        fired: set[str] = set()
        scrubbed = self.scrub.value(dict(request), fired, path="llm.request")
        inputs = llm_input(provider, chosen, scrubbed)
        return self._ask(
            EventType.LLM_CALL, inputs, path="llm.request", value=scrubbed, fired=fired
        )

    def retrieval(
        self,
        index: str,
        index_version: str,
        query: Any,
        filters: Mapping[str, Any] | None,
        top_k: int | None,
    ) -> Ask:
        """A search of a retrieval index; ``value`` is the scrubbed ``(query, filters)``.

        Raises:
            NotSerialisable: the query or the filters are not JSON (before the search).
        """
        fired: set[str] = set()
        query = self.scrub.value(query, fired, path=f"{index}.query")
        if filters is not None:
            filters = self.scrub.value(dict(filters), fired, path=f"{index}.filters")
        inputs = b.retrieval_input(index, index_version, query, filters, top_k)
        return self._ask(
            EventType.RETRIEVAL,
            inputs,
            path=f"{index}.query",
            value=(query, filters),
            fired=fired,
        )

    def clock(self, clock: str) -> Ask:
        """A read of the ``wall`` or ``monotonic`` clock."""
        return self._clocks.get(clock) or self._fixed_ask(
            self._clocks, clock, EventType.CLOCK_READ, b.clock_input(clock)
        )

    def random(self, kind: str, arguments: Mapping[str, Any] | None = None) -> Ask:
        """A random draw (``random``, ``randint`` with its bounds, ``uuid4``)."""
        if not arguments:
            return self._draws.get(kind) or self._fixed_ask(
                self._draws, kind, EventType.RANDOM_DRAW, b.random_input(kind, {})
            )
        inputs = b.random_input(kind, arguments)
        return self._ask(EventType.RANDOM_DRAW, inputs, path=f"{kind}.arguments", fired=set())

    def intent(self, effect: str, idempotency_key: str, arguments: Mapping[str, Any]) -> Ask:
        """The intent of a side effect; ``value`` is the scrubbed arguments."""
        path = f"{effect}.arguments"
        recorded = self._recorded(EventType.EFFECT_INTENT)
        if recorded is not None:
            given = dict(arguments)
            inputs = b.intent_input(effect, idempotency_key, given)
            ask = self._as_given(
                EventType.EFFECT_INTENT, inputs, path=path, value=given, recorded=recorded
            )
            if ask is not None:
                return ask
        fired: set[str] = set()
        scrubbed = self.scrub.value(dict(arguments), fired, path=path)
        inputs = b.intent_input(effect, idempotency_key, scrubbed)
        return self._ask(EventType.EFFECT_INTENT, inputs, path=path, value=scrubbed, fired=fired)

    def receipt(self, effect: str, idempotency_key: str) -> Ask:
        """The receipt of a side effect."""
        inputs = b.receipt_input(effect, idempotency_key)
        return self._ask(EventType.EFFECT_RECEIPT, inputs, path=f"{effect}.receipt", fired=set())

    def transition(
        self, from_state: str | None, to_state: str, state: Any, reason: str | None
    ) -> Ask:
        """A state transition; ``value`` is the scrubbed state, whose digest (over
        ``{"state": ...}``) is the recorded output digest."""
        recorded = self._recorded(EventType.STATE_TRANSITION)
        if recorded is not None:
            ask = self._transition_as_given(from_state, to_state, state, reason, recorded)
            if ask is not None:
                return ask
        fired: set[str] = set()
        scrubbed = self.scrub.value(state, fired, path=f"{to_state}.state")
        if reason is not None and self.scrub.version >= 2:  # v1 runs recorded it as given
            reason = self.scrub.value(reason, fired)
        inputs = b.transition_input(from_state, to_state, reason)
        return self._ask(
            EventType.STATE_TRANSITION,
            inputs,
            path=f"{to_state}.transition",
            value=scrubbed,
            fired=fired,
        )

    def _transition_as_given(
        self,
        from_state: str | None,
        to_state: str,
        state: Any,
        reason: str | None,
        recorded: Expected,
    ) -> Ask | None:
        """A transition as the code gave it, when its input and the state it sets both
        digest as recorded (see :attr:`expected`)."""
        ask = self._as_given(
            EventType.STATE_TRANSITION,
            b.transition_input(from_state, to_state, reason),
            path=f"{to_state}.transition",
            value=state,
            recorded=recorded,
        )
        if ask is None:
            return None
        try:
            state_digest = self.digest(b.state_output(state), path=f"{to_state}.state")
        except BlackboxError:
            return None
        if state_digest != recorded.output_digest:
            return None
        self._state_checked = (ask, state_digest)
        return ask

    def state_digest(self, ask: Ask, to_state: str) -> str:
        """The output digest of a transition: over the state it set."""
        checked = self._state_checked
        if checked is not None and checked[0] is ask:
            return checked[1]
        return self.digest(b.state_output(ask.value), path=f"{to_state}.state")

    def ending(
        self, output: Any, error: BaseException | None, final_state_digest: str | None
    ) -> Ending:
        """How the code ended the run: ``succeeded`` with ``output``, or ``failed`` with
        ``error``, after the last state it set."""
        status = "succeeded" if error is None else "failed"
        return self.finish(status, output, error, final_state_digest)

    def finish(
        self,
        status: str,
        output: Any,
        error: BaseException | None,
        final_state_digest: str | None,
    ) -> Ending:
        """The end of a run with ``status``; see :meth:`ending`.

        An output that cannot be recorded (a NaN, an object that is not JSON) ends the
        run ``failed`` instead, its refusal (naming where) recorded as the run's error of
        kind ``unserialisable_result``, as a tool's result that cannot be recorded is:
        the run does not stay open, and its replay, given the same output, ends alike.
        """
        given = None if error else self._end_as_given(status, output, final_state_digest)
        if given is not None:
            return given
        fired: set[str] = set()
        refused = None
        try:
            output = self.scrub.value(output, fired, path="run.output")
            # Refused here, where each mode ends, rather than half-way through writing
            # the end (the body's text, then the envelope's digest).
            canonical_text(output, path="run.output")
            self.digest(output, path="run.output")
        except NotSerialisable as exc:
            status, output, refused = "failed", None, b.unserialisable(exc)
            error, fired = refused, set()
        error = self.scrub.error(error, fired)
        ask = self._endings.get(status) or self._fixed_ask(
            self._endings, status, EventType.RUN_FINISHED, b.finished_input(status)
        )
        recorded_output = b.finished_output(output, error_info(error), final_state_digest)
        return Ending(ask, output, error, recorded_output, frozenset(fired), status, refused)

    def _end_as_given(self, status: str, output: Any, final_state: str | None) -> Ending | None:
        """A run that ended without an error, its output as the code gave it, when what
        ``run.finished`` records of that digests as recorded (see :attr:`expected`)."""
        recorded = self._recorded(EventType.RUN_FINISHED)
        if recorded is None:
            return None
        recorded_output = b.finished_output(output, None, final_state)
        try:
            digest = self.digest(recorded_output, path="output")
        except BlackboxError:
            return None
        if digest != recorded.output_digest:
            return None
        ask = self._endings.get(status) or self._fixed_ask(
            self._endings, status, EventType.RUN_FINISHED, b.finished_input(status)
        )
        return Ending(ask, output, None, recorded_output, _NOTHING_FIRED, status, digest=digest)

    def output_digest(self, ending: Ending, *, version: int = b.TYPED_VERSION) -> str:
        """The digest ``run.finished`` records over how the run ended, in the shape of
        body ``version`` (version 1 recorded an error as its type and message alone)."""
        if ending.digest is not None:  # an end taken as given: no error, alike in every version
            return ending.digest
        output = ending.recorded_output
        if version < b.TYPED_VERSION and output["error"] is not None:
            output = {**output, "error": b.plain_error(output["error"])}
        return self.digest(output, path="output")
