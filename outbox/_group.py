"""Group commit: a run's non-effect events written many to a transaction (opt-in).

In per-event mode every boundary crossing is its own transaction, so an agent that reads
the clock, draws random numbers or calls cheap tools in a tight loop pays a commit per
event. With :class:`GroupCommit`, the crossings that cause nothing outside (clock reads,
random draws, tool calls, LLM calls, retrievals: :data:`BUFFERED`) are prepared at once,
exactly as in per-event mode (the same sequence numbers, chain hashes and recorded
times), and kept in the run's buffer; the buffer is written in one transaction:

- before an effect intent or receipt, a state transition or the run's end (these are
  never buffered, and everything recorded before them commits first);
- before an event that joins the caller's transaction (in its own transaction, first);
- when it holds ``max_events`` events, at the next crossing;
- ``max_delay_ms`` after its oldest event, from a timer (a thread per sync recorder, a
  task per async run);
- when the agent calls ``run.flush()``.

A sync run writes a full or due buffer behind itself: the batch goes to the run's writer
thread, which commits it while the agent goes on and the run buffers the next events on
top of it (the database work releases the GIL, and Postgres runs on another core). One
batch is in flight per run: a buffer that fills up again waits for it, and so does
everything that must commit after the buffered events (effects, transitions, joined
events, the end, ``run.flush()``), which then writes the rest first. The async run
writes its buffer at the boundary that asked for it, or in its timer task.

What a crash can lose: only the unflushed events of the process that crashed, that is,
non-effect events recorded since their run's last committed flush. For a sync run those
are the batch in flight and the buffer behind it: at most 2 × ``max_events`` events per
run (``max_events`` for an async run). Every committed run is still a contiguous prefix
of what the agent did, with a valid chain, and every effect intent and receipt whose
call returned is committed, because nothing is buffered past one. A replay of such a run
ends where its record ends.

A flush that fails (after the retries of a per-event append) raises
:class:`~agent_blackbox.outbox.EventsNotRecorded`, naming how many events are not
recorded, at the boundary that asked for it or, for a batch written behind the run or by
the timer, at the run's next boundary. The events stay buffered, prepared as they were (a
failed batch back ahead of what was buffered after it: the same order, sequences and
chain), so the next flush writes them or, after a commit the writer never heard back
from, finds them committed. A batch written behind the run that finds the run moved (a
joined transaction it counted on rolled back) comes back unwritten, without an error,
and the run prepares it again, with everything after it, and writes it itself.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agent_blackbox.outbox._errors import EventsNotRecorded
from agent_blackbox.outbox._writer import Cursor, PreparedEvent
from agent_blackbox.schemas import BlackboxError, Envelope, env_flag

if TYPE_CHECKING:
    from agent_blackbox.outbox._boundaries import Crossing
    from agent_blackbox.outbox._core import RunCore

BUFFERED = frozenset({"clock.read", "random.draw", "tool.call", "llm.call", "retrieval"})
"""The event types a run buffers in group commit mode: crossings that cause nothing."""


@dataclass(frozen=True, slots=True)
class GroupCommit:
    """Group commit mode of a recorder: each run buffers its clock reads, random draws,
    tool and LLM calls and retrievals, prepared as in per-event mode, and writes them in
    one transaction before its next effect intent or receipt, state transition, joined
    event or end, once ``max_events`` wait, ``max_delay_ms`` after the oldest, or at
    ``run.flush()``.

    A sync run writes a full or due buffer behind itself, in a writer thread, while it
    buffers the next events (one batch in flight per run).

    What a crash can lose: only the unflushed events of the crashing process, non-effect
    events recorded since their run's last committed flush: for a sync run, the batch in
    flight and the buffer behind it, at most 2 × ``max_events`` events per run
    (``max_events`` for an async run). Every committed run stays a contiguous prefix of
    what the agent did, with an intact chain, and no effect intent or receipt whose call
    returned is lost. A failed flush raises
    :class:`~agent_blackbox.outbox.EventsNotRecorded` and keeps the events buffered.

    Args:
        max_delay_ms: the longest a buffered event waits before it is written.
        max_events: the most events a run's buffer holds.
    """

    max_delay_ms: float = 50.0
    max_events: int = 256

    def __post_init__(self) -> None:
        if not self.max_delay_ms > 0:
            raise ValueError(f"GroupCommit.max_delay_ms must be > 0, not {self.max_delay_ms!r}")
        if isinstance(self.max_events, bool) or not (
            isinstance(self.max_events, int) and self.max_events > 0
        ):
            raise ValueError(
                f"GroupCommit.max_events must be an integer > 0, not {self.max_events!r}"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> GroupCommit | None:
        """The mode ``BLACKBOX_GROUP_COMMIT`` asks for (``on``/``off``; off when unset),
        with ``BLACKBOX_GROUP_COMMIT_MS`` and ``BLACKBOX_GROUP_COMMIT_EVENTS``.

        Raises:
            ValueError: a variable holds something else than it takes.
        """
        env = os.environ if environ is None else environ
        if not env_flag("BLACKBOX_GROUP_COMMIT", env):
            return None
        defaults = cls()
        delay = _number(env, "BLACKBOX_GROUP_COMMIT_MS", defaults.max_delay_ms, float)
        events = _number(env, "BLACKBOX_GROUP_COMMIT_EVENTS", defaults.max_events, int)
        return cls(max_delay_ms=delay, max_events=int(events))


def _number(
    env: Mapping[str, str], name: str, default: float, kind: Callable[[str], float]
) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return kind(raw)
    except ValueError:
        message = f"{name}={raw!r} is not a number: give a positive {kind.__name__}"
        raise ValueError(message) from None


def buffered(crossing: Crossing) -> bool:
    """Whether a group-commit run keeps ``crossing`` in its buffer."""
    return crossing.event_type in BUFFERED


@dataclass(slots=True)
class Buffered:
    """A buffered crossing, and the event it was prepared as."""

    crossing: Crossing
    event_id: str
    event: PreparedEvent


@dataclass(slots=True)
class Batch:
    """The events of one flush, kept across the retries of its transaction and across
    failed flushes: a retry after a commit the writer never heard back from finds those
    it committed at the run's head and writes only the rest."""

    entries: list[Buffered] = field(default_factory=list)
    since: float = 0.0
    """When its oldest event was buffered (``time.monotonic()``)."""
    behind: bool = False
    """Written behind the run (a sync run's writer thread): the run prepares its next
    events on these, so a flush that finds the run moved must not prepare them again."""
    moved: bool = False
    """A flush behind the run found it moved: nothing was written, and the batch must be
    prepared again, with every event after it, by the run itself."""

    @property
    def events(self) -> list[PreparedEvent]:
        return [entry.event for entry in self.entries]

    def committed(self, head: Cursor) -> int:
        """How many of the first events ``head`` shows committed (an earlier attempt's
        commit the writer never heard back from): 0 when it is none of them."""
        for position, entry in enumerate(self.entries):
            envelope = entry.event.envelope
            if (envelope.sequence, envelope.chain_hash) == (head.sequence, head.chain_head):
                return position + 1
        return 0

    def drop(self, count: int) -> None:
        """Forget the first ``count`` events: they are committed."""
        del self.entries[:count]

    def rebase(self, core: RunCore, committed: Cursor) -> bool:
        """Prepare every event again after ``committed`` (the run moved on under this
        writer, or a joined transaction it counted on rolled back); the crossings and
        event ids stay. False, and nothing prepared, for a batch written behind the run
        (:attr:`moved`)."""
        if self.behind:
            self.moved = True
            return False
        core.cursor = committed
        for entry in self.entries:
            entry.event = core.prepare(entry.crossing, entry.event_id)
            core.advanced(entry.event)
        return True


class RunBuffer:
    """The buffered events of one run, when the oldest of them is due, and (sync runs) the
    batch a writer thread is writing behind the run."""

    def __init__(self, config: GroupCommit) -> None:
        self.config = config
        self.batch = Batch()
        self.in_flight: Batch | None = None
        """The batch being written behind the run; its events come before the buffer's."""
        self.stale = False
        """The buffer starts with a batch that came back moved: the run writes it itself."""

    def __len__(self) -> int:
        return len(self.batch.entries)

    @property
    def full(self) -> bool:
        return len(self) >= self.config.max_events

    @property
    def delay_s(self) -> float:
        return self.config.max_delay_ms / 1000.0

    @property
    def deadline(self) -> float:
        """When the oldest buffered event is due (``time.monotonic()``)."""
        return self.batch.since + self.delay_s

    def add(self, core: RunCore, crossing: Crossing, event_id: str) -> Envelope:
        """Prepare ``crossing`` as the run's next event and keep it; its envelope."""
        event = core.prepare(crossing, event_id)
        batch = self.batch
        if not batch.entries:
            batch.since = time.monotonic()
        batch.entries.append(Buffered(crossing, event_id, event))
        return core.advanced(event)

    def flushed(self) -> None:
        self.batch = Batch()
        self.stale = False

    def take(self) -> Batch:
        """Hand the buffer to the run's writer thread: it is in flight, and the run
        buffers its next events after it."""
        batch, self.batch = self.batch, Batch()
        batch.behind = True
        self.in_flight = batch
        return batch

    def returned(self, batch: Batch) -> None:
        """Take an in-flight batch back, unwritten, ahead of what was buffered since: the
        same events, in the same order, with the same sequences."""
        batch.behind = False
        later = self.batch
        if later.entries:
            batch.entries += later.entries
        self.batch = batch
        self.stale = self.stale or batch.moved
        batch.moved = False

    def failed(self, run_id: str, exc: BlackboxError) -> EventsNotRecorded:
        """The agent's error for a flush of this buffer that failed with ``exc``."""
        return EventsNotRecorded(run_id, len(self), exc)


IDLE_S = 1.0
"""How long a writer thread of group commit waits for work before it ends (the next
batch starts another): a thread started per batch costs the agent a thread start, and
waiting for the new thread to run, every few hundred events."""


class Flusher:
    """Writes a sync recorder's buffers when their oldest event is due: one thread,
    started when a buffer is waiting and ending once none has waited for a second."""

    def __init__(self) -> None:
        self._due: dict[object, tuple[float, Callable[[], None]]] = {}
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def schedule(self, key: object, deadline: float, flush: Callable[[], None]) -> None:
        """Call ``flush`` at ``deadline`` unless ``key`` is already waiting or cancelled."""
        with self._wake:
            if key in self._due:
                return
            self._due[key] = (deadline, flush)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="blackbox-group-commit", daemon=True
                )
                self._thread.start()
            self._wake.notify()

    def cancel(self, key: object) -> None:
        with self._wake:
            self._due.pop(key, None)

    def _run(self) -> None:
        try:
            while flushes := self._next():
                # Outside the condition: a flush takes its run's lock and waits on
                # Postgres, while the run's writer may be scheduling under that lock.
                for flush in flushes:
                    flush()
        finally:
            with self._wake:  # however it ended, the next schedule starts a thread
                if self._thread is threading.current_thread():
                    self._thread = None

    def _next(self) -> list[Callable[[], None]]:
        """The flushes that are due, waiting for the first; empty (and the thread ends)
        once nothing has waited for :data:`IDLE_S`."""
        with self._wake:
            while self._due or (self._wake.wait(IDLE_S) and self._due):
                now = time.monotonic()
                first = min(deadline for deadline, _ in self._due.values())
                if first <= now:
                    ready = [key for key, (deadline, _) in self._due.items() if deadline <= now]
                    return [self._due.pop(key)[1] for key in ready]
                self._wake.wait(first - now)
            self._thread = None
            return []
