"""Records the golden key-order histories (``key-order.sorted-text.avro``).

    python -m tests.golden.record_key_order tests/golden/key-order.sorted-text.avro

The archive was written by the last release that stored handed-back values as
canonical JSON, keys sorted (commit 9c2b289): it must replay forever, and recording
the same runs now (:func:`record_runs`, everything that varies between two recordings
held still) must give the same digests, and the same envelopes where no mapping's keys
are out of sorted order.

Two runs of :class:`KeyOrderAgent`: ``SORTED_INPUT``, whose every mapping has its keys
in sorted order, and ``UNSORTED_INPUT``, the same values in another order. The agent
hands each value on to where its own code could notice key order; it writes its LLM
request with ``json.dumps(..., sort_keys=True)``, so these old runs replay whatever
order the values come back in.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from agent_blackbox.outbox import AgentRun, EffectOutcome, MemoryRecorder, Redactor, RunSnapshot
from agent_blackbox.schemas import Envelope, Settings

SORTED_RUN = "00000000-0000-4000-8000-00000000a001"
UNSORTED_RUN = "00000000-0000-4000-8000-00000000a002"

SORTED_INPUT: dict[str, Any] = {
    "hits": [{"id": "kb-1", "score": 0.9, "text": "Refunds take 5 days."}],
    "order": "O-1",
    "receipt": {"amount": 12, "currency": "EUR"},
    "response": {
        "choices": [
            {
                "finish_reason": "stop",
                "index": 0,
                "message": {"content": "refunded", "role": "assistant"},
            }
        ],
        "id": "resp-1",
        "model": "m-1",
    },
    "result": {"alpha": 2, "nested": {"a": [1, {"b": 1, "c": 2}], "b": None}, "zeta": 1},
}

UNSORTED_INPUT: dict[str, Any] = {
    "order": "O-1",
    "result": {"zeta": 1, "alpha": 2, "nested": {"b": None, "a": [1, {"c": 2, "b": 1}]}},
    "hits": [{"text": "Refunds take 5 days.", "id": "kb-1", "score": 0.9}],
    "receipt": {"currency": "EUR", "amount": 12},
    "response": {
        "id": "resp-1",
        "model": "m-1",
        "choices": [
            {
                "message": {"role": "assistant", "content": "refunded"},
                "index": 0,
                "finish_reason": "stop",
            }
        ],
    },
}


class KeyOrderAgent:
    """Crosses each kind of boundary that hands a mapping back, and quotes what came
    back in its next LLM request, as agents do.

    Args:
        sort_keys: how the request quotes values (``json.dumps``'s own flag).
        seen: what the code was handed, in order, appended by each run.
    """

    def __init__(self, *, sort_keys: bool, seen: list[Any] | None = None) -> None:
        self._sort_keys = sort_keys
        self.seen: list[Any] = [] if seen is None else seen

    def __call__(self, run: AgentRun, input: Any) -> Any:
        result = run.call("lookup", lambda order: input["result"], input["order"])
        hits = run.retrieve("kb", lambda query, **how: input["hits"], "refunds", index_version="1")
        receipt = run.effect(
            "refund",
            lambda key: EffectOutcome("ext-1", input["receipt"]),
            arguments={"order": input["order"]},
            key=f"refund-{input['order']}",
        )
        quoted = [input, result, hits, receipt.result]
        request = {
            "model": "m-1",
            "messages": [{"role": "tool", "content": self._dumps(v)} for v in quoted],
        }
        response = run.llm(lambda request: input["response"], request, provider="openai")
        self.seen.append({"input": input, "result": result, "hits": hits})
        self.seen[-1].update(receipt=receipt.result, response=response)
        run.transition("answered", state={"reply": response["choices"][0]["message"]})
        return {"reply": response["choices"][0]["message"]["content"]}

    def _dumps(self, value: Any) -> str:
        return json.dumps(value, sort_keys=self._sort_keys)


EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


@contextmanager
def held_still(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Event ids counted from a fixed start and every latency 0 while recording (the
    recorder's clock is given to it): two recordings of one run give the same bytes."""
    counter = iter(range(1, 1_000_000))

    def event_id() -> str:
        return f"00000000-0000-4000-8000-{next(counter):012x}"

    for module in ("agent_blackbox.outbox._core", "agent_blackbox.outbox._recorder"):
        monkeypatch.setattr(f"{module}.new_event_id", event_id)
    monkeypatch.setattr("agent_blackbox.outbox._recording._since", lambda started: 0.0)
    yield


def record_runs(
    agent: Callable[[AgentRun, Any], Any] | None = None, *, canonical_json: str = "v1"
) -> list[Envelope]:
    """The two golden runs recorded in memory (hold them still for the same bytes),
    hashed over ``canonical_json``: the golden file's, version 1, unless told. Redacted
    under redaction version 2, the golden file's (its rules are in ``run.started``)."""
    settings = replace(Settings.from_env(), canonical_json=canonical_json)
    recorder = MemoryRecorder(clock=lambda: EPOCH, settings=settings, redaction=Redactor(version=2))
    runs: Mapping[str, dict[str, Any]] = {SORTED_RUN: SORTED_INPUT, UNSORTED_RUN: UNSORTED_INPUT}
    for run_id, value in runs.items():
        entry = agent or KeyOrderAgent(sort_keys=True)
        snapshot = RunSnapshot("key-order.1", input=value)
        recorder.record(entry, snapshot, agent_id="key-order", run_id=run_id)
    return recorder.events


def main(target: Path) -> None:
    from agent_blackbox.replayer import write_archive

    with pytest.MonkeyPatch.context() as monkeypatch, held_still(monkeypatch):
        count = write_archive(target, record_runs())
    print(f"wrote {count} events to {target}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
