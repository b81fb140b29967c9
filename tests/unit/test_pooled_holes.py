"""A request over a connection the HTTP client keeps open is a hole too.

The socket watch sees connections; a client that is not recorded connects once and sends
every later request (the next run's, a replay's in the same process) over the same
connection. These tests hold one keep-alive ``httpx2`` client across runs, as LangChain's
chat models do, against a loopback server that counts what it receives.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest

import agent_blackbox as bb
from agent_blackbox.outbox import MemoryRecorder, RunSnapshot, UnrecordedCallWarning
from agent_blackbox.replayer import DivergenceKind, replay_run
from tests.integration._llm_server import LoopbackServer, QuietHandler

CHAT = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "hi"},
            "finish_reason": "stop",
        }
    ],
}


class _Server(LoopbackServer):
    """A keep-alive HTTP/1.1 server on the loopback that answers every POST with a chat
    completion and counts the requests and the connections it got."""

    def __init__(self) -> None:
        self.requests = 0
        self.connections = 0
        server = self

        class Handler(QuietHandler):
            timeout = 10

            def setup(self) -> None:
                super().setup()
                server.connections += 1

            def do_POST(self) -> None:
                self.read_body()
                server.requests += 1
                self.send_json(200, CHAT)

        super().__init__(Handler)

    @property
    def url(self) -> str:
        return f"{self.address}/v1/chat/completions"


@pytest.fixture
def server() -> Iterator[_Server]:
    with _Server() as running:
        yield running


def _asks(client: httpx2.Client, url: str) -> Any:
    def entry(run: Any, question: str) -> str:
        body = {"model": "m", "messages": [{"role": "user", "content": question}]}
        answer = client.post(url, json=body).json()
        return str(answer["choices"][0]["message"]["content"])

    return entry


def _record(recorder: MemoryRecorder, entry: Any, question: str) -> dict[str, str]:
    snapshot = RunSnapshot(code_version="pooled/1", input=question)
    recorder.record(entry, snapshot, agent_id="pooled")
    return dict(recorder.events[-1].attributes)


def test_every_run_reports_its_requests_over_a_kept_connection(server: _Server) -> None:
    with httpx2.Client() as client:
        entry = _asks(client, server.url)
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            finished = [_record(MemoryRecorder(), entry, q) for q in ("a", "b", "c")]
    assert server.connections == 1  # the second and third runs opened no connection
    assert [f.get("unrecorded_calls") for f in finished] == ["1", "1", "1"]
    described = [f["unrecorded_call"] for f in finished]
    assert all(d.startswith("POST /v1/chat/completions to 127.0.0.1:") for d in described)
    assert any(issubclass(w.category, UnrecordedCallWarning) for w in warned)


def test_a_replay_in_the_same_process_does_not_go_online(server: _Server) -> None:
    with httpx2.Client() as client:
        entry = _asks(client, server.url)
        recorder = MemoryRecorder()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UnrecordedCallWarning)
            _record(recorder, entry, "a")
        before = server.requests
        report = replay_run(recorder.events, entry)
    assert server.requests == before
    assert report.divergence is not None
    assert report.divergence.kind is DivergenceKind.UNRECORDED_CALL
    assert report.divergence.call_site is not None
    assert report.divergence.call_site.file == __file__


def test_what_a_recording_client_sends_is_recorded_and_no_hole(server: _Server) -> None:
    with bb.http_client() as client:
        entry = _asks(client, server.url)
        recorders = [MemoryRecorder(), MemoryRecorder()]
        finished = [_record(r, entry, q) for r, q in zip(recorders, "ab", strict=True)]
        report = replay_run(recorders[1].events, entry)
    assert [f.get("unrecorded_calls") for f in finished] == [None, None]
    assert [[e.event_type for e in r.events].count("llm.call") for r in recorders] == [1, 1]
    assert (server.requests, server.connections) == (2, 1)
    assert report.passed, report.divergence and report.divergence.describe()
