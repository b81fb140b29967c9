"""A whole history read from the event topic in one pass: ``replay --all``, ``verify --all``.

The topic is read once, partition by partition, from its low to its high watermark as
they stood when the scan started. Within a partition a run's events are assembled as
they arrive, and the run is handed to the caller's handler when its ``run.finished``
is read (so memory holds the runs in flight, not the history); a run still unfinished
at the partition's end (its agent still running, or its process died) is handed off
there, marked unfinished. Every message passes, in order:

1. the partition's :class:`~agent_blackbox.broker.EpochFence`, which drops a stale
   relay's copies;
2. decoding: a message that is not an envelope (random bytes, an unknown schema
   fingerprint or framing, an empty value, truncated Avro) is skipped and reported as a
   :class:`SkippedMessage`, and so is an envelope under another run's key;
3. placement: a run is read only in the partition its key maps to (as the run index
   reads it), so an event written to another partition is passed over and reported;
4. de-duplication: the first copy of each sequence counts, as :class:`KafkaRunSource`
   does.

A finished run that has events after its ``run.finished`` (the ``run.redacted`` note
retention appends) is handled again at the partition's end, by the handler's ``late``.

Partitions are shared among readers (one per core by default): this process and worker
processes, each reading whole partitions itself and handling their runs, so events
never cross a process boundary; only results do. A reader takes the next partition
(largest first) when it is done with one, so this process, which starts at once, reads
more of them than a worker that is still starting its interpreter, and the readers
finish together. Runs are handled in the order their last event arrives, not in the
order they started.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import queue
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Generic, Protocol, TypeVar

from confluent_kafka import Message

from agent_blackbox.broker import (
    EpochFence,
    GrantedEpochs,
    KafkaUnavailable,
    partition_of,
    read_ranges,
    watermarks,
)
from agent_blackbox.outbox.lifecycle import lease_epochs
from agent_blackbox.schemas import (
    BlackboxError,
    Envelope,
    EnvelopeCodec,
    EventType,
    Settings,
    UndecodableMessage,
)
from agent_blackbox.wiring import COMMAND_POOL

log = logging.getLogger(__name__)

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)

FETCH_BATCH = 5_000
"""Messages asked of the broker per call: a whole history is being read, not one run."""
PER_WORKER = 20_000
"""Messages below which one more worker process is not started by default: starting one
(a fresh interpreter importing the replayer) costs about as much as reading that many."""
PER_WORKER_RUNS = 1_000
"""Wanted runs below which one more worker process is not started by default: each run
has a cost of its own (setting up its replay, checking its end) besides its events',
so a history of many short runs is worth a worker sooner than its messages say."""


@dataclass(frozen=True, slots=True)
class SkippedMessage:
    """A message of the topic a reader passed over instead of stopping at it."""

    partition: int
    offset: int
    reason: str
    key: str | None = None
    """The message's key (a run id, when it was written under one)."""

    def describe(self) -> str:
        under = "" if self.key is None else f" under key {self.key!r}"
        return f"[{self.partition}]@{self.offset}{under}: {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "offset": self.offset,
            "key": self.key,
            "reason": self.reason,
        }


@dataclass(slots=True)
class AssembledRun:
    """One run's events as the topic holds them, de-duplicated, in sequence order."""

    run_id: str
    partition: int
    events: list[Envelope] = field(default_factory=list)
    finished: bool = False
    """``run.finished`` was read; otherwise the partition ended first."""

    @property
    def agent_id(self) -> str | None:
        return self.events[0].agent_id if self.events else None

    @property
    def last_sequence(self) -> int:
        return self.events[-1].sequence if self.events else 0


def undecodable(message: Message, codec: EnvelopeCodec) -> tuple[Envelope | None, str]:
    """The message's envelope, or None and why it is not one."""
    value = message.value()
    if not value:
        return None, "empty value: not an envelope"
    try:
        return codec.decode(value), ""
    except UndecodableMessage as exc:
        return None, str(exc)
    except BlackboxError as exc:  # e.g. a field the envelope refuses
        return None, f"{type(exc).__name__}: {exc}"


def message_headers(message: Message) -> list[tuple[str, bytes | str | None]]:
    """The message's headers as pairs (the client may give a mapping)."""
    headers = message.headers()
    if headers is None or isinstance(headers, list):
        return headers or []  # as the client gives them: no copy per message
    return list(headers.items())


def message_key(message: Message) -> str | None:
    raw = message.key()
    if raw is None:
        return None
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


@dataclass(frozen=True, slots=True)
class LateEvents:
    """New events of a run read after its ``run.finished`` (a ``run.redacted`` note
    appended when its keys were destroyed): the run as handed off was not all of it."""

    run_id: str
    partition: int


def assemble(
    messages: Iterable[Message],
    partition: int,
    *,
    fence: EpochFence,
    wanted: Collection[str] | None = None,
    codec: EnvelopeCodec | None = None,
    partitions: int | None = None,
) -> Iterator[AssembledRun | SkippedMessage | LateEvents]:
    """The runs of one partition's messages (read in offset order), each as soon as it
    is finished, the unfinished ones at the end; every message passed over; and, at
    the end, the finished runs that had events after ``run.finished``.

    Args:
        messages: the partition's messages, in offset order.
        partition: which partition they are from (for the fence and the reports).
        fence: the fence of this reader; asked for every message.
        wanted: only these runs are assembled (None: every run).
        codec: decodes envelopes (a new one by default).
        partitions: the topic's partition count: a run's events are read only in the
            partition its key maps to, as the run index does; copies written elsewhere
            are passed over and reported (None: not checked).
    """
    codec = codec or EnvelopeCodec()
    foreign: dict[str, int] = {}
    """Runs whose key maps to another partition → that partition."""
    open_runs: dict[str, AssembledRun] = {}
    done: dict[str, int] = {}
    """Handed-off run → its last sequence; only the ids stay in memory."""
    late: dict[str, None] = {}
    for message in messages:
        if not fence.admit(partition, message_headers(message)):
            continue
        key = message_key(message)
        # Every message is decoded, those of runs not asked for too: poison under any
        # key is reported.
        envelope, why = undecodable(message, codec)
        offset = message.offset() or 0
        if envelope is None:
            yield SkippedMessage(partition, offset, why, key)
            continue
        if key is not None and envelope.run_id != key:
            yield SkippedMessage(
                partition, offset, f"an envelope of run {envelope.run_id!r} under this key", key
            )
            continue
        run_id = envelope.run_id
        if wanted is not None and run_id not in wanted:
            continue
        if run_id in done:
            if envelope.sequence > done[run_id]:
                late[run_id] = None
            continue
        run = open_runs.get(run_id)
        if run is None:
            home = foreign.get(run_id)
            if home is None and partitions is not None:
                home = partition_of(run_id.encode("utf-8"), partitions)
                if home != partition:
                    foreign[run_id] = home
            if home is not None and home != partition:
                why = f"an event of run {run_id!r}, whose key maps to partition {home}"
                yield SkippedMessage(partition, offset, why, key)
                continue
            run = open_runs[run_id] = AssembledRun(run_id, partition)
        if envelope.sequence <= run.last_sequence:
            continue  # a duplicate: the first copy of each sequence counts
        run.events.append(envelope)
        if envelope.event_type == EventType.RUN_FINISHED:
            run.finished = True
            done[run_id] = envelope.sequence
            yield open_runs.pop(run_id)
    yield from open_runs.values()
    for run_id in late:
        yield LateEvents(run_id, partition)


class RunHandler(Protocol[R_co]):
    """What a worker does with each run it assembled."""

    def handle(self, run: AssembledRun) -> R_co:
        """The run's result; never raises for a problem of the run's own."""
        ...

    def missing(self, run_id: str, why: str, *, unread: bool) -> R_co:
        """The result of a wanted run the scan did not find (``why`` says so);
        ``unread`` when a partition could not be read to its end (the run may be there)."""
        ...

    def late(self, run_id: str) -> R_co | None:
        """The result of a run that had events after the ``run.finished`` it was handed
        off at, replacing the one :meth:`handle` gave; None keeps that one."""
        ...

    def close(self) -> None:
        """Release what the handler holds (its database connections)."""
        ...


class RunWork(Protocol[R_co]):
    """How a worker process makes its handler: a picklable recipe (settings, options),
    since the handler itself holds connections that cannot cross processes."""

    def start(self) -> RunHandler[R_co]: ...


@dataclass(frozen=True, slots=True)
class Handled(Generic[R]):
    """A run's result, as the scan hands it back."""

    run_id: str
    result: R


@dataclass(frozen=True, slots=True)
class PartitionFailed:
    """A partition that could not be read to its end; its unhandled runs are missing."""

    partition: int
    reason: str


@dataclass(frozen=True, slots=True)
class _Progress:
    messages: int


@dataclass(frozen=True, slots=True)
class _Dropped:
    count: int


@dataclass(frozen=True, slots=True)
class _Taken:
    """A reader started reading a partition."""

    reader: str
    partition: int
    stretch: tuple[int, int]


@dataclass(frozen=True, slots=True)
class _Finished:
    """A reader is done with the partition it took (read to its end, or failed)."""

    reader: str
    partition: int


@dataclass(frozen=True, slots=True)
class _Done:
    """A worker process takes no more partitions."""

    reader: str
    failure: str | None = None
    """Why it stopped before the partitions ran out."""


_Item = Handled[Any] | SkippedMessage | PartitionFailed | _Progress | _Dropped | _Taken | _Finished
Plan = Sequence[tuple[int, tuple[int, int]]]
Stretch = tuple[int, tuple[int, int]]
"""A partition and the offsets to read of it."""


@dataclass(slots=True)
class HistoryScan(Generic[R]):
    """A pass over the whole topic; iterate it for each run's :class:`Handled` result
    and every :class:`SkippedMessage`, then read the counters.

    Args:
        settings: the broker and the topic.
        work: makes each worker's handler.
        wanted: only these runs (None: every run the topic holds). A wanted run not
            found is handed to the handler's ``missing``.
        workers: readers: this process, and one worker process fewer (1 reads in this
            process only). By default one per core, but no more than one per
            :data:`PER_WORKER` messages or :data:`PER_WORKER_RUNS` wanted runs.
        on_progress: called with the messages read so far, as the scan goes.
    """

    settings: Settings
    work: RunWork[R]
    wanted: frozenset[str] | None = None
    workers: int | None = None
    on_progress: Callable[[int], None] | None = None
    total: int = 0
    """Messages the scan will read (known once iteration started)."""
    partitions: int = 0
    """The topic's partition count (known once iteration started)."""
    messages: int = 0
    dropped: int = 0
    """Messages the epoch fences refused (a stale relay's copies)."""
    skipped: list[SkippedMessage] = field(default_factory=list)
    failed: list[PartitionFailed] = field(default_factory=list)

    def __iter__(self) -> Iterator[Handled[R] | SkippedMessage]:
        """Raises:
        KafkaUnavailable: the topic's partitions cannot be listed (nothing was read).
        """
        marks = watermarks(self.settings, self.settings.topic)
        self.partitions = len(marks)
        ranges = {p: (low, high) for p, (low, high) in marks.items() if high > low}
        self.total = sum(high - low for low, high in ranges.values())
        wanted = 0 if self.wanted is None else len(self.wanted)
        readers = max(1, min(self.workers or _default_workers(self.total, wanted), len(ranges)))
        seen: set[str] = set()
        if readers > 1 and not _picklable(self.work):
            log.warning(
                "reading %s in this process: %r cannot be sent to worker processes",
                self.settings.topic,
                self.work,
            )
            readers = 1
        items = (
            _in_process(self, sorted(ranges.items()))
            if readers == 1
            else _shared(self, largest_first(ranges), readers)
        )
        for item in items:
            if isinstance(item, _Taken | _Finished):
                continue
            if isinstance(item, _Progress):
                self.messages += item.messages
                if self.on_progress is not None:
                    self.on_progress(self.messages)
            elif isinstance(item, _Dropped):
                self.dropped += item.count
            elif isinstance(item, PartitionFailed):
                self.failed.append(item)
            elif isinstance(item, SkippedMessage):
                self.skipped.append(item)
                yield item
            else:
                seen.add(item.run_id)
                yield item
        yield from self._missing(seen)

    def _missing(self, seen: set[str]) -> Iterator[Handled[R]]:
        if self.wanted is None or not (absent := sorted(self.wanted - seen)):
            return
        failed = "; ".join(f"[{f.partition}]: {f.reason}" for f in self.failed)
        why = (
            f"not found in topic {self.settings.topic}"
            + (f" (partitions not read to their end: {failed})" if failed else "")
            + "; the events index lists it: was the topic's retention shorter than the "
            "index's, or the topic recreated?"
        )
        handler = self.work.start()
        try:
            for run_id in absent:
                yield Handled(run_id, handler.missing(run_id, why, unread=bool(self.failed)))
        finally:
            handler.close()


def _lease_epochs(database_url: str) -> dict[int, int] | None:
    """The write side's granted lease epochs (asked once a reader meets a stamp past
    those it knows: about once per reader)."""
    engine = COMMAND_POOL.engine(database_url)
    try:
        return lease_epochs(engine)
    finally:
        engine.dispose()


def _picklable(work: object) -> bool:
    try:
        pickle.dumps(work)
    except (pickle.PicklingError, TypeError, AttributeError):
        return False
    return True


def _default_workers(messages: int, runs: int = 0) -> int:
    """Readers for ``messages`` of ``runs`` wanted runs: one per core, but no more than
    the messages or the runs pay a worker's start for."""
    worth = max(messages // PER_WORKER, runs // PER_WORKER_RUNS)
    return max(1, min(os.cpu_count() or 1, worth))


def largest_first(ranges: dict[int, tuple[int, int]]) -> list[Stretch]:
    """The order readers take partitions in: largest first, so that the last ones taken
    are short and the readers finish together."""
    return sorted(ranges.items(), key=lambda item: (item[1][0] - item[1][1], item[0]))


def _scan(
    settings: Settings,
    handler: RunHandler[Any],
    plan: Iterable[Stretch],
    wanted: frozenset[str] | None,
    partitions: int,
    *,
    reader: str = "",
) -> Iterator[_Item]:
    """One reader's partitions, one after another; closes ``handler`` at the end."""
    try:
        yield from _scan_partitions(settings, handler, plan, wanted, partitions, reader)
    finally:
        handler.close()


def _scan_partitions(
    settings: Settings,
    handler: RunHandler[Any],
    plan: Iterable[Stretch],
    wanted: frozenset[str] | None,
    partitions: int,
    reader: str,
) -> Iterator[_Item]:
    codec = EnvelopeCodec()
    granted = GrantedEpochs(partial(_lease_epochs, settings.database_url))
    for partition, (low, high) in plan:
        yield _Taken(reader, partition, (low, high))
        fence = EpochFence(granted)
        counted = _Counted(
            read_ranges(settings, settings.topic, {partition: (low, high)}, batch=FETCH_BATCH)
        )
        try:
            runs = assemble(
                counted, partition, fence=fence, wanted=wanted, codec=codec, partitions=partitions
            )
            for item in runs:
                if isinstance(item, SkippedMessage):
                    yield item
                elif isinstance(item, LateEvents):
                    if (again := handler.late(item.run_id)) is not None:
                        yield Handled(item.run_id, again)
                else:
                    yield Handled(item.run_id, handler.handle(item))
                yield _Progress(counted.take())
        except KafkaUnavailable as exc:
            yield PartitionFailed(partition, str(exc))
        yield _Progress(counted.take())
        if fence.dropped:
            yield _Dropped(fence.dropped)
        yield _Finished(reader, partition)


class _Counted:
    """Messages passed through, counted."""

    def __init__(self, messages: Iterator[Message]) -> None:
        self._messages = messages
        self._count = 0

    def __iter__(self) -> Iterator[Message]:
        for message in self._messages:
            self._count += 1
            yield message

    def take(self) -> int:
        count, self._count = self._count, 0
        return count


def _in_process(scan: HistoryScan[Any], plan: Plan) -> Iterator[_Item]:
    yield from _scan(scan.settings, scan.work.start(), plan, scan.wanted, scan.partitions)


def _taking(todo: Any) -> Iterator[Stretch]:
    """The partitions a reader takes from the shared queue, until it says there are no
    more (None)."""
    while (stretch := todo.get()) is not None:
        yield stretch


def _worker(
    settings: Settings,
    work: RunWork[Any],
    todo: Any,
    wanted: frozenset[str] | None,
    partitions: int,
    out: Any,
) -> None:
    reader = multiprocessing.current_process().name
    reading: int | None = None
    failure = None
    try:
        for item in _scan(settings, work.start(), _taking(todo), wanted, partitions, reader=reader):
            if isinstance(item, _Taken):
                reading = item.partition
            elif isinstance(item, _Finished):
                reading = None
            out.put(item)
    except Exception as exc:  # the partition it was reading fails; the others read the rest
        failure = f"worker failed: {type(exc).__name__}: {exc}"
        if reading is not None:
            out.put(PartitionFailed(reading, failure))
            out.put(_Finished(reader, reading))
    finally:
        out.put(_Done(reader, failure))


def _shared(scan: HistoryScan[Any], stretches: list[Stretch], readers: int) -> Iterator[_Item]:
    """The partitions shared by this process and ``readers - 1`` worker processes, each
    taking the next one from a queue when it is done with one. This process reads too,
    and between its own items passes on what the workers sent."""
    # Spawned, not forked: a fork would copy the parent's broker client threads and
    # database connections into the child.
    context = multiprocessing.get_context("spawn")
    todo = context.Queue()
    for stretch in stretches:
        todo.put(stretch)
    for _ in range(readers):
        todo.put(None)  # one "no more" per reader
    out = context.Queue(maxsize=10_000)
    processes = [
        context.Process(
            target=_worker,
            args=(scan.settings, scan.work, todo, scan.wanted, scan.partitions, out),
            name=f"blackbox-history-{n}",
            daemon=True,
        )
        for n in range(1, readers)
    ]
    for process in processes:
        process.start()
    workers = _Workers(processes, [partition for partition, _ in stretches])
    try:
        mine = _scan(scan.settings, scan.work.start(), _taking(todo), scan.wanted, scan.partitions)
        for item in mine:
            if isinstance(item, _Finished):
                workers.unread.discard(item.partition)
            yield item
            yield from workers.passed_on(out, wait=False)
        yield from workers.passed_on(out, wait=True)
        # Taken by a worker that was lost before it could say so.
        for partition in sorted(workers.unread):
            yield PartitionFailed(partition, "not read: the worker that took it was lost")
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
            process.join(timeout=10)
        out.close()
        todo.close()


class _Workers:
    """The worker processes of a shared scan, and the partition each is reading."""

    def __init__(self, processes: list[Any], partitions: list[int]) -> None:
        self._running = {process.name: process for process in processes}
        self._reading: dict[str, list[Stretch]] = {process.name: [] for process in processes}
        self.unread = set(partitions)
        """Partitions no reader has finished yet (nor failed)."""

    def passed_on(self, out: Any, *, wait: bool) -> Iterator[_Item]:
        """What the workers sent, until nothing waits (``wait``: until every worker is
        done or lost; a lost worker's partition in progress fails)."""
        while self._running:
            try:
                item = out.get(timeout=1.0) if wait else out.get_nowait()
            except queue.Empty:
                if not wait:
                    return
                watched: list[tuple[Any, Plan]] = [
                    (p, self._reading[name]) for name, p in self._running.items()
                ]
                for failed in _lost_workers(watched):
                    self.unread.difference_update(f.partition for f in failed)
                    yield from failed
                for name in [n for n, p in self._running.items() if p.exitcode not in (None, 0)]:
                    del self._running[name]
                continue
            if isinstance(item, _Taken):
                self._reading[item.reader][:] = [(item.partition, item.stretch)]
            elif isinstance(item, _Finished):
                self._reading[item.reader].clear()
                self.unread.discard(item.partition)
            elif isinstance(item, _Done):
                self._running.pop(item.reader, None)
                if item.failure is not None:
                    log.warning("%s stopped: %s", item.reader, item.failure)
                continue
            yield item


def _lost_workers(watched: list[tuple[Any, Plan]]) -> Iterator[list[PartitionFailed]]:
    """Workers that were killed (a worker that failed says so and exits 0): the
    partitions each was reading, failed. A lost worker is taken off ``watched``."""
    for entry in list(watched):
        process, plan = entry
        if process.exitcode is None or process.exitcode == 0:
            continue
        watched.remove(entry)
        reason = f"worker exited with status {process.exitcode}"
        yield [PartitionFailed(partition, reason) for partition, _ in plan]
