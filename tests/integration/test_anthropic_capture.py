"""The official anthropic SDK, captured: recorded over real HTTP on loopback into the
real outbox, published to the real Kafka topic, replayed from Kafka with no request at
all, and re-executed against the endpoint.

The tests run the real SDK (sync and async clients; ``messages.create`` plain, with
tools and streamed; ``messages.stream``) against the local Anthropic-compatible server
of ``_anthropic_server``. ``capture_anthropic`` gives back a real ``anthropic.Anthropic``
whose HTTP transport records: a stream is the SDK's own, read as it arrives, and is
recorded as the server sent it (its ``ping`` events included).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator, Mapping
from http import HTTPStatus
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from anthropic.lib.streaming import MessageStream
from anthropic.types import Message, RawMessageStreamEvent
from click.testing import CliRunner
from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import create_async_engine

from agent_blackbox.cli import main
from agent_blackbox.consumers import ViewRunIndex
from agent_blackbox.outbox import (
    AgentRun,
    AsyncRecorder,
    MemoryRecorder,
    RecordedError,
    Recorder,
    RunSnapshot,
)
from agent_blackbox.outbox.integrations.anthropic import capture_anthropic
from agent_blackbox.outbox.integrations.openai import capture_openai
from agent_blackbox.outbox.relay import Relay
from agent_blackbox.outbox.storage import PostgresBlobs
from agent_blackbox.replayer import KafkaRunSource, ReplayRun, replay_run, write_archive
from agent_blackbox.replayer._reexecute import anthropic_sender, endpoints_for, reexecute
from agent_blackbox.schemas import Envelope, PayloadPipeline, Settings, llm_reply
from tests.integration import _anthropic_server
from tests.integration._anthropic_server import PREFACE, REQUEST_ID, AnthropicServer, Reply
from tests.integration._llm_server import refused_url
from tests.integration._openai_server import OpenAIServer
from tests.integration._views import build_views

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

API_KEY = "sk-ant-api03-test-5e1b7c9d2f4a6b8c0d1e3f5a7b9c1d3e"
MODEL = "claude-test"
INPUT = {"question": "hi there"}
TOOL = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
USAGE = {"input_tokens": 23, "output_tokens": 5, "cached_tokens": 8, "total_tokens": 28}

SyncAgent = Callable[[anthropic.Anthropic, list[Any]], Any]
AsyncAgent = Callable[[anthropic.AsyncAnthropic, list[Any]], Awaitable[Any]]


# Fixtures ---------------------------------------------------------------------------


@pytest.fixture
def server() -> Iterator[AnthropicServer]:
    with AnthropicServer() as running:
        yield running


@pytest.fixture
def closed_url() -> str:
    """A loopback URL where nothing listens: any request to it is refused."""
    return refused_url()


@pytest.fixture
def client(server: AnthropicServer) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=server.base_url, api_key=API_KEY, max_retries=0) as sdk:
        yield sdk


@pytest.fixture
def offline(closed_url: str) -> Iterator[anthropic.Anthropic]:
    """The client a replay gets: no real key, and a base URL that refuses connections."""
    with anthropic.Anthropic(base_url=closed_url, api_key="unused", max_retries=0) as sdk:
        yield sdk


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


# Agents -----------------------------------------------------------------------------


def sync_agent(llm: anthropic.Anthropic, seen: list[Any]) -> Any:
    """Every way an agent calls the Messages API, once each."""
    plain = llm.messages.create(
        model=MODEL,
        max_tokens=64,
        system="Be brief.",
        stop_sequences=["END"],
        messages=user("hi there"),
    )
    seen.append(plain)

    events = list(
        llm.messages.create(model=MODEL, max_tokens=64, messages=user("a b c"), stream=True)
    )
    seen.append(events)

    # A tool loop: the SDK's own content blocks go back into the next request.
    messages: list[Any] = user("weather in city=Oslo")
    first = llm.messages.create(model=MODEL, max_tokens=64, messages=messages, tools=[TOOL])
    seen.append(first)
    use = next(block for block in first.content if block.type == "tool_use")
    result = {"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}
    messages += [
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": [result]},
    ]
    seen.append(llm.messages.create(model=MODEL, max_tokens=64, messages=messages, tools=[TOOL]))

    with llm.messages.stream(model=MODEL, max_tokens=64, messages=user("x"), tools=[TOOL]) as s:
        seen.append(list(s))
        final = s.get_final_message()
        seen.append(final)
    with llm.messages.stream(model=MODEL, max_tokens=64, messages=user("streamed words")) as s:
        seen.append(list(s.text_stream))
        seen.append(s.get_final_text())
        s.until_done()
    try:
        llm.messages.create(model="fail-400", max_tokens=8, messages=user("x"))
    except anthropic.BadRequestError as exc:
        seen.append((type(exc), exc.status_code, exc.message, exc.body, exc.response.json()))
    return {"text": plain.content[0].text, "tool": use.input, "streamed": final.stop_reason}


async def async_agent(llm: anthropic.AsyncAnthropic, seen: list[Any]) -> Any:
    plain = await llm.messages.create(model=MODEL, max_tokens=64, messages=user("hi there"))
    seen.append(plain)
    stream = await llm.messages.create(
        model=MODEL, max_tokens=64, messages=user("a b"), stream=True
    )
    async with stream:
        seen.append([event async for event in stream])
    async with llm.messages.stream(
        model=MODEL, max_tokens=64, messages=user("x"), tools=[TOOL]
    ) as s:
        seen.append([event async for event in s])
        seen.append(await s.get_final_message())
    async with llm.messages.stream(model=MODEL, max_tokens=64, messages=user("one two")) as s:
        seen.append([text async for text in s.text_stream])
        seen.append(await s.get_final_text())
    try:
        await llm.messages.create(model="fail-429", max_tokens=8, messages=user("x"))
    except anthropic.RateLimitError as exc:
        seen.append((type(exc), exc.status_code, exc.body))
    return plain.content[0].text


# Recording on the real stack ----------------------------------------------------------


def publish(settings: Settings, engine: Engine, run_id: str, count: int) -> list[Envelope]:
    """Relay the outbox to Kafka, index it, and read the run back from the topic."""
    relay = Relay(engine, settings=settings)
    relay.drain(timeout=60)
    relay.close()
    build_views(settings, engine, expect=count)
    events = list(KafkaRunSource(settings, ViewRunIndex(engine), run_id))
    assert [e.sequence for e in events] == list(range(1, count + 1))
    return events


def record_sync(
    agent: SyncAgent, sdk: anthropic.Anthropic, recorder: Recorder | MemoryRecorder
) -> tuple[str, int, Any, list[Any]]:
    seen: list[Any] = []
    run, output = recorder.record(
        lambda r, _input: agent(capture_anthropic(sdk, r), seen),
        RunSnapshot(code_version="claude.1", input=INPUT),
        agent_id="claude-agent",
    )
    return run.run_id, run.last_sequence, output, seen


def replay(
    agent: SyncAgent, events: list[Envelope], sdk: anthropic.Anthropic, **kw: Any
) -> list[Any]:
    seen: list[Any] = []

    def entry(run: AgentRun, _input: Any) -> Any:
        return agent(capture_anthropic(sdk, run), seen)

    report = replay_run(events, entry, **kw)
    assert report.passed, report.divergence and report.divergence.describe()
    return seen


def llm_bodies(events: list[Envelope]) -> list[dict[str, Any]]:
    pipeline = PayloadPipeline()
    return [pipeline.unpack(e) for e in events if e.event_type == "llm.call"]


def test_sync_calls_are_recorded_published_and_replayed_from_kafka(
    settings: Settings,
    engine: Engine,
    server: AnthropicServer,
    client: anthropic.Anthropic,
    offline: anthropic.Anthropic,
) -> None:
    run_id, count, output, seen = record_sync(
        sync_agent, client, Recorder(engine, settings=settings)
    )
    assert output == {"text": "echo: hi there", "tool": {"city": "Oslo"}, "streamed": "tool_use"}
    assert isinstance(seen[0], Message)
    assert seen[0]._request_id == REQUEST_ID  # the SDK's own object, as without capture
    assert all(isinstance(e, RawMessageStreamEvent.__args__) for e in seen[1])  # type: ignore[attr-defined]
    assert seen[6] == ["echo:", " streamed", " words"]  # text_stream
    assert seen[7] == "echo: streamed words"  # get_final_text()

    events = publish(settings, engine, run_id, count)
    bodies = llm_bodies(events)
    assert len(bodies) == 7
    assert {b["provider"] for b in bodies} == {"anthropic"}
    # The request recorded is the body that went over the wire, call for call.
    assert [json.loads(b["raw_request_json"]) for b in bodies] == [
        r.json() for r in server.requests
    ]
    responses = [json.loads(b["raw_response_json"] or "null") for b in bodies]
    # A stream is recorded as it went over the wire: the server's pings too (the test
    # server leaves them out of what it lists as sent).
    assert {"type": "ping"} in responses[1]["stream"]
    for response in responses:
        if isinstance(response, dict) and "stream" in response:
            response["stream"] = [e for e in response["stream"] if e != {"type": "ping"}]
    assert responses[:6] == [
        server.sent[0],
        {"stream": server.sent[1]},
        server.sent[2],
        server.sent[3],
        {"stream": server.sent[4]},
        {"stream": server.sent[5]},
    ]
    assert [b["finish_reason"] for b in bodies] == [
        "stop", "stop", "tool_calls", "stop", "tool_calls", "stop", None,
    ]  # fmt: skip
    assert [b["usage"] for b in bodies[:6]] == [USAGE] * 6
    assert [b["response_id"] for b in bodies[:6]] == ["msg_01"] * 6
    for body in (bodies[2], bodies[4]):  # plain and streamed tool use read alike
        reply = llm_reply(body)
        assert reply.choices[0]["content"] == PREFACE
        assert [(c["id"], c["name"], c["arguments_json"]) for c in reply.tool_calls] == [
            (
                "toolu_01",
                "get_weather",
                '{"city":"Oslo"}' if body is bodies[2] else '{"city":"Paris"}',
            )
        ]
    assert llm_reply(bodies[1]).choices[0]["content"] == "echo: a b c"
    assert bodies[6]["error"]["type"] == "BadRequestError"
    assert json.loads(bodies[6]["error"]["message"])["status_code"] == 400
    calls = [e for e in events if e.event_type == "llm.call"]
    assert calls[2].attributes["tool_calls_requested"] == "1"
    assert calls[2].attributes["tool_calls_invalid"] == "0"  # checked against input_schema
    assert calls[1].attributes["streamed"] == "true"
    assert calls[6].attributes["error"] == "BadRequestError"

    before = len(server.requests)
    blobs = PostgresBlobs(engine)
    for sdk in (client, offline):
        assert replay(sync_agent, events, sdk, blobs=blobs) == seen
    assert len(server.requests) == before, "a replay sent a request"


def test_async_calls_are_recorded_published_and_replayed(
    settings: Settings, engine: Engine, server: AnthropicServer, closed_url: str
) -> None:
    async def record() -> tuple[str, int, Any, list[Any]]:
        writer = create_async_engine(settings.database_url)
        seen: list[Any] = []
        try:
            recorder = AsyncRecorder(writer, settings=settings)
            async with anthropic.AsyncAnthropic(
                base_url=server.base_url, api_key=API_KEY, max_retries=0
            ) as sdk:

                async def entry(run: Any, _input: Any) -> Any:
                    return await async_agent(capture_anthropic(sdk, run), seen)

                snapshot = RunSnapshot(code_version="claude.1", input=INPUT)
                run, output = await recorder.record(entry, snapshot, agent_id="claude-async")
            return run.run_id, run.last_sequence, output, seen
        finally:
            await writer.dispose()

    run_id, count, output, seen = asyncio.run(record())
    assert output == "echo: hi there"
    events = publish(settings, engine, run_id, count)
    bodies = llm_bodies(events)
    assert [b["finish_reason"] for b in bodies] == ["stop", "stop", "tool_calls", "stop", None]
    assert bodies[4]["error"]["type"] == "RateLimitError"
    assert seen[3].content[1].input == {"city": "Paris"}  # the final message of the stream
    assert seen[5] == "echo: one two"

    async def replayed(base_url: str) -> list[Any]:
        run = ReplayRun(events)
        again: list[Any] = []
        async with anthropic.AsyncAnthropic(
            base_url=base_url, api_key="unused", max_retries=0
        ) as sdk:
            output = await async_agent(capture_anthropic(sdk, run), again)
        run.finish(output=output)  # raises ReplayDivergence where the replay went another way
        return again

    before = len(server.requests)
    for base_url in (server.base_url, closed_url):
        assert asyncio.run(replayed(base_url)) == seen
    assert len(server.requests) == before, "a replay sent a request"


# Errors -----------------------------------------------------------------------------


def overloaded_agent(llm: anthropic.Anthropic, seen: list[Any]) -> Any:
    return llm.messages.create(model="fail-529", max_tokens=8, messages=user("x"))


def test_a_run_failed_by_an_api_error_replays_to_the_same_failure(
    server: AnthropicServer, client: anthropic.Anthropic, offline: anthropic.Anthropic
) -> None:
    recorder = MemoryRecorder()
    with pytest.raises(anthropic.OverloadedError):
        record_sync(overloaded_agent, client, recorder)
    finished = PayloadPipeline().unpack(recorder.events[-1])
    assert (finished["status"], finished["error"]["type"]) == ("failed", "OverloadedError")

    before = len(server.requests)
    report = replay_run(
        recorder.events, lambda r, _i: overloaded_agent(capture_anthropic(offline, r), [])
    )
    assert report.passed, report.divergence and report.divergence.describe()
    with pytest.raises(anthropic.OverloadedError) as raised:
        overloaded_agent(capture_anthropic(offline, ReplayRun(recorder.events)), [])
    assert raised.value.status_code == 529
    assert raised.value.body == server.sent[-1]
    assert raised.value.type == "overloaded_error"
    assert len(server.requests) == before


def test_an_error_event_in_the_middle_of_a_stream_is_recorded_and_raised_again(
    server: AnthropicServer, client: anthropic.Anthropic, offline: anthropic.Anthropic
) -> None:
    def agent(llm: anthropic.Anthropic, seen: list[Any]) -> Any:
        try:
            # The error event arrives as the stream is read (the stream is live now: it
            # is no longer read to its end before the agent gets it).
            with llm.messages.stream(model="fail-midstream", max_tokens=8, messages=user("x")) as s:
                s.until_done()
                return "finished"
        except anthropic.APIStatusError as exc:
            seen.append((type(exc), exc.body))
            return "failed"

    recorder = MemoryRecorder()
    _, _, output, seen = record_sync(agent, client, recorder)
    assert output == "failed"
    assert seen[0][1] == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "Overloaded"},
    }
    assert replay(agent, recorder.events, offline) == seen


def test_a_connection_error_is_recorded_and_replayed(closed_url: str) -> None:
    def agent(llm: anthropic.Anthropic, seen: list[Any]) -> Any:
        try:
            llm.messages.create(model=MODEL, max_tokens=8, messages=user("x"))
        except anthropic.APIConnectionError as exc:
            seen.append((type(exc), exc.message))
            return "unreachable"
        return "reached"

    with anthropic.Anthropic(base_url=closed_url, api_key=API_KEY, max_retries=0) as sdk:
        _, _, output, seen = record_sync(agent, sdk, recorder := MemoryRecorder())
        assert output == "unreachable"
        assert replay(agent, recorder.events, sdk) == seen


def test_what_the_sdk_cannot_send_is_neither_sent_nor_recorded(
    server: AnthropicServer, client: anthropic.Anthropic
) -> None:
    recorder = MemoryRecorder()
    run = recorder.start_run(RunSnapshot(code_version="t"), agent_id="a")
    llm = capture_anthropic(client, run)
    # The SDK refuses it itself, before its transport (the capture) sees a request. (What
    # the SDK does send, it sends as it chose to: the capture no longer refuses SDK
    # arguments of its own accord, such as the old capture's check of output_format.)
    with pytest.raises(TypeError, match="not JSON serializable"):
        llm.messages.create(
            model=MODEL, max_tokens=8, messages=[{"role": "user", "content": object()}]
        )
    assert server.requests == []
    assert [e.event_type for e in recorder.events] == ["run.started"]


# Streams and clients ----------------------------------------------------------------


def test_streams_are_the_sdks_own(server: AnthropicServer, client: anthropic.Anthropic) -> None:
    recorder = MemoryRecorder()
    run = recorder.start_run(RunSnapshot(code_version="t"), agent_id="a")
    llm = capture_anthropic(client, run)
    stream = llm.messages.create(model=MODEL, max_tokens=8, messages=user("a b"), stream=True)
    assert isinstance(stream, anthropic.Stream)  # the SDK's own, over the live response
    assert run.last_sequence == 1  # recorded when it ends
    events = list(stream)
    assert [e.type for e in events] == [e["type"] for e in server.sent[0]]
    assert list(stream) == []  # iterates once
    assert run.last_sequence == 2
    with llm.messages.stream(model=MODEL, max_tokens=8, messages=user("a b")) as helper:
        assert isinstance(helper, MessageStream)  # the SDK's own helper
        assert helper.request_id == REQUEST_ID
        assert helper.get_final_text() == "echo: a b"
    assert run.last_sequence == 3  # run.started and two llm.call


def test_a_strictly_validating_client_replays_validated_objects(
    server: AnthropicServer, closed_url: str
) -> None:
    def strict(base_url: str) -> anthropic.Anthropic:
        return anthropic.Anthropic(
            base_url=base_url, api_key=API_KEY, max_retries=0, _strict_response_validation=True
        )

    with strict(server.base_url) as live, strict(closed_url) as dead:
        _, _, _, seen = record_sync(sync_agent, live, recorder := MemoryRecorder())
        assert replay(sync_agent, recorder.events, dead) == seen


# Re-execution -----------------------------------------------------------------------


def test_reexecute_re_sends_each_call_and_diffs_the_answers(
    server: AnthropicServer, client: anthropic.Anthropic, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = MemoryRecorder()
    record_sync(sync_agent, client, recorder)
    recorded = len(server.requests)
    diffs = reexecute(recorder.events, anthropic_sender(server.base_url, API_KEY))
    # The call that was refused when recorded (400) is refused again: the same answer.
    assert [d.same for d in diffs] == [True] * 7
    assert diffs[6].uncompared["text"] == (
        "the call failed with BadRequestError when recorded, and again now"
    )
    assert [d.streamed for d in diffs] == [False, True, False, False, True, True, False]
    resent = [r.json() for r in server.requests[recorded:]]
    assert resent == [r.json() for r in server.requests[:recorded]]  # as recorded, no additions

    original = _anthropic_server.answer

    def terse(path: str, request: Mapping[str, Any]) -> Reply:
        reply = original(path, request)
        if reply.body is not None and reply.body.get("type") == "message":
            reply.body["stop_reason"] = "max_tokens"
        return reply

    monkeypatch.setattr(_anthropic_server, "answer", terse)
    diffs = reexecute(recorder.events, anthropic_sender(server.base_url, API_KEY))
    assert diffs[0].changed == {"finish_reason": (["stop"], ["length"])}
    assert diffs[1].same  # streamed answers are unchanged


def _cli(arguments: list[str], **env: str) -> Any:
    return CliRunner(env={"ANTHROPIC_API_KEY": API_KEY, **env}).invoke(
        main, ["reexecute", *arguments]
    )


def test_the_reexecute_command_picks_the_sender_by_each_calls_provider(
    server: AnthropicServer, client: anthropic.Anthropic, tmp_path: Path
) -> None:
    def agent(llm: anthropic.Anthropic, seen: list[Any]) -> Any:
        planned = llm.messages.create(model=MODEL, max_tokens=64, messages=user("hi"), tools=[TOOL])
        stream = llm.messages.create(model=MODEL, max_tokens=64, messages=user("a b"), stream=True)
        return [planned.id, [event.type for event in stream][-1]]

    recorder = MemoryRecorder()
    run_id, *_ = record_sync(agent, client, recorder)
    write_archive(tmp_path / "claude.avro", recorder.events)
    arguments = [run_id, "--archive", str(tmp_path / "claude.avro"), "--base-url", server.base_url]
    result = _cli([*arguments, "--purpose", "drift check", "--json"])
    assert result.exit_code == 0, result.output
    calls = json.loads(result.stdout)["calls"]
    assert [(c["same"], c["streamed"]) for c in calls] == [(True, False), (True, True)]
    assert calls[0]["fields"]["tool_calls"]["now"] == [
        [{"name": "get_weather", "arguments": {"city": "Paris"}}]
    ]
    # The key (from ANTHROPIC_API_KEY) went in the request's headers, never into the output.
    assert API_KEY in " ".join(server.requests[-1].headers.values())
    assert API_KEY not in result.output


def openai_to_anthropic(request: Mapping[str, Any]) -> dict[str, Any]:
    """A request mapper as a user would write one: a chat request as a Messages one."""
    return {"model": MODEL, "max_tokens": 64, "messages": list(request["messages"])}


def test_an_openai_run_goes_to_an_anthropic_endpoint_only_with_a_request_mapper(
    server: AnthropicServer, tmp_path: Path
) -> None:
    with (
        OpenAIServer() as openai_server,
        openai.OpenAI(base_url=openai_server.base_url, api_key="sk-openai", max_retries=0) as sdk,
    ):
        recorder = MemoryRecorder()
        run, _ = recorder.record(
            lambda r, _i: (
                capture_openai(sdk, r)
                .chat.completions.create(model="gpt-test", messages=user("hi there"))
                .id
            ),
            RunSnapshot(code_version="gpt.1", input=INPUT),
            agent_id="gpt-agent",
        )
    write_archive(tmp_path / "gpt.avro", recorder.events)
    arguments = [run.run_id, "--archive", str(tmp_path / "gpt.avro"), "--base-url", server.base_url]
    arguments += ["--provider", "anthropic", "--purpose", "try Claude", "--json"]

    refused = _cli(arguments)
    assert refused.exit_code == 2, refused.output
    assert "provider 'openai'" in refused.stderr
    assert "anthropic API" in refused.stderr
    assert "--request-mapper" in refused.stderr
    assert server.requests == []  # nothing was sent

    mapper = f"{__name__}:openai_to_anthropic"
    mapped = _cli([*arguments, "--request-mapper", mapper])
    assert mapped.exit_code == 1, mapped.output  # the answers' usage differs
    [call] = json.loads(mapped.stdout)["calls"]
    assert call["changed"].keys() == {"usage"}
    assert call["fields"]["text"]["now"] == ["echo: hi there"]  # the same answer
    assert server.requests[0].json() == {
        "model": MODEL,
        "max_tokens": 64,
        "messages": user("hi there"),
    }

    missing = _cli([*arguments, "--request-mapper", "no_such_module:f"])
    assert missing.exit_code == 2
    assert "no_such_module" in missing.stderr


def test_a_run_of_both_apis_is_re_sent_to_each_ones_endpoint(
    server: AnthropicServer, client: anthropic.Anthropic, tmp_path: Path
) -> None:
    with (
        OpenAIServer() as openai_server,
        openai.OpenAI(base_url=openai_server.base_url, api_key="sk-openai", max_retries=0) as sdk,
    ):

        def agent(run: AgentRun, _input: Any) -> Any:
            gpt = capture_openai(sdk, run).chat.completions.create(
                model="gpt-test", messages=user("hi there")
            )
            claude = capture_anthropic(client, run).messages.create(
                model=MODEL, max_tokens=64, messages=user("hi")
            )
            return [gpt.id, claude.id]

        recorder = MemoryRecorder()
        run, _ = recorder.record(agent, RunSnapshot("both.1", INPUT), agent_id="both")
        write_archive(tmp_path / "both.avro", recorder.events)
        arguments = [run.run_id, "--archive", str(tmp_path / "both.avro")]
        arguments += ["--purpose", "drift check of both", "--json"]
        sent = len(openai_server.requests), len(server.requests)

        one_url = _cli([*arguments, "--base-url", server.base_url])
        assert one_url.exit_code == 2, one_url.output
        assert "--base-url openai=URL" in one_url.stderr.replace("\n", " ")
        assert (len(openai_server.requests), len(server.requests)) == sent  # nothing sent

        urls = ["--base-url", f"openai={openai_server.base_url}"]
        urls += ["--base-url", f"anthropic={server.base_url}"]
        each = _cli([*arguments, *urls], OPENAI_API_KEY="sk-openai")
        assert each.exit_code == 0, each.output
        assert [c["same"] for c in json.loads(each.stdout)["calls"]] == [True, True]
        [gpt] = openai_server.requests[sent[0] :]
        [claude] = server.requests[sent[1] :]
        assert (gpt.json()["model"], claude.json()["model"]) == ("gpt-test", MODEL)
        assert gpt.headers["authorization"] == "Bearer sk-openai"
        assert API_KEY in " ".join(claude.headers.values())

        # The same from Python: one endpoint per API.
        endpoints = endpoints_for(
            recorder.events,
            {"openai": openai_server.base_url, "anthropic": server.base_url},
            api_key={"openai": "sk-openai", "anthropic": API_KEY},
        )
        assert [d.same for d in reexecute(recorder.events, endpoints)] == [True, True]
        assert (len(openai_server.requests), len(server.requests)) == (sent[0] + 2, sent[1] + 2)


def test_a_changed_answer_from_the_cli_is_a_diff(
    server: AnthropicServer,
    client: anthropic.Anthropic,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recorder = MemoryRecorder()
    run_id, *_ = record_sync(
        lambda llm, seen: llm.messages.create(model=MODEL, max_tokens=8, messages=user("hi")).id,
        client,
        recorder,
    )
    write_archive(tmp_path / "claude.avro", recorder.events)

    def elsewhere(path: str, request: Mapping[str, Any]) -> Reply:
        return Reply(HTTPStatus.OK, {**_anthropic_server.message_for(request), "content": [
            {"type": "text", "text": "something else"}]})  # fmt: skip

    monkeypatch.setattr(_anthropic_server, "answer", elsewhere)
    arguments = [run_id, "--archive", str(tmp_path / "claude.avro"), "--base-url", server.base_url]
    result = _cli([*arguments, "--purpose", "drift check", "--json"])
    assert result.exit_code == 1, result.output
    [call] = json.loads(result.stdout)["calls"]
    assert call["changed"] == {"text": {"recorded": ["echo: hi"], "now": ["something else"]}}


def test_an_error_it_cannot_rebuild_is_raised_as_recorded_error(
    offline: anthropic.Anthropic,
) -> None:
    # An error of a kind the capture does not rebuild: a sender's own exception, recorded
    # by a plain run.llm call with the request the agent below makes, of a class defined
    # in this function, which replay cannot look up (one it can comes back as itself).
    class ProxyExploded(Exception):
        pass

    recorder = MemoryRecorder()
    run = recorder.start_run(RunSnapshot(code_version="t"), agent_id="a")
    request = {"model": MODEL, "max_tokens": 8, "messages": user("x")}

    def broken(_: Any) -> Any:
        raise ProxyExploded("proxy exploded")

    with pytest.raises(ProxyExploded, match="proxy exploded"):
        run.llm(broken, request, provider="anthropic", model=MODEL)
    llm = capture_anthropic(offline, ReplayRun(recorder.events))
    # Raised again in the transport; the Anthropic SDK wraps whatever its transport
    # raises in APIConnectionError (it would have wrapped the sender's own error so
    # too), with the recorded error as the cause.
    with pytest.raises(anthropic.APIConnectionError) as raised:
        llm.messages.create(**request)
    cause = raised.value.__cause__
    assert isinstance(cause, RecordedError)
    assert cause.type_name.endswith("<locals>.ProxyExploded")
    assert "proxy exploded" in str(cause)
