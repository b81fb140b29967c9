"""The database's floor under the recorder: pgbench running the transaction of one
recorded event, on the same database, so a recorder figure can be read as a ratio.

A recorded tool call is one statement in autocommit: ``SELECT blackbox.append_event(...)``
(the guarded UPDATE of ``runs``, the ``outbox`` INSERT and its NOTIFY trigger, the checks
of the writer's credential, data key and envelope head, in PL/pgSQL). pgbench runs that
same call, with the same function, arguments and envelope bytes as the recorder sends
(a tool call's envelope the recorder wrote, given each client's run id, sequence and a
fresh event id, encoded by the same codec), as prepared statements as the driver
prepares them. Each pgbench client appends to a run of its own that the floor started
through ``blackbox.start_run``, with a credential it knows.

pgbench cannot build an Avro envelope, so the envelopes are made beforehand and kept in
an unlogged table keyed by (client, sequence); the script keeps its sequence in a client
variable and calls the function on that row. Reading that row (an index lookup in a
small table) is the only work the floor does that the recorder does not; it makes the
floor slightly slower, never faster.

A sealed template (the recorder has a key-encryption key) is appended as a plain run:
its envelopes keep the sealed bytes, without the key id the database would look up.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from glob import glob
from pathlib import Path

from sqlalchemy import Engine, make_url, text

from agent_blackbox.outbox import Recorder, RunSnapshot
from agent_blackbox.outbox.storage import shard_of
from agent_blackbox.schemas import GENESIS_CHAIN_HASH, Envelope, EnvelopeCodec
from bench._common import drop_runs, percentile

_SCRIPT = """\\set seq :seq + 1
SELECT blackbox.append_event(f.run_id, f.credential, f.shard, f.sequence, f.chain_hash,
    NULL, NULL, f.event_id, f.envelope, NULL, NULL, NULL, NULL, NULL, f.event_type,
    f.body_version, f.recorded_at)
  FROM {table} f WHERE f.client = :client_id AND f.sequence = :seq;
"""
_START_RUN = text(
    "SELECT blackbox.start_run(:run_id, :tenant_id, :agent_id, CAST(:subjects AS text[]), "
    ":genesis, NULL, 'bench', :classification, :retention_class, sha256(:credential))"
)
_COLUMNS = (
    "client, sequence, run_id, credential, shard, chain_hash, event_id, envelope, "
    "event_type, body_version, recorded_at"
)


@dataclass(frozen=True, slots=True)
class FloorResult:
    """What pgbench measured past each client's warm-up: per-transaction latencies,
    the rate of all clients together, and the CPU pgbench itself spent per transaction."""

    clients: int
    latencies_ms: list[float]
    tx_per_s: float
    client_cpu_us: float

    @property
    def average_ms(self) -> float:
        """Mean latency per transaction (what pgbench prints as ``latency average``)."""
        return sum(self.latencies_ms) / len(self.latencies_ms)

    @property
    def p50_ms(self) -> float:
        return percentile(self.latencies_ms, 50)


def pgbench_binary() -> str:
    """The pgbench of the newest Postgres installed (Debian's postgresql package ships it
    under ``/usr/lib/postgresql/<major>/bin``), else one on ``PATH``.

    Raises:
        RuntimeError: no pgbench on this machine.
    """
    found = sorted(glob("/usr/lib/postgresql/*/bin/pgbench"), key=_major, reverse=True)
    if found:
        return found[0]
    if (on_path := shutil.which("pgbench")) is not None:
        return on_path
    raise RuntimeError("pgbench not found: install the postgresql package (it ships pgbench)")


def _major(path: str) -> int:
    version = Path(path).parent.parent.name
    return int(version) if version.isdigit() else 0


def record_template(recorder: Recorder) -> Envelope:
    """A tool call's envelope as ``recorder`` writes it (read back from the outbox)."""
    run = recorder.start_run(RunSnapshot(code_version="bench"), agent_id="bench")
    run.call("noop", _noop, 1)
    with recorder.engine.connect() as conn:
        row = conn.execute(
            text("SELECT envelope FROM blackbox.outbox WHERE run_id = :id AND sequence = 2"),
            {"id": run.run_id},
        ).first()
    run.finish()
    drop_runs(recorder.engine, [run.run_id])
    if row is None:
        raise RuntimeError("the template's tool call left the outbox before it was read")
    return EnvelopeCodec().decode(bytes(row[0]))


def _noop(value: int) -> int:
    return value


class Floor:
    """pgbench against ``engine``'s database, appending copies of ``template``."""

    def __init__(self, engine: Engine, template: Envelope, *, shards: int) -> None:
        self._engine = engine
        self._template = replace(template, key_id=None)
        self._shards = shards
        self._table = f"public.bench_recorder_floor_{uuid.uuid4().hex[:12]}"
        self._run_ids: list[str] = []
        self._binary = pgbench_binary()

    @contextmanager
    def opened(self) -> Iterator[Floor]:
        """The floor with its table of envelopes; its runs and table dropped at the end."""
        with self._engine.begin() as conn:
            conn.execute(
                text(
                    f"CREATE UNLOGGED TABLE {self._table} (client int, sequence bigint, "
                    "run_id text, credential bytea, shard smallint, chain_hash text, "
                    "event_id uuid, envelope bytea, event_type text, body_version int, "
                    "recorded_at bigint, PRIMARY KEY (client, sequence))"
                )
            )
        try:
            yield self
        finally:
            drop_runs(self._engine, self._run_ids)
            with self._engine.begin() as conn:
                conn.execute(text(f"DROP TABLE IF EXISTS {self._table}"))

    def measure(self, *, clients: int, events: int, warmup: int) -> FloorResult:
        """``clients`` pgbench clients, each appending ``warmup + events`` events to a
        fresh run; the figures of the last ``events`` of each.

        Raises:
            RuntimeError: pgbench failed or did not run every transaction.
        """
        self._fill(clients, warmup + events)
        with tempfile.TemporaryDirectory(prefix="bench-floor-") as folder:
            script = Path(folder) / "append.sql"
            script.write_text(_SCRIPT.format(table=self._table))
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            self._pgbench(script, Path(folder) / "log", clients, warmup + events)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            done = _transactions(Path(folder).glob("log.*"), warmup=warmup)
        if len(done) != clients * events:
            raise RuntimeError(f"pgbench logged {len(done)} of {clients * events} transactions")
        cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
        started = min(end - ms / 1000 for end, ms in done)
        wall = max(end for end, _ in done) - started
        return FloorResult(
            clients=clients,
            latencies_ms=[ms for _, ms in done],
            tx_per_s=len(done) / wall,
            client_cpu_us=cpu / ((warmup + events) * clients) * 1e6,
        )

    def _fill(self, clients: int, events: int) -> None:
        """Start a run per client and store its ``events`` envelopes, replacing the last
        measurement's."""
        codec, template = EnvelopeCodec(), self._template
        with self._engine.begin() as conn:
            conn.execute(text(f"TRUNCATE {self._table}"))
            raw = conn.connection.driver_connection
            assert raw is not None
            for client in range(clients):
                run_id, credential = str(uuid.uuid4()), os.urandom(32)
                conn.execute(_START_RUN, self._start_params(run_id, credential))
                self._run_ids.append(run_id)
                shard = shard_of(run_id, self._shards)
                with raw.cursor().copy(f"COPY {self._table} ({_COLUMNS}) FROM STDIN") as copy:
                    for sequence in range(1, events + 1):
                        event_id = str(uuid.uuid4())
                        envelope = replace(
                            template, run_id=run_id, sequence=sequence, event_id=event_id
                        )
                        copy.write_row(
                            (
                                *(client, sequence, run_id, credential, shard),
                                *(template.chain_hash, event_id, codec.encode(envelope)),
                                *(template.event_type, template.body_version),
                                template.recorded_at_us,
                            )
                        )

    def _start_params(self, run_id: str, credential: bytes) -> dict[str, object]:
        template = self._template
        return {
            "run_id": run_id,
            "tenant_id": template.tenant_id,
            "agent_id": template.agent_id,
            "subjects": list(template.subject_ids),
            "genesis": GENESIS_CHAIN_HASH,
            "classification": template.classification,
            "retention_class": template.retention_class,
            "credential": credential,
        }

    def _pgbench(self, script: Path, log: Path, clients: int, transactions: int) -> None:
        url = make_url(self._engine.url)
        argv = [self._binary, "--no-vacuum", "--protocol=prepared", f"--client={clients}"]
        argv += [f"--jobs={min(clients, os.cpu_count() or 1)}", f"--transactions={transactions}"]
        argv += ["--define=seq=0", f"--file={script}", "--log", f"--log-prefix={log}"]
        argv += [f"--host={url.host or '127.0.0.1'}", f"--port={url.port or 5432}"]
        argv += [f"--username={url.username}", str(url.database)]
        env = {**os.environ, "PGPASSWORD": url.password or ""} if url.password else None
        done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"pgbench exited {done.returncode}: {done.stderr[-2000:]}")


def _transactions(logs: Iterable[Path], *, warmup: int) -> list[tuple[float, float]]:
    """(end time in seconds, latency in ms) of every logged transaction after each
    client's first ``warmup``. A line is ``client transaction latency_us script
    end_s end_us``."""
    done: list[tuple[float, float]] = []
    for log in logs:
        for line in log.read_text().splitlines():
            fields = line.split()
            if int(fields[1]) > warmup:
                done.append((int(fields[4]) + int(fields[5]) / 1e6, int(fields[2]) / 1000))
    return done
