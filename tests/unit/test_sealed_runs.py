"""Runs that have a data key accept no plaintext body, in every reader (issue 11, item 1):
a forged clear event appended to an encrypted run is refused by the guard, replay (an
error naming the event, never a divergence), the timeline and the view consumer's check."""

from __future__ import annotations

import contextlib
import io
import os
from dataclasses import replace
from typing import Any

import pytest
from rich.console import Console

from agent_blackbox.consumers import Delivered
from agent_blackbox.consumers._views import SealedBy, StoredEvent, refused_plaintext
from agent_blackbox.keystore import AesGcmSealer, KeystoreError
from agent_blackbox.outbox import AgentRun, MemoryRecorder, RunSnapshot
from agent_blackbox.replayer import replay_run
from agent_blackbox.replayer._fork import RecordedTools
from agent_blackbox.replayer._timeline import timeline_table
from agent_blackbox.schemas import (
    GENESIS_CHAIN_HASH,
    PLAIN_ENCODING,
    PLAINTEXT_IN_SEALED_RUN,
    DataKey,
    Envelope,
    EventType,
    PayloadContext,
    PayloadPipeline,
    PlaintextInSealedRun,
    SealedRunGuard,
    refusing_plaintext,
)

KEY = DataKey("dk-sealed", os.urandom(32))
FORGED = "FORGED-CLEAR-BODY-7741"


class OneKey:
    def opening_key(self, run_id: str, key_id: str) -> bytes:
        if key_id != KEY.key_id:
            raise KeystoreError(f"run {run_id} key {key_id}: unknown")
        return KEY.secret


def entry(run: AgentRun, question: Any) -> str:
    run.call("lookup", lambda q: {"answer": "secret answer"}, question["q"])
    return "done"


def _chained(events: list[Envelope]) -> list[Envelope]:
    out, head = [], GENESIS_CHAIN_HASH
    for e in events:
        e = replace(e, chain_hash=e.expected_chain_hash(head))
        out.append(e)
        head = e.chain_hash
    return out


def _recorded() -> list[Envelope]:
    recorder = MemoryRecorder()
    run = recorder.start_run(RunSnapshot("s.1", {"q": "secret question"}), agent_id="s")
    run.call("lookup", lambda q: {"answer": "secret answer"}, "secret question")
    run.finish(output="done")
    return list(recorder.events)


def _sealed(events: list[Envelope]) -> list[Envelope]:
    """``events`` with every body sealed under :data:`KEY`, chained again, as an
    encrypting recorder writes them."""
    plain, sealing = PayloadPipeline(), PayloadPipeline(sealer=AesGcmSealer())
    out = []
    for e in events:
        context = PayloadContext(e.run_id, e.sequence, e.event_id, e.tenant_id, data_key=KEY)
        sealed = sealing.pack(e.event_type, e.body_version, plain.unpack(e), context)
        out.append(
            replace(e, payload=sealed.data, key_id=sealed.key_id, payload_encoding=sealed.encoding)
        )
    return _chained(out)


def _forged_finish(recorded: list[Envelope]) -> list[Envelope]:
    """The sealed run as it crashed before ``run.finished``, then a correctly chained
    ``run.finished`` with a plaintext body appended by someone else."""
    sealed = _sealed(recorded)
    genuine_finish = recorded[-1]
    body = PayloadPipeline().unpack(genuine_finish)
    body["output_json"] = f'"{FORGED}"'
    packed = PayloadPipeline().pack(
        genuine_finish.event_type,
        genuine_finish.body_version,
        body,
        PayloadContext(
            genuine_finish.run_id,
            genuine_finish.sequence,
            genuine_finish.event_id,
            genuine_finish.tenant_id,
        ),
    )
    forged = replace(
        genuine_finish, payload=packed.data, key_id=None, payload_encoding=packed.encoding
    )
    return _chained([*sealed[:-1], forged])


def _sealed_pipeline() -> PayloadPipeline:
    return PayloadPipeline(sealer=AesGcmSealer(OneKey()))


def test_the_sealed_run_replays_before_anything_is_forged() -> None:
    report = replay_run(_sealed(_recorded()), entry, pipeline=_sealed_pipeline())
    assert report.result == "PASS", report


def test_replay_of_a_forged_plaintext_finish_is_an_error_naming_the_event() -> None:
    events = _forged_finish(_recorded())
    report = replay_run(events, entry, pipeline=_sealed_pipeline())
    assert report.result == "ERROR"
    assert report.divergence is None
    assert not report.divergences
    assert report.error is not None
    assert "plaintext body" in report.error
    assert f"sequence {events[-1].sequence} (run.finished" in report.error
    assert events[-1].event_id in report.error
    assert FORGED not in report.error


def test_replay_refuses_a_forged_clear_event_in_the_middle_even_if_the_code_catches_it() -> None:
    recorded = _recorded()
    sealed = _sealed(recorded)
    forged = replace(recorded[1], key_id=None, payload_encoding=PLAIN_ENCODING)
    events = _chained([sealed[0], forged, *sealed[2:]])

    def catching(run: AgentRun, question: Any) -> str:
        with contextlib.suppress(Exception):
            run.call("lookup", lambda q: {}, question)
        return "done"

    report = replay_run(events, catching, pipeline=_sealed_pipeline())
    assert report.result == "ERROR"
    assert report.error is not None
    assert "sequence 2 (tool.call" in report.error


def test_timeline_marks_the_forged_event_and_never_shows_its_body() -> None:
    events = _forged_finish(_recorded())
    out = io.StringIO()
    console = Console(file=out, width=400, emoji=False)
    console.print(timeline_table(events[0].run_id, events, pipeline=_sealed_pipeline()))
    text = out.getvalue()
    assert FORGED not in text
    assert "run.finished (refused)" in text
    assert "refused: plaintext body in a run sealed under data key dk-sealed" in text
    assert "secret answer" in text  # the genuine sealed bodies are shown


def test_plaintext_runs_redaction_notes_and_resumed_runs_are_not_refused() -> None:
    recorded = _recorded()
    assert list(refusing_plaintext(recorded)) == recorded  # a run recorded without a key
    sealed = _sealed(recorded)
    note = replace(
        sealed[-1],
        sequence=len(sealed) + 1,
        event_type=EventType.RUN_REDACTED.value,
        key_id=None,
        payload_encoding=PLAIN_ENCODING,
    )
    assert list(refusing_plaintext([*sealed, note]))[-1] is note
    # Sealing starts later (a plaintext run resumed by an encrypting recorder).
    resumed = [recorded[0], *sealed[1:]]
    assert list(refusing_plaintext(resumed)) == resumed


def test_the_guard_refuses_from_the_first_sealed_event_on() -> None:
    recorded, sealed = _recorded(), _sealed(_recorded())
    guard = SealedRunGuard()
    assert guard.refusal(sealed[0]) is None
    refusal = guard.refusal(replace(recorded[1], run_id=sealed[0].run_id))
    assert isinstance(refusal, PlaintextInSealedRun)
    assert (refusal.key_id, refusal.sealed_at, refusal.sequence) == (KEY.key_id, 1, 2)
    with pytest.raises(PlaintextInSealedRun, match=r"sequence 3 \(run\.finished"):
        list(refusing_plaintext(_forged_finish(recorded)))


def test_fork_refuses_a_parent_with_a_forged_clear_event() -> None:
    with pytest.raises(PlaintextInSealedRun):
        RecordedTools(_forged_finish(_recorded()), pipeline=_sealed_pipeline())


def _delivered(events: list[Envelope]) -> list[Delivered]:
    return [Delivered(e, "t", 0, offset) for offset, e in enumerate(events)]


def test_the_view_check_flags_a_forged_event_in_the_batch_or_after_a_stored_seal() -> None:
    events = _forged_finish(_recorded())
    in_batch = refused_plaintext(_delivered(events), {})
    assert [(v.kind, v.incoming.envelope.sequence, v.existing.sequence) for v in in_batch] == [
        (PLAINTEXT_IN_SEALED_RUN, 3, 1)
    ]
    first = events[0]
    stored = StoredEvent(
        first.run_id, 1, first.event_id, first.input_digest, first.output_digest, first.chain_hash
    )
    later = refused_plaintext(_delivered(events[-1:]), {first.run_id: SealedBy(stored, KEY.key_id)})
    assert [v.existing for v in later] == [stored]
    assert refused_plaintext(_delivered(_recorded()), {}) == []
