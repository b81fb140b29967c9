"""Pseudonyms for redacted values, recorded through the real write side with a key
store: code that compares redacted values behaves in replay as it did when recorded."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Engine

from agent_blackbox.keystore import AesGcmSealer, AuditedKeys, DataKeyStore, LocalKeyProvider
from agent_blackbox.outbox import AgentRun, Recorder, Redactor, RunSnapshot
from agent_blackbox.replayer import DivergenceKind, ReplayReport, replay_run
from agent_blackbox.schemas import Envelope, PayloadPipeline, Settings
from tests.integration._outbox import outbox_envelopes

pytestmark = pytest.mark.integration

CUSTOMERS = {"billing": "ann@example.com", "contact": "ann@example.com", "other": "bob@ex.io"}


def agent_seeing(seen: list[dict[str, Any]]) -> Callable[[AgentRun, Any], Any]:
    """The agent: it merges when billing and contact are one address and the other is
    another. ``seen`` gets the customers it was handed."""

    def agent(run: AgentRun, input: Any) -> Any:
        found = run.call("customers", lambda: dict(CUSTOMERS))
        seen.append(found)
        same = found["billing"] == found["contact"]
        differs = found["billing"] != found["other"]
        action = "merge" if same and differs else "review"
        run.call(action, lambda email: {"ok": True}, found["billing"])
        run.transition("checked", state={"same": same, "differs": differs})
        return {"action": action}

    return agent


def _events(engine: Engine, run_id: str) -> list[Envelope]:
    return outbox_envelopes(engine, run_id)


def _record(
    engine: Engine, settings: Settings, keys: DataKeyStore, redaction: Redactor, tenant: str
) -> list[Envelope]:
    recorder = Recorder(engine, settings=settings, keys=keys, redaction=redaction)
    run, output = recorder.record(
        agent_seeing([]), RunSnapshot("pseudonyms.1", {}), agent_id="pseudonyms", tenant_id=tenant
    )
    assert output == {"action": "merge"}
    return _events(engine, run.run_id)


def _replay(events: list[Envelope], keys: AuditedKeys) -> tuple[ReplayReport, dict[str, Any]]:
    """The report, and the customers the agent's code was handed in replay."""
    seen: list[dict[str, Any]] = []
    pipeline = PayloadPipeline(sealer=AesGcmSealer(keys))
    report = replay_run(events, agent_seeing(seen), pipeline=pipeline, digests=keys)
    return report, seen[0]


def test_equality_of_redacted_values_replays_and_pseudonyms_are_stable_per_tenant(
    engine: Engine, settings: Settings
) -> None:
    provider = LocalKeyProvider({"v1": os.urandom(32)})
    keys, reading = DataKeyStore(provider), AuditedKeys(engine, provider, purpose="pseudonyms")
    rules = Redactor(pseudonyms=["email"])
    report, seen = _replay(_record(engine, settings, keys, rules, "acme"), reading)
    assert report.passed, report.divergence and report.divergence.describe()
    assert seen["billing"] == seen["contact"] != seen["other"]
    assert seen["billing"].startswith("[email:")
    assert "@" not in str(seen)
    # Stable within a tenant, different in another.
    _, again = _replay(_record(engine, settings, keys, rules, "acme"), reading)
    _, elsewhere = _replay(_record(engine, settings, keys, rules, "globex"), reading)
    assert again == seen
    assert elsewhere["billing"] != seen["billing"]
    # The typed placeholder makes every address equal: unchanged code goes another way.
    diverged, _ = _replay(_record(engine, settings, keys, Redactor(), "acme"), reading)
    assert diverged.divergence is not None
    assert diverged.divergence.kind == DivergenceKind.ARGUMENT_MISMATCH
