"""The fault matrix's own stack: Postgres and Kafka it may kill, worker processes, load.

Nothing here touches the shared services: :class:`FaultStack` starts a Postgres and a
Kafka of its own (the ``stack`` package's launchers) on free ports, and every scenario
gets a fresh database cloned from a migrated template and a fresh topic. Relays and view
consumers run as ``blackbox relay`` / ``blackbox consume`` subprocesses that a scenario
kills (SIGKILL), pauses (SIGSTOP) and restarts; writer threads record runs with effects
through the public recorder API.

The template database carries one test-only instrument: a trigger that copies each
outbox row's (event id, run, sequence) into ``public.fault_committed`` in the writer's
own transaction. The outbox is emptied by the relays, so this is how the after-heal check
knows exactly what committed, ambiguous commits included.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO

from sqlalchemy import Engine, create_engine, func, make_url, select, text
from sqlalchemy.pool import NullPool

from agent_blackbox.broker import delete_topics
from agent_blackbox.consumers import events_index, migrate_views
from agent_blackbox.outbox import BlackboxError, EffectOutcome, Recorder, RunSnapshot
from agent_blackbox.outbox.storage import migrate_write_side
from agent_blackbox.schemas import Settings
from agent_blackbox.stack import LocalKafka, LocalPostgres
from tests.integration._wait import eventually

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = "faults_template"

_INSTRUMENT = [
    "CREATE TABLE public.fault_committed (event_id uuid NOT NULL, run_id text NOT NULL, "
    "sequence bigint NOT NULL)",
    """
    CREATE FUNCTION public.fault_note() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO public.fault_committed VALUES (NEW.event_id, NEW.run_id, NEW.sequence);
        RETURN NEW;
    END $$
    """,
    "CREATE TRIGGER fault_note AFTER INSERT ON blackbox.outbox "
    "FOR EACH ROW EXECUTE FUNCTION public.fault_note()",
]


def free_port(taken: set[int]) -> int:
    """A free loopback port below Linux's ephemeral range (32768+), so that no outgoing
    connection can be holding it when a stopped service binds it again."""
    rng = random.Random()
    while True:
        port = rng.randrange(20_000, 32_000)
        if port in taken:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        taken.add(port)
        return port


class FaultStack:
    """A Postgres and a Kafka of the fault matrix's own, on free ports."""

    def __init__(self, cache_dir: Path) -> None:
        taken: set[int] = set()
        self.cache_dir = cache_dir
        self.postgres = LocalPostgres(cache_dir, free_port(taken))
        self.kafka = LocalKafka(cache_dir, free_port(taken), free_port(taken))

    def start(self) -> None:
        """Start both services from empty Kafka storage and migrate the template."""
        # The controller port is in the KRaft quorum, so old storage would not fit.
        shutil.rmtree(self.kafka.data_dir, ignore_errors=True)
        self.postgres.start()
        self.kafka.start()
        self.make_template()

    def make_template(self) -> None:
        """Create the migrated, instrumented template database scenarios clone."""
        admin = create_engine(self.postgres.url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {TEMPLATE} WITH (FORCE)"))
            conn.execute(text(f"CREATE DATABASE {TEMPLATE}"))
        admin.dispose()
        url = self._url(TEMPLATE)
        migrate_write_side(url)
        migrate_views(url)
        engine = create_engine(url)
        with engine.begin() as conn:
            for statement in _INSTRUMENT:
                conn.execute(text(statement))
        engine.dispose()

    def stop(self) -> None:
        """Stop both services (a paused or killed one is fine)."""
        try:
            self.kafka.stop()
        finally:
            self.postgres.stop()

    def postgres_immediate_stop(self) -> None:
        """Stop Postgres as a crash would: SIGQUIT asks the postmaster for an immediate
        shutdown (no checkpoint; the next start replays the WAL)."""
        pid = self.postgres.pid()
        assert pid is not None, "postgres is not running"
        os.kill(pid, signal.SIGQUIT)
        eventually(lambda: self.postgres.pid() is None, timeout=60, what="postgres stopped")

    def _url(self, database: str) -> str:
        return make_url(self.postgres.url).set(database=database).render_as_string(False)

    @contextmanager
    def database(self) -> Iterator[str]:
        """A fresh database cloned from the template, dropped at the end."""
        name = f"fault_{uuid.uuid4().hex[:12]}"
        # No pool: a scenario may restart Postgres under a pooled connection.
        admin = create_engine(self.postgres.url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
        try:
            with admin.connect() as conn:
                conn.execute(text(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE}"))
            yield self._url(name)
        finally:
            try:
                with admin.connect() as conn:
                    conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            finally:
                admin.dispose()


class Worker:
    """One ``blackbox`` subprocess: a relay or a view consumer."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self.log = log
        self._out: IO[bytes] = log.open("ab")
        command = [sys.executable, "-m", "agent_blackbox.cli", *argv]
        self.process = subprocess.Popen(
            command, env=env, cwd=ROOT, stdout=self._out, stderr=subprocess.STDOUT
        )

    def kill(self) -> None:
        """SIGKILL, as a crash would; waits for the process to be gone."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def pause(self) -> None:
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.process.send_signal(signal.SIGCONT)

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait for the exit status."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout)

    def dump_stacks(self, timeout: float = 5.0) -> str:
        """Every thread's stack of a live process, which it prints into its log on
        SIGUSR1 (the command line registers it); "" when it has exited or did not answer
        within ``timeout``."""
        if self.process.poll() is not None:
            return ""
        start = self.log.stat().st_size
        self.process.send_signal(signal.SIGUSR1)
        deadline, last = time.monotonic() + timeout, ""
        while time.monotonic() < deadline:
            with self.log.open("rb") as log:
                log.seek(start)
                written = log.read().decode(errors="replace")
            if "most recent call first" in written and written == last:
                return written  # the dump is written at once: it stopped growing
            last = written
            time.sleep(0.1)
        return last

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)  # a paused process dies paused too
            self.process.kill()
            self.process.wait(timeout=30)
        self._out.close()


@dataclass
class Scenario:
    """One scenario's database, topic, engine and the processes it started."""

    name: str
    stack: FaultStack
    settings: Settings
    engine: Engine
    log_dir: Path
    workers: list[Worker] = field(default_factory=list)

    def env(self, **extra: str) -> dict[str, str]:
        """The environment a ``blackbox`` subprocess of this scenario runs with."""
        return {
            **os.environ,
            "BLACKBOX_DATABASE_URL": self.settings.database_url,
            "BLACKBOX_KAFKA_BOOTSTRAP": self.settings.kafka_bootstrap,
            "BLACKBOX_TOPIC": self.settings.topic,
            "BLACKBOX_CONSUMER_GROUP": self.settings.consumer_group,
            "PYTHONUNBUFFERED": "1",
            "COLUMNS": "160",  # log lines as they are, not wrapped at 80
            **extra,
        }

    def relay(self, relay_id: str, *, lease_ttl: float = 2.0, batch_size: int = 500) -> Worker:
        argv = ["relay", "--relay-id", relay_id, "--batch-size", str(batch_size)]
        return self._spawn(relay_id, [*argv, "--lease-ttl", f"{lease_ttl:g}"])

    def consumer(self, name: str) -> Worker:
        return self._spawn(name, ["consume"])

    def _spawn(self, name: str, argv: list[str], *, env: dict[str, str] | None = None) -> Worker:
        """Start ``blackbox <argv>`` with this scenario's environment (plus ``env``)."""
        log = self.log_dir / f"{self.name}.{name}.log"
        worker = Worker(name, argv, self.env(**(env or {})), log)
        self.workers.append(worker)
        return worker

    def outbox_rows(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM blackbox.outbox")).scalar_one())

    def shards_held(self, owner: str) -> int:
        """How many shard leases ``owner`` holds that have not expired."""
        query = text(
            "SELECT count(*) FROM blackbox.relay_leases WHERE owner = :o AND expires_at > now()"
        )
        with self.engine.connect() as conn:
            return int(conn.execute(query, {"o": owner}).scalar_one())

    def indexed(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(events_index)).scalar_one())

    def load(self, *, writers: int = 3, engine: Engine | None = None) -> Load:
        return Load(engine or self.engine, self.settings, writers=writers)

    def diagnosis(self, lines: int = 25) -> str:
        """What a failed wait reports: the outbox, the views, the leases, and the last
        ``lines`` of every process's log (the logs are gone once CI ends)."""
        parts = []
        try:
            parts.append(f"outbox rows {self.outbox_rows()}, events indexed {self.indexed()}")
            with self.engine.connect() as conn:
                leases = conn.execute(
                    text(
                        "SELECT owner, count(*), max(epoch), "
                        "bool_and(expires_at > now()) FROM blackbox.relay_leases GROUP BY owner"
                    )
                ).all()
            parts.append(
                f"leases (owner, shards, top epoch, all valid): {[tuple(r) for r in leases]}"
            )
        except Exception as exc:  # the database may be what failed
            parts.append(f"database unreadable: {exc}")
        for worker in self.workers:
            state = worker.process.poll()
            tail = worker.log.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {worker.name} (exit {state}) {worker.log}")
            parts.extend(line[:300] for line in tail)
            if stacks := worker.dump_stacks():
                parts.append(f"--- {worker.name}: every thread's stack (SIGUSR1)")
                parts.extend(stacks.splitlines())
        return "\n".join(parts)


@contextmanager
def scenario(stack: FaultStack, name: str, log_dir: Path) -> Iterator[Scenario]:
    """A fresh database and topic; every process started is stopped at the end."""
    suffix = uuid.uuid4().hex[:10]
    log_dir.mkdir(parents=True, exist_ok=True)
    with stack.database() as url:
        settings = replace(
            Settings(),
            database_url=url,
            kafka_bootstrap=stack.kafka.bootstrap,
            topic=f"faults.{name}.{suffix}",
            consumer_group=f"faults-views-{suffix}",
        )
        engine = create_engine(url, pool_size=8, max_overflow=8, pool_pre_ping=True)
        current = Scenario(name, stack, settings, engine, log_dir)
        try:
            yield current
        finally:
            for worker in current.workers:
                worker.close()
            engine.dispose()
            _delete_topics(settings)


def _delete_topics(settings: Settings) -> None:
    """Drop a finished scenario's topics, so a broker restarted later recovers less."""
    delete_topics(settings, [settings.topic, settings.dlq_topic])


class WriterThreads:
    """``count`` daemon threads, each running ``write(i)`` until :meth:`stop`; a writer
    checks :attr:`stopping` between its runs (and backs off on it)."""

    def __init__(self, count: int, write: Callable[[int], None]) -> None:
        self.stopping = threading.Event()
        self._threads = [
            threading.Thread(target=write, args=(i,), name=f"writer-{i}", daemon=True)
            for i in range(count)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self, *, timeout: float) -> None:
        """Ask every writer to stop and wait for it; fails when one is still going."""
        self.stopping.set()
        for thread in self._threads:
            thread.join(timeout=timeout)
        assert not any(t.is_alive() for t in self._threads), "a writer did not stop"


class Load:
    """Writer threads recording runs through the public recorder API until stopped.

    Each run: ``run.started``, then three rounds of a tool call, a clock read and an
    effect (intent and receipt), then ``run.finished`` (14 events). A writer that hears
    an error (database away, connection cut) counts it and starts a new run.
    """

    EVENTS_PER_RUN = 14

    def __init__(self, engine: Engine, settings: Settings, *, writers: int) -> None:
        self._recorder = Recorder(engine, settings=settings)
        self._lock = threading.Lock()
        self._writers = WriterThreads(writers, self._write)
        self._stop = self._writers.stopping
        self._going = threading.Event()
        self._going.set()
        self.events = 0
        """Events whose append returned (what committed may be more: see the check)."""
        self.failures = 0
        self.errors: list[str] = []

    def start(self) -> Load:
        self._writers.start()
        return self

    def hold(self) -> None:
        """Writers finish the run they are in, then wait for :meth:`release`."""
        self._going.clear()

    def release(self) -> None:
        self._going.set()

    def stop(self) -> None:
        self._stop.set()
        self._going.set()
        self._writers.stop(timeout=120)

    def wait_events(self, count: int, *, timeout: float = 120.0) -> None:
        """Until writers appended ``count`` events in all since they started."""
        eventually(lambda: self.events >= count, timeout=timeout, what=f"{count} events written")

    def _add(self, events: int) -> None:
        with self._lock:
            self.events += events

    def _write(self, _writer: int) -> None:
        while not self._stop.is_set():
            self._going.wait()
            try:
                self._one_run()
            except BlackboxError as exc:
                with self._lock:
                    self.failures += 1
                    if len(self.errors) < 20:
                        self.errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
                self._stop.wait(0.05)  # back off while the fault lasts

    def _one_run(self) -> None:
        snapshot = RunSnapshot("faults.1", input={"writer": threading.current_thread().name})
        run = self._recorder.start_run(snapshot, agent_id="fault-agent")
        self._add(1)
        for step in range(3):
            run.call("lookup", _lookup, step)
            run.now()
            run.effect("notify", _perform, arguments={"step": step})
            self._add(4)
        run.finish(output={"steps": 3})
        self._add(1)


def _lookup(step: int) -> dict[str, int]:
    return {"step": step, "square": step * step}


def _perform(key: str) -> EffectOutcome:
    return EffectOutcome(external_id=f"ext-{key}")
