"""A Postgres standby takes over: the scenario, for the tests and the soak.

A primary and a streaming standby of the scenario's own (the stack launcher's
``PostgresStandby``, free ports, a cache folder of its own), writer threads recording runs
through the multi-host URL, a ``blackbox relay``, a ``blackbox consume``, a
``blackbox analytics`` and, when a store is given, a ``blackbox backup run`` on the same
URL. The primary's postmaster is killed (SIGKILL) under load and the standby promoted;
nobody is restarted. :func:`promotion` returns what happened for the caller to judge.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from sqlalchemy import create_engine, func, select, text
from sqlalchemy.pool import NullPool

from agent_blackbox.backup import BackupBusy, BackupStore
from agent_blackbox.backup._store_lock import StoreLock
from agent_blackbox.backup._writer import backup_group
from agent_blackbox.broker import ensure_topics
from agent_blackbox.consumers import events_index, migrate_views, tool_calls
from agent_blackbox.outbox import DatabaseUnavailable, EffectOutcome, Recorder, RunSnapshot
from agent_blackbox.outbox.storage import migrate_write_side
from agent_blackbox.schemas import Settings
from agent_blackbox.stack import LocalPostgres, PostgresStandby
from agent_blackbox.stack._standby import multi_host_url
from tests.faults._backup import (
    backed_up_events,
    backed_up_to_the_end,
    backup_problems,
    manifests,
)
from tests.faults._check import Figures, after_heal
from tests.faults._harness import (
    _INSTRUMENT,
    Scenario,
    Worker,
    WriterThreads,
    _delete_topics,
    free_port,
)
from tests.integration._wait import eventually

WRITERS = 3


@dataclass
class Pair:
    """A primary and its standby, and the URL naming both."""

    primary: LocalPostgres
    standby: PostgresStandby
    url: str


@contextmanager
def standby_pair(cache_dir: Path) -> Iterator[Pair]:
    """A fresh primary and synchronous standby, migrated and instrumented; both stopped
    and their folders removed at the end (a promoted pair cannot be reused)."""
    taken: set[int] = set()
    primary = LocalPostgres(cache_dir, free_port(taken))
    standby = PostgresStandby(primary, free_port(taken))
    for root in (primary.root, standby.root):
        shutil.rmtree(root, ignore_errors=True)  # a previous run's promoted pair
    try:
        primary.start()
        standby.start()
        url = multi_host_url(primary, standby)
        migrate_write_side(url)
        migrate_views(url)
        engine = create_engine(url, poolclass=NullPool)
        with engine.begin() as conn:
            for statement in _INSTRUMENT:
                conn.execute(text(statement))
        engine.dispose()
        yield Pair(primary, standby, url)
    finally:
        for server in (standby, primary):
            if server.pid() is not None:
                server.stop()
        for root in (primary.root, standby.root):
            shutil.rmtree(root, ignore_errors=True)


@dataclass(frozen=True)
class Heard:
    """An error a writer heard: the event it names and whether it may be recorded."""

    kind: str
    event_id: str | None
    maybe_recorded: bool


@dataclass
class Writers:
    """Threads recording runs through a recorder on the multi-host URL (the agent pool,
    as an agent has it) until stopped. A run's events are acknowledged up to the
    sequence its last successful call left (``acked``); an error ends the run."""

    settings: Settings
    acked: dict[str, int] = field(default_factory=dict)
    acks: list[tuple[float, str, int]] = field(default_factory=list)
    """(when, run, sequence) of each acknowledged event."""
    heard: list[Heard] = field(default_factory=list)
    unexpected: list[BaseException] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._recorder = Recorder.from_settings(self.settings)
        self._lock = threading.Lock()
        self._writers = WriterThreads(WRITERS, self._write)
        self._stop = self._writers.stopping

    @property
    def events(self) -> int:
        with self._lock:
            return sum(self.acked.values())

    def start(self) -> Writers:
        self._writers.start()
        return self

    def stop(self) -> None:
        self._writers.stop(timeout=60)

    def first_ack_after(self, moment: float) -> float | None:
        with self._lock:
            return next((t for t, _, _ in self.acks if t > moment), None)

    def acked_after(self, moment: float) -> set[tuple[str, int]]:
        """(run, sequence) of the events acknowledged after ``moment``."""
        with self._lock:
            return {(run, sequence) for t, run, sequence in self.acks if t > moment}

    def acknowledged(self) -> set[tuple[str, int]]:
        """(run, sequence) of every acknowledged event."""
        with self._lock:
            return {(run, seq) for run, last in self.acked.items() for seq in range(1, last + 1)}

    def _ack(self, run_id: str, sequence: int) -> None:
        with self._lock:
            self.acked[run_id] = sequence
            self.acks.append((time.monotonic(), run_id, sequence))

    def _write(self, _writer: int) -> None:
        while not self._stop.is_set():
            try:
                self._one_run()
            except DatabaseUnavailable as exc:
                heard = Heard(type(exc).__name__, exc.event_id, exc.maybe_recorded)
                with self._lock:
                    self.heard.append(heard)
                self._stop.wait(0.05)  # back off while the database is away
            except BaseException as exc:  # anything else fails the test
                with self._lock:
                    self.unexpected.append(exc)
                return

    def _one_run(self) -> None:
        snapshot = RunSnapshot("faults.standby", input={"writer": threading.current_thread().name})
        run = self._recorder.start_run(snapshot, agent_id="standby-agent")
        self._ack(run.run_id, run.last_sequence)
        for step in range(3):
            run.call("lookup", _lookup, step)
            self._ack(run.run_id, run.last_sequence)
            run.now()
            self._ack(run.run_id, run.last_sequence)
            run.effect("notify", _perform, arguments={"step": step})
            self._ack(run.run_id, run.last_sequence)
        run.finish(output={"steps": 3})
        self._ack(run.run_id, run.last_sequence)


def _lookup(step: int) -> dict[str, int]:
    return {"step": step, "square": step * step}


def _perform(key: str) -> EffectOutcome:
    return EffectOutcome(external_id=f"ext-{key}")


def kill_postmaster(server: LocalPostgres) -> None:
    """SIGKILL the postmaster, as a crashed machine would leave it; its backends notice
    and exit on their own."""
    pid = server.pid()
    assert pid is not None, "the primary is not running"
    os.kill(pid, signal.SIGKILL)
    eventually(lambda: server.pid() is None, timeout=30, what="the primary's postmaster gone")


def standby_settings(url: str, kafka_bootstrap: str) -> Settings:
    """A fresh topic and consumer group on the pair's URL and ``kafka_bootstrap``."""
    suffix = uuid.uuid4().hex[:10]
    return replace(
        Settings(),
        database_url=url,
        kafka_bootstrap=kafka_bootstrap,
        topic=f"faults.pg-standby.{suffix}",
        consumer_group=f"faults-standby-{suffix}",
    )


@dataclass
class Promotion:
    """What one promotion did: the writers' view, the moments, the after-heal figures."""

    writers: Writers
    figures: Figures
    killed: float
    promoted: float
    committed: list[tuple[str, int, str]]
    """(run, sequence, event id) of every event committed in the promoted database."""
    backup_problems: list[str] = field(default_factory=list)
    """What is wrong with the backup's store (see :func:`._backup.backup_problems`)."""
    backed_up: set[tuple[str, int]] = field(default_factory=set)
    """(run, sequence) of every event the backup holds."""
    cuts: int = 0
    """Manifests the backup wrote."""

    @property
    def not_backed_up(self) -> set[tuple[str, int]]:
        """Events acknowledged after the promotion that the backup does not hold."""
        return self.writers.acked_after(self.promoted) - self.backed_up

    @property
    def lost(self) -> set[tuple[str, int]]:
        """Acknowledged events the promoted database does not hold."""
        return self.writers.acknowledged() - {(run, seq) for run, seq, _ in self.committed}

    @property
    def false_nothing(self) -> list[Heard]:
        """Errors that said nothing was recorded of an event that committed."""
        ids = {event_id for _, _, event_id in self.committed}
        return [h for h in self.writers.heard if not h.maybe_recorded and h.event_id in ids]

    @property
    def writing_again_s(self) -> float | None:
        """Seconds from the kill to the first write acknowledged after the promotion."""
        first = self.writers.first_ack_after(self.promoted)
        return None if first is None else first - self.killed


def promotion(
    pair: Pair,
    settings: Settings,
    log_dir: Path,
    *,
    before: int,
    after: int,
    store: BackupStore | None = None,
) -> Promotion:
    """Run the scenario (see the module): ``before`` events acknowledged, the kill and
    the promotion, ``after`` more; then the after-heal check, the analytics caught up
    and, with a ``store`` (``BLACKBOX_BACKUP_URL`` and the signing key set in this
    process's environment), the backup at the topic's end, holding its lock on the
    promoted database, and stopping cleanly.

    Raises:
        AssertionError: a worker exited, or a wait ran out.
    """
    engine = create_engine(pair.url, pool_size=4, max_overflow=4, pool_pre_ping=True)
    current = Scenario("pg-standby", None, settings, engine, log_dir)  # type: ignore[arg-type]
    writers = Writers(settings)
    try:
        ensure_topics(settings)  # as the relay would; the backup needs it at its start
        relay = current.relay("relay-a")
        consumer = current.consumer("views")
        analytics = current._spawn("analytics", ["analytics", "--group", f"{settings.topic}.a"])
        backup = None
        if store is not None:
            backup = current._spawn("backup", ["backup", "run", "--roll-seconds", "1"])
        writers.start()
        eventually(lambda: writers.events >= before, timeout=120, what="writers recording")
        # A consumer still starting when the database goes exits (it cannot migrate its
        # views, exit 2): the kill waits for both to be applying, as a failover in
        # production finds them; and for the backup to have written a cut.
        eventually(lambda: _applying(current, (consumer, analytics)), timeout=120, what="applying")
        if backup is not None and store is not None:
            eventually(lambda: _backing_up(backup, store), timeout=120, what="the backup cutting")
        killed = time.monotonic()
        kill_postmaster(pair.primary)
        eventually(lambda: writers.heard, timeout=30, what="writers hearing the primary's loss")
        pair.standby.promote()
        promoted = time.monotonic()
        target = writers.events + after
        eventually(lambda: writers.events >= target, timeout=120, what="writers recording again")
        writers.stop()
        figures = after_heal(current, Figures(scenario="pg_standby_promotion"))
        assert relay.process.poll() is None, f"the relay exited: see {relay.log}"
        assert consumer.process.poll() is None, f"the consumer exited: see {consumer.log}"
        eventually(
            lambda: _analytics_caught_up(current, analytics), timeout=120, what="analytics views"
        )
        done = Promotion(writers, figures, killed, promoted, _committed(pair))
        if backup is not None and store is not None:
            _backup_went_on(pair, settings, backup, store)
            # Read while the topic is there: the backup is checked against its ends.
            done.backup_problems = backup_problems(settings, store)
            done.backed_up = {(run, seq) for run, seq, _ in backed_up_events(store)}
            done.cuts = manifests(store)
    finally:
        writers.stop()
        for worker in current.workers:
            worker.close()
        engine.dispose()
        _delete_topics(settings)
    return done


def _backup_went_on(pair: Pair, settings: Settings, backup: Worker, store: BackupStore) -> None:
    """The backup reaches the topic's end, holds its store's lock on the promoted
    database (a second writer there is refused: the lock on the old primary died with
    it), and stops cleanly on SIGTERM."""
    eventually(
        lambda: _backing_up(backup, store) and backed_up_to_the_end(settings, store),
        timeout=120,
        what=f"the backup reaching the topic's end (see {backup.log})",
    )
    engine = create_engine(pair.standby.url, poolclass=NullPool)
    lock = StoreLock(engine, name=backup_group(store), store=store.describe())
    try:
        try:
            lock.acquire()
        except BackupBusy:
            pass
        else:
            raise AssertionError("a second backup writer got the lock on the promoted database")
    finally:
        lock.release()
        engine.dispose()
    assert backup.terminate(timeout=60) == 0, f"the backup exited badly: see {backup.log}"


def _backing_up(backup: Worker, store: BackupStore) -> bool:
    """Whether the backup wrote a cut; fails at once, naming its log, when it exited."""
    assert backup.process.poll() is None, f"the backup exited: see {backup.log}"
    return manifests(store) > 0


def _applying(current: Scenario, workers: tuple[Worker, ...]) -> bool:
    """Whether the views and the analytics consumers both applied something (they are
    past their start); fails at once, naming its log, when one of them exited."""
    for worker in workers:
        assert worker.process.poll() is None, f"{worker.name} exited: see {worker.log}"
    with current.engine.connect() as conn:
        calls = conn.execute(select(func.count()).select_from(tool_calls)).scalar_one()
    return current.indexed() > 0 and calls > 0


def _analytics_caught_up(current: Scenario, analytics: Worker) -> bool:
    """Whether the analytics consumer has one ``tool_calls`` row per indexed tool call;
    fails at once, naming its log, when it exited."""
    assert analytics.process.poll() is None, f"analytics exited: see {analytics.log}"
    indexed = select(func.count()).where(events_index.c.event_type == "tool.call")
    with current.engine.connect() as conn:
        expected = conn.execute(indexed).scalar_one()
        rows = conn.execute(select(func.count()).select_from(tool_calls)).scalar_one()
    return bool(expected) and rows == expected


def _committed(pair: Pair) -> list[tuple[str, int, str]]:
    """(run, sequence, event id) of every event committed in the promoted database."""
    engine = create_engine(pair.standby.url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            query = text("SELECT run_id, sequence, event_id::text FROM public.fault_committed")
            return [(str(r[0]), int(r[1]), str(r[2])) for r in conn.execute(query)]
    finally:
        engine.dispose()
