"""Replay mode: the same agent code, driven from a recorded run.

:class:`ReplayRun` and :class:`AsyncReplayRun` are the second driver of the boundaries'
step generators (``agent_blackbox.outbox._steps``), and their public surface is the
recording runs' own (``agent_blackbox.outbox._surface``). Nothing is called: every step
takes the next recorded event that answers what the code asks, checks that the code asks
for the same kind of thing with the same input (by digest), checks the recorded body
against its output digest, and hands back what came of the call, rebuilt as
``agent_blackbox.outbox._crossings`` reads it. Divergences name the sequence, the
expected and actual type and digests, and the call site; never a payload.

Reading the log is ``_log.py``'s, the order results go back in ``_turns.py``'s, opening
bodies ``_opening.py``'s, and what a divergence says ``_divergence.py``'s.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

from agent_blackbox.outbox.contract import (
    AsyncBoundaries,
    Begin,
    Boundaries,
    Call,
    Contract,
    Cross,
    Draws,
    EffectPolicy,
    End,
    Hole,
    Scrub,
    Step,
    Steps,
    ToolPolicy,
    UnrecordedCall,
)
from agent_blackbox.replayer._divergence import (
    NOTHING,
    Divergence,
    DivergenceKind,
    Findings,
    ReplayDivergence,
    asked,
    how_it_ended,
    named,
)
from agent_blackbox.replayer._log import ENDING, OPENING, RecordedLog
from agent_blackbox.replayer._opening import (
    BlobReader,
    Bodies,
    DigestKeys,
    Restorer,
    guarded,
    run_digest,
)
from agent_blackbox.replayer._sites import entry_site, raised_at, site_of
from agent_blackbox.replayer._taking import Taken, Taker
from agent_blackbox.replayer._turns import Turns
from agent_blackbox.schemas import BlackboxError, Envelope, EventType, PayloadPipeline

T = TypeVar("T")


class ReplayCore:
    """What the replayed code decided so far, as its boundaries see it: the run's id, the
    boundary contract of the rules and digest it was recorded with, the state it set."""

    def __init__(self, run_id: str, contract: Contract) -> None:
        self.run_id = run_id
        self.contract = contract
        self.state: str | None = None
        self.state_digest: str | None = None

    def check_active(self) -> None:
        """Nothing to check before a crossing in replay: taking its recorded event says
        whether the replay can go on."""


class _Offline:
    """The tools, effects and randomness of a replay run: never called, since every
    boundary is answered from the log."""

    def call(
        self, tool: str, args: tuple[Any, ...], kwargs: Mapping[str, Any], fn: Callable[..., Any]
    ) -> Any:
        raise AssertionError("replay never calls a tool")  # pragma: no cover

    def perform(
        self,
        effect: str,
        idempotency_key: str,
        arguments: Mapping[str, Any],
        perform: Callable[[str], Any],
    ) -> Any:
        raise AssertionError("replay never causes an effect")  # pragma: no cover

    def random(self) -> float:
        raise AssertionError("replay never draws")  # pragma: no cover

    def randint(self, a: int, b: int) -> int:
        raise AssertionError("replay never draws")  # pragma: no cover


_OFFLINE = _Offline()


class ReplayRun(Boundaries):
    """An :class:`~agent_blackbox.outbox.AgentRun` that answers from a recorded run.

    Every input it compares is built by the same boundary contract as record mode's
    (:mod:`agent_blackbox.outbox.contract`), under the redaction rules the run was
    recorded with, by the same step generators.

    Concurrent work replays. Each call is matched to the next recorded event of its
    branch (see ``_log.py``); results are handed back in the recorded completion order:
    a call whose event completed later waits until every earlier one was handed back.
    If the code never asks for an event others wait behind (it left out a child), the
    replay reports ``concurrency_mismatch`` after ``stall_timeout`` seconds.

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

    core: ReplayCore
    _tools: ToolPolicy = _OFFLINE
    _effects: EffectPolicy = _OFFLINE
    _draws: Draws = _OFFLINE

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
        self._findings = findings = Findings(
            reveal=reveal_values, entry_site=entry_site(entry), on_fatal=self._stopped
        )
        self._turns = turns = Turns(findings, stall_timeout)
        self._bodies = Bodies(pipeline, blobs, findings, turns)
        self._restore = Restorer(findings, entry)
        self._log = RecordedLog(guarded(events, findings), findings, turns, self._bodies)
        self._taker = taker = Taker(self._log, self._bodies, turns, findings)
        self._take = taker.take
        with turns.lock:
            first = self._log.head(0)
        self._bodies.digest = run_digest(first, digests)
        started, body, _ = self._take(EventType.RUN_STARTED, None, None, OPENING)
        findings.run_id = started.run_id
        # The rules the run was recorded under: what the code hands over now is
        # scrubbed the same way before its digest is compared.
        contract = Contract(Scrub.recorded_in(started.attributes), self._bodies.digest)
        self._bodies.requests = contract.request_split
        contract.expected = self._log.expected_crossing
        self.core = ReplayCore(started.run_id, contract)
        self.snapshot_body = body
        """The recorded ``run.started`` body: the run's input snapshot."""

    # What the replay knows -----------------------------------------------------------

    @property
    def run_id(self) -> str:
        """The id of the recorded run."""
        return self.core.run_id

    @property
    def input(self) -> Any:
        """The recorded input of the run, with its types."""
        body = self.snapshot_body
        return self._restore.value(json.loads(body["input_json"]), body.get("input_codec"))

    @property
    def last_sequence(self) -> int:
        """The sequence of the last recorded event handed back."""
        return self._turns.released

    @property
    def consumed(self) -> int:
        """How many recorded events were handed back."""
        return self._turns.consumed

    @property
    def stall_timeout(self) -> float:
        """How long a call waits for its turn before the replay decides the code will
        never ask for the event before it."""
        return self._turns.stall_timeout

    @property
    def recorded_status(self) -> str | None:
        """How the recorded run ended (``run.finished``'s status: ``succeeded``,
        ``failed``, ...), once the replay read that far."""
        return self._log.recorded_status

    @property
    def recorded_error(self) -> str | None:
        """The type of the error the recorded run failed with, once read."""
        return self._log.recorded_error

    @property
    def setup_error(self) -> BlackboxError | None:
        """Why the replay could not go on through no fault of the code, kept also when
        the agent's code caught it."""
        return self._findings.setup_error

    @property
    def limitations(self) -> list[tuple[int, str]]:
        """Events checked only in part, as (sequence, note): LLM calls recorded truncated
        over the ceiling, whose reduced response was handed back unchecked; calls that
        went online because the replay allowed it."""
        return self._findings.limitations

    @property
    def divergences(self) -> tuple[Divergence, ...]:
        """The state and content divergences found so far, the first of each level."""
        return self._findings.divergences

    def drives_here(self) -> None:
        """The current task or thread drives the agent's entry: it is the run's own
        branch, as it was in record mode (see ``Placement.root``)."""
        self._taker.placement.root()

    def flush(self) -> None:
        """Nothing is buffered in replay: the recording run's group-commit flush, kept so
        that agent code calling it replays unchanged."""

    @contextmanager
    def joined(self, connection: Any) -> Iterator[ReplayRun]:
        """Record mode appends inside the caller's transaction; replay writes nothing."""
        yield self

    def unrecorded(self, hole: Hole) -> None:
        """The code tried to reach outside the process through no boundary: refused, and
        the replay's ``unrecorded_call`` divergence (or, when the network is allowed, let
        through and noted as a limitation).

        Raises:
            UnrecordedCall: the call is refused (a connection error, for the client).
        """
        findings = self._findings
        if self._allow_network:
            findings.limitations.append((self._turns.released, f"went online: {hole.describe()}"))
            return
        with self._turns.lock:
            head = None
            if findings.fatal is None and findings.unreadable is None:
                # The next recorded event: the run's own, else its end (run.finished is
                # kept apart from the branches once read).
                head = self._log.head(0) or self._log.finished
        target = hole.host if hole.port is None else f"{hole.host}:{hole.port}"
        try:
            findings.diverge(
                DivergenceKind.UNRECORDED_CALL,
                self._turns.released + 1,
                expected=named(head) if head is not None else NOTHING,
                actual=("network", None, f"{hole.what} to {target}"),
                detail="replay never goes online: record the call through the run, or "
                "replay with --allow-network",
                fatal=True,
                site=site_of(hole),
            )
        except ReplayDivergence as exc:
            raise UnrecordedCall(hole, "replay never goes online") from exc

    # The driver: each step answered from the log ----------------------------------

    def _drive(self, boundary: Steps[T]) -> T:
        reply: Any = None
        failed: BaseException | None = None
        while True:
            try:
                step = boundary.send(reply) if failed is None else boundary.throw(failed)
            except StopIteration as returned:
                return returned.value  # type: ignore[no-any-return]
            if type(step) is Call:  # the most frequent: take its event, read what came of it
                ask, _, read, _, _, place = step
                _, body, output = self._take(ask.event_type, ask.input_digest, ask, place)
                try:
                    reply, failed = read(self._restore, body, output), None
                except Exception as exc:  # what the call raised: thrown into the boundary
                    reply, failed = None, exc
            else:
                reply, failed = self._answer(step), None

    def _answer(self, step: Step) -> Any:
        """What a step other than a call gives in replay."""
        if isinstance(step, Cross):
            ask = step.ask
            taken = self._take(ask.event_type, ask.input_digest, ask, step.place)
            return self._crossed(step, taken)
        if isinstance(step, Begin):
            return self._taker.begin(step.event_type)
        if isinstance(step, End):
            return self._end(step)
        raise TypeError(f"replay does not answer {type(step).__name__}: it opens no crossing")

    def _crossed(self, step: Cross, taken: Taken) -> tuple[Envelope, Any]:
        """The envelope and output of a crossing that calls nothing, from its recorded
        event; the output the code decides (a transition's state) is checked against
        the recorded digest."""
        envelope, _, output = taken
        if step.decided is not None:
            actual = step.decided(self.core.contract, step.ask)
            if actual != envelope.output_digest:
                kind, _, name = asked(envelope.event_type, actual, step.ask)
                self._findings.diverge(
                    DivergenceKind.STATE_MISMATCH,
                    envelope.sequence,
                    expected=(envelope.event_type, envelope.output_digest, name),
                    actual=(kind, actual, name),
                )
        return envelope, output

    def _stopped(self) -> None:
        """A divergence stopped the replay: every call waiting for its turn raises it."""
        self._turns.wake_all()

    # The end of the run -------------------------------------------------------------

    def _end(self, step: End) -> Envelope:
        """Check the recorded ``run.finished`` against how the code ended, then that
        every recorded event was consumed.

        Raises:
            ReplayDivergence: the first divergence of each level the replay found.
        """
        findings, core = self._findings, self.core
        if findings.unreadable is not None:
            raise findings.unreadable
        self._turns.unwatch()
        if findings.fatal is not None:
            raise findings.fatal  # the agent's code caught it; the run diverged all the same
        status, output, error = step.status, step.output, step.error
        ending = core.contract.finish(status, output, error, core.state_digest)
        findings.ending = True
        findings.end_site = raised_at(error) or findings.entry_site
        how = how_it_ended(error, findings.reveal)
        with self._turns.lock:
            self._log.head(-1)  # reads up to run.finished
            left = self._log.left()
            if left is not None:
                findings.diverge(
                    DivergenceKind.UNCONSUMED_EVENTS,
                    left.sequence,
                    expected=named(left),
                    actual=(EventType.RUN_FINISHED, None, None),
                    detail=f"the code ended{how} before consuming every recorded event",
                )
            ask = ending.ask
            ended = f"the code ended{how}" if how else "the code ended without an error"
            envelope, _, recorded = self._taker.take_locked(
                EventType.RUN_FINISHED, ask.input_digest, ask, ENDING, True, detail=ended
            )
        if recorded["final_state_digest"] != core.state_digest:
            findings.diverge(
                DivergenceKind.STATE_MISMATCH,
                envelope.sequence,
                expected=(envelope.event_type, recorded["final_state_digest"], None),
                actual=(EventType.RUN_FINISHED, core.state_digest, None),
                detail="final state",
            )
        renamed = self._restore.as_recorded(error, recorded["error"])
        if renamed is not error:
            ending = core.contract.finish(status, output, renamed, core.state_digest)
        actual = core.contract.output_digest(ending, version=envelope.body_version)
        if actual != envelope.output_digest:
            findings.diverge(
                DivergenceKind.OUTPUT_MISMATCH,
                envelope.sequence,
                expected=(envelope.event_type, envelope.output_digest, None),
                actual=(EventType.RUN_FINISHED, actual, None),
                detail=f"the code ended{how}" if how else "",
            )
        self._after_end()
        if findings.found:
            found = findings.divergences
            raise ReplayDivergence(found[0], found)
        return envelope

    def _after_end(self) -> None:
        """Notes of redaction may follow the end (chained); anything else may not."""
        with self._turns.lock:
            while (extra := self._log.after_end()) is not None:
                if extra.event_type != EventType.RUN_REDACTED:
                    self._findings.diverge(
                        DivergenceKind.UNCONSUMED_EVENTS,
                        extra.sequence,
                        expected=named(extra),
                        actual=NOTHING,
                        detail="events recorded after run.finished",
                    )
                self._bodies.open(extra)
                self._turns.release(extra)


class AsyncReplayRun(AsyncBoundaries):
    """The asyncio twin of :class:`ReplayRun` (what an ``async`` agent entry gets in
    replay): the same log and checks, with boundaries to ``await``; concurrent tasks
    wait for their turn without blocking the loop. ``replay`` is the sync twin, which
    answers sync code called from the agent's coroutines (a sync tool)."""

    replaying = True
    """A replay run: integrations answer from the log."""

    core: ReplayCore
    _tools: ToolPolicy = _OFFLINE
    _effects: EffectPolicy = _OFFLINE
    _draws: Draws = _OFFLINE

    def __init__(self, replay: ReplayRun) -> None:
        self.replay = replay
        self.core = replay.core

    @property
    def run_id(self) -> str:
        """The id of the recorded run."""
        return self.replay.run_id

    @property
    def input(self) -> Any:
        """The recorded input of the run, with its types."""
        return self.replay.input

    @property
    def last_sequence(self) -> int:
        """The sequence of the last recorded event handed back."""
        return self.replay.last_sequence

    def unrecorded(self, hole: Hole) -> None:
        """See :meth:`ReplayRun.unrecorded`."""
        self.replay.unrecorded(hole)

    async def flush(self) -> None:
        """Nothing is buffered in replay (see :meth:`ReplayRun.flush`)."""

    async def _drive(self, boundary: Steps[T]) -> T:
        replay, taker = self.replay, self.replay._taker
        reply: Any = None
        failed: BaseException | None = None
        while True:
            try:
                step = boundary.send(reply) if failed is None else boundary.throw(failed)
            except StopIteration as returned:
                return returned.value  # type: ignore[no-any-return]
            if type(step) is Call:
                ask, _, read, _, _, place = step
                (envelope, body, output), waiting = taker.claim(ask, place)
                if waiting is not None:  # an event completed before it is not handed back
                    await taker.turn(envelope, waiting)
                taker.hand_back(envelope)
                try:
                    reply, failed = read(replay._restore, body, output), None
                except Exception as exc:  # what the call raised: thrown into the boundary
                    reply, failed = None, exc
            elif isinstance(step, Cross):
                taken = await taker.take_async(step.ask, step.place)
                reply, failed = replay._crossed(step, taken), None
            else:
                reply, failed = replay._answer(step), None  # no turn to wait for
