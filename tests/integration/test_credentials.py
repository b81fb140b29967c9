"""No credential reaches Postgres, Kafka or a blob, whatever the redaction configuration.

Runs are recorded in plain mode (no encryption, so nothing hides a leak) with the
default rules and with every configurable rule turned off; every byte the pipeline
stored is then searched for the secrets the agent handled.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine, text

from agent_blackbox.outbox import AgentRun, Recorder, Redactor, RunSnapshot
from agent_blackbox.outbox.relay import Relay
from agent_blackbox.schemas import Settings
from tests.integration._kafka import read_topic
from tests.integration._views import build_views

pytestmark = pytest.mark.integration

API_KEY = "sk-proj-4f9TqA1b2C3d4E5f6G7h8I9j0K"
BEARER = "eyJhbGciOiJIUzI1NiJ9.c2VjcmV0LXRva2Vu.Q29va2llU2lnbmF0dXJl"
COOKIE = "session=9b1f6c0e44d2a7b3c5d8e9f0a1b2c3d4"
PASSWORD = "correct horse battery staple 42"
SECRETS = (API_KEY, BEARER, COOKIE, PASSWORD)


def agent(run: AgentRun, input: Any) -> Any:
    headers = {"Authorization": f"Bearer {BEARER}", "Cookie": COOKIE, "Accept": "text/plain"}
    page = run.call(
        "fetch",
        lambda url, headers, api_key: {"body": "x" * 100_000},
        "https://x.test/a",
        headers=headers,
        api_key=API_KEY,
    )
    run.llm(
        lambda request: {"choices": [{"message": {"content": f"used {API_KEY}"}}]},
        {"model": "m", "api_key": API_KEY, "messages": [{"role": "user", "content": BEARER}]},
        provider="openai",
    )
    run.effect(
        "login",
        lambda key: {"external_id": "s-1", "result": {"password": PASSWORD}},
        arguments={"user": "ann", "password": PASSWORD},
    )
    run.transition("in", state={"cookie": COOKIE, "note": f"Authorization: Bearer {BEARER}"})
    return {"size": len(page["body"]), "token": f"Bearer {BEARER}"}


@pytest.mark.parametrize(
    "rules", [None, Redactor(detectors=[], paths=[])], ids=["default", "everything off"]
)
def test_no_credential_is_stored_anywhere(
    engine: Engine, settings: Settings, rules: Redactor | None
) -> None:
    recorder = Recorder(engine, settings=settings, redaction=rules)
    run, _ = recorder.record(agent, RunSnapshot("creds.1", {"api_key": API_KEY}), agent_id="c")
    with engine.connect() as conn:
        stored = [
            bytes(b) for b in conn.execute(text("SELECT envelope FROM blackbox.outbox")).scalars()
        ]
        blobs = [bytes(b) for b in conn.execute(text("SELECT data FROM blackbox.blobs")).scalars()]
    assert blobs, "the large tool result should have gone out of line"
    relay = Relay(engine, settings=settings)
    relay.drain(timeout=60)
    relay.close()
    messages = read_topic(settings.kafka_bootstrap, settings.topic, expect=run.last_sequence)
    build_views(settings, engine, expect=run.last_sequence)
    with engine.connect() as conn:
        views = " ".join(
            str(row)
            for table in ("runs", "events", "integrity_violations")
            for row in conn.execute(text(f"SELECT * FROM blackbox_views.{table}"))
        )
    everything = b"".join(stored + blobs) + views.encode()
    everything += b"".join(e.payload or b"" for _, _, e in messages)
    everything += "".join(str(e.attributes) for _, _, e in messages).encode()
    for secret in SECRETS:
        assert secret.encode() not in everything, f"{secret[:8]}... was stored"
    assert b"[redacted:" in everything  # the placeholders are what was kept
