"""Errors say what is known under a real crash (issue 31, item 2): writer threads record
runs (tool calls, clock reads, effects) into a Postgres this module starts on a port of
its own, which is stopped with ``pg_ctl stop -m immediate`` (no checkpoint, sessions cut
mid-statement) and started again, a few times. Afterwards every error a writer heard is
checked against the outbox, by the event id the error names: an error that says nothing
was recorded names an event that is not there; an event that is there was reported as
"may have been recorded" (:class:`MaybeRecorded`). Never the shared stack's Postgres.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from sqlalchemy import Engine, create_engine, make_url, text
from sqlalchemy.pool import NullPool

from agent_blackbox.outbox import DatabaseUnavailable, EffectOutcome, Recorder, RunSnapshot
from agent_blackbox.outbox.storage import migrate_write_side
from agent_blackbox.schemas import Settings
from agent_blackbox.stack import LocalPostgres
from agent_blackbox.stack._postgres import OS_USER, find_bin_dir
from agent_blackbox.stack._process import as_user
from tests.conftest import _cache_dir
from tests.faults._harness import WriterThreads, free_port
from tests.integration._wait import eventually

pytestmark = [pytest.mark.integration, pytest.mark.faults, pytest.mark.timeout(300)]

CRASHES = 6
WRITERS = 4


@pytest.fixture(scope="module")
def own_postgres() -> Iterator[LocalPostgres]:
    """A Postgres of this module's own (its own cache folder and port), stopped at the end."""
    server = LocalPostgres(_cache_dir() / "faults-errors", free_port(set()))
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def database(own_postgres: LocalPostgres) -> Iterator[str]:
    """A fresh migrated database on it, dropped at the end."""
    name = f"errors_{uuid.uuid4().hex[:12]}"
    admin = create_engine(own_postgres.url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        with admin.connect() as conn:
            conn.execute(text(f"CREATE DATABASE {name}"))
        url = make_url(own_postgres.url).set(database=name).render_as_string(False)
        migrate_write_side(url)
        yield url
    finally:
        if own_postgres.pid() is None:
            own_postgres.start()  # (a failed test may leave it stopped)
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()


def _stop_immediately(server: LocalPostgres) -> None:
    """``pg_ctl stop -m immediate``: every session ends at once, nothing is checkpointed
    (the next start replays the WAL)."""
    major = (server.data_dir / "PG_VERSION").read_text().strip()
    bin_dir = find_bin_dir(major)
    assert bin_dir is not None, f"PostgreSQL {major} is not installed"
    argv = [str(bin_dir / "pg_ctl"), "stop", "-D", str(server.data_dir), "-m", "immediate", "-w"]
    subprocess.run(
        as_user(argv, OS_USER if os.geteuid() == 0 else None),
        check=True,
        timeout=60,
        capture_output=True,
    )


@dataclass(frozen=True)
class Heard:
    """An error a writer heard: the event it names and what it said of it."""

    event_id: str | None
    run_id: str | None
    sequence: int | None
    maybe_recorded: bool
    message: str


class Writers:
    """Threads recording runs until stopped; each error ends its run (a new one starts)."""

    def __init__(self, engine: Engine, settings: Settings) -> None:
        self._recorder = Recorder(engine, settings=settings)
        self._lock = threading.Lock()
        self.appended = 0
        self.heard: list[Heard] = []
        self.unexpected: list[BaseException] = []
        self.performed: list[str] = []
        self._writers = WriterThreads(WRITERS, self._write)
        self._stop = self._writers.stopping

    def start(self) -> Writers:
        self._writers.start()
        return self

    def stop(self) -> None:
        self._writers.stop(timeout=60)

    def _count(self, events: int) -> None:
        with self._lock:
            self.appended += events

    def _write(self, writer: int) -> None:
        number = 0
        while not self._stop.is_set():
            number += 1
            try:
                self._one_run(f"crash-{writer}-{number}")
            except DatabaseUnavailable as exc:
                heard = Heard(exc.event_id, exc.run_id, exc.sequence, exc.maybe_recorded, str(exc))
                with self._lock:
                    self.heard.append(heard)
                self._stop.wait(0.02)  # back off while the database is away
            except BaseException as exc:  # anything else fails the test
                with self._lock:
                    self.unexpected.append(exc)
                return

    def _one_run(self, run_id: str) -> None:
        snapshot = RunSnapshot("errors.crash", input={"run": run_id})
        run = self._recorder.start_run(snapshot, agent_id="crash-agent", run_id=run_id)
        self._count(1)
        for step in range(3):
            run.call("square", _square, step)
            run.now()
            run.effect("notify", self._perform, arguments={"step": step}, key=f"{run_id}/{step}")
            self._count(4)
        run.finish(output={"steps": 3})
        self._count(1)

    def _perform(self, key: str) -> EffectOutcome:
        with self._lock:
            self.performed.append(key)
        return EffectOutcome(external_id=f"ext-{key}")


def _square(step: int) -> int:
    return step * step


def _crash_and_restart(server: LocalPostgres, writers: Writers) -> None:
    """Stop the server immediately under load, wait for the writers to hear it, start it
    again and wait until they record again."""
    heard = len(writers.heard)
    _stop_immediately(server)
    eventually(lambda: len(writers.heard) > heard, timeout=60, what="writers hearing the stop")
    server.start()
    appended = writers.appended
    eventually(lambda: writers.appended >= appended + 50, timeout=60, what="writers recording")


def test_every_error_under_immediate_stops_says_what_is_known(
    own_postgres: LocalPostgres, database: str
) -> None:
    settings = Settings(database_url=database)
    engine = create_engine(database, pool_size=WRITERS, max_overflow=WRITERS)
    writers = Writers(engine, settings)
    try:
        writers.start()
        eventually(lambda: writers.appended >= 200, timeout=60, what="writers recording")
        for _ in range(CRASHES):
            _crash_and_restart(own_postgres, writers)
    finally:
        writers.stop()
        engine.dispose()
    assert not writers.unexpected, writers.unexpected

    checker = create_engine(database, poolclass=NullPool)
    try:
        with checker.connect() as conn:
            rows = conn.execute(
                text("SELECT event_id::text, run_id, sequence FROM blackbox.outbox")
            ).all()
            effects = dict(
                conn.execute(text("SELECT idempotency_key, status FROM blackbox.effects")).all()
            )
    finally:
        checker.dispose()
    committed = {str(row[0]) for row in rows}
    assert len(committed) == len(rows), "an event id was appended twice"
    _runs_are_contiguous([(str(run), int(seq)) for _, run, seq in rows])

    heard = writers.heard
    assert heard, "no writer heard an error: the stops proved nothing"
    assert all(h.event_id is not None for h in heard), "an error did not name its event"
    false_nothing = [h for h in heard if not h.maybe_recorded and h.event_id in committed]
    assert not false_nothing, f"'nothing was recorded' of committed events: {false_nothing}"
    assert all(("may have been recorded" in h.message) == h.maybe_recorded for h in heard)
    maybe = [h for h in heard if h.maybe_recorded]
    found = sum(h.event_id in committed for h in maybe)

    # Effects never ran twice, and none ran whose intent is not in the outbox.
    assert len(writers.performed) == len(set(writers.performed))
    assert set(writers.performed) <= set(effects)
    print(
        f"\n{CRASHES} immediate stops, {len(rows)} events committed, {len(heard)} errors: "
        f"{len(heard) - len(maybe)} 'nothing was recorded' (all true), {len(maybe)} 'may have "
        f"been recorded' ({found} committed, {len(maybe) - found} not)",
        file=sys.stderr,
    )


def _runs_are_contiguous(rows: list[tuple[str, int]]) -> None:
    """Each run's sequences are 1..n, each once."""
    by_run: dict[str, list[int]] = {}
    for run_id, sequence in rows:
        by_run.setdefault(run_id, []).append(sequence)
    for run_id, sequences in by_run.items():
        assert sorted(sequences) == list(range(1, len(sequences) + 1)), run_id
