"""The moving parts of the latency and scale-out benches: paced writers, relays and
view consumers as subprocesses, and watchers that note when each event became visible.

Every time here is wall-clock ``time.time()`` on one machine, so times taken in
different processes compare. An event is named by ``(run_id, sequence)``:

- its *commit time* is taken by the writer right after the recorder call that appended
  it returned, i.e. once its transaction's COMMIT was acknowledged to the agent;
- its *visible time* is taken by a plain consumer right after ``poll()`` handed it over
  (:class:`PlainWatcher`), or by a poller the first time the runs view's
  ``last_sequence`` covered it (:class:`ViewWatcher`).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, TopicPartition
from sqlalchemy import Engine, create_engine, text

from agent_blackbox.outbox import Recorder, Run, RunSnapshot
from agent_blackbox.schemas import EnvelopeCodec, Settings
from bench._common import console, percentile

EventKey = tuple[str, int]
"""``(run_id, sequence)``: one event."""


# -- paced writers -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Load:
    """A steady write load: ``rate`` events/s over ``runs`` concurrent runs, recorded by
    ``processes`` writer processes (one thread per run)."""

    rate: float = 1_000.0
    seconds: float = 20.0
    runs: int = 20
    processes: int = 2


@dataclass(slots=True)
class Written:
    """What the writers committed, and when."""

    commits: dict[EventKey, float] = field(default_factory=dict)
    started: float = 0.0
    """When the paced window began (the runs were started just before)."""
    append_ms: list[float] = field(default_factory=list)
    """How long each append took (the recorder call, COMMIT included)."""

    @property
    def rate(self) -> float:
        """Events/s the writers reached (below the asked rate when appends took longer
        than the schedule allows: late appends run back to back)."""
        inside = [t for t in self.commits.values() if t >= self.started]
        return len(inside) / max(max(inside, default=0.0) - self.started, 1e-9)

    def merge(self, other: Written) -> None:
        """Add what another writer process committed."""
        self.commits.update(other.commits)
        self.append_ms.extend(other.append_ms)


_WRITERS_START_S = 5.0
"""Time the writer processes get to start (a fresh interpreter each) before the paced
window opens for all of them at once."""


class Writers:
    """``load.processes`` processes of threads, each thread recording one run through
    the public :class:`~agent_blackbox.outbox.Recorder` at ``load.rate / load.runs``
    events/s.

    Processes of their own keep the writers off the watchers' interpreter lock, and
    spread the recorder's own CPU (about a millisecond per event) over the cores. Each
    thread appends on a fixed schedule (a late append does not push the next ones back),
    cycling through clock, random and tool events.
    """

    def __init__(self, settings: Settings, load: Load, *, agent_id: str) -> None:
        context = multiprocessing.get_context("spawn")
        self._results: multiprocessing.Queue[Any] = context.Queue()
        self.started = time.time() + _WRITERS_START_S
        runs = [range(p, load.runs, load.processes) for p in range(load.processes)]
        self._processes = [
            context.Process(
                target=_write,
                args=(settings, load, mine, self.started, agent_id, self._results),
                name=f"bench-writers-{p}",
                daemon=True,
            )
            for p, mine in enumerate(runs)
        ]
        self._load = load

    def __enter__(self) -> Writers:
        for process in self._processes:
            process.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        for process in self._processes:
            if process.is_alive():
                process.terminate()
            process.join(10)

    def result(self) -> Written:
        """Wait for the writers to finish; what they committed.

        Raises:
            RuntimeError: a writer process failed or took far longer than its load.
        """
        deadline = time.monotonic() + _WRITERS_START_S + self._load.seconds + 120
        written = Written(started=self.started)
        for _ in self._processes:
            try:
                outcome = self._results.get(timeout=max(deadline - time.monotonic(), 0.1))
            except Exception as exc:  # queue.Empty: a process died or hung
                raise RuntimeError("a writer process sent no result in time") from exc
            if isinstance(outcome, str):
                raise RuntimeError(f"a writer process failed: {outcome}")
            written.merge(outcome)
        return written


def _write(
    settings: Settings, load: Load, mine: range, started: float, agent_id: str, results: Any
) -> None:
    try:
        results.put(_write_runs(settings, load, mine, started, agent_id))
    except Exception as exc:  # reported to the parent, which raises it
        results.put(f"{type(exc).__name__}: {exc}")


def _write_runs(
    settings: Settings, load: Load, mine: range, started: float, agent_id: str
) -> Written:
    engine = create_engine(settings.database_url, pool_size=len(mine) + 1, max_overflow=2)
    recorder = Recorder(engine, settings=settings)
    written = Written(started=started)
    lock = threading.Lock()
    runs = []
    for index in mine:
        snapshot = RunSnapshot(code_version="bench", input={"index": index})
        run = recorder.start_run(snapshot, agent_id=agent_id)
        written.commits[(run.run_id, 1)] = time.time()
        runs.append((index, run))
    if (late := time.time() - started) > 0:
        console.log(f"[yellow]a writer process started {late:.1f} s late: it catches up[/]")
    threads = [
        threading.Thread(target=_paced, args=(run, index, load, written, lock), daemon=True)
        for index, run in runs
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for _, run in runs:
        run.finish(output={"done": True})
        written.commits[(run.run_id, run.last_sequence)] = time.time()
    engine.dispose()
    return written


def _paced(run: Run, index: int, load: Load, written: Written, lock: threading.Lock) -> None:
    interval = load.runs / load.rate
    due = written.started + interval * index / load.runs  # spread the runs over a tick
    finished = written.started + load.seconds
    step = 0
    while due < finished:
        if (wait := due - time.time()) > 0:
            time.sleep(wait)
        before = run.last_sequence
        began = time.perf_counter()
        _step(run, step)
        committed = time.time()
        took = (time.perf_counter() - began) * 1000
        with lock:
            written.append_ms.append(took)
            for sequence in range(before + 1, run.last_sequence + 1):
                written.commits[(run.run_id, sequence)] = committed
        step += 1
        due += interval


def _step(run: Run, step: int) -> None:
    """One cheap boundary (a clock read, a random draw, a small tool call): the bench
    is about the path after COMMIT, so the writers spend as little CPU as they can."""
    kind = step % 4
    if kind == 2:
        run.call("lookup", _lookup, step)
    elif kind == 3:
        run.random()
    else:
        run.now()


def _lookup(item: int) -> dict[str, int]:
    return {"item": item, "stock": item * 7 % 101}


# -- relays and consumers as subprocesses ------------------------------------------------


def worker_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The environment of a ``blackbox`` subprocess working on ``settings``."""
    return {
        **os.environ,
        "BLACKBOX_DATABASE_URL": settings.database_url,
        "BLACKBOX_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "BLACKBOX_TOPIC": settings.topic,
        "BLACKBOX_PARTITIONS": str(settings.partitions),
        "BLACKBOX_OUTBOX_SHARDS": str(settings.outbox_shards),
        **extra,
    }


class Worker:
    """One ``blackbox`` subcommand in its own process; its output goes to a temporary
    file, shown when it failed."""

    def __init__(self, args: Sequence[str], env: Mapping[str, str], *, name: str) -> None:
        self.name = name
        self._log: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 (closed in stop)
        self._process = subprocess.Popen(
            [sys.executable, "-m", "agent_blackbox.cli", *args],
            env=dict(env),
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        """The process id."""
        return self._process.pid

    def alive(self) -> bool:
        """Whether the process is still running."""
        return self._process.poll() is None

    def stop(self, *, grace_s: float = 15.0) -> int:
        """SIGTERM, then SIGKILL after ``grace_s``; the exit status."""
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
            try:
                self._process.wait(grace_s)
            except subprocess.TimeoutExpired:
                console.log(f"{self.name} did not stop in {grace_s:.0f} s: killing it")
                self._process.kill()
                self._process.wait()
        status = self._process.returncode
        if status not in (0, -signal.SIGTERM):
            console.log(f"{self.name} exited {status}:\n{self.output()[-3000:]}")
        self._log.close()
        return status

    def output(self) -> str:
        """What the process printed so far."""
        self._log.seek(0)
        return self._log.read().decode("utf-8", "replace")


def wait_for(condition: Any, *, timeout: float, what: str, every: float = 0.1) -> None:
    """Wait until ``condition()`` holds; raise naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def lease_split(engine: Engine) -> dict[str, int]:
    """Shards held (unexpired) per relay."""
    query = text(
        "SELECT owner, count(*) FROM blackbox.relay_leases "
        "WHERE owner IS NOT NULL AND expires_at > now() GROUP BY owner"
    )
    with engine.connect() as conn:
        return {str(owner): int(held) for owner, held in conn.execute(query)}


def wait_for_lease_split(engine: Engine, relays: Sequence[Worker], shards: int) -> dict[str, int]:
    """Wait until every relay holds its fair share of ``shards``; the split."""
    fair = -(-shards // len(relays))

    def split() -> bool:
        for relay in relays:
            if not relay.alive():
                raise RuntimeError(f"{relay.name} exited:\n{relay.output()[-3000:]}")
        held = lease_split(engine)
        return (
            len(held) == len(relays)
            and sum(held.values()) == shards
            and all(n <= fair for n in held.values())
        )

    wait_for(split, timeout=60, what=f"{len(relays)} relays to share {shards} shards")
    return lease_split(engine)


def outbox_rows(engine: Engine) -> int:
    """Rows left in the outbox."""
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM blackbox.outbox")).scalar_one())


# -- watchers ----------------------------------------------------------------------------


class PlainWatcher(threading.Thread):
    """A plain consumer assigned every partition of the topic from the start (or the
    end), without a group join: the time each message came out of ``poll()``.

    Messages are kept raw while watching and decoded afterwards, so the loop does
    nothing but poll and take the time.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        overrides: Mapping[str, Any] | None = None,
        from_end: bool = False,
    ) -> None:
        super().__init__(name="plain-watcher", daemon=True)
        start = OFFSET_END if from_end else OFFSET_BEGINNING
        self._consumer = Consumer(
            {
                "bootstrap.servers": settings.kafka_bootstrap,
                "group.id": f"blackbox.bench.plain.{uuid.uuid4().hex[:12]}",
                "enable.auto.commit": False,
                **(overrides or {}),
            }
        )
        self._consumer.assign(
            [TopicPartition(settings.topic, p, start) for p in range(settings.partitions)]
        )
        self._stop_event = threading.Event()
        self._received: list[tuple[float, int, bytes]] = []

    def run(self) -> None:
        poll, received = self._consumer.poll, self._received
        while not self._stop_event.is_set():
            message = poll(0.1)
            if message is None:
                continue
            at = time.time()
            if message.error() is None and (value := message.value()):
                received.append((at, message.timestamp()[1], value))

    @property
    def received(self) -> int:
        """Messages received so far."""
        return len(self._received)

    def stop(self) -> tuple[dict[EventKey, float], dict[EventKey, float]]:
        """Stop watching; when each event was first seen, and when the relay produced
        it (the message's create time, taken by the relay's client at ``produce()``,
        in milliseconds)."""
        self._stop_event.set()
        self.join()
        self._consumer.close()
        codec = EnvelopeCodec()
        seen: dict[EventKey, float] = {}
        produced: dict[EventKey, float] = {}
        for at, created_ms, value in self._received:
            envelope = codec.decode(value)
            key = (envelope.run_id, envelope.sequence)
            if key not in seen:
                seen[key], produced[key] = at, created_ms / 1000
        return seen, produced


class ViewWatcher(threading.Thread):
    """Polls the runs view every ``every_s`` for the bench's runs: an event is visible
    from the first poll whose ``last_sequence`` covers it."""

    def __init__(self, database_url: str, *, agent_id: str, every_s: float = 0.005) -> None:
        super().__init__(name="view-watcher", daemon=True)
        self._engine = create_engine(database_url, pool_size=1)
        self._agent_id = agent_id
        self._every_s = every_s
        self._stop_event = threading.Event()
        self._last: dict[str, int] = {}
        self.seen: dict[EventKey, float] = {}
        self.polls = 0
        self.poll_ms: list[float] = []

    def run(self) -> None:
        query = text("SELECT run_id, last_sequence FROM blackbox_views.runs WHERE agent_id = :a")
        with self._engine.connect() as conn:
            while not self._stop_event.wait(self._every_s):
                began = time.perf_counter()
                rows = conn.execute(query, {"a": self._agent_id}).all()
                conn.rollback()  # a fresh snapshot for the next poll
                at = time.time()
                self.poll_ms.append((time.perf_counter() - began) * 1000)
                for run_id, last in rows:
                    for sequence in range(self._last.get(run_id, 0) + 1, last + 1):
                        self.seen[(run_id, sequence)] = at
                    self._last[run_id] = max(last, self._last.get(run_id, 0))

    def stop(self) -> dict[EventKey, float]:
        """Stop polling; when each event was first seen."""
        self._stop_event.set()
        self.join()
        self._engine.dispose()
        return self.seen


@dataclass(frozen=True, slots=True)
class Latencies:
    """Commit → visible, in milliseconds, of the events committed in the measured window."""

    ms: list[float]
    missing: int

    @classmethod
    def between(
        cls, written: Written, seen: Mapping[EventKey, float], *, warmup_s: float
    ) -> Latencies:
        """The events the writers committed after ``warmup_s`` into the paced window."""
        since = written.started + warmup_s
        ms, missing = [], 0
        for key, committed in written.commits.items():
            if committed < since:
                continue
            if (visible := seen.get(key)) is None:
                missing += 1
            else:
                ms.append((visible - committed) * 1000)
        return cls(ms=ms, missing=missing)

    def at(self, q: float) -> float:
        """The ``q``-th percentile in milliseconds."""
        return percentile(self.ms, q)


def wait_until_counted(count: Any, expected: int, *, timeout: float, what: str) -> None:
    """Wait until ``count()`` reaches ``expected`` or ``timeout`` passed (then the missing
    events are counted in the figures, not raised)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and count() < expected:
        time.sleep(0.1)
    if (got := count()) < expected:
        console.log(f"[yellow]{what}: {got} of {expected} events after {timeout:.0f} s[/]")
