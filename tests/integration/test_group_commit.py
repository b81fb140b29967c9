"""Group commit mode against Postgres (issue 12, item 8): batches commit whole and in
order, effects and joined transactions flush first, a flush whose commit was cut is
written once, and a process killed -9 loses only buffered non-effect events."""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy import event as sqlalchemy_event
from sqlalchemy.ext.asyncio import create_async_engine

from agent_blackbox.outbox import (
    AsyncRecorder,
    EventsNotRecorded,
    GroupCommit,
    Recorder,
    RunSnapshot,
)
from agent_blackbox.outbox._group import BUFFERED
from agent_blackbox.outbox.lifecycle import append_redaction_txn
from agent_blackbox.schemas import GENESIS_CHAIN_HASH, Envelope, Settings
from tests.integration._outbox import outbox_envelopes
from tests.integration._pgproxy import dropping_commits
from tests.integration._wait import eventually

pytestmark = pytest.mark.integration

SLOW = GroupCommit(max_delay_ms=600_000, max_events=1_000)
"""Flushes only where the mode says, never from the timer, within a test."""
CHILD = Path(__file__).with_name("_group_child.py")


def _checked(engine: Engine, run_id: str) -> list[Envelope]:
    """The run's events in the outbox, after checking they are 1..n with a valid chain
    and that the run row's head is the last of them."""
    events = outbox_envelopes(engine, run_id)
    assert [e.sequence for e in events] == list(range(1, len(events) + 1))
    previous = GENESIS_CHAIN_HASH
    for event in events:
        assert event.chain_hash == event.expected_chain_hash(previous), event.sequence
        previous = event.chain_hash
    with engine.connect() as conn:
        head = conn.execute(
            text("SELECT last_sequence, chain_head FROM blackbox.runs WHERE run_id = :r"),
            {"r": run_id},
        ).one()
    assert (int(head[0]), head[1]) == (len(events), previous)
    return events


def _types(engine: Engine, run_id: str) -> list[str]:
    return [str(e.event_type) for e in _checked(engine, run_id)]


def test_reads_commit_together_before_the_effect_and_the_joined_transition(
    engine: Engine, settings: Settings
) -> None:
    run = Recorder(engine, settings=settings, group_commit=SLOW).start_run(
        RunSnapshot("group/1"), agent_id="a"
    )
    for _ in range(3):
        run.now()
    run.call("echo", lambda x: x, 1)
    assert _types(engine, run.run_id) == ["run.started"]  # four events wait
    run.effect("refund", lambda key: None, arguments={"order": "O-1"}, key="k1")
    assert _types(engine, run.run_id)[1:] == ["clock.read"] * 3 + [
        "tool.call",
        "effect.intent",
        "effect.receipt",
    ]
    run.random()
    with engine.begin() as conn:
        run.transition("refunded", state={"order": "O-1"}, connection=conn)
    run.now()
    run.finish()
    assert _types(engine, run.run_id)[7:] == [
        "random.draw",
        "state.transition",
        "clock.read",
        "run.finished",
    ]
    with engine.connect() as conn:
        effects = conn.execute(text("SELECT idempotency_key, status FROM blackbox.effects")).all()
    assert [tuple(e) for e in effects] == [("k1", "confirmed")]


def test_an_async_run_commits_its_buffer_the_same_way(settings: Settings, engine: Engine) -> None:
    async def scenario() -> str:
        async_engine = create_async_engine(settings.database_url)
        try:
            recorder = AsyncRecorder(async_engine, settings=settings, group_commit=SLOW)
            run = await recorder.start_run(RunSnapshot("group/1"), agent_id="a")
            await run.now()
            await run.call("echo", lambda x: x, 1)
            assert _types(engine, run.run_id) == ["run.started"]
            await run.effect("mail", lambda key: None, arguments={})
            await run.uuid()
            await run.finish()
            return run.run_id
        finally:
            await async_engine.dispose()

    run_id = asyncio.run(scenario())
    assert _types(engine, run_id) == [
        "run.started",
        "clock.read",
        "tool.call",
        "effect.intent",
        "effect.receipt",
        "random.draw",
        "run.finished",
    ]


def test_a_flush_whose_commit_was_cut_is_written_once(engine: Engine, settings: Settings) -> None:
    with dropping_commits(engine) as (proxy, writer):
        run = Recorder(writer, settings=settings, group_commit=SLOW).start_run(
            RunSnapshot("group/1"), agent_id="a"
        )
        for _ in range(5):
            run.now()
        proxy.cut(1)
        run.flush()  # committed, heard as lost, retried: the retry finds the batch in place
        assert proxy.cuts == 1
        proxy.cut(math.inf)
        run.now()
        with pytest.raises(EventsNotRecorded, match=r"1 buffered event.*may have been recorded"):
            run.flush()
        proxy.cut(0)
        run.now()
        run.finish()
    events = _checked(engine, run.run_id)
    assert len(events) == 9
    assert len({e.event_id for e in events}) == 9


def test_a_batch_whose_commit_was_cut_behind_the_run_is_written_once(
    engine: Engine, settings: Settings
) -> None:
    group = GroupCommit(max_delay_ms=600_000, max_events=5)
    with dropping_commits(engine) as (proxy, writer):
        run = Recorder(writer, settings=settings, group_commit=group).start_run(
            RunSnapshot("group/1"), agent_id="a"
        )
        for _ in range(5):
            run.now()
        proxy.cut(1)
        run.now()  # 2-6 go to the writer thread: committed, heard as lost, retried
        run.flush()  # waits for them (the retry found them in place), writes 7
        assert proxy.cuts == 1
        proxy.cut(math.inf)
        for _ in range(6):
            run.now()  # 8-12 go to the writer thread, which never hears back; 13 waits
        eventually(lambda: run.core.unreported is not None, what="the batch to fail")
        with pytest.raises(EventsNotRecorded, match=r"6 buffered event.*may have been"):
            run.now()
        proxy.cut(0)
        run.finish()  # finds 8-12 committed, writes 13, then the end
    events = _checked(engine, run.run_id)
    assert len(events) == 14
    assert len({e.event_id for e in events}) == 14


def test_a_batch_after_a_rolled_back_joined_transition_takes_the_freed_sequence(
    engine: Engine, settings: Settings
) -> None:
    run = Recorder(engine, settings=settings, group_commit=SLOW).start_run(
        RunSnapshot("group/1"), agent_id="a"
    )
    run.now()
    with engine.connect() as conn:
        transaction = conn.begin()
        run.transition("moved", state={}, connection=conn)  # the clock read commits first
        transaction.rollback()
    run.random()  # prepared as 4, after the transition this writer counted on
    run.finish()
    assert _types(engine, run.run_id) == [
        "run.started",
        "clock.read",
        "random.draw",
        "run.finished",
    ]


def test_a_batch_written_behind_the_run_that_finds_it_moved_is_prepared_again(
    engine: Engine, settings: Settings
) -> None:
    group = GroupCommit(max_delay_ms=600_000, max_events=2)
    run = Recorder(engine, settings=settings, group_commit=group).start_run(
        RunSnapshot("group/1"), agent_id="a"
    )
    with engine.connect() as conn:
        transaction = conn.begin()
        run.transition("moved", state={}, connection=conn)
        transaction.rollback()
    run.now()
    run.now()  # 3 and 4, prepared after the transition this writer counted on
    run.random()  # full: 3 and 4 go to the writer thread, which finds the run at 1
    run.finish()  # the batch came back: the run prepares it again after 1, and writes it
    assert _types(engine, run.run_id) == [
        "run.started",
        "clock.read",
        "clock.read",
        "random.draw",
        "run.finished",
    ]
    assert len(_checked(engine, run.run_id)) == 5  # contiguous, chain intact


def test_a_batch_behind_an_event_appended_meanwhile_is_prepared_again_after_it(
    engine: Engine, settings: Settings
) -> None:
    run = Recorder(engine, settings=settings, group_commit=SLOW).start_run(
        RunSnapshot("group/1"), agent_id="a"
    )
    for _ in range(3):
        run.now()  # prepared as 2, 3 and 4
    with engine.begin() as conn:  # the owner's note takes 2
        append_redaction_txn(conn, run.run_id, reason="retention", key_ids=[], settings=settings)
    # The batch (2, 3 and 4) no longer follows the run's head: nothing of it is written
    # (not even 3 and 4, which would follow the note), and it is prepared again as 3, 4
    # and 5, chained on the note.
    statements: list[str] = []
    listen = ("before_cursor_execute", lambda *args: statements.append(str(args[2])))
    sqlalchemy_event.listen(engine, *listen)
    try:
        run.flush()
    finally:
        sqlalchemy_event.remove(engine, *listen)
    assert sum("append_events" in sql for sql in statements) == 2
    assert not any("ROLLBACK TO SAVEPOINT" in sql for sql in statements)  # nothing to undo
    run.finish()
    assert _types(engine, run.run_id) == [
        "run.started",
        "run.redacted",
        "clock.read",
        "clock.read",
        "clock.read",
        "run.finished",
    ]


def test_a_process_killed_mid_run_loses_only_its_buffered_non_effect_events(
    engine: Engine, settings: Settings
) -> None:
    journal: dict[str, list[tuple[int, str]]] = defaultdict(list)
    child = subprocess.Popen(
        [sys.executable, str(CHILD), settings.database_url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "BLACKBOX_GROUP_COMMIT": "off"},
    )
    try:
        assert child.stdout is not None
        blocked = _read_journal(child.stdout, journal, until_blocked=True)
        assert blocked is not None, child.stderr.read() if child.stderr else ""
        child.send_signal(signal.SIGKILL)
        _read_journal(child.stdout, journal, until_blocked=False)
    finally:
        child.kill()
        child.wait(timeout=30)
        for stream in (child.stdin, child.stdout, child.stderr):
            if stream is not None:
                stream.close()
    assert len(journal) >= 2
    for run_id, recorded in journal.items():
        committed = _checked(engine, run_id)  # contiguous from 1, chain intact
        head = len(committed)
        done = dict(recorded)
        # The kill may land after a commit and before its journal line: at most an
        # effect's intent and receipt committed unjournaled.
        assert head <= max(done) + 2
        for event in committed:  # what committed is what the agent recorded
            assert done.get(event.sequence, str(event.event_type)) == event.event_type
        lost = sorted((seq, kind) for seq, kind in recorded if seq > head)
        assert all(kind in BUFFERED for _, kind in lost), lost  # never an effect or an end
        if lost:  # only events after the run's last flush: none had to commit before them
            assert lost[0][0] == head + 1
    # The steady run: three effects committed; of its 120 reads, the 50 of the first full
    # buffer committed, the next 50 committed unless the kill landed while they were in
    # flight, and the last 20 (buffered at the kill) are lost: at most 2 x max_events.
    steady = journal[blocked]
    head = len(_checked(engine, blocked))
    assert head in (1 + 6 + 50, 1 + 6 + 100)
    assert [kind for seq, kind in steady if seq > head] == ["clock.read"] * (127 - head)
    assert 127 - head <= 2 * 50


def _read_journal(
    stdout: Any, journal: dict[str, list[tuple[int, str]]], *, until_blocked: bool
) -> str | None:
    """Collect journal lines; the id of the blocked run once it says so (None at EOF)."""
    for raw in stdout:
        line = json.loads(raw)
        if "blocked" in line:
            if until_blocked:
                return str(line["blocked"])
            continue
        journal[line["run"]].append((int(line["seq"]), str(line["type"])))
    return None
