"""The recorder bench's floor (``bench._floor``): pgbench appends, through the recorder's
own ``append_event``, envelopes the database accepts as the recorder's, every client to a
run of its own; the measured figures cover exactly the transactions after the warm-up,
and nothing of the floor is left behind. Its figures are not checked here: timings belong
to the bench, never to a test."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from agent_blackbox.outbox import Recorder
from agent_blackbox.schemas import EnvelopeCodec, Settings
from bench import _floor

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _tables(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        query = "SELECT tablename FROM pg_tables WHERE tablename LIKE 'bench_recorder_floor_%'"
        return [str(row[0]) for row in conn.execute(text(query))]


def test_pgbench_appends_the_recorders_events_and_cleans_up(
    engine: Engine, settings: Settings
) -> None:
    recorder = Recorder(engine, settings=settings, group_commit=None)
    template = _floor.record_template(recorder)
    floor = _floor.Floor(engine, template, shards=settings.outbox_shards)
    with floor.opened():
        result = floor.measure(clients=2, events=5, warmup=3)
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT run_id, sequence, envelope FROM blackbox.outbox ORDER BY id")
            ).all()
            heads = dict(
                conn.execute(text("SELECT run_id, last_sequence FROM blackbox.runs")).all()
            )
        assert len(_tables(engine)) == 1

    assert len(result.latencies_ms) == 2 * 5  # the warm-up's 3 per client left out
    assert result.clients == 2
    assert result.tx_per_s > 0
    assert result.average_ms > 0
    assert sorted(heads.values()) == [8, 8]  # two runs, each at warm-up + events
    codec = EnvelopeCodec()
    decoded = [codec.decode(bytes(envelope)) for _, _, envelope in rows]
    assert len(decoded) == 16
    for (run_id, sequence, _), envelope in zip(rows, decoded, strict=True):
        assert (envelope.run_id, envelope.sequence) == (run_id, sequence)
        assert envelope.event_type == template.event_type
        assert envelope.payload == template.payload  # the recorder's body, byte for byte
    assert len({e.event_id for e in decoded}) == 16
    # Left behind: nothing (the runs, their outbox rows and the table of envelopes).
    assert _tables(engine) == []
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM blackbox.runs")).scalar_one() == 0
        assert conn.execute(text("SELECT count(*) FROM blackbox.outbox")).scalar_one() == 0


def test_the_log_is_read_past_each_clients_warm_up(tmp_path: Path) -> None:
    log = tmp_path / "log.1"
    # client, transaction, latency µs, script, end s, end µs
    log.write_text("0 1 900 0 100 0\n0 2 400 0 100 500000\n1 1 800 0 101 0\n1 2 300 0 101 250\n")
    assert _floor._transactions([log], warmup=1) == [(100.5, 0.4), (101.00025, 0.3)]
