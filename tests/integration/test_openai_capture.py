"""The official openai SDK, captured: recorded over real HTTP on loopback, replayed with
no request at all.

The tests run the real SDK (sync and async clients, Chat Completions and Responses,
plain and streamed) against the local OpenAI-compatible server of ``_openai_server``.
Runs are recorded with a MemoryRecorder, so no Postgres or Kafka is needed; they are
integration tests for the SDK and the HTTP they drive.

The capture records at the HTTP transport: ``capture_openai`` gives back a real
``openai.OpenAI`` whose transport records, so what the agent is handed is what the SDK
builds without any capture (a stream is the SDK's own ``Stream``, read as it arrives;
an object carries its ``_request_id``), and in replay the SDK builds the same objects
from the recorded HTTP answer.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx2
import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response

from agent_blackbox.outbox import (
    AgentRun,
    AsyncMemoryRecorder,
    MemoryRecorder,
    RecordedError,
    RunSnapshot,
)
from agent_blackbox.outbox.integrations.openai import capture_openai
from agent_blackbox.replayer import ReplayRun, replay_run
from agent_blackbox.schemas import Envelope, EnvelopeCodec, PayloadPipeline, llm_reply
from tests.integration._fork_agents import WEATHER_TOOL
from tests.integration._llm_server import refused_url
from tests.integration._openai_server import REQUEST_ID, TOOL_ARGUMENTS, OpenAIServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

API_KEY = "sk-test-7f3c9a1e5b2d4f6a8c0e1b3d5f7a9c2e"
INPUT = {"question": "hi there"}
RESPONSES_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": WEATHER_TOOL["function"]["parameters"],  # type: ignore[index]
    "strict": True,
}

SyncAgent = Callable[[openai.OpenAI, list[Any]], Any]
AsyncAgent = Callable[[openai.AsyncOpenAI, list[Any]], Awaitable[Any]]


# Fixtures ---------------------------------------------------------------------------


@pytest.fixture
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer() as running:
        yield running


@pytest.fixture
def closed_url() -> str:
    """A loopback URL where nothing listens: any request to it is refused."""
    return refused_url("/v1")


@pytest.fixture
def client(server: OpenAIServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0) as sdk:
        yield sdk


@pytest.fixture
def offline(closed_url: str) -> Iterator[openai.OpenAI]:
    """The client a replay gets: no real key, and a base URL that refuses connections."""
    with openai.OpenAI(base_url=closed_url, api_key="unused", max_retries=0) as sdk:
        yield sdk


# Recording and replaying ------------------------------------------------------------


@dataclass
class Recorded:
    events: list[Envelope]
    output: Any
    seen: list[Any]
    """The SDK objects the agent was handed, in order."""

    def llm_bodies(self) -> list[dict[str, Any]]:
        pipeline = PayloadPipeline()
        return [pipeline.unpack(e) for e in self.events if e.event_type == "llm.call"]


def record(agent: SyncAgent, sdk: openai.OpenAI) -> Recorded:
    recorder = MemoryRecorder()
    seen: list[Any] = []
    run = recorder.start_run(RunSnapshot(code_version="t", input=INPUT), agent_id="openai-agent")
    output = run.drive(lambda r, _input: agent(capture_openai(sdk, r), seen), INPUT)
    return Recorded(recorder.events, output, seen)


def replay(agent: SyncAgent, events: list[Envelope], sdk: openai.OpenAI) -> list[Any]:
    seen: list[Any] = []

    def entry(run: AgentRun, _input: Any) -> Any:
        return agent(capture_openai(sdk, run), seen)

    report = replay_run(events, entry)
    assert report.passed, report.divergence and report.divergence.describe()
    return seen


def assert_replays(
    agent: SyncAgent,
    recorded: Recorded,
    *,
    server: OpenAIServer,
    client: openai.OpenAI,
    offline: openai.OpenAI,
) -> None:
    """Replay through a client of the live server (which must see no request) and through
    one whose port is closed; both hand back objects equal to the recorded ones."""
    before = len(server.requests)
    for sdk in (client, offline):
        assert replay(agent, recorded.events, sdk) == recorded.seen
    assert len(server.requests) == before, "a replay sent a request"


async def record_async(agent: AsyncAgent, base_url: str) -> Recorded:
    recorder = AsyncMemoryRecorder()
    run = await recorder.start_run(
        RunSnapshot(code_version="t", input=INPUT), agent_id="openai-agent"
    )
    seen: list[Any] = []
    async with openai.AsyncOpenAI(base_url=base_url, api_key=API_KEY, max_retries=0) as sdk:
        output = await agent(capture_openai(sdk, run), seen)
    await run.finish(output=output)
    return Recorded(recorder.events, output, seen)


async def replay_async(agent: AsyncAgent, events: list[Envelope], base_url: str) -> list[Any]:
    run = ReplayRun(events)
    seen: list[Any] = []
    async with openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0) as sdk:
        output = await agent(capture_openai(sdk, run), seen)
    run.finish(output=output)  # raises ReplayDivergence where the replay went another way
    return seen


def chunk_text(chunks: list[ChatCompletionChunk]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


# Chat Completions -------------------------------------------------------------------


def chat_agent(llm: openai.OpenAI, seen: list[Any]) -> Any:
    completion = llm.chat.completions.create(
        model="gpt-test",
        messages=[{"role": "user", "content": INPUT["question"]}],
        temperature=0.2,
        seed=7,
    )
    seen.append(completion)
    return completion.choices[0].message.content


def test_chat_completion_is_recorded_and_replayed(
    server: OpenAIServer, client: openai.OpenAI, offline: openai.OpenAI
) -> None:
    recorded = record(chat_agent, client)

    original = recorded.seen[0]
    assert isinstance(original, ChatCompletion)
    assert original._request_id == REQUEST_ID  # the SDK's own object, as without capture
    assert recorded.output == "echo: hi there"
    (body,) = recorded.llm_bodies()
    assert body["provider"] == "openai"
    assert body["model"] == "gpt-test"
    assert json.loads(body["raw_request_json"]) == {
        "model": "gpt-test",
        "messages": [{"role": "user", "content": "hi there"}],
        "temperature": 0.2,
        "seed": 7,
    }
    assert json.loads(body["raw_response_json"]) == server.sent[0]  # exactly what was sent
    assert body["finish_reason"] == "stop"
    assert body["usage"] == {
        "input_tokens": 12,
        "output_tokens": 5,
        "cached_tokens": 2,
        "total_tokens": 17,
    }
    assert body["response_id"] == "chatcmpl-1"
    assert body["latency_ms"] > 0
    assert body["error"] is None
    assert ChatCompletion.model_validate(json.loads(body["raw_response_json"])) == original

    assert_replays(chat_agent, recorded, server=server, client=client, offline=offline)
    # Headers are never recorded, so a replayed object has no request id of its own.
    (replayed,) = replay(chat_agent, recorded.events, offline)
    assert replayed._request_id is None


def chat_stream_agent(llm: openai.OpenAI, seen: list[Any]) -> Any:
    stream = llm.chat.completions.create(
        model="gpt-test",
        messages=[{"role": "user", "content": INPUT["question"]}],
        stream=True,
        stream_options={"include_usage": True},
    )
    with stream:
        chunks = list(stream)
    seen.append(chunks)
    return chunk_text(chunks)


def test_chat_stream_chunks_are_recorded_and_re_yielded(
    server: OpenAIServer, client: openai.OpenAI, offline: openai.OpenAI
) -> None:
    recorded = record(chat_stream_agent, client)

    chunks = recorded.seen[0]
    assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
    assert recorded.output == "echo: hi there"
    (body,) = recorded.llm_bodies()
    assert json.loads(body["raw_response_json"]) == {"stream": server.sent[0]}
    assert json.loads(body["raw_request_json"])["stream"] is True
    assert body["finish_reason"] == "stop"
    assert llm_reply(body).choices[0]["content"] == "echo: hi there"  # derived when read
    assert body["usage"]["total_tokens"] == 17

    assert_replays(chat_stream_agent, recorded, server=server, client=client, offline=offline)
    replayed = replay(chat_stream_agent, recorded.events, offline)[0]
    assert [type(c) for c in replayed] == [type(c) for c in chunks]


def chat_tool_agent(llm: openai.OpenAI, seen: list[Any]) -> Any:
    messages: list[Any] = [{"role": "user", "content": "weather in Paris?"}]
    first = llm.chat.completions.create(model="gpt-test", messages=messages, tools=[WEATHER_TOOL])
    seen.append(first)
    call = first.choices[0].message.tool_calls[0]
    # The SDK's own message object goes back into the next request, as agents do.
    messages += [
        first.choices[0].message,
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    second = llm.chat.completions.create(model="gpt-test", messages=messages)
    seen.append(second)
    return {"tool": call.function.name, "arguments": call.function.arguments}


def test_chat_tool_call_is_recorded(
    server: OpenAIServer, client: openai.OpenAI, offline: openai.OpenAI
) -> None:
    recorded = record(chat_tool_agent, client)

    assert recorded.output == {"tool": "get_weather", "arguments": TOOL_ARGUMENTS}
    first, second = recorded.llm_bodies()
    assert first["finish_reason"] == "tool_calls"
    assert list(llm_reply(first).tool_calls) == [
        {
            "id": "call_1",
            "type": "function",
            "name": "get_weather",
            "arguments_json": '{"city":"Paris"}',
            "arguments_raw": None,
        }
    ]
    # The assistant message went into the second request as the JSON the SDK sent.
    sent_messages = server.requests[1].json()["messages"]
    assert json.loads(second["raw_request_json"])["messages"] == sent_messages

    assert_replays(chat_tool_agent, recorded, server=server, client=client, offline=offline)


def chat_stream_tool_agent(llm: openai.OpenAI, seen: list[Any]) -> Any:
    stream = llm.chat.completions.create(
        model="gpt-test",
        messages=[{"role": "user", "content": "weather in Paris?"}],
        tools=[WEATHER_TOOL],
        stream=True,
    )
    chunks = list(stream)
    seen.append(chunks)
    return len(chunks)


def test_streamed_tool_call_is_folded_into_the_body(
    server: OpenAIServer, client: openai.OpenAI, offline: openai.OpenAI
) -> None:
    recorded = record(chat_stream_tool_agent, client)

    (body,) = recorded.llm_bodies()
    assert body["finish_reason"] == "tool_calls"
    assert [(c["id"], c["name"], c["arguments_json"]) for c in llm_reply(body).tool_calls] == [
        ("call_1", "get_weather", '{"city":"Paris"}')
    ]
    assert body["usage"] is None  # the stream was not asked for usage
    assert_replays(chat_stream_tool_agent, recorded, server=server, client=client, offline=offline)


# Responses --------------------------------------------------------------------------


def responses_agent(llm: openai.OpenAI, seen: list[Any]) -> Any:
    response = llm.responses.create(
        model="gpt-test", input=INPUT["question"], instructions="Be brief."
    )
    seen.append(response)
    return response.output_text


def test_responses_call_is_recorded_and_replayed(
    server: OpenAIServer, client: openai.OpenAI, offline: openai.OpenAI
) -> None:
    recorded = record(responses_agent, client)

    original = recorded.seen[0]
    assert isinstance(original, Response)
    assert recorded.output == "echo: hi there"
    (body,) = recorded.llm_bodies()
    assert body["provider"] == "openai"
    assert body["model"] == "gpt-test"
    assert json.loads(body["raw_response_json"]) == server.sent[0]
    assert body["response_id"] == "resp_1"
    assert body["finish_reason"] == "stop"
    assert llm_reply(body).choices[0]["content"] == "echo: hi there"  # derived when read
    assert body["usage"] == {
        "input_tokens": 20,
        "output_tokens": 6,
        "cached_tokens": 4,
        "total_tokens": 26,
    }
    assert Response.model_validate(json.loads(body["raw_response_json"])) == original

    assert_replays(responses_agent, recorded, server=server, client=client, offline=offline)


def responses_stream_agent(llm: openai.OpenAI, seen: list[Any]) -> Any:
    stream = llm.responses.create(model="gpt-test", input=INPUT["question"], stream=True)
    events = list(stream)
    seen.append(events)
    return "".join(e.delta for e in events if e.type == "response.output_text.delta")


def test_responses_stream_events_are_recorded_and_re_yielded(
    server: OpenAIServer, client: openai.OpenAI, offline: openai.OpenAI
) -> None:
    recorded = record(responses_stream_agent, client)

    events = recorded.seen[0]
    assert events[0].type == "response.created"
    assert events[-1].type == "response.completed"
    assert recorded.output == "echo: hi there"
    (body,) = recorded.llm_bodies()
    assert json.loads(body["raw_response_json"]) == {"stream": server.sent[0]}
    assert body["finish_reason"] == "stop"
    assert body["usage"]["total_tokens"] == 26

    assert_replays(responses_stream_agent, recorded, server=server, client=client, offline=offline)
    replayed = replay(responses_stream_agent, recorded.events, offline)[0]
    assert [type(e) for e in replayed] == [type(e) for e in events]


def responses_tool_agent(llm: openai.OpenAI, seen: list[Any]) -> Any:
    response = llm.responses.create(
        model="gpt-test", input="weather in Paris?", tools=[RESPONSES_TOOL]
    )
    seen.append(response)
    call = response.output[0]
    follow_up = llm.responses.create(
        model="gpt-test",
        input=[call, {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
    )
    seen.append(follow_up)
    return call.arguments


def test_responses_function_call_is_recorded(
    server: OpenAIServer, client: openai.OpenAI, offline: openai.OpenAI
) -> None:
    recorded = record(responses_tool_agent, client)

    assert recorded.output == TOOL_ARGUMENTS
    first, second = recorded.llm_bodies()
    assert first["finish_reason"] == "tool_calls"
    calls = llm_reply(first).tool_calls
    assert [(c["id"], c["type"], c["name"], c["arguments_json"]) for c in calls] == [
        ("call_1", "function", "get_weather", '{"city":"Paris"}')
    ]
    assert json.loads(second["raw_request_json"])["input"] == server.requests[1].json()["input"]
    assert_replays(responses_tool_agent, recorded, server=server, client=client, offline=offline)


# Errors -----------------------------------------------------------------------------


def caught_error_agent(model: str) -> SyncAgent:
    def agent(llm: openai.OpenAI, seen: list[Any]) -> Any:
        try:
            llm.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}])
        except openai.APIStatusError as exc:
            seen.append((type(exc), exc.status_code, exc.message, exc.body, exc.response.json()))
            return {"status": exc.status_code, "code": exc.code}
        raise AssertionError("the server was to fail")

    return agent


@pytest.mark.parametrize(
    ("model", "error_class"),
    [("fail-400", openai.BadRequestError), ("fail-500", openai.InternalServerError)],
)
def test_api_error_is_recorded_and_raised_again_as_the_same_class(
    server: OpenAIServer,
    client: openai.OpenAI,
    offline: openai.OpenAI,
    model: str,
    error_class: type[openai.APIStatusError],
) -> None:
    agent = caught_error_agent(model)
    recorded = record(agent, client)

    status = int(model.removeprefix("fail-"))
    assert recorded.output == {"status": status, "code": f"status_{status}"}
    assert recorded.seen[0][0] is error_class
    (body,) = recorded.llm_bodies()
    assert body["error"]["type"] == error_class.__name__
    assert json.loads(body["error"]["message"])["status_code"] == status
    assert body["raw_response_json"] is None
    llm_event = next(e for e in recorded.events if e.event_type == "llm.call")
    assert llm_event.attributes["error"] == error_class.__name__

    assert_replays(agent, recorded, server=server, client=client, offline=offline)


def uncaught_error_agent(llm: openai.OpenAI, seen: list[Any]) -> Any:
    return llm.responses.create(model="fail-429", input="x")


def test_a_run_failed_by_an_api_error_replays_to_the_same_failure(
    server: OpenAIServer, client: openai.OpenAI, offline: openai.OpenAI
) -> None:
    recorder = MemoryRecorder()
    run = recorder.start_run(RunSnapshot(code_version="t", input=INPUT), agent_id="a")
    with pytest.raises(openai.RateLimitError):
        run.drive(lambda r, _i: uncaught_error_agent(capture_openai(client, r), []), INPUT)
    finished = PayloadPipeline().unpack(recorder.events[-1])
    assert finished["status"] == "failed"
    assert finished["error"]["type"] == "RateLimitError"

    before = len(server.requests)
    report = replay_run(
        recorder.events, lambda r, _i: uncaught_error_agent(capture_openai(offline, r), [])
    )
    assert report.passed, report.divergence and report.divergence.describe()
    with pytest.raises(openai.RateLimitError) as raised:
        uncaught_error_agent(capture_openai(offline, ReplayRun(recorder.events)), [])
    assert raised.value.status_code == 429
    assert raised.value.body == server.sent[-1]["error"]
    assert len(server.requests) == before


def test_a_connection_error_is_recorded_and_replayed(closed_url: str) -> None:
    def agent(llm: openai.OpenAI, seen: list[Any]) -> Any:
        try:
            llm.chat.completions.create(model="gpt-test", messages=[])
        except openai.APIConnectionError as exc:
            seen.append((type(exc), exc.message, type(exc.__cause__)))
            return "unreachable"
        return "reached"

    with openai.OpenAI(base_url=closed_url, api_key=API_KEY, max_retries=0) as sdk:
        recorded = record(agent, sdk)
        assert recorded.output == "unreachable"
        # Recorded under the HTTP library's name for what failed (the transport sees the
        # connection refused, before the SDK wraps it); replay raises that class again
        # in the transport, and the SDK wraps it in the same APIConnectionError.
        assert recorded.llm_bodies()[0]["error"]["type"] == "ConnectError"
        assert recorded.seen == [
            (openai.APIConnectionError, "Connection error.", httpx2.ConnectError)
        ]
        assert replay(agent, recorded.events, sdk) == recorded.seen


def test_an_error_it_cannot_rebuild_is_raised_as_recorded_error(offline: openai.OpenAI) -> None:
    # An error of a kind the capture does not rebuild: here a sender's own exception,
    # recorded by a plain run.llm call with the request chat_agent makes, of a class
    # defined in this function, which replay cannot look up (one it can comes back as
    # itself).
    class ProxyExploded(Exception):
        pass

    recorder = MemoryRecorder()
    run = recorder.start_run(RunSnapshot(code_version="t", input=INPUT), agent_id="a")
    request = {
        "model": "gpt-test",
        "messages": [{"role": "user", "content": "hi there"}],
        "temperature": 0.2,
        "seed": 7,
    }

    def broken(_: Any) -> Any:
        raise ProxyExploded("proxy exploded")

    with pytest.raises(ProxyExploded, match="proxy exploded"):
        run.llm(broken, request, provider="openai", model="gpt-test")
    with pytest.raises(RecordedError, match="proxy exploded") as raised:
        chat_agent(capture_openai(offline, ReplayRun(recorder.events)), [])
    assert raised.value.type_name.endswith("<locals>.ProxyExploded")


def test_a_request_that_is_not_json_is_refused_before_sending(
    server: OpenAIServer, client: openai.OpenAI
) -> None:
    recorder = MemoryRecorder()
    run = recorder.start_run(RunSnapshot(code_version="t"), agent_id="a")
    llm = capture_openai(client, run)
    # The SDK itself refuses a body it cannot write as JSON, before its transport (and
    # so the capture) sees a request: its own TypeError, as without capture.
    with pytest.raises(TypeError, match="not JSON serializable"):
        llm.chat.completions.create(
            model="gpt-test", messages=[{"role": "user", "content": object()}]
        )
    assert server.requests == []
    assert [e.event_type for e in recorder.events] == ["run.started"]


def test_a_call_the_recorder_refuses_is_a_400_the_sdk_does_not_retry(
    server: OpenAIServer,
) -> None:
    recorder = MemoryRecorder()
    run = recorder.start_run(RunSnapshot(code_version="t"), agent_id="a")
    run.finish(output=None)
    # Retries on: a 400 that says x-should-retry false is not sent again.
    with openai.OpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=3) as sdk:
        llm = capture_openai(sdk, run)  # bound to a run that takes no more events
        with pytest.raises(openai.BadRequestError) as refused:
            chat_agent(llm, [])
    assert refused.value.code == "RunNotActive"
    assert "is finished" in refused.value.message
    assert refused.value.response.headers["x-should-retry"] == "false"
    assert server.requests == []  # nothing was sent, not even once
    assert [e.event_type for e in recorder.events] == ["run.started", "run.finished"]


# Credentials ------------------------------------------------------------------------


def everything_agent(llm: openai.OpenAI, seen: list[Any]) -> Any:
    headers = {"x-tenant-secret": API_KEY, "Authorization": f"Bearer {API_KEY}"}
    outputs = [
        chat_agent(llm, seen),
        chat_stream_agent(llm, seen),
        responses_agent(llm, seen),
        responses_stream_agent(llm, seen),
        caught_error_agent("fail-400")(llm, seen),
    ]
    # Transport options go to the SDK but never into the record.
    tuned = llm.with_options(timeout=20.0)
    seen.append(
        tuned.chat.completions.create(
            model="gpt-test",
            messages=[{"role": "user", "content": "again"}],
            extra_headers=headers,
            extra_query={"key": API_KEY},
        )
    )
    return outputs


def test_no_credential_is_ever_recorded(
    server: OpenAIServer, client: openai.OpenAI, offline: openai.OpenAI
) -> None:
    recorded = record(everything_agent, client)

    # The key did travel: in the Authorization header of every request.
    assert all(r.headers["authorization"] == f"Bearer {API_KEY}" for r in server.requests)
    assert server.requests[-1].headers["x-tenant-secret"] == API_KEY
    codec, pipeline = EnvelopeCodec(), PayloadPipeline()
    # "bearer_token" is the name of a redaction rule run.started lists; a header is not.
    secrets = (API_KEY.encode(), b"Bearer ", b"bearer ")
    for envelope in recorded.events:
        stored = codec.encode(envelope)
        body = json.dumps(pipeline.unpack(envelope)).encode()
        attributes = json.dumps(envelope.attributes).encode()
        for data in (stored, envelope.payload or b"", body, attributes):
            assert not any(secret in data for secret in secrets), envelope.event_type
    assert len(recorded.llm_bodies()) == 6

    assert_replays(everything_agent, recorded, server=server, client=client, offline=offline)


# Async ------------------------------------------------------------------------------


async def async_agent(llm: openai.AsyncOpenAI, seen: list[Any]) -> Any:
    question = {"role": "user", "content": INPUT["question"]}
    completion = await llm.chat.completions.create(model="gpt-test", messages=[question])
    seen.append(completion)
    stream = await llm.chat.completions.create(
        model="gpt-test", messages=[question], stream=True, stream_options={"include_usage": True}
    )
    async with stream:
        chunks = [chunk async for chunk in stream]
    seen.append(chunks)
    response = await llm.responses.create(model="gpt-test", input=INPUT["question"])
    seen.append(response)
    events = [
        event
        async for event in await llm.responses.create(
            model="gpt-test", input=INPUT["question"], stream=True
        )
    ]
    seen.append(events)
    try:
        await llm.responses.create(model="fail-400", input="x")
    except openai.BadRequestError as exc:
        seen.append((type(exc), exc.status_code, exc.body))
    return [completion.choices[0].message.content, chunk_text(chunks), response.output_text]


def test_async_client_records_and_replays(server: OpenAIServer, closed_url: str) -> None:
    recorded = asyncio.run(record_async(async_agent, server.base_url))

    assert recorded.output == ["echo: hi there"] * 3
    assert isinstance(recorded.seen[0], ChatCompletion)
    assert isinstance(recorded.seen[2], Response)
    bodies = recorded.llm_bodies()
    assert [b["finish_reason"] for b in bodies] == ["stop", "stop", "stop", "stop", None]
    assert [json.loads(b["raw_response_json"] or "null") for b in bodies[:4]] == [
        server.sent[0],
        {"stream": server.sent[1]},
        server.sent[2],
        {"stream": server.sent[3]},
    ]
    assert bodies[4]["error"]["type"] == "BadRequestError"

    before = len(server.requests)
    for base_url in (server.base_url, closed_url):
        seen = asyncio.run(replay_async(async_agent, recorded.events, base_url))
        assert seen == recorded.seen
    assert len(server.requests) == before, "a replay sent a request"


def test_async_stream_is_an_async_iterator(server: OpenAIServer) -> None:
    async def agent(llm: openai.AsyncOpenAI, seen: list[Any]) -> Any:
        stream = await llm.chat.completions.create(
            model="gpt-test", messages=[{"role": "user", "content": "a b c"}], stream=True
        )
        first = await stream.__anext__()
        rest = [chunk async for chunk in stream]
        seen.append([first, *rest])
        return len(rest) + 1

    recorded = asyncio.run(record_async(agent, server.base_url))
    assert recorded.output == len(server.sent[0])


def test_a_stream_is_the_sdks_own_and_is_recorded_when_it_ends(
    server: OpenAIServer, client: openai.OpenAI
) -> None:
    recorder = MemoryRecorder()
    run = recorder.start_run(RunSnapshot(code_version="t"), agent_id="a")
    stream = capture_openai(client, run).chat.completions.create(
        model="gpt-test", messages=[{"role": "user", "content": "a b"}], stream=True
    )
    # The SDK's own Stream over the live response (no longer a recording read to its
    # end before the agent saw a chunk), with the response's headers.
    assert isinstance(stream, openai.Stream)
    assert stream.response.headers["x-request-id"] == REQUEST_ID
    assert [e.event_type for e in recorder.events] == ["run.started"]  # not ended yet
    chunks = list(stream)
    assert [c.model_dump(exclude_unset=True) for c in chunks] == server.sent[0]
    assert list(stream) == []  # it iterates once, as the SDK's streams do
    assert [e.event_type for e in recorder.events] == ["run.started", "llm.call"]
    (body,) = Recorded(recorder.events, None, []).llm_bodies()
    assert json.loads(body["raw_response_json"]) == {"stream": server.sent[0]}


def test_a_strictly_validating_client_replays_validated_objects(
    server: OpenAIServer, closed_url: str
) -> None:
    def strict(base_url: str) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=base_url, api_key=API_KEY, max_retries=0, _strict_response_validation=True
        )

    with strict(server.base_url) as live, strict(closed_url) as dead:
        recorded = record(responses_agent, live)
        assert replay(responses_agent, recorded.events, dead) == recorded.seen
        recorded = record(responses_stream_agent, live)
        assert replay(responses_stream_agent, recorded.events, dead) == recorded.seen
