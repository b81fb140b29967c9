"""Divergences: what a replay found where today's code (or the log) goes another way.

The three levels are kept apart. A control-flow divergence (another boundary, other
arguments, a missing or extra event) raises :class:`ReplayDivergence` at once: past it,
recorded events no longer line up with the code's calls. A state or content divergence
(another state, another final output, a body that does not match its digest, a broken
chain) is noted and the replay goes on with the recorded values, so control flow is
still checked to the end; the end of the run then raises naming the first one.
:class:`Findings` keeps them, with what stopped the replay through no fault of the code.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from typing import Any

from agent_blackbox.outbox.contract import Ask, branch_of, started_of
from agent_blackbox.replayer._sites import CallSite, call_site
from agent_blackbox.schemas import BlackboxError, Envelope, EventType, canonical_text


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
    """Whether :attr:`changes` are shown with their values (an explicit choice of the
    replay's caller); they carry them either way, kept only behind a purpose."""
    asked: Any = None
    """The input the code asked with, scrubbed by the run's redaction rules (None when it
    asked for nothing): never shown unless revealed."""

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
        if not self.revealed:
            del values["asked"]
        return values

    @property
    def summary(self) -> str:
        """:meth:`describe` without a value, whatever the replay was asked to reveal: what
        anyone who may see the run may read."""
        return replace(self, revealed=False).describe()

    def values(self) -> dict[str, Any] | None:
        """The values behind the divergence (each changed path's recorded and asked
        value, and the input the code asked with), JSON-ready; None when there are none.
        Scrubbed already; kept only behind a stated purpose."""
        if not self.changes and self.asked is None:
            return None
        return {
            "changes": [
                {"path": c.path, "expected": c.expected, "actual": c.actual} for c in self.changes
            ],
            "asked": self.asked,
        }

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


Named = tuple[str | None, str | None, str | None]
"""A boundary as a divergence names it: event type, digest, and its name (tool, model...)."""

NOTHING: Named = (None, None, None)


class Findings:
    """What a replay found so far: the first state and content divergence of each level
    (the replay went on past them), the control-flow one that stopped it, what stopped it
    through no fault of the code, and the events checked only in part.

    Args:
        reveal: argument mismatches list the changed values, not only their paths.
        entry_site: where the agent's entry is defined (the site of what is found after
            it returned).
        on_fatal: called once a divergence stops the replay (wakes every waiting call).
    """

    def __init__(
        self, *, reveal: bool, entry_site: CallSite | None, on_fatal: Callable[[], None]
    ) -> None:
        self.run_id = "unknown"
        self.reveal = reveal
        self.entry_site = entry_site
        self._on_fatal = on_fatal
        self.found: dict[str, Divergence] = {}
        self.fatal: ReplayDivergence | None = None
        self.end_site: CallSite | None = None
        """Past the entry's return, the stack is the caller's: the site is where the
        code raised what ended the run, else the entry's definition."""
        self.ending = False
        # An event no release of ours can read stops the replay for good, also when the
        # agent code catches the error: nothing after it can be checked.
        self.unreadable: BlackboxError | None = None
        self.setup_error: BlackboxError | None = None
        """Why the replay could not go on, kept also when the agent's code caught it."""
        self.limitations: list[tuple[int, str]] = []
        """Events checked only in part, as (sequence, note): LLM calls recorded truncated
        over the ceiling, whose reduced response was handed back unchecked; calls that
        went online because the replay allowed it."""
        self.redacted: dict[int, str] = {}
        """The recorded results handed back to the code that redaction had changed, as
        sequence: the rules that fired (the event's ``redacted`` attribute)."""

    @property
    def divergences(self) -> tuple[Divergence, ...]:
        """The state and content divergences found so far, the first of each level."""
        return tuple(sorted(self.found.values(), key=lambda d: d.sequence))

    def check(self) -> None:
        """Raise what stopped the replay: an unreadable event, then a divergence."""
        if self.unreadable is not None:
            raise self.unreadable
        if self.fatal is not None:
            raise self.fatal

    def setup(self, exc: BlackboxError) -> BlackboxError:
        """Keep ``exc`` as the reason the replay stops, and give it back to raise."""
        if self.setup_error is None:
            self.setup_error = exc
        return exc

    def stop(self, exc: BlackboxError) -> BlackboxError:
        """Keep ``exc`` (an event no release can read) as the reason the replay stops for
        good, and give it back to raise."""
        self.unreadable = exc
        return self.setup(exc)

    def diverge(
        self,
        kind: DivergenceKind,
        sequence: int,
        *,
        expected: Named,
        actual: Named,
        detail: str = "",
        fatal: bool = False,
        changes: tuple[Change, ...] = (),
        site: CallSite | None = None,
        asked: Any = None,
    ) -> None:
        """Raise a control-flow (or ``fatal``) divergence; note the first state or
        content one of its level and return, so the replay goes on.

        ``expected`` and ``actual`` are (event type, digest, boundary name); ``site`` is
        the call site when the caller knows it better than the stack does."""
        if kind in _FROM_VALUES and self.redacted:
            detail = "; ".join(part for part in (detail, self._redacted_note(sequence)) if part)
        divergence = Divergence(
            kind=kind,
            run_id=self.run_id,
            sequence=sequence,
            expected_type=expected[0],
            actual_type=actual[0],
            expected_digest=expected[1],
            actual_digest=actual[1],
            # Past the entry's return, the stack is the caller's: the entry is the site.
            call_site=site or (self.ending and self.end_site) or call_site() or self.entry_site,
            detail=detail,
            expected_name=expected[2],
            actual_name=actual[2],
            changes=changes,
            revealed=self.reveal,
            asked=asked,
        )
        if fatal or divergence.level == "control_flow":
            found = tuple(sorted([*self.found.values(), divergence], key=lambda d: d.sequence))
            self.fatal = ReplayDivergence(found[0], found)
            self._on_fatal()
            raise self.fatal
        known = self.found.get(divergence.level)
        if known is None or divergence.sequence < known.sequence:
            self.found[divergence.level] = divergence

    def _redacted_note(self, before: int) -> str:
        """What may explain a divergence of values with the code unchanged: results
        handed back before ``before`` that were redacted when recorded ('' if none)."""
        handed = sorted(seq for seq in self.redacted if seq < before)
        if not handed:
            return ""
        rules = sorted({rule for seq in handed for rule in self.redacted[seq].split(",")})
        shown = ", ".join(map(str, handed[:5])) + (", ..." if len(handed) > 5 else "")
        return (
            f"{len(handed)} recorded event(s) handed back to the code had values redacted "
            f"({', '.join(rules)}; sequence {shown}): code that slices, compares or "
            "parses a redacted value sees its placeholder in replay and can go another "
            "way with the code unchanged"
        )

    def changes(self, before: Any, ask: Ask) -> tuple[Change, ...]:
        """What differs between a recorded input and ``ask``'s, path by path, with the
        values (shown only when revealing them)."""
        after = json.loads(canonical_text(ask.input))
        return tuple(Change(path, old, new) for path, old, new in _differences(before, after, ""))


_FROM_VALUES = frozenset(
    {
        DivergenceKind.ARGUMENT_MISMATCH,
        DivergenceKind.STATE_MISMATCH,
        DivergenceKind.OUTPUT_MISMATCH,
    }
)
"""Divergences of values, which code reading a redacted result can cause unchanged."""


# What divergences say ---------------------------------------------------------------


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


def named(envelope: Envelope) -> Named:
    """A recorded event as a divergence names it."""
    field = _NAME_ATTRIBUTE.get(envelope.event_type)  # type: ignore[call-overload]
    name = envelope.attributes.get(field) if field else None
    return envelope.event_type, envelope.input_digest, name


def asked(event_type: str, actual: str | None, ask: Ask | None) -> Named:
    """What the code asks for as a divergence names it."""
    field = _NAME_ATTRIBUTE.get(event_type)  # type: ignore[call-overload]
    name = None
    if field and ask is not None and isinstance(ask.input, Mapping):
        value = ask.input.get(field)
        name = None if value is None else str(value)
    return event_type, actual, name


def branch_label(envelope: Envelope | None) -> str:
    """Where a recorded event ran among the run's concurrent work."""
    if envelope is None:
        return "not read"
    return (
        f"branch {branch_of(envelope.attributes)}, "
        f"started {started_of(envelope.attributes, envelope.sequence)}"
    )


def how_it_ended(error: BaseException | None, reveal: bool) -> str:
    """`` raising KeyError: ...`` for a run the code ended with an exception (its
    message only when values may be shown: it may hold data)."""
    if error is None:
        return ""
    message = f": {error}" if reveal and str(error) else ""
    return f" raising {type(error).__name__}{message}"


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
