"""No credential reaches Postgres, Kafka or a blob, whatever the redaction configuration.

Runs are recorded in plain mode (no encryption, so nothing hides a leak) with the
default rules and with every configurable rule turned off; every byte the pipeline
stored is then searched for the secrets the agent handled.
"""

from __future__ import annotations

import base64
import contextlib
import random
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest
from sqlalchemy import Engine, text

from agent_blackbox.outbox import AgentRun, Recorder, Redactor, RunSnapshot
from agent_blackbox.outbox.integrations.anthropic import capture_anthropic
from agent_blackbox.outbox.relay import Relay
from agent_blackbox.schemas import Settings
from tests.integration._anthropic_server import AnthropicServer
from tests.integration._kafka import read_topic
from tests.integration._views import build_views
from tests.integration.frameworks._harness import instrumented

pytestmark = pytest.mark.integration

API_KEY = "sk-proj-4f9TqA1b2C3d4E5f6G7h8I9j0K"
BEARER = "eyJhbGciOiJIUzI1NiJ9.c2VjcmV0LXRva2Vu.Q29va2llU2lnbmF0dXJl"
COOKIE = "session=9b1f6c0e44d2a7b3c5d8e9f0a1b2c3d4"
PASSWORD = "correct horse battery staple 42"
SECRETS = (API_KEY, BEARER, COOKIE, PASSWORD)
# A page too large to travel inline whatever the payload compression: random base64.
PAGE = base64.b64encode(random.Random(7).randbytes(75_000)).decode("ascii")


def agent(run: AgentRun, input: Any) -> Any:
    headers = {"Authorization": f"Bearer {BEARER}", "Cookie": COOKIE, "Accept": "text/plain"}
    page = run.call(
        "fetch",
        lambda url, headers, api_key: {"body": PAGE},
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


def _stored(settings: Settings, engine: Engine, expect: int) -> bytes:
    """Every byte the pipeline stored: outbox rows, blobs, the topic's payloads and
    attributes, and the views built from it."""
    with engine.connect() as conn:
        stored = [
            bytes(b) for b in conn.execute(text("SELECT envelope FROM blackbox.outbox")).scalars()
        ]
        blobs = [bytes(b) for b in conn.execute(text("SELECT data FROM blackbox.blobs")).scalars()]
    relay = Relay(engine, settings=settings)
    relay.drain(timeout=60)
    relay.close()
    messages = read_topic(settings.kafka_bootstrap, settings.topic, expect=expect)
    build_views(settings, engine, expect=expect)
    with engine.connect() as conn:
        views = " ".join(
            str(row)
            for table in ("runs", "events", "llm_calls")
            for row in conn.execute(text(f"SELECT * FROM blackbox_views.{table}"))
        )
    everything = b"".join(stored + blobs) + views.encode()
    everything += b"".join(e.payload or b"" for _, _, e in messages)
    everything += "".join(str(e.attributes) for _, _, e in messages).encode()
    return everything


@pytest.fixture
def anthropic_server() -> Iterator[AnthropicServer]:
    with AnthropicServer() as running:
        yield running


def claude_agent(llm: anthropic.Anthropic) -> Any:
    """Calls the Messages API every way, with credentials in the per-call headers too."""
    headers = {"Authorization": f"Bearer {BEARER}", "x-api-key": API_KEY, "Cookie": COOKIE}
    question = [{"role": "user", "content": "hi"}]
    tool = {"name": "look", "input_schema": {"type": "object", "properties": {}}}
    plain = llm.messages.create(model="claude-test", max_tokens=8, messages=question)
    streamed = llm.messages.create(
        model="claude-test", max_tokens=8, messages=question, stream=True, extra_headers=headers
    )
    with llm.with_options(timeout=20.0).messages.stream(
        model="claude-test", max_tokens=8, messages=question, tools=[tool], extra_headers=headers
    ) as stream:
        final = stream.get_final_message()
    try:
        llm.messages.create(
            model="fail-401", max_tokens=8, messages=question, extra_query={"key": API_KEY}
        )
    except anthropic.AuthenticationError as exc:
        failed = exc.status_code
    return [plain.id, len(list(streamed)), final.stop_reason, failed]


@pytest.mark.parametrize(
    ("rules", "wiring"),
    [
        (None, "captured"),
        (Redactor(detectors=[], paths=[]), "captured"),
        (Redactor(detectors=[], paths=[]), "instrumented"),
    ],
    ids=["default", "everything off", "everything off, instrumented"],
)
def test_the_anthropic_sdks_key_headers_and_cookies_are_never_stored(
    engine: Engine,
    settings: Settings,
    anthropic_server: AnthropicServer,
    rules: Redactor | None,
    wiring: str,
) -> None:
    """Through a client captured for the run, and through the agent's own client with
    every client of the process instrumented (recording into the run in force)."""
    defaults = {"X-Custom-Auth": f"Token {BEARER}", "Cookie": COOKIE}
    recorder = Recorder(engine, settings=settings, redaction=rules)
    with (
        instrumented() if wiring == "instrumented" else contextlib.nullcontext(),
        anthropic.Anthropic(
            base_url=anthropic_server.base_url,
            api_key=API_KEY,
            default_headers=defaults,
            max_retries=0,
        ) as sdk,
    ):
        llm = sdk if wiring == "instrumented" else capture_anthropic(sdk)
        run, output = recorder.record(
            lambda _run, _input: claude_agent(llm), RunSnapshot("creds.claude"), agent_id="claude"
        )
    assert output == ["msg_01", 7, "tool_use", 401]
    assert run.last_sequence == 6  # run.started, the four calls, run.finished
    # They did travel: the key, the custom auth header and the cookie on every request.
    sent = [" ".join(r.headers.values()) for r in anthropic_server.requests]
    assert len(sent) == 4
    assert all(API_KEY in h and BEARER in h and COOKIE in h for h in sent)
    everything = _stored(settings, engine, run.last_sequence)
    for secret in (API_KEY, BEARER, COOKIE, "x-custom-auth", "X-Custom-Auth"):
        assert secret.encode() not in everything, f"{secret[:8]}... was stored"
    assert b"claude-test" in everything  # what was recorded is there to search
