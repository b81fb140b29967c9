"""Finding 6: truncation went unnoticed.

Deleting a run's last outbox rows before the relay published them left ``verify``
saying OK while ``runs.last_sequence`` said more existed, and crashed runs never got a
checkpoint, so ``--require-checkpoint`` could not be used over a whole history. Now
``verify`` says ``truncated`` and the signer signs crashed runs mid-run.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from agent_blackbox.consumers import CheckpointPolicy, ViewRunIndex, load_checkpoint
from agent_blackbox.outbox import Recorder
from agent_blackbox.outbox.storage import EVERY_TENANT
from agent_blackbox.replayer import write_archive
from agent_blackbox.schemas import Settings
from tests.conftest import Login
from tests.integration._agents import record_ticket_runs, ticket_ids
from tests.integration._views import build_views
from tests.security._signing import (
    crashed_run,
    relay_all,
    sign_until,
    signing_key,
    topic_events,
    verify,
)

pytestmark = pytest.mark.integration


def test_events_deleted_before_publication_make_the_run_truncated(
    settings: Settings, engine: Engine, login: Login, tmp_path: Path
) -> None:
    key = signing_key(tmp_path)
    cut, whole = record_ticket_runs(Recorder(engine, settings=settings), ticket_ids(2))

    # The relay's role may delete outbox rows (it does, once published): an attacker in
    # it removes the run's last two events before they are published.
    relay_role = login("blackbox_relay", tenant=EVERY_TENANT)
    with relay_role.begin() as conn:
        deleted = conn.execute(
            text("DELETE FROM blackbox.outbox WHERE run_id = :r AND sequence > :s"),
            {"r": cut.run_id, "s": cut.events - 2},
        ).rowcount
    assert deleted == 2
    relay_all(settings, engine)
    build_views(settings, engine, expect=cut.events - 2 + whole.events)

    reader = login("blackbox_reader", tenant=EVERY_TENANT)
    code, [report] = verify(settings, key, cut.run_id, as_user=reader)
    assert code == 1
    assert (report["ok"], report["result"]) == (False, "truncated")
    assert report["sequence"] == cut.events - 1
    assert f"committed {cut.events} events" in report["detail"]

    # An archive that lost the last event of a run the database and the index know whole.
    events = topic_events(settings, whole.run_id, expect=cut.events - 2 + whole.events)
    archive = tmp_path / "short.avro"
    write_archive(archive, events[:-1])
    code, [report] = verify(settings, key, whole.run_id, "--archive", str(archive))
    assert (code, report["result"], report["sequence"]) == (1, "truncated", whole.events)


def test_crashed_runs_get_a_mid_run_checkpoint_and_the_history_verifies(
    settings: Settings, engine: Engine, tmp_path: Path
) -> None:
    key = signing_key(tmp_path)
    recorder = Recorder(engine, settings=settings)
    finished = record_ticket_runs(recorder, ticket_ids(2))
    crashed, last = crashed_run(recorder)
    relay_all(settings, engine)
    build_views(settings, engine, expect=sum(r.events for r in finished) + last)

    index = ViewRunIndex(engine)
    every = [r.run_id for r in finished] + [crashed]
    sign_until(
        settings,
        engine,
        key.signer,
        lambda: all(index.checkpoint(r) for r in every),
        policy=CheckpointPolicy(every_events=1000, every_seconds=1),
        what="a checkpoint for every run, the crashed one included",
    )
    checkpoint = load_checkpoint(engine, crashed)
    assert checkpoint is not None
    assert (checkpoint.last_sequence, checkpoint.finished) == (last, False)
    for run in finished:
        signed = load_checkpoint(engine, run.run_id)
        assert signed is not None
        assert (signed.last_sequence, signed.finished) == (run.events, True)

    code, reports = verify(settings, key, "--all", "--require-checkpoint", "--strict")
    assert code == 0, reports
    assert sorted(r["run_id"] for r in reports) == sorted(every)
    assert {(r["result"], r["checkpoint"]) for r in reports} == {("ok", "valid")}
    assert [r["finished"] for r in reports if r["run_id"] == crashed] == [False]
