"""Retrieval is a boundary: the query, the index version, the filters and the hits are
recorded; replay checks the query and hands back the recorded hits without searching."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from agent_blackbox.outbox import AsyncMemoryRecorder, MemoryRecorder, RunSnapshot
from agent_blackbox.replayer import DivergenceKind, replay_run
from agent_blackbox.schemas import Envelope, EventType, PayloadPipeline

DOCS = {
    "refunds": [
        {"id": "kb-12", "chunk_version": "3", "score": 0.91, "text": "Refunds take 5 days."},
        {"id": "kb-40", "chunk_version": "1", "score": 0.55, "text": "Card refunds..."},
    ],
}


class SearchDown(Exception):
    pass


def search(query: str, *, filters: Any = None, top_k: int | None = None) -> Any:
    if query == "outage":
        raise SearchDown("the index is rebuilding")
    hits = DOCS.get(query, [])
    return iter(hits[:top_k] if top_k else hits)  # any iterable of hits will do


def agent(run: Any, input: Any) -> Any:
    hits = run.retrieve(
        "kb", search, input["query"], index_version="2026-11-30", filters={"lang": "en"}, top_k=2
    )
    try:
        run.retrieve("kb", search, "outage", index_version="2026-11-30")
    except SearchDown as exc:
        return {"ids": [h["id"] for h in hits], "down": str(exc)}
    return {"ids": [h["id"] for h in hits]}


def _recorded(input: Any = None) -> list[Envelope]:
    recorder = MemoryRecorder()
    snapshot = RunSnapshot(code_version="1", input=input or {"query": "refunds"})
    recorder.record(agent, snapshot, agent_id="kb")
    return recorder.events


def test_a_retrieval_records_index_version_filters_and_hits() -> None:
    events = _recorded()
    found = [e for e in events if e.event_type == EventType.RETRIEVAL]
    assert len(found) == 2
    first = found[0]
    assert first.attributes["index"] == "kb"
    assert first.attributes["index_version"] == "2026-11-30"
    assert first.attributes["hits"] == "2"
    body = PayloadPipeline().unpack(first)
    assert json.loads(body["filters_json"]) == {"lang": "en"}
    assert body["top_k"] == 2
    hits = json.loads(body["hits_json"])
    assert [(h["id"], h["chunk_version"], h["score"]) for h in hits] == [
        ("kb-12", "3", 0.91),
        ("kb-40", "1", 0.55),
    ]
    assert found[1].attributes["error"] == "SearchDown"


def test_replay_hands_back_the_hits_and_the_error_without_searching() -> None:
    events = _recorded()

    def no_search(query: str, **_: Any) -> Any:
        raise AssertionError("replay searched")

    def replayed(run: Any, input: Any) -> Any:
        hits = run.retrieve(
            "kb",
            no_search,
            input["query"],
            index_version="2026-11-30",
            filters={"lang": "en"},
            top_k=2,
        )
        try:
            run.retrieve("kb", no_search, "outage", index_version="2026-11-30")
        except SearchDown as exc:  # the tool's own class, re-raised
            return {"ids": [h["id"] for h in hits], "down": str(exc)}
        return None

    report = replay_run(events, replayed)
    assert report.passed, report.divergence and report.divergence.describe()


@pytest.mark.parametrize(
    ("change", "path"),
    [
        ({"index_version": "2026-12-01"}, "index_version"),
        ({"filters": {"lang": "de"}}, "filters.lang"),
        ({"top_k": 5}, "top_k"),
        ({"query": "refund"}, "query"),
    ],
)
def test_another_query_or_index_version_diverges_naming_the_index(
    change: dict[str, Any], path: str
) -> None:
    events = _recorded()

    def changed(run: Any, input: Any) -> Any:
        asked = {"filters": {"lang": "en"}, "top_k": 2, "query": input["query"]} | change
        version = asked.pop("index_version", "2026-11-30")
        query = asked.pop("query")
        run.retrieve("kb", search, query, index_version=version, **asked)
        return None

    report = replay_run(events, changed)
    assert report.divergence is not None
    assert report.divergence.kind == DivergenceKind.ARGUMENT_MISMATCH
    assert report.divergence.expected_name == "kb"
    assert [c.path for c in report.divergence.changes] == [path]
    assert "expected retrieval kb" in report.divergence.describe()


def test_what_is_not_a_hit_is_refused_and_recorded_as_the_error() -> None:
    def broken(query: str, **_: Any) -> Any:
        return [{"score": 0.3, "text": "no id"}]

    def asks(run: Any, input: Any) -> Any:
        return run.retrieve("kb", broken, "refunds", index_version="1")

    recorder = MemoryRecorder()
    with pytest.raises(ValueError, match="has no 'id'"):
        recorder.record(asks, RunSnapshot(code_version="1"), agent_id="kb")
    retrieval = next(e for e in recorder.events if e.event_type == EventType.RETRIEVAL)
    assert retrieval.attributes["error"] == "ValueError"
    # The run replays: the code fails the same way at the same place.
    assert replay_run(recorder.events, asks).passed


def test_the_query_is_redacted_before_it_is_recorded() -> None:
    events = _recorded({"query": "refund for ann@example.com"})
    retrieval = next(e for e in events if e.event_type == EventType.RETRIEVAL)
    body = PayloadPipeline().unpack(retrieval)
    assert "ann@example.com" not in body["query_json"]
    assert replay_run(events, agent).passed


def test_an_async_search_records_and_replays() -> None:
    async def asearch(query: str, *, filters: Any = None, top_k: int | None = None) -> Any:
        await asyncio.sleep(0)
        return DOCS[query]

    async def async_agent(run: Any, input: Any) -> Any:
        hits = await run.retrieve("kb", asearch, input, index_version="7")
        return [h["id"] for h in hits]

    recorder = AsyncMemoryRecorder()
    _, output = asyncio.run(
        recorder.record(async_agent, RunSnapshot(code_version="1", input="refunds"), agent_id="a")
    )
    assert output == ["kb-12", "kb-40"]
    assert replay_run(recorder.events, async_agent).passed
