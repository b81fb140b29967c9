"""Security: a group flush (``blackbox.append_events``, migration 0009) is held to every
check ``append_event`` makes of a single event, tried as a writer login calling the
function directly with a hand-built batch."""

from __future__ import annotations

import os
import uuid
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from agent_blackbox.outbox import Recorder, Run, RunSnapshot
from agent_blackbox.outbox._boundaries import clock_read
from agent_blackbox.outbox._core import Cursor, new_factory, utc_now
from agent_blackbox.outbox._postgres import load_run_txn
from agent_blackbox.outbox._writer import new_event_id
from agent_blackbox.schemas import Settings
from tests.conftest import Login
from tests.security.conftest import TENANT_A, TENANT_B

pytestmark = pytest.mark.integration

APPEND_EVENTS = text(
    "SELECT blackbox.append_events(:run_id, :credential, CAST(:shard AS smallint), "
    "CAST(:sequences AS bigint[]), CAST(:chain_hashes AS text[]), CAST(:event_ids AS uuid[]), "
    "CAST(:envelopes AS bytea[]), CAST(:key_ids AS text[]), CAST(:event_types AS text[]), "
    "CAST(:body_versions AS integer[]), CAST(:recorded_ats AS bigint[]))"
)


def _batch(engine: Engine, settings: Settings, run: Run, count: int) -> dict[str, Any]:
    """The parameters of a correct batch of ``count`` clock reads after the head of
    ``run`` (read as the owner), under the credential its recorder holds."""
    with engine.connect() as conn:
        stored = load_run_txn(conn, run.run_id, shards=settings.outbox_shards)
    factory = new_factory(settings, None, utc_now)
    cursor, events = stored.cursor, []
    for i in range(count):
        crossing = clock_read(clock="wall", value_us=1_700_000_000_000_000 + i)
        event = factory.prepare(stored.identity, cursor, crossing, event_id=new_event_id())
        events.append(event)
        cursor = Cursor(event.envelope.sequence, event.envelope.chain_hash)
    envelopes = [event.envelope for event in events]
    return {
        "run_id": run.run_id,
        "credential": run.core.identity.credential,
        "shard": stored.identity.shard,
        "sequences": [e.sequence for e in envelopes],
        "chain_hashes": [e.chain_hash for e in envelopes],
        "event_ids": [e.event_id for e in envelopes],
        "envelopes": [event.encoded for event in events],
        "key_ids": [e.key_id for e in envelopes],
        "event_types": [str(e.event_type) for e in envelopes],
        "body_versions": [e.body_version for e in envelopes],
        "recorded_ats": [e.recorded_at_us for e in envelopes],
    }


def _head(engine: Engine) -> tuple[list[Any], int]:
    with engine.connect() as conn:
        runs = list(
            conn.execute(
                text("SELECT run_id, last_sequence, chain_head FROM blackbox.runs ORDER BY run_id")
            )
        )
        outbox = conn.execute(text("SELECT count(*) FROM blackbox.outbox")).scalar_one()
    return runs, outbox


def test_a_batch_is_refused_whole_for_any_bad_event(
    login: Login, engine: Engine, settings: Settings
) -> None:
    writer = login("blackbox_writer", tenant=TENANT_B)
    recorder = Recorder(writer, settings=settings)
    own = recorder.start_run(
        RunSnapshot(code_version="sec.1", input={}), agent_id="b", tenant_id=TENANT_B
    )
    other = Recorder(login("blackbox_writer", tenant=TENANT_A), settings=settings).start_run(
        RunSnapshot(code_version="sec.1", input={}), agent_id="a", tenant_id=TENANT_A
    )
    batch = _batch(engine, settings, own, 3)
    foreign = _batch(engine, settings, other, 3)
    swapped = list(batch["envelopes"])
    swapped[1] = foreign["envelopes"][1]  # another run's (and tenant's) envelope inside
    attacks = {
        "was not started by this writer": {**batch, "credential": os.urandom(32)},
        "another run's credential": {**batch, "credential": other.core.identity.credential},
        "does not carry that run": {**batch, "envelopes": swapped},
        "does not carry that run, sequence": {
            **batch,
            "event_ids": [batch["event_ids"][0], str(uuid.uuid4()), batch["event_ids"][2]],
        },
        "must follow each other": {**batch, "sequences": [s * 2 for s in batch["sequences"]]},
        "of one length": {**batch, "chain_hashes": batch["chain_hashes"][:2]},
        "carries no 'effect.intent' event": {
            **batch,
            "event_types": ["clock.read", "effect.intent", "clock.read"],
        },
        "is not a data key of run": {**batch, "key_ids": [None, "k-forged", None]},
    }
    before = _head(engine)
    for expected, params in attacks.items():
        match = "was not started by this writer" if expected.startswith("another") else expected
        with writer.connect() as conn, pytest.raises(DBAPIError, match=match):
            conn.execute(APPEND_EVENTS, params)
        assert _head(engine) == before, expected
    # The same batch, untouched, is written whole; sent again, it finds the run moved on.
    with writer.begin() as conn:
        assert conn.execute(APPEND_EVENTS, batch).scalar_one() == 3
    with writer.begin() as conn:
        assert conn.execute(APPEND_EVENTS, batch).scalar_one() == 0
    runs, outbox = _head(engine)
    assert outbox == before[1] + 3
    assert (own.run_id, batch["sequences"][-1], batch["chain_hashes"][-1]) in runs
