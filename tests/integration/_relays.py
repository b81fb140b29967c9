"""Relays as processes for the fault tests: start, pause, kill, and read what they published.

``python -m tests.integration._relays OWNER PAUSE_AT LINGER_MS`` runs a relay that stops
itself (SIGSTOP) once, after handing ``PAUSE_AT`` messages of one batch to its producer.
With a long ``linger.ms`` those messages are still queued in the producer when it stops,
so a test knows the pause happened with messages waiting to be sent (an outside SIGSTOP
would have to be lucky). It goes on as a normal relay once continued; SIGTERM stops it.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, text

from agent_blackbox.broker import LeaseStamp, read_stamp
from agent_blackbox.outbox import Recorder
from agent_blackbox.outbox.relay import Relay, RelayOptions
from agent_blackbox.schemas import Envelope, EnvelopeCodec, Settings
from tests.integration._agents import RecordedRun, record_ticket_runs
from tests.integration._kafka import read_messages

__all__ = ["RecordedRun", "Writer", "read_published", "spawn_cli_relay", "spawn_pausing_relay"]

ROOT = Path(__file__).resolve().parents[2]
LEASE_TTL_S = 2.0


def relay_env(settings: Settings) -> dict[str, str]:
    return {
        **os.environ,
        "BLACKBOX_DATABASE_URL": settings.database_url,
        "BLACKBOX_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "BLACKBOX_TOPIC": settings.topic,
        "PYTHONPATH": str(ROOT),
    }


def spawn_cli_relay(
    settings: Settings, owner: str, log: Path, *, batch_size: int = 500
) -> subprocess.Popen[bytes]:
    """``blackbox relay`` at the default lease settings, its output in ``log``."""
    command = [sys.executable, "-m", "cli", "relay", "--relay-id", owner]
    command += ["--batch-size", str(batch_size)]
    with log.open("wb") as out:
        return subprocess.Popen(
            command, env=relay_env(settings), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT
        )


def spawn_pausing_relay(
    settings: Settings, owner: str, log: Path, *, pause_at: int, linger_ms: int
) -> subprocess.Popen[bytes]:
    """A relay that stops itself once with ``pause_at`` messages queued (see above)."""
    command = [sys.executable, "-m", "tests.integration._relays", owner, str(pause_at)]
    command.append(str(linger_ms))
    with log.open("wb") as out:
        return subprocess.Popen(
            command, env=relay_env(settings), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT
        )


def is_stopped(process: subprocess.Popen[bytes]) -> bool:
    """Whether the process is stopped by a signal (Linux: state T in /proc)."""
    try:
        stat = Path(f"/proc/{process.pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] in {"T", "t"}


def end_processes(processes: list[subprocess.Popen[bytes]]) -> None:
    """Kill whatever is still running (stopped ones too) and reap it."""
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)


def leases(engine: Engine) -> dict[int, tuple[str | None, int]]:
    """Every shard's (owner, epoch)."""
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT shard, owner, epoch FROM blackbox.relay_leases"))
        return {int(s): (o, int(e)) for s, o, e in rows}


def grant_epoch(engine: Engine, shard: int, epoch: int) -> None:
    """Record that a relay was granted ``epoch`` of ``shard`` (as a takeover does), for a
    test that publishes as that relay would: readers move their fences only to epochs
    the write side granted."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO blackbox.relay_leases (shard, epoch) VALUES (:shard, :epoch) "
                "ON CONFLICT (shard) DO UPDATE "
                "SET epoch = greatest(blackbox.relay_leases.epoch, excluded.epoch)"
            ),
            {"shard": shard, "epoch": epoch},
        )


def outbox_rows(engine: Engine, shards: list[int] | None = None, upto: int | None = None) -> int:
    query = "SELECT count(*) FROM blackbox.outbox WHERE true"
    params: dict[str, Any] = {}
    if shards is not None:
        query += " AND shard = ANY(:shards)"
        params["shards"] = shards
    if upto is not None:
        query += " AND id <= :upto"
        params["upto"] = upto
    with engine.connect() as conn:
        return int(conn.execute(text(query), params).scalar_one())


def last_outbox_id(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT coalesce(max(id), 0) FROM blackbox.outbox")).scalar())


@dataclass(frozen=True)
class Published:
    partition: int
    offset: int
    stamp: LeaseStamp | None
    headers: list[tuple[str, bytes | None]]
    envelope: Envelope


def read_published(settings: Settings, *, expect: int, timeout: float = 60.0) -> list[Published]:
    """Every message of the topic with its headers, in offset order per partition."""
    codec = EnvelopeCodec()
    out: list[Published] = []
    messages = read_messages(
        settings.kafka_bootstrap, settings.topic, expect=expect, timeout=timeout
    )
    for msg in messages:
        headers = list(msg.headers() or [])
        envelope = codec.decode(msg.value() or b"")
        out.append(Published(msg.partition(), msg.offset(), read_stamp(headers), headers, envelope))
    out.sort(key=lambda m: (m.partition, m.offset))
    return out


@dataclass
class Writer:
    """A thread recording ticket-agent runs until stopped: load on the outbox."""

    recorder: Recorder
    recorded: list[RecordedRun]
    stop: threading.Event
    thread: threading.Thread | None = None
    error: BaseException | None = None

    def start(self) -> None:
        def loop() -> None:
            chunk = 0
            try:
                while not self.stop.is_set():
                    # Ticket ids of the sample set; every recording is a run of its own.
                    ids = [f"T-{(chunk * 4 + i) % 1_000:05d}" for i in range(4)]
                    self.recorded.extend(record_ticket_runs(self.recorder, ids, workers=2))
                    chunk += 1
            except BaseException as exc:  # reported by the test
                self.error = exc

        self.thread = threading.Thread(target=loop, daemon=True)
        self.thread.start()

    def finish(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=60)
        if self.error is not None:
            raise AssertionError(f"the writer failed: {self.error!r}")


class _PausingProducer:
    """The relay's producer, stopping the process once after ``pause_at`` messages of
    one batch were handed to it (``batch_started`` counts from the batch's start)."""

    def __init__(self, producer: Any, pause_at: int) -> None:
        self._producer = producer
        self._pause_at = pause_at
        self._in_batch = 0
        self._paused = False

    def batch_started(self) -> None:
        self._in_batch = 0

    def produce(self, *args: Any, **kwargs: Any) -> None:
        self._producer.produce(*args, **kwargs)
        self._in_batch += 1
        if not self._paused and self._in_batch == self._pause_at:
            self._paused = True
            print(f"pausing with {len(self._producer)} messages queued", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
            print("continued", flush=True)

    def __len__(self) -> int:
        return len(self._producer)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)


class _PausingRelay(Relay):
    def __init__(self, *args: Any, pause_at: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        publisher = self._pipeline._publisher
        self._pausing = _PausingProducer(publisher._producer, pause_at)
        publisher._producer = self._pausing  # type: ignore[assignment]

    def drain_once(self, stop: threading.Event | None = None) -> int:
        # A call produces one batch at most: the count starts again with each.
        self._pausing.batch_started()
        return super().drain_once(stop)


def _main(argv: list[str]) -> None:
    owner, pause_at, linger_ms = argv[0], int(argv[1]), int(argv[2])
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(name)s %(message)s")
    settings = Settings.from_env()
    engine = create_engine(settings.database_url, pool_size=4)
    relay = _PausingRelay(
        engine,
        settings=settings,
        owner=owner,
        options=RelayOptions(batch_size=500, lease_ttl_s=LEASE_TTL_S),
        producer_overrides={"linger.ms": linger_ms},
        pause_at=pause_at,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    relay.run(stop)
    engine.dispose()


def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Fixture body: the processes a test starts, ended whatever happens."""
    started: list[subprocess.Popen[bytes]] = []
    try:
        yield started
    finally:
        end_processes(started)


if __name__ == "__main__":
    _main(sys.argv[1:])
