"""Finding 5 (as a new user's attacker trial found it): a forged message must neither
damage the views nor block verification.

With produce access to the topic only, the attacker wrote

- an unsigned, correctly chained ``run.redacted`` after a real run's signed end: the
  views consumer marked the run redacted (limited replay) and replaced every digest of
  it by ``shredded``;
- one event of a real run on another partition than the run's key maps to: the run was
  then "indexed on 2 partitions", ``verify --all`` exited 2 without a table, and
  ``replay`` and ``timeline --bodies`` failed.

Now the views act on a ``run.redacted`` only when the write side's deletion ledger
confirms it (a genuine one still shreds), an event on the wrong partition is flagged
and not indexed, and ``verify --all`` reports a run it cannot read and verifies the
others.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer
from sqlalchemy import Engine, text

from agent_blackbox.broker import run_partition
from agent_blackbox.cli import main
from agent_blackbox.consumers import (
    RetentionJob,
    RetentionPolicy,
    ViewConsumer,
    ViewRunIndex,
    runs_view,
)
from agent_blackbox.keystore import DataKeyStore, LocalKeyProvider
from agent_blackbox.outbox import Recorder, RunSnapshot
from agent_blackbox.schemas import BodyCodec, Envelope, EventType, Settings
from tests.integration._agents import RecordedRun, record_ticket_runs, ticket_ids
from tests.integration._views import build_views
from tests.integration._wait import eventually
from tests.security._forging import produce_to
from tests.security._signing import (
    produce,
    relay_all,
    sign_until,
    signing_key,
    topic_events,
    verify,
    violations,
)

pytestmark = pytest.mark.integration

POLICY = RetentionPolicy.from_mapping({"standard": {"bodies_days": 30, "metadata_days": 400}})


def _note_after(last: Envelope, key_ids: list[str]) -> Envelope:
    """An unsigned run.redacted correctly chained after ``last``: what a producer forges."""
    body: dict[str, Any] = {
        "reason": "forget",
        "retention_class": None,
        "subject_id": "customer-1",
        "key_ids": key_ids,
    }
    note = replace(
        last,
        event_id=str(uuid.uuid4()),
        sequence=last.sequence + 1,
        event_type=EventType.RUN_REDACTED,
        body_version=1,
        payload=BodyCodec().encode("run.redacted", 1, body),
        payload_encoding="avro",
        key_id=None,
        attributes={"reason": "forget", "keys_destroyed": str(len(key_ids))},
        chain_hash="",
    )
    return replace(note, chain_hash=note.expected_chain_hash(last.chain_hash))


def _run_row(engine: Engine, run_id: str) -> tuple[bool, object]:
    with engine.connect() as conn:
        row = conn.execute(runs_view.select().where(runs_view.c.run_id == run_id)).one()
    return bool(row.limited_replay), row.redacted_at


def _digests(engine: Engine, run_id: str) -> list[tuple[int, str, str]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT sequence, input_digest, output_digest FROM blackbox_views.events "
                "WHERE run_id = :r ORDER BY sequence"
            ),
            {"r": run_id},
        )
        return [(int(s), str(i), str(o)) for s, i, o in rows]


def test_a_forged_redaction_note_changes_nothing_in_the_views(
    settings: Settings, engine: Engine, tmp_path: Path
) -> None:
    key = signing_key(tmp_path)
    keys = DataKeyStore(LocalKeyProvider({"v1": os.urandom(32)}))
    [real] = record_ticket_runs(Recorder(engine, settings=settings, keys=keys), ticket_ids(1))
    relay_all(settings, engine)
    build_views(settings, engine, expect=real.events)
    index = ViewRunIndex(engine)
    sign_until(
        settings, engine, key.signer, lambda: index.checkpoint(real.run_id), what="signed end"
    )
    events = topic_events(settings, real.run_id, expect=real.events)
    assert events[-1].event_type == EventType.RUN_FINISHED
    before = _digests(engine, real.run_id)
    assert all(digest != "shredded" for _, i, o in before for digest in (i, o))

    # The attacker appends an unsigned run.redacted naming the run's real key.
    produce(settings, [_note_after(events[-1], [str(events[-1].key_id)])])
    build_views(settings, engine, expect=real.events + 1)

    assert _run_row(engine, real.run_id) == (False, None)
    assert _digests(engine, real.run_id)[: real.events] == before
    assert ("unconfirmed_redaction", real.events + 1) in violations(engine, real.run_id)

    # A genuine deletion (the retention job's, in the write side's ledger) still shreds.
    report = RetentionJob(engine, policy=POLICY, settings=settings).forget("customer-1")
    assert [r.run_id for r in report.redacted] == [real.run_id]
    relay_all(settings, engine)
    with engine.connect() as conn:
        indexed = conn.execute(text("SELECT count(*) FROM blackbox_views.events")).scalar_one()
    with ViewConsumer(settings, engine=engine) as consumer:

        def shredded() -> bool:
            consumer.poll_once(0.5)
            return _run_row(engine, real.run_id)[0]

        eventually(shredded, timeout=60, what="the genuine redaction applied")
    assert indexed == real.events + 1
    assert _run_row(engine, real.run_id)[1] is not None
    assert {i for _, i, _ in _digests(engine, real.run_id)} == {"shredded"}


def _cli(settings: Settings, *args: str) -> Any:
    env = {
        "BLACKBOX_DATABASE_URL": settings.database_url,
        "BLACKBOX_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "BLACKBOX_TOPIC": settings.topic,
        "BLACKBOX_AGENTS": "ticket-agent=agent_blackbox.examples.ticket_agent:replay_entry",
        "BLACKBOX_PURPOSE": "security test of forged messages",
        "BLACKBOX_KEK": None,
        "BLACKBOX_KEK_FILE": None,
    }
    return CliRunner(env=env).invoke(main, list(args))


def _forge_on_wrong_partition(settings: Settings, engine: Engine, run: RecordedRun) -> int:
    """A correctly chained next event of ``run`` on a partition its key does not map to;
    returns that partition once the views consumer has taken it."""
    events = topic_events(settings, run.run_id, expect=run.events)
    last = events[-1]
    forged = replace(last, event_id=str(uuid.uuid4()), sequence=last.sequence + 1, chain_hash="")
    forged = replace(forged, chain_hash=forged.expected_chain_hash(last.chain_hash))
    home = run_partition(run.run_id, settings.partitions)
    wrong = (home + 1) % settings.partitions
    produce_to(settings, forged, wrong)
    with ViewConsumer(settings, engine=engine) as consumer:

        def taken() -> bool:
            consumer.poll_once(0.5)
            with engine.connect() as conn:
                indexed = conn.execute(
                    text("SELECT max(sequence) FROM blackbox_views.events WHERE run_id = :r"),
                    {"r": run.run_id},
                ).scalar_one()
            return indexed == run.events + 1 or bool(violations(engine, run.run_id))

        eventually(taken, timeout=60, what="the forged event consumed")
    return wrong


def test_an_event_on_the_wrong_partition_blocks_no_reader(
    settings: Settings, engine: Engine, tmp_path: Path
) -> None:
    key = signing_key(tmp_path)
    runs = record_ticket_runs(Recorder(engine, settings=settings), ticket_ids(3))
    relay_all(settings, engine)
    build_views(settings, engine, expect=sum(r.events for r in runs))
    target = runs[0]

    wrong = _forge_on_wrong_partition(settings, engine, target)

    assert violations(engine, target.run_id) == [("wrong_partition", target.events + 1)]
    located = ViewRunIndex(engine).locate(target.run_id)
    assert located is not None
    assert (located.partition, located.events) == (
        run_partition(target.run_id, settings.partitions),
        target.events,
    )
    assert located.partition != wrong

    code, reports = verify(settings, key, "--all")
    assert code == 1  # the misplaced event is a finding, listed; the run is still read
    by_run = {r["run_id"]: r for r in reports}
    assert set(by_run) == {r.run_id for r in runs}
    assert {r["result"] for r in reports} == {"unverified"}  # sound; nothing signed yet
    [misplaced] = by_run[target.run_id]["skipped_messages"]
    assert misplaced["partition"] == wrong
    assert "whose key maps to partition" in misplaced["reason"]

    single = _cli(settings, "replay", target.run_id)
    assert single.exit_code == 0, single.output
    assert "PASS" in single.stdout
    every = _cli(settings, "replay", "--all")
    assert every.exit_code == 0, every.output
    timeline = _cli(settings, "timeline", target.run_id, "--bodies", "--purpose", "audit")
    assert timeline.exit_code == 0, timeline.output


def test_verify_all_reports_a_run_it_cannot_read_and_verifies_the_others(
    settings: Settings, engine: Engine, tmp_path: Path
) -> None:
    key = signing_key(tmp_path)
    runs = record_ticket_runs(Recorder(engine, settings=settings), ticket_ids(2))
    relay_all(settings, engine)
    build_views(settings, engine, expect=sum(r.events for r in runs))
    # An index built before wrong-partition events were flagged: the first run also
    # "indexed" on another partition. Readers take the partition its key maps to.
    first = runs[0].run_id
    home = run_partition(first, settings.partitions)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO blackbox_views.events SELECT run_id, 999, :e, event_type, "
                "body_version, topic, :p, 0, input_digest, output_digest, chain_hash, "
                "recorded_at, key_id, payload_ref FROM blackbox_views.events "
                "WHERE run_id = :r AND sequence = 1"
            ),
            {"r": first, "e": str(uuid.uuid4()), "p": (home + 1) % settings.partitions},
        )
        # A run the views know but whose events the index lost.
        conn.execute(
            runs_view.insert().values(
                run_id="lost-run",
                tenant_id="default",
                agent_id="ticket-agent",
                last_event_at=conn.execute(text("SELECT now()")).scalar_one(),
            )
        )

    code, reports = verify(settings, key, "--all")
    assert code == 1
    by_run = {r["run_id"]: r["result"] for r in reports}
    assert by_run == {first: "unverified", runs[1].run_id: "unverified", "lost-run": "unreadable"}


def test_junk_under_a_runs_key_blocks_no_reader(
    settings: Settings, engine: Engine, tmp_path: Path
) -> None:
    """Bytes that are no envelope, produced under a live run's key to its own partition
    (between its events): the view consumer dead-letters them, and verify and timeline
    pass over them instead of stopping at that run (verify lists them, a finding)."""
    key = signing_key(tmp_path)
    run = Recorder(engine, settings=settings).start_run(
        RunSnapshot(code_version="junk.1", input={}), agent_id="junk"
    )
    run.now()
    relay_all(settings, engine)
    producer = Producer(
        {"bootstrap.servers": settings.kafka_bootstrap, "partitioner": "murmur2_random"}
    )
    producer.produce(settings.topic, b"\xc3\x01" + b"\xee" * 8 + b"junk", key=run.run_id.encode())
    assert producer.flush(30) == 0
    run.now()
    run.finish(status="succeeded", output={"ok": True})
    relay_all(settings, engine)
    build_views(settings, engine, expect=run.last_sequence)

    code, reports = verify(settings, key, run.run_id)
    assert code == 1, reports  # the junk is a finding: the report still comes, listing it
    assert [r["result"] for r in reports] == ["unverified"]  # sound; nothing signed yet
    [junk] = reports[0]["skipped_messages"]
    assert junk["key"] == run.run_id
    assert "unknown writer schema fingerprint" in junk["reason"]
    shown = _cli(settings, "timeline", run.run_id)
    assert shown.exit_code == 0, shown.output
    assert "run.finished" in shown.stdout
