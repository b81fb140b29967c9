"""Backup throughput and a restore drill over a large log.

Cloned runs of a recorded template (see ``bench._synthetic``) are produced to a fresh
topic by a bare producer with the relay's config, run by run in interleaved windows as
concurrent writers leave them; its rate, ``producer_events_per_s``, is the scale the
backup's own figure is read against (the relay's raw producer, measured in the same run).
Each clone also gets its row in ``blackbox.runs``, as the write side would hold it.

Then ``backup_events_per_s``: a :class:`BackupWriter` backs the topic up to the object
store (``BLACKBOX_BACKUP_URL``, under a fresh prefix; a temporary folder when unset),
from its start to its cut written. Last, the drill over all of it
(``drill_rto_s``, target 600 s for 1,000,000 events on two cores), with its RPO and the
time of each stage; ``drill_passed`` is 1 when every check passed.

    python -m bench.backup [--events 1000000] [--sample 20]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

from sqlalchemy import Engine, create_engine, text

from agent_blackbox.backup import (
    BACKUP_URL_ENV,
    BackupStore,
    BackupWriter,
    DrillOptions,
    FolderStore,
    open_store,
    run_drill,
)
from agent_blackbox.broker import ensure_topics, new_producer, producer_config
from agent_blackbox.consumers import migrate_views
from agent_blackbox.outbox.relay import EVENT_ID_HEADER
from agent_blackbox.schemas import (
    CheckpointSigner,
    CheckpointVerifier,
    Envelope,
    EnvelopeCodec,
    Settings,
    write_owner_only,
)
from bench import _synthetic
from bench._common import (
    bench_settings,
    console,
    delete_topics,
    drop_runs,
    emit,
    progress,
    stage,
)

BENCH = "backup"
DRILL_TARGET_S = 600.0
WINDOW_RUNS = 1_000
"""Runs cloned and interleaved at a time (bounded memory for a million events)."""
AGENT = "bench=bench._synthetic:bench_agent"


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.backup")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--sample", type=int, default=20)
    args = parser.parse_args(argv)
    settings = bench_settings(BENCH)
    migrate_views(settings.database_url)
    engine = create_engine(settings.database_url, pool_size=4)
    signer, folder = _signer()
    store = _store()
    run_ids: list[str] = []
    try:
        template = _synthetic.record_template(engine, settings)
        ensure_topics(settings)
        with stage("produce the topic"):
            run_ids = _produce(settings, template, args.events)
        _runs_rows(engine, template, run_ids)
        _back_up(settings, engine, store, signer, args.events)
        _drill(settings, store, signer, folder, args.events, args.sample)
    finally:
        drop_runs(engine, run_ids)
        engine.dispose()
        delete_topics(settings, [settings.topic, settings.dlq_topic])
        _empty(store)


def _signer() -> tuple[CheckpointSigner, Path]:
    signer = CheckpointSigner.generate()
    folder = Path(tempfile.mkdtemp(prefix="blackbox-bench-backup-"))
    write_owner_only(folder / "signer.pem", signer.private_key_pem())
    (folder / "signer.pub").write_bytes(signer.public_key_pem())
    return signer, folder


def _store() -> BackupStore:
    url = os.environ.get(BACKUP_URL_ENV)
    if url is None:
        return FolderStore(Path(tempfile.mkdtemp(prefix="blackbox-bench-store-")))
    prefix = f"bench-{uuid.uuid4().hex[:12]}"
    if url.startswith("s3://"):
        bucket, _, rest = url[len("s3://") :].partition("?")
        return open_store(f"s3://{bucket.rstrip('/')}/{prefix}?{rest}")
    return open_store(url.rstrip("/") + "/" + prefix)


def _windows(template: Sequence[Envelope], events: int) -> Iterator[list[Envelope]]:
    """The clones' envelopes, window by window, interleaved within each window."""
    runs = -(-events // len(template))
    left = events
    for first in range(0, runs, WINDOW_RUNS):
        clones = [
            _synthetic.clone(template, str(uuid.uuid4()))
            for _ in range(min(WINDOW_RUNS, runs - first))
        ]
        window = [c[i] for i in range(len(template)) for c in clones][:left]
        left -= len(window)
        yield window


def _produce(settings: Settings, template: Sequence[Envelope], events: int) -> list[str]:
    """Produce ``events`` cloned envelopes with the relay's producer config; the rate is
    taken over the producing alone (cloning and encoding are left out)."""
    codec = EnvelopeCodec()
    producer = new_producer(settings, producer_config(settings))
    run_ids: dict[str, None] = {}
    spent = 0.0
    with progress() as display:
        task = display.add_task("produce the topic", total=events)
        for window in _windows(template, events):
            encoded = [(e.run_id, e.event_id, codec.encode(e)) for e in window]
            started = time.perf_counter()
            for run_id, event_id, value in encoded:
                headers = [(EVENT_ID_HEADER, event_id.encode("ascii"))]
                while True:
                    try:
                        producer.produce(
                            settings.topic, key=run_id.encode(), value=value, headers=headers
                        )
                        break
                    except BufferError:
                        producer.poll(0.05)
                run_ids.setdefault(run_id)
            spent += time.perf_counter() - started
            display.advance(task, len(window))
        started = time.perf_counter()
        if left := producer.flush(300):
            raise RuntimeError(f"{left} messages were not delivered")
        spent += time.perf_counter() - started
    emit(BENCH, "producer_events_per_s", events / spent, unit="events/s", events=events)
    return list(run_ids)


def _runs_rows(engine: Engine, template: Sequence[Envelope], run_ids: Sequence[str]) -> None:
    """Each clone's row in ``blackbox.runs``. The chain heads differ per clone and are
    not known here; the drill rewinds a run's row to the cut's last event anyway."""
    first = template[0]
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO blackbox.runs (run_id, tenant_id, agent_id, status, last_sequence, "
                "chain_head, code_version) SELECT r, :tenant, :agent, 'succeeded', :last, "
                "'pending', 'bench' FROM unnest(CAST(:ids AS text[])) AS r"
            ),
            {
                "ids": list(run_ids),
                "tenant": first.tenant_id,
                "agent": first.agent_id,
                "last": len(template) + 1,
            },
        )


def _back_up(
    settings: Settings, engine: Engine, store: BackupStore, signer: CheckpointSigner, events: int
) -> None:
    started = time.perf_counter()
    with (
        BackupWriter(settings, store, signer=signer, engine=engine) as writer,
        progress() as display,
    ):
        task = display.add_task("back up to the store", total=events)
        writer.catch_up(progress=lambda done, _total: display.update(task, completed=done))
    elapsed = time.perf_counter() - started
    size = writer.written_bytes
    emit(BENCH, "backup_events_per_s", events / elapsed, unit="events/s", store=store.describe())
    emit(BENCH, "backup_bytes_per_event", size / events, unit="bytes", events=events)


def _drill(
    settings: Settings,
    store: BackupStore,
    signer: CheckpointSigner,
    folder: Path,
    events: int,
    sample: int,
) -> None:
    os.environ["BLACKBOX_SIGNING_PUBLIC_KEYS"] = str(folder / "signer.pub")
    os.environ.setdefault("BLACKBOX_AGENTS", AGENT)
    verifier = CheckpointVerifier({signer.key_id: signer.public_key})
    report = run_drill(
        settings,
        store,
        verifier=verifier,
        options=DrillOptions(sample=sample),
        say=lambda name: console.log(f"drill: {name}"),
    )
    for check in report.checks:
        if check.passed is False:
            console.print(f"[red]FAIL[/] {check.name}: {check.detail} {list(check.where)[:3]}")
    emit(BENCH, "drill_passed", float(report.passed), unit="bool", target=1.0)
    emit(
        BENCH,
        "drill_rto_s",
        report.rto_s if report.rto_s is not None else float("inf"),
        unit="s",
        target=DRILL_TARGET_S,
        at_least=False,
        events=events,
    )
    emit(BENCH, "drill_rpo_s", report.rpo_s or 0.0, unit="s", events=events)
    for name, seconds in report.stages.items():
        emit(BENCH, "drill_stage_s", seconds, unit="s", stage=name)


def _empty(store: BackupStore) -> None:
    for key in list(store.keys()):
        store.delete(key)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
