"""Redaction catches secrets hidden behind an encoding, an inserted character or a cut.

A tenant-A writer (a login user, with encryption) records, on the real stack, a run that
passes secrets in each shape the review found slipping through: a credential name or an
address percent-encoded (``?api%5Fkey=``, ``email=alice%40example.com``); U+FE0F, a
Unicode tag character or a line break inside a key or a key name; JSON encoded twice (a
JSON string holding JSON holding the secret); a ``data:...;base64,`` body; a card number
grouped by dots or slashes, or given as a number under a card field; an internationalised
e-mail address; a key cut across the chunks of a legacy completions stream
(``choices[].text``). Then, as the replayer holding the keys, every body of the run is
opened: the secret is in none of them, and the event names the rule that removed it.
One test per shape group; each failed before redaction version 3.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import Engine

from agent_blackbox.keystore import AesGcmSealer, AuditedKeys, DataKeyStore, LocalKeyProvider
from agent_blackbox.outbox import AgentRun, Recorder, RunSnapshot
from agent_blackbox.schemas import PayloadPipeline, Settings
from tests.conftest import Login
from tests.integration._outbox import outbox_envelopes
from tests.security.conftest import TENANT_A

pytestmark = pytest.mark.integration

PROVIDER = LocalKeyProvider({"v1": os.urandom(32)})
SECRET = "Qk7mZ2vX9pLr4TnB"
KEY_TAIL = "Ab3dEf6hIj9kLm2nOp5qRs8t"
KEY = f"sk-proj-{KEY_TAIL}"
DATA = f"api_key={SECRET}\nowner=ops\n"


@dataclass(frozen=True)
class Group:
    """Values that hide secrets one way, the secrets, and the rule that must fire."""

    arguments: dict[str, Any]
    secrets: tuple[str, ...]
    rule: str


GROUPS = {
    "percent-encoded names and addresses": Group(
        {
            "url": f"https://api.example.com/v1/items?q=1&api%5Fkey={SECRET}",
            "callback": f"/cb?%61ccess%5Ftoken={SECRET}x&state=9",
            "form": "email=alice.quinn7%40example.com&plan=pro",
        },
        (SECRET, "alice.quinn7"),
        "email",
    ),
    "invisible characters and line breaks inside keys": Group(
        {
            "selector": f"use sk\ufe0f-proj-{KEY_TAIL} today",
            "tag": f"sk-proj-Ab3dEf\U000e0041{KEY_TAIL[6:]}",
            "wrapped": f"key:\nsk-proj-Ab3dEf6hIj9k\n{KEY_TAIL[10:]}\n",
            "headers": {"api\nkey": SECRET, "pass\u200dword\ufe0f": f"{SECRET}2"},
        },
        (KEY_TAIL[10:], SECRET),
        "api_key",
    ),
    "JSON encoded twice": Group(
        {
            "payload": json.dumps(json.dumps({"password": SECRET, "user": "bob"})),
            "log": "sent body=" + json.dumps(json.dumps({"client_secret": f"{SECRET}3"})),
        },
        (SECRET,),
        "credential",
    ),
    "data: URL bodies": Group(
        {
            "attachment": "data:text/plain;base64," + base64.b64encode(DATA.encode()).decode(),
            "config": "data:application/json;base64,"
            + base64.urlsafe_b64encode(json.dumps({"token": SECRET}).encode()).decode(),
        },
        (
            SECRET,
            base64.b64encode(DATA.encode()).decode()[:24],
            base64.urlsafe_b64encode(json.dumps({"token": SECRET}).encode()).decode()[:24],
        ),
        "credential",
    ),
    "cards grouped by dots or slashes or given as numbers": Group(
        {
            "dotted": "card 4532.5260.1815.9080 exp 12/29",
            "slashed": "5425/3016/6131/8608",
            "as_float": {"card": 4916913909960303.0},
            "as_int": {"cardNumber": 2221824628194823},
            "details": {"number": "371993518190936", "exp_month": 4, "cvc": "123"},
        },
        ("5260.1815", "3016/6131", "4916913909960303", "2221824628194823", "3719935181"),
        "card_number",
    ),
    "internationalised e-mail addresses": Group(
        {"to": "josé.ñandú@exämple.com", "cc": "用户名@例子.广告", "bcc": "алиса@пример.рф"},
        ("josé.ñandú", "用户名", "алиса"),
        "email",
    ),
}


def _group_agent(group: Group) -> Callable[[AgentRun, Any], Any]:
    def agent(run: AgentRun, input: Any) -> Any:
        run.call("deliver", lambda **kwargs: {"ok": True}, **group.arguments)
        return "done"

    return agent


def _legacy_stream(text: str) -> dict[str, Any]:
    """A legacy completions stream (``choices[].text``), four characters a chunk."""
    pieces = [text[i : i + 4] for i in range(0, len(text), 4)]
    chunks = [
        {"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": p}]}
        for p in pieces
    ]
    return {"stream": chunks}


STREAMED = f"Your new key is {KEY} - store it in the vault."


def _stream_agent(run: AgentRun, input: Any) -> Any:
    response = run.llm(
        lambda _request: _legacy_stream(STREAMED),
        {"model": "gpt-3.5-turbo-instruct", "prompt": "rotate the key", "stream": True},
        provider="openai",
        model="gpt-3.5-turbo-instruct",
    )
    pieces = [chunk["choices"][0]["text"] for chunk in response["stream"]]
    assert KEY in "".join(pieces)  # the agent gets the stream as the model sent it
    assert not any(KEY_TAIL in piece for piece in pieces)
    return "done"


def _recorded_bodies(
    engine: Engine, settings: Settings, login: Login, agent: Callable[[AgentRun, Any], Any]
) -> list[tuple[dict[str, str], str]]:
    """Record ``agent`` as a tenant-A writer; every event's attributes and opened body
    (as the tenant's replayer)."""
    writer = login("blackbox_writer", tenant=TENANT_A)
    replayer = login("blackbox_replayer", tenant=TENANT_A)
    recorder = Recorder(writer, settings=settings, keys=DataKeyStore(PROVIDER))
    run, output = recorder.record(
        agent, RunSnapshot(code_version="redaction.3"), agent_id="encoded", tenant_id=TENANT_A
    )
    assert output == "done"
    opener = PayloadPipeline(
        sealer=AesGcmSealer(AuditedKeys(replayer, PROVIDER, purpose="redaction check"))
    )
    return [
        (dict(envelope.attributes), json.dumps(opener.unpack(envelope), ensure_ascii=False))
        for envelope in outbox_envelopes(engine, run.run_id)
    ]


@pytest.mark.parametrize("name", list(GROUPS))
def test_secrets_hidden_in_values_are_removed(
    name: str, engine: Engine, settings: Settings, login: Login
) -> None:
    group = GROUPS[name]
    events = _recorded_bodies(engine, settings, login, _group_agent(group))
    tool_attributes, tool_body = events[1]
    leaked = [secret for secret in group.secrets if any(secret in body for _, body in events)]
    assert leaked == [], f"{name}: {leaked} recorded in {tool_body}"
    assert group.rule in tool_attributes["redacted"].split(",")
    assert "deliver" in tool_body  # the call itself was recorded, only the secrets went


def test_a_key_cut_across_legacy_completions_chunks_is_removed(
    engine: Engine, settings: Settings, login: Login
) -> None:
    events = _recorded_bodies(engine, settings, login, _stream_agent)
    llm_attributes, llm_body = events[1]
    assert KEY_TAIL not in llm_body
    assert "api_key" in llm_attributes["redacted"].split(",")
    # The chunks still add up to the answer, the key replaced.
    response = json.loads(json.loads(llm_body)["raw_response_json"])
    text = "".join(chunk["choices"][0]["text"] for chunk in response["stream"])
    assert text == STREAMED.replace(KEY, "[redacted:api_key]")
