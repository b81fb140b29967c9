"""The continuous backup on the real stack: Postgres, Kafka and an S3-compatible store.

Encrypted runs (one with a body stored out of line) are recorded and relayed; the backup
writes cuts; the store is then checked as a restore would check it, and damaged in each
way a disaster or an attacker could damage it.
"""

from __future__ import annotations

import socket
import threading
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, create_engine, text

from agent_blackbox.backup import (
    BackupBusy,
    BackupDiverged,
    BackupError,
    BackupPolicy,
    BackupStore,
    BackupWriter,
    FolderStore,
    Manifest,
    check_store,
    open_store,
)
from agent_blackbox.broker import ensure_topics
from agent_blackbox.cli import main
from agent_blackbox.consumers import load_offsets
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
from tests.integration._pgproxy import CommitDropper, through
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


def _offsets(engine: Engine, settings: Settings, group: str) -> dict[int, int]:
    """The offsets the database stores for the backup's ``group``, by partition."""
    wanted = [(settings.topic, p) for p in range(settings.partitions)]
    with engine.connect() as conn:
        found = load_offsets(conn, group_id=group, partitions=wanted)
    return {p: o for (_, p), o in found.items() if o is not None}


def test_a_running_writer_whose_offsets_the_database_lost_stores_them_again(
    settings: Settings, engine: Engine, store: BackupStore, recorded: list[str]
) -> None:
    """A failover to a standby that had not received the writer's last offsets (an
    asynchronous one) moves them back under the running writer: its next cut stores
    them again from there, without a gap or a second copy. A rival only moves them
    forward, and that still stops the writer."""
    with BackupWriter(settings, store, signer=SIGNER, engine=engine) as writer:
        while writer.poll(1.0):
            pass
        first = writer.cut()
        group = writer.group_id
        stored = _offsets(engine, settings, group)
        assert stored
        with engine.begin() as conn:  # the standby never got the cut's offsets
            conn.execute(
                text("DELETE FROM blackbox_views.consumer_offsets WHERE group_id = :g"),
                {"g": group},
            )
        before = events(engine)
        record(engine, settings, "barbara")
        relay(engine, settings)
        while writer.poll(1.0):
            pass
        second = writer.cut()
        assert second.previous == first.digest
        assert sum(s.count for s in second.segments) == events(engine) - before
        assert all(_offsets(engine, settings, group)[p] >= o for p, o in stored.items())

        with engine.begin() as conn:  # a rival moves the offsets past this writer's
            conn.execute(
                text(
                    "UPDATE blackbox_views.consumer_offsets SET next_offset = next_offset "
                    "+ 1000 WHERE group_id = :g"
                ),
                {"g": group},
            )
        record(engine, settings, "hedy")
        relay(engine, settings)
        while writer.poll(1.0):
            pass
        with pytest.raises(BackupDiverged, match="another backup writer moved the offsets"):
            writer.cut()
    assert check_store(store, VERIFIER).passed


class _CountingStore(FolderStore):
    """A folder store that counts every put, by key."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.puts: Counter[str] = Counter()

    def put(self, key: str, data: bytes) -> None:
        self.puts[key] += 1
        super().put(key, data)


class _NthCommitDropper(CommitDropper):
    """Drops the connection after the ``nth`` COMMIT from now only (0: none)."""

    nth = 0

    def take_cut(self) -> bool:
        cut = super().take_cut()
        return cut or self.commits == self.nth


def test_a_cut_whose_offsets_commit_lost_its_reply_is_recorded_not_written_again(
    settings: Settings, engine: Engine, tmp_path: Path, recorded: list[str]
) -> None:
    """The offsets' COMMIT reaches the database, its reply does not (the connection
    drops, as in a failover): the cut fails; the retry finds the offsets it wrote and
    writes no second manifest 1."""
    store = _CountingStore(tmp_path / "store")
    url = engine.url
    proxy = _NthCommitDropper(url.host or "127.0.0.1", url.port or 5432)
    proxied = create_engine(through(url, proxy), pool_pre_ping=True)
    try:
        with BackupWriter(settings, store, signer=SIGNER, engine=proxied) as writer:
            while writer.poll(1.0):
                pass
            proxy.nth = proxy.commits + 2  # the snapshot's COMMIT, then the offsets'
            with pytest.raises(BackupError, match="cannot store the backup's offsets"):
                writer.cut()
            assert proxy.cuts == 1

            manifest = writer.cut()
    finally:
        proxied.dispose()
        proxy.stop()

    assert manifest.number == 1
    assert store.puts[manifest.key] == 1
    assert [k for k in store.keys("manifests/")] == [manifest.key]
    check = check_store(store, VERIFIER)
    assert check.passed, check.problems
    assert check.messages == events(engine)
    with BackupWriter(settings, store, signer=SIGNER, engine=engine) as again:
        assert again.head == manifest  # the database records its offsets: no divergence


def _end_lock_sessions(engine: Engine) -> int:
    """End the sessions holding an advisory lock, as a failover ends them all.

    Each is waited for (up to 10 s) until its backend has exited: a terminated
    backend lets its locks go only as it exits, after the signal has been sent.
    """
    query = text(
        "SELECT pg_terminate_backend(pid, 10000) FROM pg_locks "
        "WHERE locktype = 'advisory' AND database = "
        "(SELECT oid FROM pg_database WHERE datname = current_database())"
    )
    with engine.begin() as conn:
        ended = [row[0] for row in conn.execute(query)]
    assert all(ended), "a session holding the lock did not exit within 10 s"
    return len(ended)


def test_a_writer_whose_lock_went_with_its_session_takes_it_again_before_a_cut(
    settings: Settings, engine: Engine, store: BackupStore, recorded: list[str]
) -> None:
    with BackupWriter(settings, store, signer=SIGNER, engine=engine) as writer:
        assert _end_lock_sessions(engine) == 1
        rival = BackupWriter(settings, store, signer=SIGNER, engine=engine)
        rival.open()  # the lock was free: a second writer takes it
        try:
            while writer.poll(1.0):
                pass
            with pytest.raises(BackupBusy):
                writer.cut()  # refused before it writes anything
            assert list(store.keys("manifests/")) == []
        finally:
            rival.close()

        writer.cut()  # the lock is free again: taken back, then the cut
        second = BackupWriter(settings, store, signer=SIGNER, engine=engine)
        with pytest.raises(BackupBusy, match="another backup writer"):
            second.open()
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


def test_a_backup_once_rides_out_a_store_away_until_give_up_after(
    settings: Settings, tmp_path: Path
) -> None:
    """--once waits for the store as the continuous backup does, for --give-up-after."""
    key = tmp_path / "signing.pem"
    key.write_bytes(CheckpointSigner.generate().private_key_pem())
    key.chmod(0o600)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {
        "BLACKBOX_DATABASE_URL": settings.database_url,
        "BLACKBOX_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "BLACKBOX_TOPIC": settings.topic,
        "BLACKBOX_SIGNING_KEY_FILE": str(key),
        "AWS_ACCESS_KEY_ID": "local",
        "AWS_SECRET_ACCESS_KEY": "local-secret",
    }
    ensure_topics(settings)
    store = f"s3://backups/?endpoint=http://127.0.0.1:{port}"
    args = ["backup", "run", "--once", "--give-up-after", "2s", "--store", store]
    result = CliRunner(env=env).invoke(main, args)
    assert result.exit_code == 2, result.output
    assert "longer than BLACKBOX_BACKUP_GIVE_UP_AFTER / --give-up-after allows (2 s)" in " ".join(
        result.output.split()
    )
