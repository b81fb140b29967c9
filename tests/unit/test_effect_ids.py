"""An effect's ids reach the clear attributes scrubbed; the effects rows keep them as given
(recovery asks the external system by them) and the external system gets them as given."""

from __future__ import annotations

import contextlib
from typing import Any

from agent_blackbox.outbox import AgentRun, MemoryRecorder, RunSnapshot

KEY = "refund-for-alice.smith@example.com"
EXTERNAL = "ext-bob.jones@example.org"


def test_effect_ids_in_clear_attributes_are_scrubbed() -> None:
    seen: list[str] = []

    def agent(run: AgentRun, input: Any) -> Any:
        def perform(key: str) -> dict[str, Any]:
            seen.append(key)
            return {"external_id": EXTERNAL}

        run.effect("refund", perform, arguments={"order": "O-1"}, key=KEY)
        return None

    recorder = MemoryRecorder()
    recorder.record(agent, RunSnapshot("e.1"), agent_id="e")
    assert seen == [KEY]
    clear = [e.attributes for e in recorder.events if e.event_type.startswith("effect.")]
    assert len(clear) == 2
    for attributes in clear:
        text = repr(attributes)
        assert "alice.smith" not in text, text
        assert "bob.jones" not in text, text
        assert "idempotency_key" in attributes


def test_effects_rows_keep_the_key_for_recovery() -> None:
    recorder = MemoryRecorder()
    run = recorder.start_run(RunSnapshot("e.1"), agent_id="e")

    def perform(key: str) -> dict[str, Any]:
        raise ConnectionError("the line dropped")

    with contextlib.suppress(ConnectionError):
        run.effect("refund", perform, arguments={"order": "O-1"}, key=KEY)
    pending = recorder.unresolved_effects(run_id=run.run_id)
    assert [p.idempotency_key for p in pending] == [KEY]
