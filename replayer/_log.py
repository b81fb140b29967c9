"""Reading a recorded run: which recorded event each call of the code stands for.

Events are read from the log in sequence order, as the code asks for them, and read
ahead only as far as a call needs. Each goes to the lane of the branch it ran in (the
asyncio task or thread, numbered as record mode numbers them: see
:class:`~agent_blackbox.outbox.contract.Placement`); a call is matched to the next event
of its own branch, so a task that starts its children in another order, or another set
of children, diverges. Threads of a pool pick up work in no repeatable order: a call
from a thread whose branch has not recorded it takes the next event of another branch
that asks the same thing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator

from agent_blackbox.outbox.contract import (
    BRANCH,
    FIRED_ATTRIBUTE,
    STARTED,
    Ask,
    Expected,
    Place,
    branch_of,
)
from agent_blackbox.replayer._divergence import (
    NOTHING,
    DivergenceKind,
    Findings,
    asked,
    named,
)
from agent_blackbox.replayer._opening import Bodies
from agent_blackbox.replayer._turns import Turns
from agent_blackbox.schemas import Envelope, EventType

_FINISHED = EventType.RUN_FINISHED
_INTERRUPTIONS = frozenset({"KeyboardInterrupt", "SystemExit", "CancelledError", "GeneratorExit"})
"""The exceptions that end a recorded run from outside the agent's own logic."""

OPENING = Place(1)
"""The place of ``run.started``."""
SEQUENTIAL = Place(0)
"""The place of a call while the log shows no concurrent work: the run's own branch."""
ENDING = Place(0)
"""The place of ``run.finished``, taken by the driver in whatever thread it runs."""


class RecordedLog:
    """The recorded events read so far and not yet asked for, by branch.

    Every method but :meth:`straight` and :meth:`expected_crossing` is called holding
    the turns' lock.

    Args:
        events: the run's envelopes in sequence order (streamed).
        findings: where divergences go.
        turns: how far events were handed back.
        bodies: reads what a call's recorded input was, for an argument mismatch.
    """

    def __init__(
        self, events: Iterator[Envelope], findings: Findings, turns: Turns, bodies: Bodies
    ) -> None:
        self._events = events
        self._findings = findings
        self._turns = turns
        self._bodies = bodies
        self.own: deque[Envelope] = deque()
        self._lanes: dict[int, deque[Envelope]] = {0: self.own}
        """Events read from the log and not yet asked for, by branch, in sequence order
        (``own`` is branch 0's: the run's own)."""
        self.finished: Envelope | None = None
        """``run.finished``, once read (the driver takes it, from whatever thread)."""
        self.finished_read = False
        """Whether the log was read up to ``run.finished`` (or its end)."""
        self._read = 0
        self._bound: dict[int, tuple[int, int]] = {}
        """For threads: the recorded branch each follows, and the last sequence it took."""
        self.concurrent = False
        """Whether an event read so far ran concurrently with others."""
        self.recorded_status: str | None = None
        self.recorded_error: str | None = None
        self._ahead: Envelope | None = None
        """The event :meth:`upcoming` read from the log and nothing has taken yet."""
        self._unread: Exception | None = None
        """What reading the log raised in :meth:`upcoming`: raised by the next read."""

    def upcoming(self) -> Envelope | None:
        """The event :meth:`straight` would be handed next, read from the log but not
        taken; None while the log shows concurrent work or events are read ahead, and at
        its end. What reading raises is raised where the event is taken."""
        if self.concurrent or self.own or self.finished_read or self._unread is not None:
            return None
        if self._ahead is None:
            try:
                self._ahead = next(self._events, None)
            except Exception as exc:  # the read's own error, raised where it is taken
                self._unread = exc
        return self._ahead

    def expected_crossing(self) -> Expected | None:
        """What the recorded event the code's next call is compared with says of it, and
        whether a redaction rule fired on it (the run's contract asks: see ``Expected``).
        Takes the turns' lock."""
        with self._turns.lock:
            envelope = self.upcoming()
        if envelope is None:
            return None
        fired = FIRED_ATTRIBUTE in envelope.attributes
        return Expected(envelope.event_type, envelope.input_digest, envelope.output_digest, fired)

    def _next(self) -> Envelope | None:
        """The next event of the log (the one :meth:`upcoming` read, if any)."""
        envelope = self._ahead
        if envelope is not None:
            self._ahead = None
            return envelope
        if self._unread is not None:
            unread, self._unread = self._unread, None
            raise unread
        return next(self._events, None)

    def straight(self, event_type: EventType, actual: str | None) -> Envelope | None:
        """The next event of the log when it is what the call asks for and nothing else
        is pending (most runs cross one boundary at a time, and most calls ask for what
        was recorded next); else None, and the event is taken in among the events read
        ahead. Only while the log shows no concurrent work and no event is read ahead."""
        envelope = self._next()
        if envelope is None:
            self.finished_read = True
        elif (
            envelope.sequence == self._read + 1
            and envelope.event_type == event_type
            and (actual is None or actual == envelope.input_digest)
            and STARTED not in envelope.attributes
            and BRANCH not in envelope.attributes
            and self._findings.fatal is None
            and self._findings.unreadable is None
        ):
            self._read = envelope.sequence
            return envelope
        else:
            self.admit(envelope)
        return None

    def claim(
        self,
        event_type: EventType,
        actual: str | None,
        ask: Ask | None,
        place: Place,
        strict: bool,
        begin: Callable[[], Place],
        *,
        detail: str = "",
    ) -> Envelope:
        """The recorded event the call of ``place`` stands for, checked against what it
        asks (type, then input digest: ``actual``, None to leave it unchecked), and taken
        out of the events read ahead. ``begin`` places a call made as
        :data:`SEQUENTIAL` once reading ahead found concurrent work; ``detail`` says
        more of a mismatched input (how the code ended a run)."""
        findings = self._findings
        if findings.unreadable is not None or findings.fatal is not None:
            findings.check()  # the replay stopped: raises why
        if place is ENDING:  # the end of the run read the log up to run.finished
            envelope, lane = self.finished, None
        else:
            if place is SEQUENTIAL:
                lane = self.own
                envelope = lane[0] if lane else self.head(0)
                if self.concurrent:  # reading ahead found concurrent work: place the call
                    place = begin()
                    envelope = self.head(place.branch)
                    lane = self._lanes.get(place.branch)
            else:
                envelope = self.head(place.branch)
                lane = self._lanes.get(place.branch)
            if (
                not strict
                and place.branch
                and self.concurrent
                and (found := self._threaded(place.branch, event_type, actual)) is not None
            ):
                envelope, lane = found
        if (
            envelope is None
            or envelope.event_type != event_type
            or (actual is not None and actual != envelope.input_digest)
        ):
            self._diverge(envelope, event_type, actual, ask, place, detail)
        assert envelope is not None
        # Taken out of the events read ahead (inline: every call of an async run, and
        # every call of a sync one past the straight path, comes this way).
        if lane is None:
            self.finished = None
        elif lane[0] is envelope:
            lane.popleft()
        else:
            del lane[next(i for i, e in enumerate(lane) if e is envelope)]
        if lane is not None and not lane and lane is not self.own:
            # A child's branch is often done: forget it (read ahead, it comes back).
            # Lanes are keyed by the recorded branch of the events they hold.
            self._lanes.pop(branch_of(envelope.attributes), None)
        return envelope

    def _diverge(
        self,
        envelope: Envelope | None,
        event_type: EventType,
        actual: str | None,
        ask: Ask | None,
        place: Place,
        detail: str,
    ) -> None:
        """Diverge: ``envelope`` is not what the call asks for (a missing event, another
        kind of boundary, other input)."""
        findings = self._findings
        if envelope is None or (envelope.event_type == _FINISHED and event_type != _FINISHED):
            findings.diverge(
                DivergenceKind.MISSING_EVENT,
                self._turns.released + 1,
                expected=NOTHING,
                actual=asked(event_type, actual, ask),
                detail=self._nothing_left(place.branch),
                asked=None if ask is None else ask.input,
            )
        assert envelope is not None
        if envelope.event_type != event_type:
            findings.diverge(
                DivergenceKind.TYPE_MISMATCH,
                envelope.sequence,
                expected=named(envelope),
                actual=asked(event_type, actual, ask),
                asked=None if ask is None else ask.input,
            )
        if actual is not None and actual != envelope.input_digest:
            before = None if ask is None else self._bodies.recorded_input(envelope)
            findings.diverge(
                DivergenceKind.ARGUMENT_MISMATCH,
                envelope.sequence,
                expected=named(envelope),
                actual=asked(event_type, actual, ask),
                changes=() if before is None or ask is None else findings.changes(before, ask),
                asked=None if ask is None else ask.input,
                detail=detail,
            )

    def head(self, branch: int) -> Envelope | None:
        """The next recorded event of ``branch`` not yet asked for, reading ahead for it
        up to ``run.finished``; None when the branch has no more (-1: just read up to
        ``run.finished``)."""
        lane = self._lanes.get(branch)
        if lane:
            return lane[0]
        while not lane:
            if self.finished_read:
                return None
            envelope = self._next()
            if envelope is None:
                self.finished_read = True
                return None
            self.admit(envelope)
            lane = self._lanes.get(branch)
        return lane[0]

    def admit(self, envelope: Envelope, *, after_end: bool = False) -> None:
        """Take an event read from the log into the events read ahead."""
        expected = self._read + 1
        if envelope.sequence != expected:
            self._findings.diverge(
                DivergenceKind.SEQUENCE_GAP,
                expected,
                expected=NOTHING,
                actual=(envelope.event_type, None, None),
                detail=f"the log holds sequence {envelope.sequence} where {expected} belongs",
            )
        self._read = envelope.sequence
        if after_end:
            return
        if envelope.event_type == _FINISHED:
            self.finished = envelope
            self.finished_read = True
            self.recorded_status = envelope.attributes.get("status")
            self.recorded_error = envelope.attributes.get("error")
            return
        attributes = envelope.attributes
        if STARTED not in attributes and BRANCH not in attributes:
            self.own.append(envelope)  # one boundary at a time, as most runs go
            return
        self.concurrent = True
        branch = branch_of(attributes)
        lane = self._lanes.get(branch)
        if lane is None:
            lane = self._lanes[branch] = deque()
        lane.append(envelope)

    def after_end(self) -> Envelope | None:
        """The next event of the log past ``run.finished``, taken in; None at its end."""
        extra = self._next()
        if extra is not None:
            self.admit(extra, after_end=True)
        return extra

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
        self.head(-1)  # the whole run is read: any branch may hold the call
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

    def _nothing_left(self, branch: int) -> str:
        """Why a call of ``branch`` finds no recorded event: the run holds no more, or
        only on other branches (the code crosses a boundary on another thread or task
        than when it was recorded, or one the recording did not)."""
        where = f" of branch {branch}" if branch else ""
        other = self.left()
        if other is None:
            interrupted = _interrupted(self.finished, self._bodies)
            return f"the recorded run has no more boundary events{where}{interrupted}"
        return (
            f"the recorded run has no more boundary events{where or ' of the run itself'}; "
            f"it still holds a {other.event_type} at sequence {other.sequence}, recorded on "
            f"branch {branch_of(other.attributes)} (concurrent work)"
        )

    def left(self) -> Envelope | None:
        """The earliest recorded boundary event nobody asked for."""
        heads = [lane[0] for lane in self._lanes.values() if lane]
        return min(heads, key=lambda e: e.sequence, default=None)


def _interrupted(finished: Envelope | None, bodies: Bodies) -> str:
    """What to add when the recording ended on an interruption (Ctrl-C, a cancelled
    task): the code replayed goes on past the point where the recording stopped."""
    body = None if finished is None else bodies.recorded_body(finished)
    error = None if body is None else body.get("error")
    if not isinstance(error, dict) or error.get("type") not in _INTERRUPTIONS:
        return ""
    return (
        f": the recording was interrupted there ({error['type']}), and the code "
        "replayed goes on past that point"
    )


def _answers(envelope: Envelope | None, event_type: str, actual: str | None) -> bool:
    return (
        envelope is not None
        and envelope.event_type == event_type
        and (actual is None or actual == envelope.input_digest)
    )
