"""Retention and deletion on the real stack: crypto-shredding reaches every copy.

Encrypted runs are recorded for two data subjects and relayed to Kafka; a copy of the
topic is taken; then one subject is forgotten. Their bodies no longer open from the
topic, from the copy taken before, or after an old backup of the key store is restored
(the ledger in the topic is re-applied); the other subject's run still replays.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select, text

from agent_blackbox.consumers import (
    RetentionJob,
    RetentionPolicy,
    entries_of,
    ledger_entries,
    reapply_ledger,
    runs_view,
)
from agent_blackbox.keystore import (
    AesGcmSealer,
    AuditedKeys,
    DataKeyStore,
    KeyDestroyed,
    LocalKeyProvider,
)
from agent_blackbox.outbox import AgentRun, Recorder, RunNotActive, RunSnapshot
from agent_blackbox.outbox.relay import Relay
from agent_blackbox.replayer import replay_run
from agent_blackbox.schemas import (
    CheckpointSigner,
    CheckpointVerifier,
    Envelope,
    EventType,
    PayloadPipeline,
    Settings,
)
from tests._run_ids import unchecked_run_ids
from tests.integration._kafka import read_topic
from tests.integration._outbox import outbox_envelopes
from tests.integration._views import build_views

pytestmark = pytest.mark.integration

PROVIDER = LocalKeyProvider({"v1": os.urandom(32)})
POLICY = RetentionPolicy.from_mapping({"standard": {"bodies_days": 30, "metadata_days": 400}})


def agent(run: AgentRun, input: Any) -> Any:
    found = run.call("lookup", lambda who: {"address": f"{who} lives at 1 Main St"}, input["who"])
    run.transition("found", state={"address": found["address"]})
    return found["address"]


def _record(engine: Engine, settings: Settings, who: str) -> str:
    recorder = Recorder(engine, settings=settings, keys=DataKeyStore(PROVIDER))
    snapshot = RunSnapshot(code_version="retention.1", input={"who": who})
    run, _ = recorder.record(agent, snapshot, agent_id="retention", subject_ids=(who,))
    return run.run_id


def _relay(engine: Engine, settings: Settings) -> None:
    relay = Relay(engine, settings=settings)
    try:
        relay.drain(timeout=60)
    finally:
        relay.close()


def _by_run(messages: list[tuple[int, int, Envelope]]) -> dict[str, list[Envelope]]:
    runs: dict[str, list[Envelope]] = {}
    for _, _, envelope in sorted(messages, key=lambda m: (m[0], m[1])):
        runs.setdefault(envelope.run_id, []).append(envelope)
    return runs


def _pipeline(engine: Engine, purpose: str) -> PayloadPipeline:
    return PayloadPipeline(sealer=AesGcmSealer(AuditedKeys(engine, PROVIDER, purpose=purpose)))


def _opening(engine: Engine, purpose: str) -> dict[str, Any]:
    """A replay's pipeline and digest keys: runs recorded with keys take keyed digests."""
    keys = AuditedKeys(engine, PROVIDER, purpose=purpose)
    return {"pipeline": PayloadPipeline(sealer=AesGcmSealer(keys)), "digests": keys}


def test_forget_destroys_a_subjects_bodies_everywhere(engine: Engine, settings: Settings) -> None:
    alice = [_record(engine, settings, "alice") for _ in range(2)]
    bob = _record(engine, settings, "bob")
    _relay(engine, settings)
    copy = _by_run(read_topic(settings.kafka_bootstrap, settings.topic, expect=12))
    with engine.connect() as conn:
        backup = conn.execute(text("SELECT * FROM blackbox.data_keys")).mappings().all()

    report = RetentionJob(engine, policy=POLICY, settings=settings).forget("alice")
    assert sorted(r.run_id for r in report.redacted) == sorted(alice)
    assert all(len(r.key_ids) == 1 for r in report.redacted)
    assert RetentionJob(engine, policy=POLICY, settings=settings).forget("alice").redacted == ()

    _relay(engine, settings)
    now = _by_run(read_topic(settings.kafka_bootstrap, settings.topic, expect=14))
    for run_id in alice:
        assert now[run_id][-1].event_type == EventType.RUN_REDACTED
        for source in (now[run_id], copy[run_id]):  # the topic today, and the old copy
            with pytest.raises(KeyDestroyed, match=f"run {run_id} key dk-"):
                _pipeline(engine, "forget test").unpack(source[1])
        limited = replay_run(now[run_id], agent, **_opening(engine, "limited"))
        assert limited.result == "LIMITED", limited.to_dict()
        assert limited.levels == {
            "control_flow": "pass",
            "state": "unavailable",
            "content": "unavailable",
        }
        assert limited.limited is not None
        assert "destroyed" in limited.limited
    kept = replay_run(copy[bob], agent, **_opening(engine, "bob still replays"))
    assert kept.result == "PASS", kept.divergence and kept.divergence.describe()

    build_views(settings, engine, expect=14)
    with engine.connect() as conn:
        rows = conn.execute(select(runs_view.c.run_id, runs_view.c.limited_replay))
        flags = {str(run_id): bool(flag) for run_id, flag in rows}
        ledger = conn.execute(
            text("SELECT action, run_id, subject_id FROM blackbox.deletion_ledger")
        ).all()
    assert flags == {alice[0]: True, alice[1]: True, bob: False}
    assert sorted(ledger) == sorted(("shred_keys", run_id, "alice") for run_id in alice)

    # An old backup of the key store comes back; the ledger in the topic wins.
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM blackbox.data_keys"))
        for row in backup:
            conn.execute(
                text(
                    "INSERT INTO blackbox.data_keys (key_id, run_id, tenant_id, kek_version, "
                    "wrapped, created_at) VALUES (:key_id, :run_id, :tenant_id, :kek_version, "
                    ":wrapped, :created_at)"
                ),
                dict(row),
            )
        # ... and with it the run rows as they were before forget scrubbed them.
        conn.execute(
            text(
                "UPDATE blackbox.runs SET subject_ids = '{alice}', state = 'alice at 1 Main St' "
                "WHERE run_id = ANY(:runs)"
            ),
            {"runs": alice},
        )
    entries = list(ledger_entries(settings))
    assert sorted(e.run_id for e in entries) == sorted(alice)
    again = reapply_ledger(engine, entries)  # unsigned notes the database's ledger records
    assert again.ignored == ()
    assert sorted(run_id for run_id, _ in again.destroyed) == sorted(alice)
    with engine.connect() as conn:  # scrubbed again with the keys' destruction
        restored = conn.execute(
            text("SELECT subject_ids, state FROM blackbox.runs WHERE run_id = ANY(:runs)"),
            {"runs": alice},
        ).all()
    assert [tuple(row) for row in restored] == [([], None)] * len(alice)
    for run_id in alice:
        with pytest.raises(KeyDestroyed):
            _pipeline(engine, "after restore").unpack(copy[run_id][1])
    assert replay_run(copy[bob], agent, **_opening(engine, "after restore")).passed


def test_retention_shreds_expired_bodies_then_deletes_expired_metadata(
    engine: Engine, settings: Settings
) -> None:
    run_id = _record(engine, settings, "carol")
    start = datetime.now(UTC)

    def job(days: int) -> RetentionJob:
        at = start + timedelta(days=days)
        return RetentionJob(engine, policy=POLICY, settings=settings, clock=lambda: at)

    assert job(29).run_once().redacted == ()
    shredded = job(31).run_once()
    assert [(r.run_id, r.reason) for r in shredded.redacted] == [(run_id, "retention")]
    assert job(31).run_once().metadata_deleted == ()  # metadata is kept far longer
    _relay(engine, settings)  # run.redacted leaves the outbox before metadata can go
    assert job(401).run_once().metadata_deleted == (run_id,)
    with engine.connect() as conn:
        left = conn.execute(
            text("SELECT count(*) FROM blackbox.runs WHERE run_id = :r"), {"r": run_id}
        ).scalar_one()
        actions = (
            conn.execute(
                text("SELECT action FROM blackbox.deletion_ledger WHERE run_id = :r ORDER BY id"),
                {"r": run_id},
            )
            .scalars()
            .all()
        )
    assert left == 0
    assert actions == ["shred_keys", "delete_metadata"]


def _crashed(engine: Engine, settings: Settings, who: str) -> str:
    """A run whose writer died after one tool call: still marked running."""
    recorder = Recorder(engine, settings=settings, keys=DataKeyStore(PROVIDER))
    snapshot = RunSnapshot(code_version="retention.1", input={"who": who})
    run = recorder.start_run(snapshot, agent_id="retention", subject_ids=(who,))
    run.call("lookup", lambda w: {"address": f"{w} lives here"}, who)
    return run.run_id


def test_forget_goes_past_a_running_run_and_reports_it(engine: Engine, settings: Settings) -> None:
    running = _crashed(engine, settings, "dave")
    ended = _record(engine, settings, "dave")  # recorded after the running one
    report = RetentionJob(engine, policy=POLICY, settings=settings).forget("dave")
    assert [r.run_id for r in report.redacted] == [ended]
    assert report.still_running == (running,)


def test_retention_marks_a_silent_running_run_abandoned_and_then_shreds_it(
    engine: Engine, settings: Settings
) -> None:
    crashed = _crashed(engine, settings, "erin")
    start = datetime.now(UTC)

    def job(days: float) -> RetentionJob:
        at = start + timedelta(days=days)
        return RetentionJob(
            engine, policy=POLICY, settings=settings, clock=lambda: at, abandon_after=timedelta(1)
        )

    assert job(0.5).run_once().abandoned == ()  # quiet for less than a day: still running
    assert job(2).run_once().abandoned == (crashed,)
    with engine.connect() as conn:
        status = conn.execute(
            text("SELECT status FROM blackbox.runs WHERE run_id = :r"), {"r": crashed}
        ).scalar_one()
    assert status == "abandoned"
    shredded = job(31).run_once()  # bodies expire counted from the last event
    assert [r.run_id for r in shredded.redacted] == [crashed]
    with pytest.raises(RunNotActive, match="abandoned"):
        Recorder(engine, settings=settings, keys=DataKeyStore(PROVIDER)).resume(crashed)


def test_a_run_of_a_class_the_policy_does_not_define_expires_like_a_standard_one(
    engine: Engine, settings: Settings
) -> None:
    """An agent names its run's class: a made-up one must not exempt it from retention."""
    recorder = Recorder(engine, settings=settings, keys=DataKeyStore(PROVIDER))
    snapshot = RunSnapshot(code_version="retention.1", input={"who": "frank"})
    run, _ = recorder.record(
        agent, snapshot, agent_id="retention", retention_class="keep-forever-please"
    )
    start = datetime.now(UTC)

    def job(days: int) -> RetentionJob:
        at = start + timedelta(days=days)
        return RetentionJob(engine, policy=POLICY, settings=settings, clock=lambda: at)

    early = job(29).run_once()
    assert early.redacted == ()
    assert early.unknown_classes == ("keep-forever-please",)
    shredded = job(31).run_once()  # the standard class's 30 days
    assert [(r.run_id, r.reason) for r in shredded.redacted] == [(run.run_id, "retention")]
    assert shredded.unknown_classes == ("keep-forever-please",)
    _relay(engine, settings)
    assert job(401).run_once().metadata_deleted == (run.run_id,)


def test_the_forget_table_escapes_a_hostile_run_id(engine: Engine, settings: Settings) -> None:
    from click.testing import CliRunner

    from agent_blackbox.cli import main

    hostile = "\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\\x1b[2J\u202e:smile:"
    subject = f"subject-{os.urandom(4).hex()}"
    recorder = Recorder(engine, settings=settings, keys=DataKeyStore(PROVIDER))
    snapshot = RunSnapshot(code_version="retention.1", input={"who": subject})
    run_id = f"run-{os.urandom(4).hex()}-{hostile}"
    with unchecked_run_ids():  # a run recorded before the run id rule
        recorder.record(
            agent, snapshot, agent_id="retention", subject_ids=(subject,), run_id=run_id
        )
    env = {
        **os.environ,
        "BLACKBOX_DATABASE_URL": settings.database_url,
        "BLACKBOX_TOPIC": settings.topic,
        "COLUMNS": "400",
    }
    result = CliRunner(env=env).invoke(main, ["forget", "--subject", subject])
    assert result.exit_code == 0, result.output
    assert "1 run redacted" in result.output
    assert "\\x1b]8;;https://evil.example/" in result.output  # the run is listed, escaped
    assert "\x1b" not in result.output
    assert "\u202e" not in result.output
    assert "\U0001f604" not in result.output  # :smile: is not turned into an emoji
    # Forgotten, the subject has no run linked, as an id never recorded (a typo): the
    # command says so and what it may mean; an empty id is refused.
    for again in (subject, f"{subject}x"):
        result = CliRunner(env=env).invoke(main, ["forget", "--subject", again])
        assert result.exit_code == 0, result.output
        assert f"no run is linked to subject {again}, so nothing" in result.output
        assert "check the id" in result.output
    empty = CliRunner(env=env).invoke(main, ["forget", "--subject", " "])
    assert empty.exit_code == 2
    assert "is empty" in empty.output


def test_forget_signs_its_run_redacted_note_with_the_signers_key(
    engine: Engine, settings: Settings, tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from agent_blackbox.cli import main

    subject = f"subject-{os.urandom(4).hex()}"
    run_id = _record(engine, settings, subject)
    signer = CheckpointSigner.generate()
    key_file = tmp_path / "signing.pem"
    key_file.touch(mode=0o600)
    key_file.write_bytes(signer.private_key_pem())
    env = {
        **os.environ,
        "BLACKBOX_DATABASE_URL": settings.database_url,
        "BLACKBOX_TOPIC": settings.topic,
        "BLACKBOX_SIGNING_KEY_FILE": str(key_file),
    }
    result = CliRunner(env=env).invoke(main, ["forget", "--subject", subject])
    assert result.exit_code == 0, result.output
    note = outbox_envelopes(engine, run_id)[-1]
    assert (note.event_type, note.body_version) == (EventType.RUN_REDACTED, 2)
    [entry] = entries_of([note], PayloadPipeline())
    verifier = CheckpointVerifier({signer.key_id: signer.public_key})
    statement = entry.statement()
    assert statement is not None
    assert statement["sequence"] == note.sequence
    assert entry.signer_key_id == signer.key_id
    assert entry.signature is not None
    problem = verifier.statement_problem(
        statement, signer_key_id=signer.key_id, signature=entry.signature
    )
    assert problem is None
