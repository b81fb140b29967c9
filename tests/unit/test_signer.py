"""The checkpoint signer's decisions, without a database: what it follows, and when the
database's head lets it sign."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner

from agent_blackbox.cli import main
from agent_blackbox.consumers._signing import (
    ChainHead,
    CheckpointPolicy,
    SignerFinding,
    Step,
    conflicts,
    follow,
    judge,
)
from agent_blackbox.outbox.storage import RunHead
from agent_blackbox.schemas import PLAIN_ENCODING, Checkpoint, Envelope, EventType, Settings
from tests.unit.test_verify import EVENTS, RUN, SIGNER, VERIFIER, _chain

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
POLICY = CheckpointPolicy(every_events=3, every_seconds=60)


def _followed(events: list[Envelope]) -> ChainHead:
    head = ChainHead(RUN)
    for event in events:
        assert follow(head, event) is Step.ADVANCED
    return head


def _stored(last: int, *, status: str = "running", chain: str | None = None) -> RunHead:
    return RunHead(RUN, "acme", status, last, chain or EVENTS[last - 1].chain_hash)


def test_follow_advances_repeats_and_breaks() -> None:
    head = _followed(EVENTS[:3])
    assert (head.last_sequence, head.chain_head, head.tenant_id) == (
        3,
        EVENTS[2].chain_hash,
        "acme",
    )
    assert follow(head, EVENTS[1]) is Step.REPEAT
    assert follow(head, EVENTS[4]) is Step.BROKEN  # sequence 4 is missing
    assert head.broken_at == 5
    assert follow(head, EVENTS[3]) is Step.IGNORED  # a refused run is not followed again


def test_follow_marks_the_end_and_sealing() -> None:
    head = _followed(EVENTS)
    assert head.finished
    assert not head.sealed
    sealed = _chain([replace(e, key_id="k1", payload_encoding="sealed") for e in EVENTS])
    assert _followed(sealed).sealed


def test_plaintext_after_a_sealed_event_stops_the_run() -> None:
    events = [replace(e, key_id="k1", payload_encoding="sealed") for e in EVENTS]
    events[2] = replace(events[2], key_id=None, payload_encoding=PLAIN_ENCODING)
    events = _chain(events)
    head = _followed(events[:2])
    assert follow(head, events[2]) is Step.PLAINTEXT
    assert head.broken_at == 3
    assert head.last_sequence == 2
    note = replace(events[2], event_type=EventType.RUN_REDACTED)
    head = _followed(events[:2])
    assert follow(head, _chain([*events[:2], note])[2]) is Step.ADVANCED


def test_a_conflict_is_another_chain_hash_or_event_id() -> None:
    event = EVENTS[2]
    assert not conflicts(event.event_id, event.chain_hash, event)
    assert not conflicts(None, event.chain_hash, event)
    assert conflicts(event.event_id, "0" * 64, event)
    assert conflicts("another-id", event.chain_hash, event)


def test_a_run_the_database_does_not_know_is_refused() -> None:
    verdict = judge(_followed(EVENTS), None, policy=POLICY, now=NOW)
    assert verdict.finding is SignerFinding.UNKNOWN_RUN
    assert not verdict.sign


@pytest.mark.parametrize(
    ("stored", "finding"),
    [
        (_stored(4), SignerFinding.AHEAD_OF_DATABASE),
        (_stored(6, status="finished", chain="0" * 64), SignerFinding.HEAD_MISMATCH),
        (replace(_stored(6, status="finished"), tenant_id="other"), SignerFinding.TENANT_MISMATCH),
    ],
)
def test_a_head_the_database_does_not_hold_is_refused(
    stored: RunHead, finding: SignerFinding
) -> None:
    verdict = judge(_followed(EVENTS), stored, policy=POLICY, now=NOW)
    assert verdict.finding is finding
    assert not verdict.sign
    assert "run-1" in verdict.detail


def test_a_finished_run_is_signed_when_the_database_agrees() -> None:
    verdict = judge(_followed(EVENTS), _stored(6, status="finished"), policy=POLICY, now=NOW)
    assert verdict.sign
    assert verdict.finished
    assert verdict.finding is None


def test_a_database_that_knows_more_means_wait() -> None:
    verdict = judge(_followed(EVENTS[:2]), _stored(5), policy=POLICY, now=NOW)
    assert not verdict.sign
    assert verdict.finding is None


def test_a_running_run_is_signed_every_n_events_or_after_its_wait() -> None:
    two = _followed(EVENTS[:2])
    assert not judge(two, _stored(2), policy=POLICY, now=NOW).sign
    three = _followed(EVENTS[:3])
    grown = judge(three, _stored(3), policy=POLICY, now=NOW)
    assert grown.sign
    assert not grown.finished
    two.check_after = NOW - timedelta(seconds=1)
    waited = judge(two, _stored(2), policy=POLICY, now=NOW)
    assert waited.sign
    assert not waited.finished
    assert judge(_followed(EVENTS[:2]), _stored(2), policy=POLICY, now=NOW, sweep=True).sign


def test_a_crashed_run_marked_abandoned_is_signed_unfinished() -> None:
    verdict = judge(_followed(EVENTS[:4]), _stored(4, status="abandoned"), policy=POLICY, now=NOW)
    assert verdict.sign
    assert not verdict.finished


def test_a_signed_head_is_not_signed_again() -> None:
    head = _followed(EVENTS)
    head.signed_sequence = 6
    assert not judge(head, _stored(6, status="finished"), policy=POLICY, now=NOW).sign


def test_policy_from_settings_and_bad_values() -> None:
    settings = Settings.from_env(
        {"BLACKBOX_CHECKPOINT_EVERY_EVENTS": "50", "BLACKBOX_CHECKPOINT_EVERY_SECONDS": "5"}
    )
    assert CheckpointPolicy.from_settings(settings) == CheckpointPolicy(50, 5.0)
    assert CheckpointPolicy.from_settings(Settings()) == CheckpointPolicy(1000, 60.0)
    with pytest.raises(ValueError, match="every_events"):
        CheckpointPolicy(0, 5)


def test_a_checkpoint_says_whether_the_run_finished() -> None:
    mid = SIGNER.sign(
        run_id=RUN,
        tenant_id="acme",
        last_sequence=3,
        chain_head=EVENTS[2].chain_hash,
        finished=False,
    )
    VERIFIER.verify(mid)
    assert not mid.final
    assert Checkpoint.from_record(mid.to_record()) == mid
    # The flag is signed: flipping it breaks the signature.
    with pytest.raises(Exception, match="does not verify"):
        VERIFIER.verify(replace(mid, finished=True))
    legacy = SIGNER.sign(
        run_id=RUN, tenant_id="acme", last_sequence=6, chain_head=EVENTS[5].chain_hash
    )
    assert legacy.finished is None
    assert legacy.final
    assert b"finished" not in legacy.message()
    with pytest.raises(Exception, match="finished"):
        Checkpoint.from_record({**mid.to_record(), "finished": "yes"})


def test_sign_refuses_a_bad_policy_before_connecting() -> None:
    result = CliRunner().invoke(main, ["sign", "--every-seconds", "0"])
    assert result.exit_code == 2
    assert "--every-seconds" in result.output
    help_text = CliRunner().invoke(main, ["sign", "--help"]).output
    assert "--every-events" in help_text


def test_an_event_that_cannot_be_hashed_breaks_the_chain_instead_of_the_signer() -> None:
    head = _followed(EVENTS[:2])
    odd = replace(EVENTS[2], attributes={"tool": object()})  # type: ignore[dict-item]
    assert follow(head, odd) is Step.BROKEN
    assert head.broken_at == 3
