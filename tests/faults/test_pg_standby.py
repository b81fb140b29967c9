"""A Postgres standby takes over (issue 31, item 5): a primary and a synchronous
streaming standby of this module's own (the stack launcher's ``PostgresStandby``, free
ports, its own cache folder; never the shared stack's Postgres), writer threads recording
runs through the multi-host URL, a ``blackbox relay``, a ``blackbox consume`` and a
``blackbox analytics`` on the same URL, with the shared Kafka and a fresh topic. The
primary's postmaster is killed (SIGKILL) under load and the standby promoted; nobody is
restarted.

Afterwards: every event a writer was told was recorded is in the promoted database (the
outbox trigger's copy) and on the topic; every error a writer heard was a
``DatabaseUnavailable`` (``MaybeRecorded`` included), and one that said nothing was
recorded names an event that is not in the promoted database; the after-heal check holds
(committed = published, order, views, effects, ``verify --all``) and the analytics views
caught up. The time from the kill to the first write acknowledged again is measured.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.pool import NullPool

from agent_blackbox.consumers import events_index, migrate_views, tool_calls
from agent_blackbox.outbox import DatabaseUnavailable, EffectOutcome, Recorder, RunSnapshot
from agent_blackbox.outbox.storage import migrate_write_side
from agent_blackbox.schemas import Settings
from agent_blackbox.stack import LocalPostgres, LocalStack, PostgresStandby, StackError, StackPorts
from agent_blackbox.stack._standby import multi_host_url
from tests.conftest import Services, _cache_dir
from tests.faults._check import Figures, after_heal
from tests.faults._harness import _INSTRUMENT, Scenario, Worker, _delete_topics, free_port
from tests.integration._wait import eventually

pytestmark = [pytest.mark.integration, pytest.mark.faults, pytest.mark.timeout(300)]

WRITERS = 3
BEFORE_KILL = 600
"""Events acknowledged before the primary is killed."""
AFTER_PROMOTION = 600
"""Events acknowledged after the promotion, before the writers stop."""


@dataclass
class Pair:
    """The module's primary and standby, and the URL naming both."""

    primary: LocalPostgres
    standby: PostgresStandby
    url: str


@pytest.fixture
def pair() -> Iterator[Pair]:
    """A fresh primary and synchronous standby, migrated and instrumented; both stopped
    and their folders removed at the end (a promoted pair cannot be reused)."""
    taken: set[int] = set()
    primary = LocalPostgres(_cache_dir() / "faults-standby", free_port(taken))
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
    ack_times: list[float] = field(default_factory=list)
    heard: list[Heard] = field(default_factory=list)
    unexpected: list[BaseException] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._recorder = Recorder.from_settings(self.settings)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._write, name=f"writer-{i}", daemon=True)
            for i in range(WRITERS)
        ]

    @property
    def events(self) -> int:
        with self._lock:
            return sum(self.acked.values())

    def start(self) -> Writers:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)
        assert not any(t.is_alive() for t in self._threads), "a writer did not stop"

    def first_ack_after(self, moment: float) -> float | None:
        with self._lock:
            return next((t for t in self.ack_times if t > moment), None)

    def _ack(self, run_id: str, sequence: int) -> None:
        with self._lock:
            self.acked[run_id] = sequence
            self.ack_times.append(time.monotonic())

    def _write(self) -> None:
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


def _kill_postmaster(server: LocalPostgres) -> None:
    """SIGKILL the postmaster, as a crashed machine would leave it; its backends notice
    and exit on their own."""
    pid = server.pid()
    assert pid is not None, "the primary is not running"
    os.kill(pid, signal.SIGKILL)
    eventually(lambda: server.pid() is None, timeout=30, what="the primary's postmaster gone")


def _settings(url: str, kafka_bootstrap: str) -> Settings:
    suffix = uuid.uuid4().hex[:10]
    return replace(
        Settings(),
        database_url=url,
        kafka_bootstrap=kafka_bootstrap,
        topic=f"faults.pg-standby.{suffix}",
        consumer_group=f"faults-standby-{suffix}",
    )


@pytest.mark.parametrize("replication", ["synchronous", "asynchronous"])
def test_standby_takes_over(
    pair: Pair, services: Services, tmp_path: Path, replication: str
) -> None:
    """Synchronous: nothing acknowledged is lost and the after-heal check holds.
    Asynchronous: what is lost (acknowledged on the primary, not yet on the standby) is
    measured, and errors stay honest."""
    if replication == "asynchronous":
        pair.standby.require_synchronous(False)
    settings = _settings(pair.url, services.kafka_bootstrap)  # the suite's own Kafka
    engine = create_engine(pair.url, pool_size=4, max_overflow=4, pool_pre_ping=True)
    current = Scenario("pg-standby", None, settings, engine, tmp_path)  # type: ignore[arg-type]
    writers = Writers(settings)
    try:
        relay = current.relay("relay-a")
        consumer = current.consumer("views")
        analytics = current._spawn("analytics", ["analytics", "--group", f"{settings.topic}.a"])
        writers.start()
        eventually(lambda: writers.events >= BEFORE_KILL, timeout=120, what="writers recording")
        # A consumer still starting when the database goes exits (it cannot migrate its
        # views, exit 2): the kill waits for both to be applying, as a failover in
        # production finds them.
        eventually(lambda: _applying(current, (consumer, analytics)), timeout=120, what="applying")
        killed = time.monotonic()
        _kill_postmaster(pair.primary)
        eventually(lambda: writers.heard, timeout=30, what="writers hearing the primary's loss")
        pair.standby.promote()
        promoted = time.monotonic()
        target = writers.events + AFTER_PROMOTION
        eventually(lambda: writers.events >= target, timeout=120, what="writers recording again")
        writers.stop()
        figures = after_heal(current, Figures(scenario=f"pg-standby-{replication}"))
        assert relay.process.poll() is None, f"the relay exited: see {relay.log}"
        assert consumer.process.poll() is None, f"the consumer exited: see {consumer.log}"
        eventually(
            lambda: _analytics_caught_up(current, analytics), timeout=120, what="analytics views"
        )
    finally:
        writers.stop()
        for worker in current.workers:
            worker.close()
        engine.dispose()
        _delete_topics(settings)

    assert not writers.unexpected, writers.unexpected
    first_ack = writers.first_ack_after(promoted)
    assert first_ack is not None
    print(
        f"pg-standby ({replication}): {writers.events} events acknowledged, "
        f"{len(writers.heard)} errors "
        f"({sum(h.maybe_recorded for h in writers.heard)} may-have-been-recorded); "
        f"kill -> promoted {promoted - killed:.2f}s, kill -> writing again "
        f"{first_ack - killed:.2f}s; {figures.json_line()}",
        file=sys.stderr,
    )
    rows = _committed(pair)
    committed = {(run, seq) for run, seq, _ in rows}
    acknowledged = {(run, seq) for run, last in writers.acked.items() for seq in range(1, last + 1)}
    lost = acknowledged - committed
    print(f"pg-standby ({replication}): {len(lost)} acknowledged events lost", file=sys.stderr)
    committed_ids = {event_id for _, _, event_id in rows}
    false_nothing = [
        h for h in writers.heard if not h.maybe_recorded and h.event_id in committed_ids
    ]
    assert false_nothing == [], "an error said nothing was recorded of a committed event"
    assert figures.lost == 0, "a committed event of the promoted database is not on the topic"
    if replication == "synchronous":
        assert lost == set(), f"{len(lost)} acknowledged events missing after the failover"
        assert figures.problems() == [], figures.json_line()


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


def test_stack_up_with_a_standby_status_promote_and_down(tmp_path: Path) -> None:
    """``stack up --pg-standby`` as the launcher does it: both servers, the URL naming
    both, the roles in ``status``; ``promote`` refuses while the primary runs; ``down``
    stops both; once promoted, ``up`` starts the promoted server alone."""
    taken: set[int] = set()
    port = free_port(taken)
    while port + 1 in taken or not _free(port + 1):
        port = free_port(taken)
    ports = StackPorts(port, *(free_port(taken | {port + 1}) for _ in range(4)))
    environ = {"BLACKBOX_KAFKA_BOOTSTRAP": os.environ.get("BLACKBOX_KAFKA_BOOTSTRAP", "x:1")}
    stack = LocalStack(_cache_dir() / "faults-standby-cli", ports, environ=environ)
    for root in (stack.postgres.root, stack.postgres_standby.root):
        shutil.rmtree(root, ignore_errors=True)
    try:
        endpoints = stack.up(pg_standby=True)
        assert endpoints.database_url == (
            f"postgresql+psycopg://blackbox@/blackbox?host=127.0.0.1:{port}"
            f"&host=127.0.0.1:{port + 1}&target_session_attrs=read-write"
        )
        roles = {s.name: (s.state, s.role) for s in stack.status()}
        assert roles["postgres"] == ("running", "primary")
        assert roles["postgres-standby"] == ("running", "standby")
        with pytest.raises(StackError, match="still runs"):
            stack.promote()
        stack.down()
        roles = {s.name: (s.state, s.role) for s in stack.status()}
        assert roles["postgres"] == ("stopped", None)
        assert roles["postgres-standby"] == ("stopped", None)

        stack.up(pg_standby=True)  # again: the standby streams from where it was
        _kill_postmaster(stack.postgres)
        assert stack.promote() == stack.postgres_standby.url
        roles = {s.name: (s.state, s.role) for s in stack.status()}
        assert roles["postgres"] == ("stopped", None)
        assert roles["postgres-standby"] == ("running", "primary")
        stack.down()
        assert stack.up().database_url == stack.postgres_standby.url
        assert stack.postgres.pid() is None, "the old primary must not serve again"
    finally:
        stack.down()
        for root in (stack.postgres.root, stack.postgres_standby.root):
            shutil.rmtree(root, ignore_errors=True)


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
