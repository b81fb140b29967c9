"""Finding 5: the signer trusted the topic.

A Kafka producer with no database access wrote a three-event run that does not exist in
``blackbox.runs``: the signer signed it and ``verify`` said valid. A conflicting
duplicate was counted as a repeat. Now the signer signs only heads ``blackbox.runs``
holds, flags what it refuses, and ``verify`` checks the database too.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import Engine

from agent_blackbox.consumers import ViewRunIndex, load_checkpoint
from agent_blackbox.keystore import DataKeyStore, LocalKeyProvider
from agent_blackbox.outbox import Recorder
from agent_blackbox.schemas import PLAIN_ENCODING, Envelope, EventType, Settings
from tests.integration._agents import record_ticket_runs, ticket_ids
from tests.integration._views import build_views
from tests.security._signing import (
    crashed_run,
    produce,
    rechain,
    relay_all,
    sign_until,
    signing_key,
    topic_events,
    verify,
    violations,
)

pytestmark = pytest.mark.integration


def test_a_run_forged_in_the_topic_is_not_signed_and_does_not_verify(
    settings: Settings, engine: Engine, tmp_path: Path
) -> None:
    key = signing_key(tmp_path)
    [real] = record_ticket_runs(Recorder(engine, settings=settings), ticket_ids(1))
    relay_all(settings, engine)
    build_views(settings, engine, expect=real.events)
    events = topic_events(settings, real.run_id, expect=real.events)

    # The attacker can produce to the topic, nothing else: a made-up run of three
    # correctly chained events, and a second event 2 of the real run.
    forged_id = f"forged-{uuid.uuid4().hex[:8]}"
    forged = rechain([events[0], events[1], events[-1]], run_id=forged_id)
    assert [e.event_type for e in forged][-1] == EventType.RUN_FINISHED
    duplicate = replace(events[1], event_id=str(uuid.uuid4()))
    produce(settings, [*forged, duplicate])
    build_views(settings, engine, expect=real.events + 3)

    index = ViewRunIndex(engine)
    sign_until(
        settings,
        engine,
        key.signer,
        lambda: index.checkpoint(real.run_id) and violations(engine, forged_id),
        what="the real run signed and the forged one refused",
    )
    assert load_checkpoint(engine, forged_id) is None
    assert violations(engine, forged_id) == [("unknown_run", 3)]
    assert ("conflicting_duplicate", 2) in violations(engine, real.run_id)
    checkpoint = load_checkpoint(engine, real.run_id)
    assert checkpoint is not None
    assert (checkpoint.last_sequence, checkpoint.finished) == (real.events, True)

    code, [report] = verify(settings, key, forged_id)
    assert code == 1
    assert (report["ok"], report["result"]) == (False, "not_in_database")
    assert report["checkpoint"] == "missing"
    code, [report] = verify(settings, key, real.run_id)
    assert (code, report["result"], report["checkpoint"]) == (0, "ok", "valid")


def _continued(events: list[Envelope], **changes: object) -> Envelope:
    """A new event chained onto the last of ``events``: what a producer can forge."""
    last = events[-1]
    forged = replace(
        last, event_id=str(uuid.uuid4()), sequence=last.sequence + 1, chain_hash="", **changes
    )
    return replace(forged, chain_hash=forged.expected_chain_hash(last.chain_hash))


def test_a_forged_end_of_another_agents_crashed_run_is_not_signed(
    settings: Settings, engine: Engine, tmp_path: Path
) -> None:
    key = signing_key(tmp_path)
    recorder = Recorder(engine, settings=settings)
    run_id, last = crashed_run(recorder)
    relay_all(settings, engine)
    events = topic_events(settings, run_id, expect=last)

    # A correctly chained run.finished appended to the crashed run, through the topic.
    produce(settings, [_continued(events, event_type=EventType.RUN_FINISHED)])
    build_views(settings, engine, expect=last + 1)

    sign_until(
        settings,
        engine,
        key.signer,
        lambda: violations(engine, run_id),
        what="the forged ending refused",
    )
    assert violations(engine, run_id) == [("ahead_of_database", last + 1)]
    assert load_checkpoint(engine, run_id) is None

    code, [report] = verify(settings, key, run_id)
    assert code == 1
    assert (report["result"], report["sequence"]) == ("ahead_of_database", last + 1)


def test_a_plaintext_event_in_a_sealed_run_is_refused_by_signer_and_verify(
    settings: Settings, engine: Engine, tmp_path: Path
) -> None:
    key = signing_key(tmp_path)
    keys = DataKeyStore(LocalKeyProvider({"v1": os.urandom(32)}))
    run_id, last = crashed_run(Recorder(engine, settings=settings, keys=keys))
    relay_all(settings, engine)
    events = topic_events(settings, run_id, expect=last)
    assert all(e.key_id is not None for e in events)

    # A chained event with a plaintext body in the run sealed under its data key.
    plain = _continued(
        events,
        key_id=None,
        payload_encoding=PLAIN_ENCODING,
        payload=b"plaintext the reader would show",
    )
    produce(settings, [plain])
    build_views(settings, engine, expect=last + 1)

    sign_until(
        settings,
        engine,
        key.signer,
        lambda: violations(engine, run_id),
        what="the plaintext event refused",
    )
    assert violations(engine, run_id) == [("plaintext_in_sealed_run", last + 1)]
    assert load_checkpoint(engine, run_id) is None

    code, [report] = verify(settings, key, run_id)
    assert code == 1
    assert (report["result"], report["sequence"]) == ("plaintext_in_sealed_run", last + 1)
