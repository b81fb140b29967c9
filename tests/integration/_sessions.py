"""Runs recorded with sessions, users, tools, errors and words, built into the views,
the analytics views and the full-text index: what the sessions and search tests read."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import openai
import pytest
from sqlalchemy import Engine, text

import agent_blackbox as bb
from agent_blackbox.consumers import (
    INDEX_PURPOSE,
    AnalyticsConsumer,
    ConsumerRuntime,
    TextIndexConsumer,
    enable_text_search_txn,
    migrate_views,
)
from agent_blackbox.keystore import AesGcmSealer, AuditedKeys, DataKeyStore
from agent_blackbox.outbox import AgentRun, Recorder, RunSnapshot
from agent_blackbox.schemas import PayloadPipeline, Settings
from tests.integration._backups import PROVIDER, relay
from tests.integration._openai_server import OpenAIServer
from tests.integration._views import build_views
from tests.integration._wait import eventually

SECRET = "jane.doe@example.com"
"""Said by the user in a message; the recorder's rules redact it before it is written."""


@dataclass
class Recorded:
    """The runs recorded, by name, and how many events in all."""

    runs: dict[str, str]
    events: int


def _entry(
    client: openai.OpenAI, said: list[str], *, tool: bool = False, fail: bool = False
) -> Callable[[AgentRun, Any], str]:
    def entry(run: AgentRun, _input: Any) -> str:
        sdk = bb.capture_openai(client)
        for words in said:
            sdk.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": words}]
            )
        if tool:
            run.call("lookup_order", lambda order: {"order": order, "state": "shipped"}, "7731")
            with contextlib.suppress(KeyError):  # a tool error the agent caught
                run.call("lookup_order", _no_such_order, "0000")
            with pytest.raises(openai.RateLimitError):
                sdk.chat.completions.create(
                    model="fail-429", messages=[{"role": "user", "content": "again"}]
                )
        if fail:
            raise ValueError("the order does not exist")
        return "done"

    return entry


def _no_such_order(order: str) -> dict[str, str]:
    raise KeyError(order)


def _consume(consumer: ConsumerRuntime, total: int, what: str) -> None:
    seen = 0

    def caught_up() -> bool:
        nonlocal seen
        outcome = consumer.poll_once(0.5)
        seen += outcome.messages if outcome is not None else 0
        return seen >= total

    with consumer:
        eventually(caught_up, timeout=60, what=what)


def record_sessions(settings: Settings, engine: Engine) -> Recorded:
    """Record the runs (tenant ``acme`` opted in to full-text search, ``globex`` not),
    relay them and build every view; what was recorded."""
    migrate_views(settings.database_url)
    with engine.begin() as conn:
        enable_text_search_txn(conn, "acme")  # globex did not opt in
    plain = Recorder(engine, settings=settings)
    sealed = Recorder(engine, settings=settings, keys=DataKeyStore(PROVIDER))
    runs: dict[str, str] = {}
    events = 0
    plan: list[tuple[str, Recorder, dict[str, Any], list[str], dict[str, bool]]] = [
        ("first", plain, {"session_id": "chat-1", "user_id": "u-42"}, ["hello there"], {}),
        (
            "refund",
            plain,
            {"session_id": "chat-1", "user_id": "u-42", "subject_ids": ("customer-jane",)},
            [f"my email is {SECRET}", "please refund order 7731"],
            {},
        ),
        ("tools", plain, {"session_id": "chat-1", "user_id": "u-42"}, ["lookup"], {"tool": True}),
        ("failed", plain, {"session_id": "chat-2", "user_id": "u-7"}, ["broken"], {"fail": True}),
        (
            "sensitive",
            sealed,
            {"session_id": "chat-3", "user_id": "u-secret", "classification": "sensitive"},
            ["a quiet refund for the sealed run"],
            {},
        ),
        (
            "globex",
            plain,
            {"session_id": "chat-1", "user_id": "u-42", "tenant_id": "globex"},
            ["refund at globex"],
            {},
        ),
    ]
    with (
        OpenAIServer() as server,
        openai.OpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0) as client,
    ):
        for name, recorder, options, said, flags in plan:
            snapshot = RunSnapshot(code_version=f"code-{name}", tags={"team": name})
            entry = _entry(client, said, **flags)
            fields = {"tenant_id": "acme", **options}
            if flags.get("fail"):
                with pytest.raises(ValueError, match="does not exist"):
                    recorder.record(entry, snapshot, agent_id="support", **fields)
                with engine.connect() as conn:
                    run_id, last = conn.execute(
                        text(
                            "SELECT run_id, last_sequence FROM blackbox.runs "
                            "WHERE agent_id = 'support' AND status = 'failed'"
                        )
                    ).one()
                runs[name], events = str(run_id), events + int(last)
                continue
            run, _ = recorder.record(entry, snapshot, agent_id="support", **fields)
            runs[name], events = run.run_id, events + run.last_sequence
    relay(engine, settings)
    build_views(settings, engine, expect=events)
    _consume(
        AnalyticsConsumer(settings, group_id="ss-analytics", engine=engine), events, "analytics"
    )
    keys = AuditedKeys(engine, PROVIDER, purpose=INDEX_PURPOSE)
    indexer = TextIndexConsumer(
        settings,
        group_id="ss-text",
        engine=engine,
        pipeline=PayloadPipeline(sealer=AesGcmSealer(keys)),
    )
    _consume(indexer, events, "the text index")
    return Recorded(runs, events)
