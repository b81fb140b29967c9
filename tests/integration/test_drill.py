"""The restore drill on the real stack (Postgres, Kafka, S3-compatible store).

Runs are recorded (some encrypted, one with a body stored out of line), one subject is
forgotten before the first backup cut and another after it; a second cut follows. Then
production's database and topic are destroyed, and the drill restores the first cut:
every check passes, and both forgotten subjects stay unreadable in the restored copy.
Each kind of damage a backup can suffer is then shown to fail the drill by name.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from agent_blackbox.backup import (
    BackupStore,
    DrillOptions,
    DrillReport,
    Manifest,
    PruneRecord,
    RestoreRequest,
    RestoreResult,
    TargetError,
    check_store,
    drop_target,
    open_store,
    plan_prune,
    prune,
    restore_runs,
    run_drill,
)
from agent_blackbox.broker import delete_topics
from agent_blackbox.consumers import (
    CheckpointConsumer,
    RetentionJob,
    RetentionPolicy,
    load_checkpoint,
)
from agent_blackbox.outbox.lifecycle import delete_run_metadata_txn
from agent_blackbox.schemas import CheckpointSigner, Settings
from tests.integration._backups import (
    AGENTS,
    KEK,
    SIGNER,
    VERIFIER,
    corrupt,
    cut,
    events,
    record,
    record_large,
    relay,
)
from tests.integration._views import build_views
from tests.integration._wait import eventually

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def replay_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """What the drill's child processes (verify, replay) need: the signer's public key,
    the KEK, and the entry points of the agents recorded here."""
    pem = tmp_path / "signer.pem"
    pem.write_bytes(SIGNER.public_key_pem())
    monkeypatch.setenv("BLACKBOX_SIGNING_PUBLIC_KEYS", str(pem))
    monkeypatch.delenv("BLACKBOX_SIGNING_KEY_FILE", raising=False)
    monkeypatch.setenv("BLACKBOX_KEK", f"v1:{base64.b64encode(KEK).decode()}")
    monkeypatch.setenv(
        "BLACKBOX_AGENTS",
        AGENTS,
    )
    monkeypatch.setenv("PYTHONPATH", str(ROOT))


def _forget(engine: Engine, settings: Settings, who: str) -> None:
    job = RetentionJob(
        engine,
        policy=RetentionPolicy.from_mapping(
            {"standard": {"bodies_days": 30, "metadata_days": 400}}
        ),
        settings=settings,
        signer=SIGNER,
    )
    assert job.forget(who).redacted
    relay(engine, settings)


def _sign(settings: Settings, engine: Engine, run_ids: list[str]) -> None:
    """Build the views and run the checkpoint signer until every run is signed."""
    build_views(settings, engine, expect=events(engine))
    with CheckpointConsumer(settings, SIGNER, engine=engine) as consumer:

        def signed() -> bool:
            consumer.poll_once(0.5)
            return all(load_checkpoint(engine, run_id) is not None for run_id in run_ids)

        eventually(signed, timeout=60, what="a checkpoint for every run")


@pytest.fixture
def store(s3_url: str) -> BackupStore:
    return open_store(s3_url)


@pytest.fixture
def history(settings: Settings, engine: Engine, store: BackupStore) -> dict[str, str]:
    """Runs recorded and forgotten around two cuts; run ids by name, and the time of
    the first cut as ``at``."""
    runs = {who: record(engine, settings, who) for who in ("ada", "grace", "edsger")}
    runs["plain"] = record(engine, settings, "linus", sealed=False)
    runs["large"] = record_large(engine, settings)
    relay(engine, settings)
    _sign(settings, engine, list(runs.values()))
    _forget(engine, settings, "ada")  # before the cut
    first = cut(settings, engine, store)
    _forget(engine, settings, "grace")  # after it
    cut(settings, engine, store)
    runs["at"] = first.created_at
    return runs


def _destroy_production(settings: Settings, engine: Engine) -> None:
    engine.dispose()
    admin_url = make_url(settings.database_url).set(database="postgres")
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            name = make_url(settings.database_url).database
            conn.execute(text(f"DROP DATABASE {name} WITH (FORCE)"))
    finally:
        admin.dispose()
    delete_topics(settings, [settings.topic, settings.dlq_topic])


@pytest.fixture
def kept(settings: Settings) -> Iterator[list[DrillReport]]:
    """Reports of drills run with keep=True; their targets are dropped afterwards."""
    reports: list[DrillReport] = []
    yield reports
    for report in reports:
        if report.kept_target is not None:
            assert drop_target(settings, report.kept_target) == []


def _at(history: dict[str, str]) -> datetime:
    return datetime.fromisoformat(history["at"]) + timedelta(milliseconds=1)


def test_a_drill_after_production_is_destroyed_restores_everything_and_forgets(
    settings: Settings,
    engine: Engine,
    store: BackupStore,
    history: dict[str, str],
    kept: list[DrillReport],
) -> None:
    _destroy_production(settings, engine)

    report = run_drill(
        settings, store, verifier=VERIFIER, options=DrillOptions(at=_at(history), keep=True)
    )
    kept.append(report)

    failed = [(c.name, c.detail, c.where) for c in report.checks if c.passed is False]
    assert failed == []
    assert report.passed
    names = {c.name: c for c in report.checks}
    assert names["sample of runs replayed"].passed is True
    assert names["views equal production's at the cut"].passed is None  # production is gone
    assert "later backup cuts" in names["deletion ledger applied first"].detail
    # Production's database is gone: what only it could tell is said to be unchecked.
    backup_check = names["backup objects and manifest chain"].detail
    assert "not checked: whether the store's newest manifests were removed" in backup_check
    assert names["verify --all on the restored copy"].detail.startswith(
        "5 runs: 5 verified against signed checkpoints"
    )
    assert report.rto_s is not None
    assert report.rpo_s is not None
    assert report.kept_target is not None
    live = _live_keys(report.kept_target.settings)
    assert live[history["ada"]] is False  # forgotten before the cut
    assert live[history["grace"]] is False  # forgotten after it: a later cut's ledger
    assert live[history["edsger"]] is True
    assert _blob_tenants(report.kept_target.settings) == {"default"}, (
        "the large run's body is restored as its tenant's (its replayers read it)"
    )


def test_a_damaged_later_cut_leaves_an_earlier_whole_cut_restorable_and_is_named(
    settings: Settings,
    engine: Engine,
    store: BackupStore,
    history: dict[str, str],
    kept: list[DrillReport],
) -> None:
    """Restoring a cut reads the later cuts for newer deletions: one whose objects are
    damaged is said to be unread, and the cut restores from what else knows of them
    (here production's deletion ledger, which forgot grace after the first cut)."""
    later = check_store(store, verifier=VERIFIER).cut
    assert later is not None
    assert later.created_at != history["at"]
    damaged = [s.key for s in later.segments]
    damaged.append(later.snapshot.tables["deletion_ledger"].key)
    for key in damaged:
        corrupt(store, key)

    report = run_drill(
        settings, store, verifier=VERIFIER, options=DrillOptions(at=_at(history), keep=True)
    )
    kept.append(report)

    assert [(c.name, c.detail) for c in report.checks if c.passed is False] == []
    ledger = {c.name: c for c in report.checks}["deletion ledger applied first"]
    assert f"not read: deletion ledger of later cut {later.number}" in ledger.detail
    assert "is corrupt" in ledger.detail
    assert report.kept_target is not None
    live = _live_keys(report.kept_target.settings)
    assert (live[history["grace"]], live[history["edsger"]]) == (False, True)


def _damage(kind: str, store: BackupStore, cut: Manifest) -> str:
    """Damage the store one way; the key the drill must name."""
    segment = cut.segments[0].key
    if kind == "corrupted object":
        corrupt(store, segment)
        return segment
    if kind == "missing object":
        store.delete(segment)
        return segment
    if kind == "truncated manifest":
        store.put(cut.key, cut.to_bytes()[:-50])
        return cut.key
    assert kind == "manifest signed by another key"
    forged = replace(cut, segments=cut.segments[1:]).signed(CheckpointSigner.generate())
    store.put(cut.key, forged.to_bytes())
    return cut.key


@pytest.mark.parametrize(
    ("kind", "says"),
    [
        ("corrupted object", "is corrupt: its SHA-256"),
        ("missing object", "is missing from"),
        ("truncated manifest", "not valid JSON"),
        ("manifest signed by another key", "no public key is known for signer key id"),
    ],
)
def test_a_damaged_backup_fails_the_drill_naming_the_object(
    settings: Settings, engine: Engine, store: BackupStore, kind: str, says: str
) -> None:
    record(engine, settings, "ada")
    relay(engine, settings)
    where = _damage(kind, store, cut(settings, engine, store))

    report = run_drill(settings, store, verifier=VERIFIER, options=DrillOptions(sample=0))

    assert not report.passed
    [check] = report.checks  # nothing is restored from a backup that fails its check
    assert check.passed is False
    assert any(w.startswith(where) and says in w for w in check.where), check.where
    assert report.target is None


def test_a_missing_data_key_fails_the_drill_naming_the_run(
    settings: Settings, engine: Engine, store: BackupStore
) -> None:
    run_id = record(engine, settings, "ada")
    relay(engine, settings)
    with engine.begin() as conn:  # the key row is lost before the backup is taken
        conn.execute(text("DELETE FROM blackbox.data_keys WHERE run_id = :r"), {"r": run_id})
    cut(settings, engine, store)

    report = run_drill(settings, store, verifier=VERIFIER, options=DrillOptions(sample=0))

    assert not report.passed
    [check] = [c for c in report.checks if c.passed is False]
    assert check.name == "data keys and blobs the events name"
    assert any(run_id in w and "missing data key" in w for w in check.where)


def test_a_ledger_entry_newer_than_the_cut_is_applied_before_the_restore_and_named(
    settings: Settings, engine: Engine, store: BackupStore, kept: list[DrillReport]
) -> None:
    run_id = record(engine, settings, "ada")
    relay(engine, settings)
    cut(settings, engine, store)
    _forget(engine, settings, "ada")  # after the only cut: production still knows

    report = run_drill(
        settings, store, verifier=VERIFIER, options=DrillOptions(sample=0, keep=True)
    )
    kept.append(report)

    assert report.passed, [c for c in report.checks if c.passed is False]
    ledger = next(c for c in report.checks if c.name == "deletion ledger applied first")
    assert "production database" in ledger.detail
    assert any(run_id in w and "destroyed after the cut" in w for w in ledger.where)
    assert report.kept_target is not None
    restored = create_engine(report.kept_target.settings.database_url)
    try:
        with restored.connect() as conn:
            reasons = (
                conn.execute(
                    text("SELECT destroyed_reason FROM blackbox.data_keys WHERE run_id = :r"),
                    {"r": run_id},
                )
                .scalars()
                .all()
            )
    finally:
        restored.dispose()
    assert reasons
    assert all("newer than the cut" in str(r) for r in reasons)


def test_a_partial_restore_brings_back_the_selection_forgotten_and_audited(
    settings: Settings, engine: Engine, store: BackupStore, history: dict[str, str]
) -> None:
    name = f"t{uuid.uuid4().hex[:10]}"
    request = RestoreRequest(
        into=name, purpose="investigate complaint 42", run_ids=frozenset({history["edsger"]})
    )
    restored: list[RestoreResult] = []
    try:
        restored.append(restore_runs(settings, store, request, verifier=VERIFIER))
        by_subject = replace(request, into=f"{name}g", run_ids=frozenset(), subject="grace")
        restored.append(restore_runs(settings, store, by_subject, verifier=VERIFIER))
        edsger, grace = restored
        assert edsger.runs == [history["edsger"]]
        assert grace.runs == [history["grace"]]
        assert _live_keys(edsger.target.settings) == {history["edsger"]: True}
        assert _live_keys(grace.target.settings) == {history["grace"]: False}
        with engine.connect() as conn:
            audited = (
                conn.execute(
                    text("SELECT run_id FROM blackbox.access_audit WHERE purpose = :p"),
                    {"p": "investigate complaint 42"},
                )
                .scalars()
                .all()
            )
        assert sorted(audited) == sorted([history["edsger"], history["grace"]])
    finally:
        for result in restored:
            assert drop_target(settings, result.target) == []


def _blob_tenants(target: Settings) -> set[str]:
    restored = create_engine(target.database_url)
    try:
        with restored.connect() as conn:
            query = text("SELECT DISTINCT tenant_id FROM blackbox.blobs")
            return {str(tenant) for tenant in conn.execute(query).scalars()}
    finally:
        restored.dispose()


def _live_keys(target: Settings) -> dict[str, bool]:
    restored = create_engine(target.database_url)
    try:
        with restored.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT run_id, bool_or(wrapped IS NOT NULL) FROM blackbox.data_keys "
                    "GROUP BY run_id"
                )
            ).all()
    finally:
        restored.dispose()
    return {str(run): bool(live) for run, live in rows}


def test_prune_removes_what_expired_and_the_rest_still_restores(
    settings: Settings, engine: Engine, store: BackupStore
) -> None:
    gone = record(engine, settings, "ada")
    relay(engine, settings)
    first = cut(settings, engine, store)  # ada's events alone in their segments
    kept_run = record(engine, settings, "grace")
    relay(engine, settings)
    second = cut(settings, engine, store)
    with engine.begin() as conn:  # the retention job deleted ada's run: metadata expired
        delete_run_metadata_txn(conn, [gone])
        conn.execute(text("DELETE FROM blackbox.data_keys WHERE run_id = :r"), {"r": gone})
    cut(settings, engine, store)
    policy = RetentionPolicy.from_mapping({"standard": {"bodies_days": 1, "metadata_days": 1}})

    plan = plan_prune(store, VERIFIER, policy, now=datetime.now(UTC) + timedelta(days=2))
    written = prune(store, SIGNER, plan)

    assert written is not None
    assert plan.segments
    assert all({r.run_id for r in s.runs} == {gone} for s in plan.segments)
    assert plan.cuts == [first.number, second.number]
    assert not [k for s in plan.segments for k in store.keys(s.key)]
    check = check_store(store, VERIFIER)
    assert check.passed, check.problems
    assert {r.run_id for s in check.segments_held() for r in s.runs} == {kept_run}
    old = check_store(store, VERIFIER, at=datetime.fromisoformat(first.created_at))
    assert [p.problem for p in old.problems] == [
        "this cut was pruned (older than the retention horizon)"
    ]
    report = run_drill(settings, store, verifier=VERIFIER, options=DrillOptions(sample=0))
    assert report.passed, [c for c in report.checks if c.passed is False]


def test_a_prune_record_signed_by_another_key_is_named(
    settings: Settings, engine: Engine, store: BackupStore
) -> None:
    record(engine, settings, "ada")
    relay(engine, settings)
    manifest = cut(settings, engine, store)
    forged = PruneRecord(
        number=1, created_at=manifest.created_at, segments=(manifest.segments[0].key,), cuts=()
    ).signed(CheckpointSigner.generate())
    store.put(forged.key, forged.to_bytes())

    check = check_store(store, VERIFIER)

    assert not check.passed
    assert [p.where for p in check.problems] == [forged.key]
    assert check.segments_held() == list(manifest.segments)  # the forged record hides nothing


def test_a_restore_into_a_name_taken_is_refused_and_the_copy_kept(
    settings: Settings, engine: Engine, store: BackupStore
) -> None:
    run_id = record(engine, settings, "ada")
    relay(engine, settings)
    cut(settings, engine, store)
    request = RestoreRequest(
        into=f"t{uuid.uuid4().hex[:10]}", purpose="investigate twice", run_ids=frozenset({run_id})
    )
    first = restore_runs(settings, store, request, verifier=VERIFIER)
    try:
        with pytest.raises(TargetError, match="exists already"):
            restore_runs(settings, store, request, verifier=VERIFIER)
        assert _live_keys(first.target.settings) == {run_id: True}  # still there, reachable
    finally:
        assert drop_target(settings, first.target) == []


def test_a_sample_that_cannot_be_replayed_fails_the_drill_as_such(
    settings: Settings,
    engine: Engine,
    store: BackupStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    record(engine, settings, "ada")
    relay(engine, settings)
    cut(settings, engine, store)
    monkeypatch.setenv("BLACKBOX_AGENTS", "backup=no_such_module:agent")

    report = run_drill(settings, store, verifier=VERIFIER, options=DrillOptions(sample=1))

    [check] = [c for c in report.checks if c.passed is False]
    assert check.name == "sample of runs replayed"
    assert "could not be replayed" in check.detail
    assert any("ERROR" in w for w in check.where)
    assert not report.unrun  # runs of the copy the drill cannot open: a finding (exit 1)

    # With no entry point at all, the sample could not run: that alone is no finding.
    monkeypatch.delenv("BLACKBOX_AGENTS")
    report = run_drill(settings, store, verifier=VERIFIER, options=DrillOptions(sample=1))
    [check] = [c for c in report.checks if c.passed is False]
    assert (check.name, check.unrun, report.unrun) == ("sample of runs replayed", True, True), check
    assert report.to_dict()["could_not_run"] is True


def test_a_removed_newest_manifest_is_found_from_the_database(
    settings: Settings, engine: Engine, store: BackupStore
) -> None:
    record(engine, settings, "ada")
    relay(engine, settings)
    cut(settings, engine, store)
    record(engine, settings, "grace")
    relay(engine, settings)
    newest = cut(settings, engine, store)
    store.delete(newest.key)

    report = run_drill(settings, store, verifier=VERIFIER, options=DrillOptions(sample=0))

    assert not report.passed
    [check] = report.checks
    assert any("manifests after it were removed" in w for w in check.where)


def test_dropping_a_copy_that_does_not_exist_says_so_and_exits_2(settings: Settings) -> None:
    from click.testing import CliRunner

    from agent_blackbox.cli import main

    env = {"BLACKBOX_DATABASE_URL": settings.database_url, "BLACKBOX_TOPIC": settings.topic}
    drops = (["drill", "--drop", "blackbox_drill_nosuch"], ["restore", "--into", "no", "--drop"])
    for args in drops:
        result = CliRunner(env=env).invoke(main, args)
        assert result.exit_code == 2, result.output
        assert "no copy named" in result.output
        assert "dropped" not in result.output
