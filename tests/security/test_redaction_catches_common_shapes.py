"""Finding 3: redaction misses common shapes.

A tenant-A writer (a login user) records, on the real stack and with encryption, a run
whose secrets travel where the finding saw them slip through: URL query strings and a
URL password in tool arguments, a credential under a key name outside the old list, a
token as a dict key, a key shape in free text, an LLM tool call's ``arguments`` JSON
string (whole, and streamed in two chunks cut through the secret), OpenAI
``extra_body`` and ``metadata`` request fields (through the SDK capture, which records
the body as sent, ``extra_body`` merged), the snapshot's flags, a transition's reason,
and an exception message. Then, as the replayer holding the keys, every body is opened
and every clear attribute and view row read: none of the secrets is anywhere, in the
outbox rows, the topic, or the views.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Iterator
from typing import Any

import openai
import pytest
from sqlalchemy import Engine, text

from agent_blackbox.keystore import AesGcmSealer, AuditedKeys, DataKeyStore, LocalKeyProvider
from agent_blackbox.outbox import AgentRun, Recorder, RunSnapshot
from agent_blackbox.outbox.integrations.openai import capture_openai
from agent_blackbox.outbox.relay import Relay
from agent_blackbox.schemas import Envelope, EnvelopeCodec, PayloadPipeline, Settings
from tests.conftest import Login
from tests.integration._kafka import read_topic
from tests.integration._openai_server import OpenAIServer
from tests.integration._outbox import outbox_rows
from tests.integration._views import build_views
from tests.security.conftest import TENANT_A

pytestmark = pytest.mark.integration

PROVIDER = LocalKeyProvider({"v1": os.urandom(32)})

SECRETS = {
    "query api_key": "Qk7mZ2vX9pLr4TnB8wYc",
    "query access_token": "at9Jh3Kd8Lq2Wz5Xv1Nm",
    "url password": "pwHq4Zr8Tm2Vx6Kc1",
    "clientSecret kwarg": "cs7Tg2Hn5Jk8Lp3Qw",
    "token as a dict key": "ghp_16C7e42F292c6912E7710c838347Ae178B4a",
    "stripe key in text": "sk_live_51Hq7xYzAbCdEfGhIjKlMnOp",
    "llm tool-call arguments": "Tz9Wq3Er7Yu1Io5Pa",
    "streamed tool-call arguments": "Sx4Rt8Yu2Io6Pa1Df",
    "openai extra_body": "AIzaSyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY",
    "openai metadata": "hooks.slack.com/services/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",
    "snapshot flag": "flRv8Nc2Mx6Bz4Kd7",
    "transition reason": "glpat-xY3zQ9wLm2Nb8Vc7Kd1R",
    "exception message": "exPd3Ks7Lf1Gh9Wq2",
}
S = SECRETS

LOGIN_TOOL = {
    "type": "function",
    "function": {
        "name": "db_login",
        "description": "Log in to the database.",
        "parameters": {
            "type": "object",
            "properties": {"db_password": {"type": "string"}},
            "required": ["db_password"],
        },
    },
}


def agent(run: AgentRun, input: Any) -> Any:
    url = (
        f"https://api.example.com/v1/items?q=1&api_key={S['query api_key']}"
        f"&access_token={S['query access_token']}"
    )
    run.call(
        "http_get",
        lambda url, **kw: {"status": 200},
        url,
        mirror=f"https://bob:{S['url password']}@db.example.com/items",
        clientSecret=S["clientSecret kwarg"],
        lookup={S["token as a dict key"]: "owner"},
        note=f"charge with {S['stripe key in text']} today",
    )
    llm = capture_openai(input["sdk"], run)
    reply = llm.chat.completions.create(
        model="gpt-test",
        messages=[{"role": "user", "content": f"db_password={S['llm tool-call arguments']}"}],
        tools=[LOGIN_TOOL],
        extra_body={"provider": {"x-goog-api-key": S["openai extra_body"]}},
        metadata={"deploy": f"https://{S['openai metadata']}"},
    )
    arguments = reply.choices[0].message.tool_calls[0].function.arguments
    assert S["llm tool-call arguments"] in arguments  # the agent gets the real reply
    # Streamed, the model's arguments arrive cut in two chunks (the local server halves
    # them), the secret across the cut: the stream passes through to the agent as sent
    # and is redacted as a whole when it is recorded.
    stream = llm.chat.completions.create(
        model="gpt-test",
        messages=[{"role": "user", "content": f"db_password={S['streamed tool-call arguments']}"}],
        tools=[LOGIN_TOOL],
        stream=True,
    )
    pieces = [
        call.function.arguments or ""
        for chunk in stream
        for call in (chunk.choices[0].delta.tool_calls or [] if chunk.choices else [])
        if call.function
    ]
    assert S["streamed tool-call arguments"] in "".join(pieces)
    assert not any(S["streamed tool-call arguments"] in piece for piece in pieces)

    def connect() -> None:
        raise RuntimeError(f"login failed: password={S['exception message']} for bob")

    with contextlib.suppress(RuntimeError):
        run.call("db_connect", connect)
    run.transition("rotated", state={"ok": True}, reason=f"rotated {S['transition reason']}")
    return "done"


def _record(writer: Engine, settings: Settings, sdk: openai.OpenAI) -> str:
    recorder = Recorder(writer, settings=settings, keys=DataKeyStore(PROVIDER))
    snapshot = RunSnapshot(
        code_version="redaction.1",
        input={"ticket": "T-3"},
        flags={"db_password": S["snapshot flag"], "beta": "on"},
    )
    run = recorder.start_run(snapshot, agent_id="redaction", tenant_id=TENANT_A)
    output = agent(run, {"sdk": sdk})
    run.finish(output=output)
    return run.run_id


def _leaks(texts: Iterable[str]) -> list[str]:
    joined = "\n".join(texts)
    return [name for name, secret in SECRETS.items() if secret in joined]


def _envelope_texts(envelopes: Iterable[Envelope], opener: PayloadPipeline) -> Iterator[str]:
    """Every clear field of each envelope and its body, opened."""
    for envelope in envelopes:
        yield json.dumps(envelope.attributes, ensure_ascii=False)
        yield " ".join(
            str(v) for v in (envelope.run_id, envelope.subject_ids, envelope.input_digest)
        )
        yield json.dumps(opener.unpack(envelope), ensure_ascii=False, default=str)


def _bytes_texts(raw: Iterable[bytes]) -> Iterator[str]:
    for data in raw:
        yield data.decode("utf-8", "replace")


def test_no_secret_of_finding_3_survives_anywhere(
    engine: Engine, settings: Settings, login: Login
) -> None:
    writer = login("blackbox_writer", tenant=TENANT_A)
    replayer = login("blackbox_replayer", tenant=TENANT_A)
    reader = login("blackbox_reader", tenant=TENANT_A)
    with (
        OpenAIServer() as server,
        openai.OpenAI(base_url=server.base_url, api_key="sk-test-unused", max_retries=0) as sdk,
    ):
        run_id = _record(writer, settings, sdk)
    opener = PayloadPipeline(
        sealer=AesGcmSealer(AuditedKeys(replayer, PROVIDER, purpose="finding 3 check"))
    )
    codec = EnvelopeCodec()

    raw_rows = outbox_rows(engine, run_id)  # before the relay publishes them
    outbox = [codec.decode(row) for row in raw_rows]
    assert len(outbox) == 7
    assert _leaks(_bytes_texts(raw_rows)) == []
    assert _leaks(_envelope_texts(outbox, opener)) == []

    relay = Relay(engine, settings=settings)
    try:
        relay.drain(timeout=60)
    finally:
        relay.close()
    messages = read_topic(settings.kafka_bootstrap, settings.topic, expect=len(outbox))
    topic = [envelope for _, _, envelope in messages]
    assert [e.event_id for e in topic] == [e.event_id for e in outbox]
    assert _leaks(_envelope_texts(topic, opener)) == []
    assert _leaks(_bytes_texts(codec.encode(e) for e in topic)) == []

    build_views(settings, engine, expect=len(outbox))
    with reader.connect() as conn:
        views = [
            str(row)
            for table in ("events", "runs", "integrity_violations")
            for row in conn.execute(text(f"SELECT * FROM blackbox_views.{table}")).all()
        ]
    assert any(run_id in row for row in views)  # the reader does see the run
    assert _leaks(views) == []
