"""The continuous backup on the real stack: Postgres, Kafka and an S3-compatible store.

Encrypted runs (one with a body stored out of line) are recorded and relayed; the backup
writes cuts; the store is then checked as a restore would check it, and damaged in each
way a disaster or an attacker could damage it.
"""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest
from sqlalchemy import Engine, text

from agent_blackbox.backup import (
    BackupBusy,
    BackupDiverged,
    BackupPolicy,
    BackupStore,
    BackupWriter,
    Manifest,
    check_store,
    open_store,
)
from agent_blackbox.schemas import CheckpointSigner, Settings
from tests.integration._backups import (
    SIGNER,
    VERIFIER,
    corrupt,
    cut,
    events,
    record,
    record_large,
    relay,
)
from tests.integration._wait import eventually

pytestmark = pytest.mark.integration


@pytest.fixture
def store(s3_url: str) -> BackupStore:
    return open_store(s3_url)


@pytest.fixture
def recorded(engine: Engine, settings: Settings) -> list[str]:
    runs = [record(engine, settings, who) for who in ("ada", "grace", "edsger")]
    runs.append(record_large(engine, settings))
    relay(engine, settings)
    return runs


def test_a_cut_holds_every_event_keys_and_blobs_and_checks_clean(
    settings: Settings, engine: Engine, store: BackupStore, recorded: list[str]
) -> None:
    manifest = cut(settings, engine, store)

    assert manifest.number == 1
    assert sum(s.count for s in manifest.segments) == events(engine)
    backed_up = {r.run_id for s in manifest.segments for r in s.runs}
    assert backed_up == set(recorded)
    tables = manifest.snapshot.tables
    assert tables["data_keys"].rows == len(recorded)
    assert tables["runs"].rows == len(recorded)
    assert manifest.snapshot.blobs >= 1
    assert manifest.snapshot.kek_versions == ("v1",)
    check = check_store(store, VERIFIER)
    assert check.problems == []
    assert check.passed
    assert check.messages == events(engine)
    assert check.blobs == manifest.snapshot.blobs


def test_the_next_cut_holds_only_what_is_new_and_chains_to_the_last(
    settings: Settings, engine: Engine, store: BackupStore, recorded: list[str]
) -> None:
    first = cut(settings, engine, store)
    new_run = record(engine, settings, "barbara")
    relay(engine, settings)

    second = cut(settings, engine, store)

    assert second.number == 2
    assert second.previous == first.digest
    assert {r.run_id for s in second.segments for r in s.runs} == {new_run}
    # Unchanged tables are not copied again; the changed ones are.
    assert second.snapshot.tables["tenant_keys"].key == first.snapshot.tables["tenant_keys"].key
    assert second.snapshot.tables["data_keys"].key != first.snapshot.tables["data_keys"].key
    check = check_store(store, VERIFIER)
    assert check.passed, check.problems
    assert check.messages == events(engine)


def test_a_second_writer_on_the_same_store_is_refused(
    settings: Settings, engine: Engine, store: BackupStore, recorded: list[str]
) -> None:
    second = BackupWriter(settings, store, signer=SIGNER, engine=engine)
    with (
        BackupWriter(settings, store, signer=SIGNER, engine=engine),
        pytest.raises(BackupBusy, match="another backup writer"),
    ):
        second.open()


def test_a_store_emptied_behind_the_database_is_refused(
    settings: Settings, engine: Engine, store: BackupStore, recorded: list[str]
) -> None:
    cut(settings, engine, store)
    for key in list(store.keys("manifests/")):
        store.delete(key)

    with pytest.raises(BackupDiverged, match="holds no manifest"):
        cut(settings, engine, store)


def test_a_crash_after_the_manifest_before_the_offsets_resumes_without_a_gap(
    settings: Settings, engine: Engine, store: BackupStore, recorded: list[str]
) -> None:
    first = cut(settings, engine, store)
    group = BackupWriter(settings, store, signer=SIGNER, engine=engine).group_id
    with engine.begin() as conn:  # the offsets' commit never happened
        conn.execute(
            text("DELETE FROM blackbox_views.consumer_offsets WHERE group_id = :g"), {"g": group}
        )
    before = events(engine)
    record(engine, settings, "barbara")
    relay(engine, settings)

    second = cut(settings, engine, store)

    assert second.previous == first.digest
    assert sum(s.count for s in second.segments) == events(engine) - before  # the new run
    assert check_store(store, VERIFIER).passed


def test_damage_to_the_store_is_found_and_named(
    settings: Settings, engine: Engine, store: BackupStore, recorded: list[str]
) -> None:
    manifest = cut(settings, engine, store)
    segment = manifest.segments[0]
    data_keys = manifest.snapshot.tables["data_keys"]

    corrupt(store, segment.key)
    store.delete(data_keys.key)
    check = check_store(store, VERIFIER)

    assert not check.passed
    found = {p.where: p.problem for p in check.problems}
    assert "corrupt" in found[segment.key]
    assert "missing" in found[data_keys.key]


def test_a_truncated_manifest_or_one_signed_by_another_key_is_found(
    settings: Settings, engine: Engine, store: BackupStore, recorded: list[str]
) -> None:
    manifest = cut(settings, engine, store)
    forged = replace(manifest, number=2, previous=manifest.digest).signed(
        CheckpointSigner.generate(key_id="intruder")
    )
    store.put(forged.key, forged.to_bytes())
    check = check_store(store, VERIFIER)
    assert [p.where for p in check.problems] == [forged.key]
    assert "intruder" in check.problems[0].problem

    store.put(manifest.key, manifest.to_bytes()[:-40])
    check = check_store(store, VERIFIER)
    assert not check.passed
    assert check.problems[0].where == manifest.key
    assert "not valid JSON" in check.problems[0].problem


def test_the_running_backup_rolls_cuts_on_time_and_reports_its_lag(
    settings: Settings, engine: Engine, store: BackupStore, recorded: list[str]
) -> None:
    policy = BackupPolicy(roll_seconds=0.2)
    writer = BackupWriter(settings, store, signer=SIGNER, engine=engine, policy=policy)
    stop = threading.Event()
    cuts: list[Manifest] = []
    with writer:
        thread = threading.Thread(target=writer.run, args=(stop,), kwargs={"on_cut": cuts.append})
        thread.start()
        try:
            eventually(
                lambda: sum(s.count for c in cuts for s in c.segments) == events(engine),
                timeout=60,
                what="every event in a cut",
            )
            record(engine, settings, "barbara")
            relay(engine, settings)
            eventually(
                lambda: sum(s.count for c in cuts for s in c.segments) == events(engine),
                timeout=60,
                what="the new run in a later cut",
            )
        finally:
            stop.set()
            thread.join(timeout=30)
    assert not thread.is_alive()
    assert len(cuts) >= 2
    registry = writer.metrics.registry
    topic = {"topic": settings.topic}
    assert registry.get_sample_value("blackbox_backup_messages_total", topic) == events(engine)
    lags = [
        s.value
        for metric in registry.collect()
        if metric.name == "blackbox_backup_lag_messages"
        for s in metric.samples
    ]
    assert lags
    assert all(lag == 0 for lag in lags)
    assert check_store(store, VERIFIER).passed
