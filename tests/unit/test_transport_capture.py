"""Recording at the HTTP transport, without services: the real OpenAI and Anthropic SDKs
against local servers on loopback, recorded with a MemoryRecorder and replayed with no
request sent.

What a user of the SDKs would expect of a capture: every API of the SDK (chat,
Responses, embeddings, completions, Messages, ``beta.messages``, token counts, raw and
streaming responses) records one ``llm.call`` with the JSON body as sent; a captured
client is a real client; one process-wide client serves concurrent runs, each
recording its own calls; a stream reaches the agent as it arrives; an SDK retry is a
call of its own; a legacy ``httpx`` client records too; and replay hands the SDK the
recorded HTTP answers, so it builds the same objects, raises the same errors, and
refuses a changed request with a 400 that names the divergence.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest

import agent_blackbox as bb
from agent_blackbox.outbox import (
    AsyncMemoryRecorder,
    MemoryRecorder,
    RunSnapshot,
    UnrecordedCallWarning,
)
from agent_blackbox.outbox.integrations import recording_client
from agent_blackbox.replayer import (
    DivergenceKind,
    ExportTally,
    ReplayReport,
    chat_examples,
    reexecute,
    replay_run,
)
from agent_blackbox.replayer._reexecute import anthropic_sender, openai_sender
from agent_blackbox.schemas import Envelope, PayloadPipeline
from tests.integration._anthropic_server import REQUEST_ID as ANTHROPIC_REQUEST_ID
from tests.integration._fork_agents import WEATHER_TOOL
from tests.integration._llm_server import refused_url
from tests.integration._openai_server import REQUEST_ID
from tests.integration.frameworks._harness import instrumented
from tests.unit._api_servers import ApiAnthropicServer, ApiServer

pytestmark = pytest.mark.timeout(60)

KEY = "sk-test-transport-5d1f0a"
Agent = Callable[[Any, list[Any]], Any]
"""``agent(client, seen)``: calls the model through ``client``, keeps what it was handed."""


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


# Fixtures and helpers -------------------------------------------------------------------


@pytest.fixture
def server() -> Iterator[ApiServer]:
    running = ApiServer().start()
    try:
        yield running
    finally:
        running.release.set()  # a held stream the test left open
        running.stop()


@pytest.fixture
def claude() -> Iterator[ApiAnthropicServer]:
    with ApiAnthropicServer() as running:
        yield running


def openai_client(base_url: str, **options: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, **{"api_key": KEY, "max_retries": 0, **options})


@pytest.fixture
def offline() -> Iterator[openai.OpenAI]:
    """The client a replay builds: no key, an address where nothing listens."""
    with openai_client(refused_url("/v1"), api_key="unused") as client:
        yield client


def record(agent: Agent, client: Any) -> tuple[list[Envelope], list[Any]]:
    """One run of ``agent`` through ``client`` (captured for the run in force)."""
    recorder, seen = MemoryRecorder(), []
    recorder.record(lambda _run, _input: agent(client, seen), RunSnapshot("t"), agent_id="a")
    return recorder.events, seen


def replay(agent: Agent, events: list[Envelope], client: Any) -> tuple[ReplayReport, list[Any]]:
    seen: list[Any] = []
    return replay_run(events, lambda _run, _input: agent(client, seen)), seen


def assert_replays(agent: Agent, events: list[Envelope], client: Any, seen: list[Any]) -> None:
    report, again = replay(agent, events, client)
    assert report.passed, report.divergence and report.divergence.describe()
    assert again == seen


def bodies(events: list[Envelope]) -> list[dict[str, Any]]:
    pipeline = PayloadPipeline()
    return [pipeline.unpack(e) for e in events if e.event_type == "llm.call"]


def requests(events: list[Envelope]) -> list[Any]:
    return [json.loads(b["raw_request_json"]) for b in bodies(events)]


def responses(events: list[Envelope]) -> list[Any]:
    return [json.loads(b["raw_response_json"] or "null") for b in bodies(events)]


# Every API of the SDKs ------------------------------------------------------------------


def openai_apis(llm: openai.OpenAI, seen: list[Any]) -> None:
    seen.append(llm.chat.completions.create(model="gpt-test", messages=user("hi")))
    seen.append(llm.responses.create(model="gpt-test", input="hi", instructions="Be brief."))
    seen.append(llm.embeddings.create(model="embed-test", input=["a", "bb"]))
    seen.append(llm.completions.create(model="instruct-test", prompt="hi"))


def test_each_openai_api_is_one_llm_call_of_the_body_as_sent_and_replays(
    server: ApiServer, offline: openai.OpenAI
) -> None:
    events, seen = record(openai_apis, bb.capture_openai(openai_client(server.base_url)))

    assert [type(o).__name__ for o in seen] == [
        "ChatCompletion", "Response", "CreateEmbeddingResponse", "Completion",
    ]  # fmt: skip
    paths = [r.path for r in server.requests]
    assert paths == ["/v1/chat/completions", "/v1/responses", "/v1/embeddings", "/v1/completions"]
    # The body the SDK sent, its own additions too (embeddings ask for base64).
    assert requests(events) == [r.json() for r in server.requests]
    assert requests(events)[2]["encoding_format"] == "base64"
    assert responses(events) == server.sent
    calls = [e for e in events if e.event_type == "llm.call"]
    assert [(e.attributes["provider"], e.attributes["model"]) for e in calls] == [
        ("openai", "gpt-test"), ("openai", "gpt-test"), ("openai", "embed-test"),
        ("openai", "instruct-test"),
    ]  # fmt: skip

    assert_replays(openai_apis, events, bb.capture_openai(offline), seen)
    assert len(server.requests) == 4, "a replay sent a request"


def raw_agent(llm: openai.OpenAI, seen: list[Any]) -> None:
    raw = llm.chat.completions.with_raw_response.create(model="gpt-test", messages=user("hi"))
    seen.append((raw.status_code, raw.parse()))
    with llm.chat.completions.with_streaming_response.create(
        model="gpt-test", messages=user("a b"), stream=True
    ) as streamed:
        # Each event's JSON: replay writes the recorded JSON again, not its spelling (the
        # recording keeps what the events say; the bytes of the server's spacing are gone).
        seen.append([_data(line) for line in streamed.iter_lines() if line])
    with llm.responses.with_streaming_response.create(model="gpt-test", input="hi") as whole:
        seen.append(whole.parse())


def _data(line: str) -> Any:
    data = line.removeprefix("data: ")
    return data if data == "[DONE]" else json.loads(data)


def test_raw_and_streaming_responses_record_and_replay(
    server: ApiServer, offline: openai.OpenAI
) -> None:
    llm = bb.capture_openai(openai_client(server.base_url))
    raw = llm.chat.completions.with_raw_response.create(model="gpt-test", messages=user("x"))
    assert raw.headers["x-request-id"] == REQUEST_ID  # the live response, headers and all
    events, seen = record(raw_agent, llm)

    assert seen[0][0] == 200
    assert seen[1][:-1] == server.sent[2]
    assert seen[1][-1] == "[DONE]"
    assert len(bodies(events)) == 3
    assert responses(events)[1] == {"stream": server.sent[2]}
    # Headers are never recorded: a replayed raw response carries the body and its type
    # (what the SDK parses), not the request id.
    assert_replays(raw_agent, events, bb.capture_openai(offline), seen)


def test_a_captured_client_is_a_real_client_and_the_original_is_left_as_it_was(
    server: ApiServer,
) -> None:
    original = openai_client(server.base_url)
    captured = bb.capture_openai(original)
    assert type(captured) is openai.OpenAI
    assert isinstance(bb.capture_openai(openai.AsyncOpenAI(api_key=KEY)), openai.AsyncOpenAI)
    assert isinstance(bb.capture_anthropic(anthropic.Anthropic(api_key=KEY)), anthropic.Anthropic)
    with pytest.raises(TypeError, match="capture_openai takes"):
        bb.capture_openai(anthropic.Anthropic(api_key=KEY))  # type: ignore[type-var]

    recorder = MemoryRecorder()
    with recorder.start_run(RunSnapshot("t"), agent_id="a"):
        captured.with_options(timeout=5).chat.completions.create(model="m", messages=user("a"))
        with pytest.warns(UnrecordedCallWarning, match="POST /v1/chat/completions"):
            original.chat.completions.create(model="m", messages=user("b"))  # a hole
    assert [e.event_type for e in recorder.events] == ["run.started", "llm.call", "run.finished"]
    assert requests(recorder.events)[0]["messages"] == user("a")
    assert len(server.requests) == 2


@pytest.mark.parametrize(
    ("module", "name", "instead"),
    [
        ("openai", "CapturedOpenAI", "openai.OpenAI"),
        ("openai", "RecordedStream", "openai.Stream"),
        ("anthropic", "CapturedAsyncAnthropic", "anthropic.AsyncAnthropic"),
    ],
)
def test_the_names_of_the_sdk_level_capture_say_what_replaced_them(
    module: str, name: str, instead: str
) -> None:
    imported = importlib.import_module(f"agent_blackbox.outbox.integrations.{module}")
    with pytest.raises(ImportError, match=rf"{name} is gone: .*\({re.escape(instead)}\)"):
        getattr(imported, name)


def test_extra_body_is_recorded_merged_into_the_body_as_sent(server: ApiServer) -> None:
    def agent(llm: openai.OpenAI, seen: list[Any]) -> None:
        llm.chat.completions.create(
            model="gpt-test",
            messages=user("hi"),
            extra_body={"reasoning_effort": "low", "provider": {"order": ["a", "b"]}},
            extra_headers={"x-team": "blue-team-header"},
            extra_query={"deployment": "blue-team-query"},
        )

    events, _ = record(agent, bb.capture_openai(openai_client(server.base_url)))
    (sent,) = server.requests
    assert requests(events) == [sent.json()]
    assert sent.json()["provider"] == {"order": ["a", "b"]}
    assert sent.json()["reasoning_effort"] == "low"
    assert "deployment=blue-team-query" in sent.path  # the query went, and is not recorded
    stored = json.dumps(bodies(events)) + json.dumps([e.attributes for e in events])
    assert "blue-team" not in stored


def test_an_openai_compatible_server_behind_a_path_prefix_is_recorded() -> None:
    gateway = ApiServer(prefix="/team-a/llm").start()
    try:
        assert gateway.base_url.endswith("/team-a/llm/v1")
        llm = bb.capture_openai(openai_client(gateway.base_url))
        events, seen = record(openai_apis, llm)
        paths = [r.path for r in gateway.requests]
    finally:
        gateway.stop()
    assert all(p.startswith("/team-a/llm/v1/") for p in paths)
    assert [b["provider"] for b in bodies(events)] == ["openai"] * 4
    assert seen[0].choices[0].message.content == "echo: hi"


def anthropic_apis(llm: anthropic.Anthropic, seen: list[Any]) -> None:
    seen.append(llm.messages.create(model="claude-test", max_tokens=8, messages=user("hi")))
    seen.append(
        llm.beta.messages.create(
            model="claude-test", max_tokens=8, messages=user("beta"), betas=["beta-test-1"]
        )
    )
    seen.append(llm.messages.count_tokens(model="claude-test", messages=user("a b c")))
    seen.append(llm.beta.messages.count_tokens(model="claude-test", messages=user("a b")))
    with llm.beta.messages.stream(model="claude-test", max_tokens=8, messages=user("s")) as s:
        seen.append(s.get_final_message())


def test_each_anthropic_api_is_one_llm_call_and_replays(
    claude: ApiAnthropicServer, offline: openai.OpenAI
) -> None:
    sdk = anthropic.Anthropic(base_url=claude.base_url, api_key=KEY, max_retries=0)
    events, seen = record(anthropic_apis, bb.capture_anthropic(sdk))

    assert [r.path.split("?")[0] for r in claude.requests] == [
        "/v1/messages", "/v1/messages", "/v1/messages/count_tokens",
        "/v1/messages/count_tokens", "/v1/messages",
    ]  # fmt: skip
    assert claude.requests[1].headers["anthropic-beta"] == "beta-test-1"
    assert requests(events) == [r.json() for r in claude.requests]  # the beta flag: a header
    assert [b["provider"] for b in bodies(events)] == ["anthropic"] * 5
    assert [o.input_tokens for o in seen[2:4]] == [r["input_tokens"] for r in claude.sent[2:4]]
    assert seen[4].content[0].text == "echo: s"
    assert seen[0]._request_id == ANTHROPIC_REQUEST_ID

    dead = anthropic.Anthropic(base_url=refused_url(), api_key="unused", max_retries=0)
    assert_replays(anthropic_apis, events, bb.capture_anthropic(dead), seen)
    assert len(claude.requests) == 5


# One client, several runs at once ---------------------------------------------------------


@contextlib.contextmanager
def wired(wiring: str, client: Any) -> Iterator[Any]:
    """``client`` as the agent uses it: captured once for every run, or left as it is
    with every client of the process instrumented."""
    if wiring == "captured":
        yield bb.capture_openai(client)
        return
    with instrumented():
        yield client


def calls_by_run(events: list[Envelope]) -> dict[str, list[str]]:
    """The question of each llm.call, by run."""
    found: dict[str, list[str]] = {}
    pipeline = PayloadPipeline()
    for envelope in events:
        if envelope.event_type == "llm.call":
            request = json.loads(pipeline.unpack(envelope)["raw_request_json"])
            found.setdefault(envelope.run_id, []).append(request["messages"][0]["content"])
    return found


@pytest.mark.parametrize("wiring", ["captured", "instrumented"])
def test_two_runs_in_threads_through_one_client_record_only_their_own_calls(
    server: ApiServer, wiring: str
) -> None:
    recorder = MemoryRecorder()
    both = threading.Barrier(2, timeout=10)
    run_ids: dict[str, str] = {}
    with wired(wiring, openai_client(server.base_url)) as llm:

        def entry(run: Any, given: Any) -> list[str | None]:
            answers = []
            for turn in range(3):
                both.wait()  # each call is made while the other run is in flight
                reply = llm.chat.completions.create(
                    model="gpt-test", messages=user(f"{given['who']} {turn}")
                )
                answers.append(reply.choices[0].message.content)
            return answers

        def one(who: str) -> None:
            run, _ = recorder.record(entry, RunSnapshot("t", {"who": who}), agent_id=who)
            run_ids[who] = run.run_id

        workers = [threading.Thread(target=one, args=(who,)) for who in ("ann", "bob")]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(timeout=30)
    recorded = calls_by_run(recorder.events)
    assert {who: recorded[run_ids[who]] for who in run_ids} == {
        who: [f"{who} {turn}" for turn in range(3)] for who in ("ann", "bob")
    }
    assert len(server.requests) == 6


@pytest.mark.parametrize("wiring", ["captured", "instrumented"])
def test_two_runs_as_asyncio_tasks_through_one_client_record_only_their_own_calls(
    server: ApiServer, wiring: str
) -> None:
    async def both_runs() -> tuple[list[Envelope], dict[str, str]]:
        recorder = AsyncMemoryRecorder()
        both = asyncio.Barrier(2)
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key=KEY) as client:
            with wired(wiring, client) as llm:

                async def entry(run: Any, given: Any) -> int:
                    for turn in range(3):
                        await asyncio.wait_for(both.wait(), timeout=10)
                        await llm.chat.completions.create(
                            model="gpt-test", messages=user(f"{given['who']} {turn}")
                        )
                    return 3

                async def one(who: str) -> tuple[str, str]:
                    snapshot = RunSnapshot("t", {"who": who})
                    run, _ = await recorder.record(entry, snapshot, agent_id=who)
                    return who, run.run_id

                run_ids = dict(await asyncio.gather(one("ann"), one("bob")))
        return recorder.events, run_ids

    events, run_ids = asyncio.run(both_runs())
    recorded = calls_by_run(events)
    assert {who: recorded[run_ids[who]] for who in run_ids} == {
        who: [f"{who} {turn}" for turn in range(3)] for who in ("ann", "bob")
    }


def test_a_sync_client_in_an_async_run_records_from_a_thread_and_is_refused_on_the_loop(
    server: ApiServer,
) -> None:
    """Through ``http_client=``: a thread (a framework's executor) records through the
    run's loop; on the loop itself recording would block it, so the call is refused, in
    replay as when recorded, and the agent's handling of it replays."""
    llm = openai_client(server.base_url, http_client=bb.http_client())

    def ask(text: str) -> str | None:
        return (
            llm.chat.completions.create(model="m", messages=user(text)).choices[0].message.content
        )

    async def entry(run: Any, _input: Any) -> list[Any]:
        found: list[Any] = [await asyncio.to_thread(ask, "from a thread")]
        try:
            ask("on the loop")
        except openai.BadRequestError as exc:
            found.append(exc.code)
        return found

    async def main() -> tuple[list[Envelope], Any]:
        recorder = AsyncMemoryRecorder()
        _, output = await recorder.record(entry, RunSnapshot("t"), agent_id="a")
        return recorder.events, output

    events, output = asyncio.run(main())
    assert output == ["echo: from a thread", "SyncClientOnLoop"]
    assert requests(events) == [{"messages": user("from a thread"), "model": "m"}]
    assert len(server.requests) == 1
    report = replay_run(events, entry)
    assert report.passed, report.divergence and report.divergence.describe()


# Streams pass through ---------------------------------------------------------------------


def chunk_text(chunks: list[Any]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_a_stream_reaches_the_agent_as_it_arrives_and_is_recorded_when_it_ends(
    server: ApiServer, offline: openai.OpenAI
) -> None:
    llm = bb.capture_openai(openai_client(server.base_url))
    recorder = MemoryRecorder()
    first = threading.Event()
    recorded_at_first: list[int] = []

    def entry(run: Any, _input: Any) -> str:
        stream = llm.chat.completions.create(model="held", messages=user("a b c"), stream=True)
        chunks = [next(stream)]  # the server holds the rest back until the test says so
        recorded_at_first.append(len(recorder.events))
        first.set()
        chunks += list(stream)
        return chunk_text(chunks)

    outputs: list[Any] = []
    worker = threading.Thread(
        target=lambda: outputs.append(recorder.record(entry, RunSnapshot("t"), agent_id="a")[1])
    )
    worker.start()
    try:
        assert first.wait(timeout=10), "the first chunk did not reach the agent before the rest"
        # The server marks itself holding just after the first chunk went out.
        assert server.holding.wait(timeout=10)
        assert not server.release.is_set()
    finally:
        server.release.set()
    worker.join(timeout=10)
    assert outputs == ["echo: a b c"]
    assert recorded_at_first == [1]  # run.started only: the call was still streaming
    assert responses(recorder.events) == [{"stream": server.sent[0]}]

    report = replay_run(recorder.events, entry_replayed(offline))
    assert report.passed, report.divergence and report.divergence.describe()


def entry_replayed(client: openai.OpenAI) -> Callable[[Any, Any], str]:
    """The agent of the held-stream test as replay drives it (nothing is held there)."""
    llm = bb.capture_openai(client)

    def entry(run: Any, _input: Any) -> str:
        stream = llm.chat.completions.create(model="held", messages=user("a b c"), stream=True)
        return chunk_text(list(stream))

    return entry


def early_close(llm: openai.OpenAI, seen: list[Any]) -> None:
    stream = llm.chat.completions.create(model="held", messages=user("a b c"), stream=True)
    seen.append(next(stream))
    stream.close()  # the agent has what it needs


def test_a_stream_closed_early_records_what_was_read(
    server: ApiServer, offline: openai.OpenAI
) -> None:
    events, seen = record(early_close, bb.capture_openai(openai_client(server.base_url)))
    assert responses(events) == [{"stream": server.sent[0][:1]}]  # the event read, only
    assert_replays(early_close, events, bb.capture_openai(offline), seen)


def test_an_async_stream_reaches_the_agent_as_it_arrives(server: ApiServer) -> None:
    async def main() -> tuple[list[Envelope], str]:
        recorder = AsyncMemoryRecorder()
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key=KEY) as client:
            llm = bb.capture_openai(client)
            first = asyncio.Event()

            async def entry(run: Any, _input: Any) -> str:
                stream = await llm.chat.completions.create(
                    model="held", messages=user("x y"), stream=True
                )
                chunks = [await stream.__anext__()]
                first.set()
                chunks += [chunk async for chunk in stream]
                return chunk_text(chunks)

            task = asyncio.create_task(recorder.record(entry, RunSnapshot("t"), agent_id="a"))
            try:
                await asyncio.wait_for(first.wait(), timeout=10)
                assert len(recorder.events) == 1  # still streaming: not recorded yet
            finally:
                server.release.set()
            _, output = await asyncio.wait_for(task, timeout=10)
        return recorder.events, output

    events, output = asyncio.run(main())
    assert output == "echo: x y"
    assert responses(events) == [{"stream": server.sent[0]}]


class SlowAsyncRecorder(AsyncMemoryRecorder):
    """An async recorder whose appends take as long as a busy database's can (a fifth of
    a second): latency, not synchronisation."""

    async def append(self, core: Any, crossing: Any, event_id: str, connection: Any) -> Envelope:
        await asyncio.sleep(0.2)
        return await super().append(core, crossing, event_id, connection)


def test_a_stream_is_recorded_also_when_the_sdk_drains_it_under_a_deadline(
    server: ApiServer,
) -> None:
    """The async SDK drains the rest of a finished stream under a 0.1 s deadline; the
    call, recorded when the stream ends, must not be cancelled with the draining."""

    async def main() -> tuple[list[Envelope], list[str]]:
        recorder = SlowAsyncRecorder()
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key=KEY) as client:
            llm = bb.capture_openai(client)

            async def entry(run: Any, _input: Any) -> list[str]:
                answers = []
                for question in ("a b", "c d"):
                    stream = await llm.chat.completions.create(
                        model="m", messages=user(question), stream=True
                    )
                    answers.append(chunk_text([chunk async for chunk in stream]))
                    await run.call("note", lambda text: text, answers[-1])
                return answers

            _, output = await recorder.record(entry, RunSnapshot("t"), agent_id="a")
        return recorder.events, output

    events, output = asyncio.run(main())
    assert output == ["echo: a b", "echo: c d"]
    assert [e.event_type for e in events] == [
        "run.started", "llm.call", "tool.call", "llm.call", "tool.call", "run.finished",
    ]  # fmt: skip


# Retries and transport errors -------------------------------------------------------------


class _SleepSpy:
    """Stands in for the ``time`` module of the SDK's client: keeps every wait between
    retries (and waits it)."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        time.sleep(seconds)

    @staticmethod
    def time() -> float:
        return time.time()


def flaky(llm: openai.OpenAI, seen: list[Any]) -> None:
    seen.append(llm.chat.completions.create(model="flaky", messages=user("hi")))


def test_each_retry_of_the_sdk_is_an_llm_call_and_replay_does_not_wait_again(
    server: ApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = _SleepSpy()
    monkeypatch.setattr(openai._base_client, "time", spy)
    events, seen = record(flaky, bb.capture_openai(openai_client(server.base_url, max_retries=2)))

    assert seen[0].choices[0].message.content == "echo: hi"
    assert [(b["error"] or {}).get("type") for b in bodies(events)] == ["RateLimitError", None]
    assert requests(events) == [r.json() for r in server.requests]  # the same request twice
    assert spy.waits == [1.0]  # the server's retry-after, waited when recorded

    spy.waits.clear()
    dead = openai_client(refused_url("/v1"), max_retries=2)
    assert_replays(flaky, events, bb.capture_openai(dead), seen)
    assert len(spy.waits) == 1
    assert spy.waits[0] < 0.01
    assert len(server.requests) == 2


def unreachable(llm: openai.OpenAI, seen: list[Any]) -> None:
    try:
        llm.chat.completions.create(model="gpt-test", messages=user("hi"))
    except openai.APIConnectionError as exc:
        seen.append((type(exc), type(exc.__cause__)))


def test_a_refused_connection_is_recorded_per_attempt_and_raised_again() -> None:
    llm = bb.capture_openai(openai_client(refused_url("/v1"), max_retries=1))
    events, seen = record(unreachable, llm)
    assert seen == [(openai.APIConnectionError, httpx2.ConnectError)]
    # The transport's own error, once per attempt of the SDK.
    assert [b["error"]["type"] for b in bodies(events)] == ["ConnectError", "ConnectError"]
    assert_replays(unreachable, events, llm, seen)
    # Re-executed against an endpoint as unreachable, it fails the same way (the SDK
    # raises APIConnectionError from the transport's ConnectError).
    diffs = reexecute(events, openai_sender(refused_url("/v1"), KEY))
    assert [d.same for d in diffs] == [True, True]
    assert diffs[0].uncompared["text"] == (
        "the call failed with ConnectError when recorded, and again now"
    )


def test_a_changed_request_is_answered_with_a_400_naming_the_divergence(
    server: ApiServer,
) -> None:
    llm = bb.capture_openai(openai_client(server.base_url, max_retries=2))

    def asks(client: openai.OpenAI, seen: list[Any]) -> None:
        seen.append(client.chat.completions.create(model="m", messages=user("hi")).id)

    events, _ = record(asks, llm)
    refused: list[openai.BadRequestError] = []

    def changed(run: Any, _input: Any) -> str:
        try:
            llm.chat.completions.create(model="m", messages=user("bye"))  # the changed line
        except openai.BadRequestError as exc:  # caught: the replay diverged all the same
            refused.append(exc)
        return "handled"

    report = replay_run(events, changed)
    (error,) = refused
    assert error.code == "ReplayDivergence"
    assert "argument_mismatch" in error.message
    assert error.response.headers["x-should-retry"] == "false"  # not sent again
    assert report.divergence is not None
    assert report.divergence.kind == DivergenceKind.ARGUMENT_MISMATCH
    site = report.divergence.call_site
    assert site is not None
    assert (site.function, site.file) == ("changed", __file__)
    assert len(server.requests) == 1


# Legacy httpx clients ---------------------------------------------------------------------


@pytest.mark.parametrize("wiring", ["recording_client", "instrumented"])
def test_a_legacy_httpx_client_records_and_replays(server: ApiServer, wiring: str) -> None:
    body = {"model": "gpt-test", "messages": user("legacy")}

    def agent(client: httpx.Client, seen: list[Any]) -> None:
        seen.append(client.post("/chat/completions", json=body).json())

    with (
        httpx.Client(base_url=server.base_url) as plain,
        instrumented() if wiring == "instrumented" else contextlib.nullcontext(),
    ):
        client = recording_client(plain) if wiring == "recording_client" else plain
        events, seen = record(agent, client)
        assert requests(events) == [body]
        assert responses(events) == server.sent
        assert_replays(agent, events, client, seen)
    assert len(server.requests) == 1


def test_a_legacy_async_httpx_client_records(server: ApiServer) -> None:
    async def main() -> list[Envelope]:
        recorder = AsyncMemoryRecorder()
        async with httpx.AsyncClient(base_url=server.base_url) as plain:
            client = recording_client(plain)

            async def entry(run: Any, _input: Any) -> Any:
                reply = await client.post("/responses", json={"model": "m", "input": "hi"})
                return reply.json()["output"][0]["content"][0]["text"]

            _, output = await recorder.record(entry, RunSnapshot("t"), agent_id="a")
        assert output == "echo: hi"
        return recorder.events

    assert responses(asyncio.run(main())) == server.sent


# What the replayer reads of the recorded bodies -----------------------------------------


def every_reply(llm: openai.OpenAI, claude: anthropic.Anthropic, seen: list[Any]) -> None:
    asked = llm.chat.completions.create(
        model="gpt-test", messages=user("weather?"), tools=[WEATHER_TOOL]
    )
    call = (asked.choices[0].message.tool_calls or [])[0]
    result = {"role": "tool", "tool_call_id": call.id, "content": "sunny"}
    stream = llm.chat.completions.create(
        model="gpt-test", messages=[*user("weather?"), asked.choices[0].message, result],
        stream=True,
    )  # fmt: skip
    seen.append(chunk_text(list(stream)))
    seen.append(llm.responses.create(model="gpt-test", input="hi").output_text)
    seen.append(len(llm.embeddings.create(model="embed-test", input="hi").data))
    with claude.messages.stream(model="claude-test", max_tokens=8, messages=user("x")) as s:
        seen.append(s.get_final_text())
    seen.append(claude.messages.count_tokens(model="claude-test", messages=user("x")).input_tokens)


def test_export_and_reexecute_read_the_bodies_the_transport_records(
    server: ApiServer, claude: ApiAnthropicServer
) -> None:
    sdk = anthropic.Anthropic(base_url=claude.base_url, api_key=KEY, max_retries=0)
    llm, messages = bb.capture_openai(openai_client(server.base_url)), bb.capture_anthropic(sdk)
    events, seen = record(lambda client, found: every_reply(client, messages, found), llm)
    assert seen == ["answer: sunny", "echo: hi", 1, "echo: x", claude.sent[-1]["input_tokens"]]

    tally = ExportTally()
    examples = list(chat_examples(events, PayloadPipeline(), tally=tally, per_call=True))
    assert [e["metadata"]["api"] for e in examples] == [
        "chat.completions", "chat.completions", "responses", "anthropic.messages",
    ]  # fmt: skip
    assert examples[1]["messages"][-1] == {"role": "assistant", "content": "answer: sunny"}
    assert tally.skipped["not a chat"] == 2  # the embeddings and the token count
    assert all("has no reply" in problem for problem in tally.problems)

    sent = len(server.requests), len(claude.requests)
    endpoints = {
        "openai": openai_sender(server.base_url, KEY),
        "anthropic": anthropic_sender(claude.base_url, KEY),
    }
    diffs = reexecute(events, endpoints)
    assert [d.same for d in diffs] == [True] * 6
    assert [bool(d.uncompared) for d in diffs] == [False, True, False, True, False, True]
    assert "not re-sent" in diffs[3].uncompared["text"]  # the embeddings
    assert "not re-sent" in diffs[5].uncompared["text"]  # the token count
    # Each reply was re-sent once, as recorded; the embeddings and the count were not.
    assert len(server.requests) - sent[0] == 3
    assert len(claude.requests) - sent[1] == 1
    assert [r.path for r in server.requests[sent[0] :]] == [
        "/v1/chat/completions", "/v1/chat/completions", "/v1/responses",
    ]  # fmt: skip
