"""The peers' capture bench (``python -m bench.capture --peers``): its conversation, a
worker's timing of it against the local server, and the figures it derives, so that it
cannot rot unnoticed (its figures are not checked here: timings belong to the bench)."""

from __future__ import annotations

import json
import threading
from multiprocessing import Pipe

import openai
import pytest

from bench import _capture_peers as peers
from bench._fake_llm import FakeLLM

pytestmark = [pytest.mark.timeout(120)]


def test_the_conversation_grows_from_a_few_kilobytes_to_about_59() -> None:
    sizes = [len(json.dumps(request)) for request in peers.requests(0)]
    assert len(sizes) == peers.TURNS
    assert sizes == sorted(sizes)
    assert 2_000 < sizes[0] < 5_000
    assert 50_000 < sizes[-1] < 66_000


def test_a_raw_worker_times_each_call_of_a_conversation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peers, "TURNS", 3)
    with FakeLLM() as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="bench", max_retries=0)
        got = peers.converse(client, peers._client("raw", server.base_url, None)[1], seed=1)
    assert [c.turn for c in got.calls] == [1, 2, 3]
    assert all(c.wall_ms > 0 and c.cpu_ms >= 0 for c in got.calls)
    assert got.process_cpu_ms > 0


def test_workers_hold_a_conversation_in_lockstep(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each turn goes to every worker before the next turn goes to any; a worker's
    calls come back as one conversation per round, the warm-up round left out."""
    monkeypatch.setattr(peers, "TURNS", 3)
    with FakeLLM() as server:
        workers, threads = [], []
        for name in ("raw", "other"):
            mine, theirs = Pipe()
            thread = threading.Thread(
                target=peers.worker, args=("raw", server.base_url, None, theirs)
            )
            thread.start()
            assert mine.recv() == "ready"
            workers.append(peers.Worker(name, None, mine, []))  # type: ignore[arg-type]
            threads.append(thread)
        try:
            peers.measure(workers, 2)
        finally:
            for w in workers:
                w.conn.send(None)
            for thread in threads:
                thread.join(timeout=30)
    for w in workers:
        assert [[c.turn for c in conv.calls] for conv in w.conversations] == [[1, 2, 3]] * 2
        assert all(conv.process_cpu_ms > 0 for conv in w.conversations)
    assert not any(thread.is_alive() for thread in threads)


def test_the_added_p50_pairs_each_call_with_the_raw_call_of_its_turn() -> None:
    """The CPU's speed moves from one second to the next: a slow moment that slows both
    calls of a turn adds nothing, where a difference of the two p50s would bill it."""

    def worker(name: str, walls: list[float]) -> peers.Worker:
        calls = [peers.Call(turn, wall, 1.0) for turn, wall in enumerate(walls, start=1)]
        return peers.Worker(name, None, None, [peers.Conversation(calls, 1.0)])  # type: ignore[arg-type]

    raw = worker("raw", [10.0, 30.0, 12.0])
    durable = worker("durable", [11.0, 31.0, 40.0])
    assert durable.added_p50(raw, range(1, 4)) == pytest.approx(1.0)
    assert durable.p50(range(1, 4)) - raw.p50(range(1, 4)) == pytest.approx(19.0)


def _worker(name: str, wall: float, cpu: float, process: float) -> peers.Worker:
    calls = [peers.Call(turn, wall, cpu) for turn in range(1, peers.TURNS + 1)]
    conversation = peers.Conversation(calls, process * len(calls))
    return peers.Worker(name, None, None, [conversation])  # type: ignore[arg-type]


def test_the_figures_are_each_variant_over_the_raw_sdk(capsys: pytest.CaptureFixture[str]) -> None:
    workers = {
        "raw": _worker("raw", 12.0, 2.0, 2.5),
        "durable": _worker("durable", 13.0, 3.0, 3.0),
        "langfuse": _worker("langfuse", 12.5, 2.5, 4.5),
    }
    figures = peers.report(workers, {})
    assert figures["durable"]["added_p50_ms"] == pytest.approx(1.0)
    assert figures["langfuse"]["added_all_in_cpu_ms_per_call"] == pytest.approx(2.0)
    peers.verdict(figures, {})
    lines = {
        json.loads(ln)["figure"]: json.loads(ln) for ln in capsys.readouterr().out.splitlines()
    }
    assert lines["durable_over_langfuse_p50_ms"]["value"] == pytest.approx(0.5)
    assert lines["durable_over_langfuse_p50_ms"]["met"] is True
    assert lines["durable_cpu_over_langfuse_all_in_ms"]["value"] == pytest.approx(-1.0)
    assert lines["durable_size_gap_ms"]["met"] is True
