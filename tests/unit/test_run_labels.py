"""A run's session and user ids: recorded on ``run.started`` after redaction, a user id
as the tenant's keyed digest where the run's class takes keyed digests, and refused when
they are not short printable labels."""

from __future__ import annotations

from typing import Any

import pytest

from agent_blackbox.outbox import MemoryRecorder, RunOptions, RunSnapshot
from agent_blackbox.outbox._core import _run_labels
from agent_blackbox.outbox._scrub import Scrub
from agent_blackbox.schemas import KeyedDigest, Settings


def _started(**fields: Any) -> dict[str, str]:
    recorder = MemoryRecorder()
    recorder.record(lambda run, _: "ok", RunSnapshot(code_version="c1"), agent_id="a", **fields)
    started = recorder.events[0]
    assert started.event_type == "run.started"
    return dict(started.attributes)


def test_session_and_user_ids_are_on_run_started() -> None:
    attributes = _started(session_id="chat-1841", user_id="u-42")
    assert attributes["session_id"] == "chat-1841"
    assert attributes["user_id"] == "u-42"
    assert "session_id" not in _started()


def test_a_user_id_passes_the_redaction_rules() -> None:
    attributes = _started(user_id="jane.doe@example.com")
    assert "jane" not in attributes["user_id"]
    assert "email" in attributes["redacted"]


def test_a_keyed_class_records_the_users_keyed_digest_never_the_id() -> None:
    options = RunOptions(agent_id="a", user_id="u-secret", classification="sensitive")
    settings = Settings()

    def label(key: bytes) -> str:
        return _run_labels(options, settings, KeyedDigest(key), Scrub(None), set())["user_id"]

    first = label(b"k" * 32)
    assert first.startswith("hmac-sha256:")
    assert "u-secret" not in first
    assert label(b"k" * 32) == first  # a user's runs share it, so they group
    assert label(b"j" * 32) != first  # another tenant's key, another digest
    plain = RunOptions(agent_id="a", user_id="u-secret")  # internal: as given
    labels = _run_labels(plain, settings, KeyedDigest(b"k" * 32), Scrub(None), set())
    assert labels["user_id"] == "u-secret"


@pytest.mark.parametrize(
    "fields",
    [
        {"session_id": ""},
        {"session_id": "a\nb"},
        {"user_id": "x" * 201},
        {"user_id": " padded"},
        {"session_id": 42},
    ],
)
def test_ids_that_are_not_short_printable_labels_are_refused(fields: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="must be 1 to 200 printable characters"):
        RunOptions(agent_id="a", **fields)
