"""A run's LLM calls as a conversation, over each provider shape the recorder writes:
Chat Completions (plain, with tool calls, streamed), Responses with function calls,
Anthropic Messages with tool_use and tool_result (plain and streamed); JSON inside
content pretty-printed; the answer once; hostile text escaped on the page."""

from __future__ import annotations

import json
from typing import Any

from agent_blackbox.console._conversation import (
    Exchange,
    Opened,
    Part,
    ToolRun,
    Withheld,
    conversation,
    exchange,
)
from agent_blackbox.console._templates import page_templates

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}


def _body(request: dict[str, Any], response: Any, **extra: Any) -> dict[str, Any]:
    """An llm.call body as the console gets it (readable: the raw JSON parsed)."""
    return {
        "provider": extra.pop("provider", "openai"),
        "model": request.get("model", "m"),
        "raw_request": request,
        "raw_response": response,
        "error": None,
        **extra,
    }


def _roles(made: Exchange) -> list[str]:
    return [t.role for t in made.turns]


def _chat(message: dict[str, Any], finish: str = "stop") -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    }


def test_a_chat_completion_is_system_user_and_the_answer_once() -> None:
    request = {
        "model": "gpt-test",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "hi there"}]},
        ],
    }
    made = exchange(4, _body(request, _chat({"role": "assistant", "content": "echo: hi"})))
    assert made.api == "chat completions"
    assert _roles(made) == ["system", "user"]
    assert made.turns[0].parts == (Part("text", "Be brief."),)
    assert made.turns[1].parts == (Part("text", "hi there"),)
    assert len(made.answer) == 1  # one answer: not the choices, the raw and the parsed
    assert made.answer[0].role == "assistant"
    assert made.answer[0].parts == (Part("text", "echo: hi"),)
    assert made.streamed is None
    assert json.loads(made.raw_request) == request


def test_chat_tool_calls_keep_their_arguments_and_results_name_their_call() -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
    }
    asked = {"role": "assistant", "content": None, "tool_calls": [call]}
    request = {
        "model": "gpt-test",
        "tools": [WEATHER],
        "messages": [
            {"role": "user", "content": "weather in Oslo"},
            asked,
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ],
    }
    made = exchange(6, _body(request, _chat({"role": "assistant", "content": "It is sunny."})))
    assert _roles(made) == ["user", "assistant", "tool"]
    (sent,) = made.turns[1].tool_calls
    assert (sent.call_id, sent.name) == ("call_1", "get_weather")
    assert sent.arguments == Part("json", '{\n  "city": "Oslo"\n}')
    result = made.turns[2]
    assert (result.answers, result.tool, result.parts) == (
        "call_1",
        "get_weather",
        (Part("text", "sunny"),),
    )


def test_a_streamed_chat_answer_is_shown_assembled() -> None:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"id": "c", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    fragment = {"index": 0, "id": "call_9", "type": "function"}
    stream = [
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Let me"}),
        chunk({"content": " check."}),
        chunk({"tool_calls": [{**fragment, "function": {"name": "lookup", "arguments": ""}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"q":'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": ' "x"}'}}]}, "tool_calls"),
    ]
    request = {"model": "gpt-test", "stream": True, "messages": [{"role": "user", "content": "x"}]}
    made = exchange(3, _body(request, {"stream": stream}))
    assert made.streamed == 6
    (answer,) = made.answer
    assert answer.parts == (Part("text", "Let me check."),)
    assert [(c.call_id, c.name) for c in answer.tool_calls] == [("call_9", "lookup")]
    assert answer.tool_calls[0].arguments == Part("json", '{\n  "q": "x"\n}')
    assert '"stream"' in made.raw_response  # the raw events stay one click away


def test_responses_with_function_calls_and_their_outputs() -> None:
    request = {
        "model": "gpt-test",
        "instructions": "You answer weather questions.",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Oslo and Rome?"}]},
            {
                "type": "function_call",
                "call_id": "fc_1",
                "name": "get_weather",
                "arguments": '{"city":"Oslo"}',
            },
            {
                "type": "function_call",
                "call_id": "fc_2",
                "name": "get_weather",
                "arguments": '{"city":"Rome"}',
            },
            {"type": "function_call_output", "call_id": "fc_1", "output": "sunny"},
            {"type": "function_call_output", "call_id": "fc_2", "output": '{"sky": "rain"}'},
        ],
    }
    response = {
        "id": "resp_1",
        "object": "response",
        "status": "completed",
        "output": [
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Oslo sunny, Rome rain."}],
            }
        ],
    }
    made = exchange(5, _body(request, response))
    assert made.api == "responses"
    assert _roles(made) == ["system", "user", "assistant", "tool", "tool"]
    assert made.turns[0].label == "instructions"
    # Two function call items in a row are one assistant turn asking for both.
    assert [c.call_id for c in made.turns[2].tool_calls] == ["fc_1", "fc_2"]
    assert [(t.answers, t.tool) for t in made.turns[3:]] == [
        ("fc_1", "get_weather"),
        ("fc_2", "get_weather"),
    ]
    assert made.turns[4].parts == (Part("json", '{\n  "sky": "rain"\n}'),)
    assert made.answer[0].parts == (Part("text", "Oslo sunny, Rome rain."),)


def test_a_responses_function_call_answer_and_a_streamed_one() -> None:
    final = {
        "id": "resp_2",
        "object": "response",
        "status": "completed",
        "output": [
            {"type": "function_call", "call_id": "fc_3", "name": "lookup", "arguments": "{}"}
        ],
    }
    request = {
        "model": "gpt-test",
        "input": "find it",
        "stream": True,
        "previous_response_id": "r0",
    }
    events = [
        {"type": "response.created", "response": {**final, "status": "in_progress", "output": []}},
        {"type": "response.completed", "response": final},
    ]
    made = exchange(2, _body(request, {"stream": events}))
    assert made.api == "responses"
    assert made.turns[0].parts == (Part("text", "find it"),)
    assert made.streamed == 2
    assert [(c.call_id, c.name) for c in made.answer[0].tool_calls] == [("fc_3", "lookup")]
    assert made.notes == ("continues the stored response r0",)


def test_anthropic_tool_use_and_tool_result_blocks() -> None:
    request = {
        "model": "claude-test",
        "system": [{"type": "text", "text": "Be brief."}],
        "messages": [
            {"role": "user", "content": "weather in city=Oslo"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Let me look that up."},
                    {
                        "type": "tool_use",
                        "id": "toolu_01",
                        "name": "get_weather",
                        "input": {"city": "Oslo"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_01",
                        "content": "no such city",
                        "is_error": True,
                    },
                    {"type": "text", "text": "try again"},
                ],
            },
        ],
    }
    response = {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": "Sorry."}],
        "stop_reason": "end_turn",
    }
    made = exchange(7, _body(request, response, provider="anthropic"))
    assert made.api == "messages"
    assert _roles(made) == ["system", "user", "assistant", "tool", "user"]
    assert made.turns[2].parts == (Part("text", "Let me look that up."),)
    assert made.turns[2].tool_calls[0].arguments == Part("json", '{\n  "city": "Oslo"\n}')
    result = made.turns[3]
    assert (result.answers, result.tool, result.error) == ("toolu_01", "get_weather", True)
    assert made.turns[4].parts == (Part("text", "try again"),)
    assert made.answer[0].parts == (Part("text", "Sorry."),)


def test_an_anthropic_stream_is_shown_assembled_with_its_tool_use() -> None:
    block = {"type": "tool_use", "id": "toolu_02", "name": "get_weather", "input": {}}
    stream = [
        {"type": "message_start", "message": {"id": "m", "role": "assistant", "content": []}},
        {"type": "ping"},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "On"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": " it"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": block},
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": '{"city": '},
        },
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": '"Oslo"}'},
        },
        {"type": "content_block_stop", "index": 1},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"}},
        {"type": "message_stop"},
    ]
    request = {
        "model": "claude-test",
        "stream": True,
        "messages": [{"role": "user", "content": "x"}],
    }
    made = exchange(2, _body(request, {"stream": stream}, provider="anthropic"))
    assert made.streamed == len(stream)
    (answer,) = made.answer
    assert answer.parts == (Part("text", "On it"),)
    (call,) = answer.tool_calls
    assert (call.call_id, call.name) == ("toolu_02", "get_weather")
    assert call.arguments == Part("json", '{\n  "city": "Oslo"\n}')


def test_json_in_content_is_pretty_printed_and_other_text_is_not() -> None:
    request = {
        "model": "m",
        "messages": [
            {"role": "user", "content": ' {"order": 42, "items": [1, 2]} '},
            {"role": "user", "content": "{not json}"},
            {"role": "user", "content": "[1, 2] and more"},
        ],
    }
    made = exchange(2, _body(request, None))
    assert made.turns[0].parts == (
        Part("json", '{\n  "order": 42,\n  "items": [\n    1,\n    2\n  ]\n}'),
    )
    assert made.turns[1].parts == (Part("text", "{not json}"),)
    assert made.turns[2].parts == (Part("text", "[1, 2] and more"),)
    assert made.answer == ()


def test_a_failed_call_shows_its_error_and_no_answer() -> None:
    request = {"model": "gpt-test", "messages": [{"role": "user", "content": "x"}]}
    body = _body(request, None)
    body["error"] = {"type": "RateLimitError", "message": "slow down"}
    made = exchange(2, body)
    assert made.error == "RateLimitError: slow down"
    assert made.answer == ()


def test_images_are_notes_and_a_data_url_is_summarised() -> None:
    data = "data:image/png;base64," + "A" * 5000
    content = [{"type": "image_url", "image_url": {"url": data}}, {"type": "text", "text": "?"}]
    made = exchange(2, _body({"messages": [{"role": "user", "content": content}]}, None))
    note, text = made.turns[0].parts
    assert note.kind == "note"
    assert note.text.startswith("image: data:image/png;base64…")
    assert "5,022 characters" in note.text
    assert text == Part("text", "?")


def _tool_loop() -> list[Opened]:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
    }
    first = {"model": "m", "messages": [{"role": "user", "content": "Oslo?"}], "tools": [WEATHER]}
    asked = _chat({"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls")
    # The SDK sends the answer back its own way: compact arguments, extra fields.
    again = {**call, "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    second = {
        **first,
        "messages": [
            *first["messages"],
            {"role": "assistant", "content": None, "refusal": None, "tool_calls": [again]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ],
    }
    tool = {
        "tool": "get_weather",
        "arguments": {"tool": "get_weather", "args": [], "kwargs": {"city": "Oslo"}},
        "result": None,
        "error": {"type": "LookupError", "message": "the weather service is down"},
        "latency_ms": 2.5,
    }
    return [
        Opened(4, "llm.call", _body(second, _chat({"role": "assistant", "content": "Sunny."}))),
        Opened(2, "llm.call", _body(first, asked)),
        Opened(3, "tool.call", tool),
        Opened(5, "llm.call", None, "stored out of line (blob:x)"),
    ]


def test_a_run_is_its_calls_in_order_with_the_resent_turns_folded() -> None:
    items = conversation(_tool_loop())
    assert [type(i) for i in items] == [Exchange, ToolRun, Exchange, Withheld]
    first, tool, second, withheld = items
    assert isinstance(first, Exchange)
    assert isinstance(second, Exchange)
    assert first.folded == 0
    # Call 4 resends call 2's user turn and its answer: both folded, the tool result new.
    assert (second.folded, second.folded_from) == (2, 2)
    assert [t.role for t in second.turns[second.folded :]] == ["tool"]
    assert isinstance(tool, ToolRun)
    assert tool.error == "LookupError: the weather service is down"
    assert tool.result is None
    assert tool.arguments == Part("json", '{\n  "city": "Oslo"\n}')
    assert isinstance(withheld, Withheld)
    assert withheld.reason.startswith("stored out of line")


HOSTILE = '<script>window.__pwned = 1</script><img src=x onerror="alert(2)">\x1b[31m\u202e'


def test_hostile_text_in_every_place_is_escaped_on_the_page() -> None:
    request = {
        "model": HOSTILE,
        "messages": [
            {"role": HOSTILE, "content": HOSTILE},
            {"role": "user", "content": json.dumps({"k": HOSTILE})},
            {"role": "tool", "tool_call_id": HOSTILE, "content": HOSTILE},
        ],
    }
    call = {"id": HOSTILE, "type": "function", "function": {"name": HOSTILE, "arguments": HOSTILE}}
    answer = _chat({"role": "assistant", "content": HOSTILE, "tool_calls": [call]})
    opened = [
        Opened(2, "llm.call", _body(request, answer, provider=HOSTILE)),
        Opened(3, "tool.call", {"tool": HOSTILE, "arguments": HOSTILE, "error": {"type": HOSTILE}}),
        Opened(4, "llm.call", None, HOSTILE),
    ]
    page = (
        page_templates()
        .get_template("conversation.html")
        .render(items=conversation(opened), base="/runs/r")
    )
    assert "<script" not in page
    assert "<img" not in page
    assert "&lt;script&gt;window.__pwned = 1&lt;/script&gt;" in page
    assert "onerror=&#34;alert(2)&#34;" in page
    assert "\x1b" not in page
    assert "\u202e" not in page
    assert "\\x1b[31m" in page
    assert "\\u202e" in page
    assert page.count('class="turn') >= 6


def test_an_anthropic_answers_thinking_is_shown_before_its_text() -> None:
    request = {"model": "claude-test", "messages": [{"role": "user", "content": "x"}]}
    whole = {
        "type": "message",
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "the user wants x", "signature": "s"},
            {"type": "text", "text": "Here is x"},
        ],
        "stop_reason": "end_turn",
    }
    (answer,) = exchange(2, _body(request, whole, provider="anthropic")).answer
    assert answer.parts == (Part("thinking", "the user wants x"), Part("text", "Here is x"))
    thinking = {"type": "thinking", "thinking": ""}
    stream = [
        {"type": "message_start", "message": {"id": "m", "role": "assistant", "content": []}},
        {"type": "content_block_start", "index": 0, "content_block": thinking},
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "thinking_delta", "thinking": "wants"},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "thinking_delta", "thinking": " x"},
        },
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "x!"}},
        {"type": "content_block_stop", "index": 1},
        {"type": "message_stop"},
    ]
    (answer,) = exchange(3, _body(request, {"stream": stream}, provider="anthropic")).answer
    assert answer.parts == (Part("thinking", "wants x"), Part("text", "x!"))
