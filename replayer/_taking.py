"""Taking the recorded event each call of the replayed code stands for.

A call's event is found in the log (``_log.py``), its body opened and checked against
its digest (``_opening.py``), and it is handed back in its turn (``_turns.py``): the
three go together under the turns' lock, in the order that names the most precise
cause of a divergence.
"""

from __future__ import annotations

import asyncio
from typing import Any, NoReturn

from agent_blackbox.outbox.contract import Ask, Place, Placement, started_of
from agent_blackbox.replayer._divergence import (
    NOTHING,
    DivergenceKind,
    Findings,
    branch_label,
    named,
)
from agent_blackbox.replayer._log import SEQUENTIAL, RecordedLog
from agent_blackbox.replayer._opening import Bodies
from agent_blackbox.replayer._turns import Stalled, Turns
from agent_blackbox.schemas import Envelope, EventType

Taken = tuple[Envelope, dict[str, Any], Any]
"""A recorded event taken for a call: its envelope, its body and the output it recorded."""


class Taker:
    """Takes recorded events for the calls of the code, sync or async.

    Args:
        log: the recorded events read so far, by branch.
        bodies: opens and checks each event's body.
        turns: the order events go back in.
        findings: where divergences go.
    """

    def __init__(self, log: RecordedLog, bodies: Bodies, turns: Turns, findings: Findings) -> None:
        self._log = log
        self._bodies = bodies
        self._turns = turns
        self._findings = findings
        self.placement = Placement()
        """Places the code's calls among its concurrent work, as record mode did."""

    def begin(self, event_type: EventType) -> Place:
        """The place of a crossing that begins now, with the start number record mode
        gave it: the recorded one, when the branch's next event is of its kind."""
        place = self.placement.begin()
        with self._turns.lock:
            head = self._log.head(place.branch)
        started = self._turns.released + 1
        if head is not None and head.event_type == event_type:
            started = started_of(head.attributes, head.sequence)
        return Place(started, place.branch, place.parent)

    def take(
        self, event_type: EventType, actual: str | None, ask: Ask | None, place: Place | None
    ) -> Taken:
        """The recorded event a call of sync code asks for (see :meth:`take_locked`)."""
        log, turns = self._log, self._turns
        with turns.lock:
            if place is None and not (log.concurrent or log.own or log.finished_read):
                envelope = log.straight(event_type, actual)
                if envelope is not None:
                    body, output = self._bodies.open(envelope, ask)
                    turns.release(envelope)
                    return envelope, body, output
            if place is None:
                # Until the log shows concurrent work, every call is the run's own
                # branch's (see ``RecordedLog.claim``).
                place = self.placement.begin() if log.concurrent else SEQUENTIAL
            return self.take_locked(event_type, actual, ask, place, False)

    def take_locked(
        self,
        event_type: EventType,
        actual: str | None,
        ask: Ask | None,
        place: Place,
        strict: bool,
        *,
        detail: str = "",
    ) -> Taken:
        """The event the code asks for, checked in the order that names the most precise
        cause: sequence, type, input digest (``actual``, None to leave unchecked; a
        mismatch says ``detail``), body against output digest, then (when its turn comes)
        the chain hash (held: the turns' lock)."""
        begin = self.placement.begin
        envelope = self._log.claim(event_type, actual, ask, place, strict, begin, detail=detail)
        body, output = self._bodies.open(envelope, ask)
        if envelope.sequence != self._turns.released + 1:
            try:
                self._turns.wait(envelope)
            except Stalled:
                self.stalled(envelope)
        self._turns.release(envelope)
        return envelope, body, output

    def claim(self, ask: Ask, place: Place | None) -> tuple[Taken, asyncio.Future[None] | None]:
        """:meth:`take` for a task, in three parts (so a call whose turn has come costs
        no coroutine of its own: with origin tracking on, as an async replay has it,
        each one made costs its stack): the event, checked, and what the task awaits
        until its turn comes (None when it has: then :meth:`hand_back` at once; else
        ``await`` :meth:`turn` first). Tasks start in a repeatable order, so every call
        must find its event in its own branch."""
        if place is None:
            place = self.placement.begin()
        turns = self._turns
        with turns.lock:
            begin = self.placement.begin
            envelope = self._log.claim(ask.event_type, ask.input_digest, ask, place, True, begin)
            body, output = self._bodies.open(envelope, ask)
            waiting = None if envelope.sequence == turns.released + 1 else turns.future(envelope)
        return (envelope, body, output), waiting

    async def turn(self, envelope: Envelope, waiting: asyncio.Future[None]) -> None:
        """Wait for ``envelope``'s turn without blocking the loop.

        Raises:
            ReplayDivergence: the replay stopped meanwhile, or the turn never came
                (``concurrency_mismatch``).
        """
        try:
            await self._turns.wait_async(waiting)
        except Stalled:
            with self._turns.lock:
                self.stalled(envelope)

    def hand_back(self, envelope: Envelope) -> None:
        """Hand back the event a task claimed, its turn come.

        Raises:
            ReplayDivergence: the replay stopped meanwhile.
        """
        with self._turns.lock:
            if self._findings.fatal is not None:
                raise self._findings.fatal
            self._turns.release(envelope)

    async def take_async(self, ask: Ask, place: Place | None) -> Taken:
        """:meth:`take` for a task: waits for its turn without blocking the loop."""
        taken, waiting = self.claim(ask, place)
        if waiting is not None:
            await self.turn(taken[0], waiting)
        self.hand_back(taken[0])
        return taken

    def stalled(self, waiting: Envelope) -> NoReturn:
        """A call waited ``stall_timeout`` for an event the code never asked for."""
        sequence = self._turns.released + 1
        missing = self._log.left()
        self._findings.diverge(
            DivergenceKind.CONCURRENCY_MISMATCH,
            sequence,
            expected=named(missing) if missing is not None else NOTHING,
            actual=NOTHING,
            detail=(
                f"the code never asked for sequence {sequence} "
                f"({branch_label(missing)}) while sequence {waiting.sequence} waited "
                f"{self._turns.stall_timeout:g}s for it: it started a different set of "
                "concurrent children than was recorded"
            ),
            fatal=True,
        )
        raise AssertionError("unreachable")  # pragma: no cover
