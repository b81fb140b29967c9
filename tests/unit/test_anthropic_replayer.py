"""The replayer's reading of Anthropic calls, without services: the chat export, the fork
diff's summary, and re-execution's routing of a call to an endpoint of its own or the
other API (only through a request mapper)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest

from agent_blackbox.outbox import AgentRun, MemoryRecorder, RunSnapshot
from agent_blackbox.replayer import chat_examples, reexecute
from agent_blackbox.replayer._reexecute import (
    Endpoint,
    ReexecuteSetupError,
    check_routes,
    load_request_mapper,
)
from agent_blackbox.schemas import Envelope, PayloadPipeline

SYSTEM = "You answer weather questions."
TOOL = {
    "name": "weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
USAGE = {"input_tokens": 10, "output_tokens": 4, "cache_read_input_tokens": 0}


def reply(*content: dict[str, Any], stop: str = "end_turn") -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": list(content),
        "stop_reason": stop,
        "usage": USAGE,
    }


USE = {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Oslo"}}
SUNNY = {"type": "text", "text": "Sunny."}


def _record(agent: Any) -> list[Envelope]:
    recorder = MemoryRecorder()
    recorder.record(agent, RunSnapshot(code_version="a.1", input={}), agent_id="claude")
    return list(recorder.events)


def tool_agent(run: AgentRun, input: Any) -> Any:
    question = {"role": "user", "content": "Oslo?"}
    first = {"model": "claude-test", "max_tokens": 50, "system": SYSTEM, "tools": [TOOL]}
    first["messages"] = [question]
    run.llm(lambda _: reply({"type": "thinking", "thinking": "hm"}, USE, stop="tool_use"),
            first, provider="anthropic")  # fmt: skip
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}
    second = {
        **first,
        "messages": [
            question,
            {"role": "assistant", "content": [USE]},
            {"role": "user", "content": [result]},
        ],
    }
    run.llm(lambda _: reply(SUNNY), second, provider="anthropic")
    return "done"


# The chat export ------------------------------------------------------------------------


def test_an_anthropic_conversation_becomes_one_chat_example() -> None:
    [example] = chat_examples(_record(tool_agent), PayloadPipeline())
    call = {
        "id": "toolu_1",
        "type": "function",
        "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
    }
    assert example["messages"] == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Oslo?"},
        {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
        {"role": "assistant", "content": "Sunny."},
    ]
    function = {"name": "weather", "parameters": TOOL["input_schema"]}
    function["description"] = TOOL["description"]
    assert example["tools"] == [{"type": "function", "function": function}]
    metadata = example["metadata"]
    assert (metadata["api"], metadata["provider"], metadata["finish_reason"]) == (
        "anthropic.messages",
        "anthropic",
        "stop",
    )
    assert metadata["sequences"] == [2, 3]


def test_an_anthropic_call_with_an_image_or_a_server_tool_is_skipped_as_not_a_chat() -> None:
    image = {"type": "image", "source": {"type": "url", "url": "https://x.test/a.png"}}

    def agent(run: AgentRun, input: Any) -> Any:
        request = {
            "model": "c",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": [image]}],
        }
        run.llm(lambda _: reply(SUNNY), request, provider="anthropic")
        search = {"type": "web_search_20250305", "name": "web_search"}
        request = {"model": "c", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
        run.llm(lambda _: reply(SUNNY), {**request, "tools": [search]}, provider="anthropic")
        return None

    from agent_blackbox.replayer import ExportTally

    tally = ExportTally()
    assert list(chat_examples(_record(agent), PayloadPipeline(), tally=tally)) == []
    assert tally.skipped["not a chat"] == 2
    assert any("'image'" in p for p in tally.problems)
    assert any("web_search_20250305" in p for p in tally.problems)


# Re-execution routing -------------------------------------------------------------------


def _answer(request: Mapping[str, Any]) -> dict[str, Any]:
    """An Anthropic endpoint: a tool call for a question with tools, else the text."""
    asked = isinstance(request["messages"][-1]["content"], str)
    return reply(USE, stop="tool_use") if request.get("tools") and asked else reply(SUNNY)


def test_anthropic_calls_re_sent_to_an_anthropic_endpoint_compare_the_same() -> None:
    sent: list[Mapping[str, Any]] = []

    def send(request: Mapping[str, Any]) -> dict[str, Any]:
        sent.append(request)
        return _answer(request)

    diffs = reexecute(_record(tool_agent), Endpoint("anthropic", send))
    assert [d.same for d in diffs] == [True, True]
    assert "stream_options" not in sent[0]  # an OpenAI-only field is never added
    changed = reexecute(_record(tool_agent), Endpoint("anthropic", lambda r: reply(SUNNY)))
    assert set(changed[0].changed) == {"text", "finish_reason", "tool_calls"}


def openai_to_anthropic(request: Mapping[str, Any]) -> dict[str, Any]:
    """A request mapper, as a user writes one: a chat request as a Messages request."""
    system = [m["content"] for m in request["messages"] if m["role"] == "system"]
    turns = [m for m in request["messages"] if m["role"] != "system"]
    return {
        "model": "claude-test",
        "max_tokens": 50,
        "system": "\n".join(system),
        "messages": turns,
    }


def openai_agent(run: AgentRun, input: Any) -> Any:
    request = {"model": "gpt", "messages": [{"role": "user", "content": "Oslo?"}]}
    answer = {
        "id": "c",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Sunny."},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14},
    }  # fmt: skip
    return run.llm(lambda _: answer, request, provider="openai")["id"]


def test_an_openai_call_goes_to_an_anthropic_endpoint_only_through_a_mapper() -> None:
    events = _record(openai_agent)
    endpoint = Endpoint("anthropic", _answer)
    with pytest.raises(ReexecuteSetupError) as refused:
        check_routes(events, endpoint)
    message = str(refused.value)
    assert "provider 'openai'" in message
    assert "anthropic API" in message
    assert "--request-mapper" in message
    with pytest.raises(ReexecuteSetupError):
        reexecute(events, endpoint)  # never reported as a changed answer

    check_routes(events, endpoint, request_mapper=openai_to_anthropic)
    [diff] = reexecute(events, endpoint, request_mapper=openai_to_anthropic)
    assert diff.same, diff.to_dict()  # the same text, finish reason and usage


def test_endpoints_by_api_take_each_call_of_their_own_api() -> None:
    events = _record(openai_agent) + _record(tool_agent)
    with pytest.raises(ReexecuteSetupError, match="no endpoint speaks that API"):
        check_routes(events, {"openai": Endpoint("openai", _answer), "x": Endpoint("x", _answer)})
    seen: list[str] = []

    def by(api: str) -> Endpoint:
        def send(request: Mapping[str, Any]) -> dict[str, Any]:
            seen.append(api)
            return _answer(request) if api == "anthropic" else {"choices": []}

        return Endpoint(api, send)

    reexecute(events, {"openai": by("openai"), "anthropic": by("anthropic")})
    assert seen == ["openai", "anthropic", "anthropic"]


def test_a_mapper_that_fails_or_returns_no_mapping_is_a_setup_error() -> None:
    events = _record(openai_agent)
    endpoint = Endpoint("anthropic", _answer)

    def broken(request: Mapping[str, Any]) -> Any:
        raise KeyError("max_tokens")

    with pytest.raises(ReexecuteSetupError, match="mapper failed on call 2: KeyError"):
        reexecute(events, endpoint, request_mapper=broken)
    with pytest.raises(ReexecuteSetupError, match="returned a str"):
        reexecute(events, endpoint, request_mapper=lambda r: json.dumps(r))
    with pytest.raises(ReexecuteSetupError, match=r"request mapper: .*module:function"):
        load_request_mapper("no-colon")
    assert load_request_mapper(f"{__name__}:openai_to_anthropic") is openai_to_anthropic
