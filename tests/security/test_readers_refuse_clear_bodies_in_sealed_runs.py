"""Finding 1, the readers' half: a clear body forged into an encrypted run is refused.

A tenant-A writer records an encrypted run that crashes before ``run.finished``. An
attacker with produce access to the event topic appends a correctly chained
``run.finished`` with a plaintext body, as a producer would. The view consumer records
an integrity violation and does not let it end the run; ``timeline --bodies`` (as the
replayer, with the keys) shows a refusal instead of the forged body; ``replay`` fails
the run as an ERROR naming the event, never a divergence.
"""

from __future__ import annotations

import base64
import json
import os
import uuid
from dataclasses import replace
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer
from sqlalchemy import Engine, select

from agent_blackbox.cli import main
from agent_blackbox.consumers import integrity_violations
from agent_blackbox.keystore import DataKeyStore, LocalKeyProvider
from agent_blackbox.outbox import AgentRun, MemoryRecorder, Recorder, RunSnapshot
from agent_blackbox.outbox.relay import Relay
from agent_blackbox.schemas import (
    PLAIN_ENCODING,
    PLAINTEXT_IN_SEALED_RUN,
    Envelope,
    EnvelopeCodec,
    EventType,
    Settings,
)
from tests.conftest import Login
from tests.integration._kafka import read_topic
from tests.integration._views import build_views, view_runs
from tests.security.conftest import TENANT_A

pytestmark = pytest.mark.integration

KEK = os.urandom(32)
SECRET = "sealed-note-5521"
FORGED = "FORGED-CLEAR-OUTPUT-9034"
AGENT = "sealed-readers"


def agent(run: AgentRun, input: Any) -> Any:
    note = run.call("lookup", lambda ticket: {"note": f"{SECRET} {ticket}"}, input["ticket"])
    return note["note"]


def _crashed_sealed_run(writer: Engine, settings: Settings) -> str:
    """An encrypted run that recorded its call and died before ``run.finished``."""
    recorder = Recorder(writer, settings=settings, keys=DataKeyStore(LocalKeyProvider({"v1": KEK})))
    run = recorder.start_run(
        RunSnapshot(code_version="sealed.1", input={"ticket": "T-9"}),
        agent_id=AGENT,
        tenant_id=TENANT_A,
    )
    agent(run, {"ticket": "T-9"})
    return run.run_id


def _forged_finish(last: Envelope) -> Envelope:
    """A plaintext ``run.finished`` chained after ``last``, built as anyone can: a plain
    body needs no key."""
    template = MemoryRecorder()
    run = template.start_run(RunSnapshot("x", {}), agent_id=AGENT)
    run.finish(output=FORGED)
    finished = template.events[-1]
    assert finished.payload_encoding == PLAIN_ENCODING
    assert FORGED.encode() in (finished.payload or b"")
    forged = replace(
        finished,
        event_id=str(uuid.uuid4()),
        run_id=last.run_id,
        sequence=last.sequence + 1,
        tenant_id=last.tenant_id,
        agent_id=last.agent_id,
        subject_ids=last.subject_ids,
        key_id=None,
        chain_hash="",
    )
    return replace(forged, chain_hash=forged.expected_chain_hash(last.chain_hash))


def _produce(settings: Settings, envelope: Envelope) -> None:
    producer = Producer(
        {"bootstrap.servers": settings.kafka_bootstrap, "partitioner": "murmur2_random"}
    )
    producer.produce(
        settings.topic, key=envelope.run_id.encode(), value=EnvelopeCodec().encode(envelope)
    )
    assert producer.flush(30) == 0


def _env(settings: Settings, database_url: str) -> dict[str, str | None]:
    return {
        "BLACKBOX_DATABASE_URL": database_url,
        "BLACKBOX_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "BLACKBOX_TOPIC": settings.topic,
        "BLACKBOX_AGENTS": f"{AGENT}={__name__}:agent",
        "BLACKBOX_KEK": f"v1:{base64.b64encode(KEK).decode()}",
        "BLACKBOX_KEK_FILE": None,
        "BLACKBOX_PURPOSE": "incident 1 forged finish",
        "COLUMNS": "400",
    }


def test_a_forged_plaintext_finish_is_refused_by_every_reader(
    engine: Engine, settings: Settings, login: Login
) -> None:
    writer = login("blackbox_writer", tenant=TENANT_A)
    run_id = _crashed_sealed_run(writer, settings)
    relay = Relay(engine, settings=settings)
    try:
        relay.drain(timeout=60)
    finally:
        relay.close()
    build_views(settings, engine, expect=2)
    genuine = [e for _, _, e in read_topic(settings.kafka_bootstrap, settings.topic, expect=2)]
    assert [e.key_id is not None for e in genuine] == [True, True]
    before = view_runs(engine)[run_id]
    assert before[:3] == ("running", 2, 2)

    forged = _forged_finish(genuine[-1])
    assert forged.event_type == EventType.RUN_FINISHED
    _produce(settings, forged)
    build_views(settings, engine, expect=3)

    # The view consumer: a violation naming the event; the run is not ended by it.
    with engine.connect() as conn:
        violations = conn.execute(
            select(
                integrity_violations.c.kind,
                integrity_violations.c.run_id,
                integrity_violations.c.sequence,
                integrity_violations.c.event_id,
            )
        ).all()
    assert violations == [(PLAINTEXT_IN_SEALED_RUN, run_id, 3, forged.event_id)]
    assert view_runs(engine)[run_id] == before

    replayer = login("blackbox_replayer", tenant=TENANT_A)
    env = _env(settings, replayer.url.render_as_string(hide_password=False))

    # The timeline, with bodies, as the replayer holding the keys: the forged event is
    # past the run's head, so it is left out unless asked for, and then refused.
    timeline = ["timeline", run_id, "--bodies", "--purpose", "incident 1 forged finish"]
    shown = CliRunner(env=env).invoke(main, timeline)
    assert shown.exit_code == 0, shown.output
    assert "run.finished" not in shown.stdout
    shown = CliRunner(env=env).invoke(main, [*timeline, "--include-unverified"])
    assert shown.exit_code == 0, shown.output
    assert SECRET in shown.stdout  # the genuine sealed body opens
    assert FORGED not in shown.output
    assert "run.finished (refused) (unverified)" in shown.stdout
    assert "refused: plaintext body in a run sealed under data key" in shown.stdout

    # Replay: an ERROR naming the forged event, not a divergence.
    replayed = CliRunner(env=env).invoke(main, ["replay", run_id, "--json"])
    assert replayed.exit_code == 2, replayed.output
    line = json.loads(replayed.stdout.splitlines()[0])
    assert line["result"] == "ERROR"
    assert line["divergence"] is None
    assert "plaintext body" in line["error"]
    assert f"sequence 3 (run.finished, event {forged.event_id})" in line["error"]
    assert FORGED not in replayed.output
