"""Finding 4: redaction can be stalled.

A prompt-injected reply or tool result crafted against a backtracking detector
(``"xoxb-"*N + "_"`` at 80 KB took 5.9 s; ``"eyJ-"*N`` at 1 MB ran past 60 s) froze
the agent inside ``run.call`` / ``run.llm``, before the write. Here a tenant-A writer
records each such input (and others built to stall a detector) as a tool result and as
a model reply, on the real stack; the whole run must finish well inside a generous
hard limit. The limit is a bound on a condition (the recording thread ended), not a
timing measurement.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import Engine, text

from agent_blackbox.outbox import AgentRun, Recorder, RunSnapshot
from agent_blackbox.schemas import Settings
from tests.conftest import Login
from tests.security.conftest import TENANT_A

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

HARD_LIMIT_S = 60.0
"""Every input below is redacted in well under a second each; before the fix one input
alone ran past this."""

SIZE = 1_000_000


def _repeated(unit: str, size: int = SIZE) -> str:
    return (unit * (size // len(unit) + 1))[:size]


INPUTS = {
    "xoxb_80k": "xoxb-" * (80_000 // 5) + "_",
    "jwt_prefix_1m": _repeated("eyJ-"),
    "pairs_1m": _repeated("password="),
    "query_1m": _repeated("a=b&api_key="),
    "userinfo_1m": _repeated("https://a:"),
    "digits_1m": _repeated("4111 "),
    "json_nesting_1m": _repeated('{"a":'),
}


def agent(run: AgentRun, input: Any) -> Any:
    for name, crafted in INPUTS.items():
        run.call(f"fetch_{name}", lambda t: t, crafted)
        run.llm(
            lambda _request, t=crafted: {"choices": [{"message": {"content": t}}]},
            {"model": "m", "messages": [{"role": "user", "content": name}]},
            provider="test",
            model="m",
        )
    return "done"


def test_crafted_replies_do_not_stall_the_recorder(
    engine: Engine, settings: Settings, login: Login
) -> None:
    writer = login("blackbox_writer", tenant=TENANT_A)
    # Bodies stay inline: what is timed is redaction, not the blob store. (A writer login
    # user cannot store a blob today: INSERT ... ON CONFLICT (digest) needs SELECT on
    # blackbox.blobs, which the writer role lacks; reported to the write side.)
    inline = replace(settings, blob_threshold_bytes=16 * 1024 * 1024)
    recorder = Recorder(writer, settings=inline)
    outcome: dict[str, Any] = {}

    def record() -> None:
        try:
            run, output = recorder.record(
                agent,
                RunSnapshot(code_version="stall.1"),
                agent_id="stall",
                tenant_id=TENANT_A,
            )
            outcome["run_id"], outcome["output"] = run.run_id, output
        except BaseException as exc:  # reported by the assertion below
            outcome["error"] = exc

    recording = threading.Thread(target=record, name="stall-recording", daemon=True)
    recording.start()
    recording.join(timeout=HARD_LIMIT_S)
    assert not recording.is_alive(), (
        f"recording the crafted inputs did not finish within {HARD_LIMIT_S:.0f}s"
    )
    assert "error" not in outcome, outcome.get("error")
    assert outcome["output"] == "done"
    with engine.connect() as conn:
        status, last = conn.execute(
            text("SELECT status, last_sequence FROM blackbox.runs WHERE run_id = :r"),
            {"r": outcome["run_id"]},
        ).one()
    assert (status, last) == ("succeeded", 2 + 2 * len(INPUTS))
