"""Records the golden history other languages are checked against (``contract.rfc8785.avro``).

    python -m tests.golden.record_contract tests/golden/contract.rfc8785.avro

Runs of a support agent hashed over RFC 8785 (the canonicalisation new runs take), with
what an outside reader has to get exactly right: floats that JCS writes otherwise than
Python (``1e-05`` as ``0.00001``, ``1e-7``, ``1e+21``, ``5e-324``, ``1.0`` as ``1``,
``-0.0`` as ``0``), an integer past 2**53, keys whose UTF-16 and code-point orders
differ, text that JSON escapes, LLM requests stored by reference to earlier ones, and
every payload encoding a recorder writes (zstd with the shared dictionary, zstd without
it, deflate, plain Avro). The JVM consumer (``examples/jvm-consumer``) verifies its
chains and digests and decodes its bodies; ``tests/unit/test_canonicalisation.py``
replays it.

Event ids, the clock and latencies are held still while recording (clock reads and
random draws are not).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from agent_blackbox.outbox import AgentRun, EffectOutcome, MemoryRecorder, RunSnapshot
from agent_blackbox.schemas import Envelope, Settings
from tests.golden.record_key_order import held_still

RUNS: Mapping[str, str] = {
    "00000000-0000-4000-8000-00000000c001": "zstd",
    "00000000-0000-4000-8000-00000000c002": "zstd-nodict",
    "00000000-0000-4000-8000-00000000c003": "deflate",
    "00000000-0000-4000-8000-00000000c004": "none",
}
"""Each run and the payload compression it is recorded with."""

PARAMS: dict[str, Any] = {
    "top_p": 1e-05,
    "temperature": 1.0,
    "frequency_penalty": -0.0,
    "logit_bias": {"50256": -100.0, "13": 1e-7},
    "seed": 2**53 + 1,
    "max_tokens": 256,
}
"""Sampling parameters whose JCS text is not Python's."""

TICKET: dict[str, Any] = {
    "id": "T-7",
    "text": 'Card "ending 4242" was charged twice\n\u2014 please refund \u20ac12.50',
    "labels": {"\ufb33": "hebrew", "\U0001f600": "smile", "a": "plain"},
    "amounts": [12.5, 1e21, 5e-324, 2.5e-8],
}
"""The run's input: escaped text, keys in two orders, numbers at the edges."""

SYSTEM = "You are a support agent. Answer briefly and cite the ticket. " * 8


def support_agent(run: AgentRun, ticket: Any) -> Any:
    """Looks the ticket up, searches the knowledge base, asks the model three times in
    one conversation (later requests are stored by reference), refunds, and answers."""
    found = run.call("lookup_ticket", lambda ticket_id: {**ticket, "score": 0.75}, ticket["id"])
    hits = run.retrieve(
        "kb",
        lambda query, **how: [{"id": "kb-1", "score": 0.125}, {"id": "kb-2", "score": 1e-9}],
        "refund double charge",
        index_version="3",
        top_k=2,
    )
    run.now()
    run.random()
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    replies = []
    for turn, question in enumerate(("What happened?", "Is it a double charge?", "Refund?")):
        messages.append({"role": "user", "content": question, "ticket": found, "hits": hits})
        request = {"model": "gpt-test", "messages": list(messages), **PARAMS}
        reply = run.llm(lambda r, n=turn: _reply(n), request, provider="openai")
        replies.append(reply["choices"][0]["message"]["content"])
        messages.append(reply["choices"][0]["message"])
    receipt = run.effect(
        "refund",
        lambda key: EffectOutcome("re-1", {"amount": 12.5, "fee": 0.0}),
        arguments={"ticket": ticket["id"], "amount": 12.5},
        key=f"refund-{ticket['id']}",
    )
    run.transition("refunded", state={"refund": receipt.result, "ratio": 1e-7})
    return {"replies": replies, "refunded": receipt.result}


def _reply(turn: int) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{turn}",
        "object": "chat.completion",
        "model": "gpt-test",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": f"Answer {turn}: yes."},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 120 + turn, "completion_tokens": 5, "total_tokens": 125 + turn},
        "system_fingerprint": "fp_1e-05",
        "created": 1767225600,
        "score": 1e-05,
    }


EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def record_runs() -> list[Envelope]:
    """The golden runs, recorded in memory over RFC 8785."""
    events: list[Envelope] = []
    for run_id, compression in RUNS.items():
        settings = replace(
            Settings.from_env(), canonical_json="rfc8785", payload_compression=compression
        )
        recorder = MemoryRecorder(clock=lambda: EPOCH, settings=settings)
        snapshot = RunSnapshot("contract.1", input=TICKET)
        recorder.record(support_agent, snapshot, agent_id="support", run_id=run_id)
        events.extend(recorder.events)
    return events


def main(target: Path) -> None:
    from agent_blackbox.replayer import write_archive

    with pytest.MonkeyPatch.context() as monkeypatch, held_still(monkeypatch):
        count = write_archive(target, record_runs())
    print(f"wrote {count} events of {len(RUNS)} runs to {target}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
