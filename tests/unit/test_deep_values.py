"""A value nested deeper than MAX_VALUE_DEPTH is refused with NotSerialisable naming where,
by every walk over values, never a bare RecursionError; the recorder refuses such tool
arguments before the tool runs and records such a result as an unserialisable result."""

from __future__ import annotations

from typing import Any

import pytest

from agent_blackbox.outbox import AgentRun, MemoryRecorder, Redactor, RunSnapshot
from agent_blackbox.outbox._values import encode_value
from agent_blackbox.replayer import replay_run
from agent_blackbox.schemas import (
    MAX_VALUE_DEPTH,
    NotSerialisable,
    PayloadPipeline,
    canonical_json,
    canonical_text,
    deepest_path,
    digest,
    ordered_text,
)

DEEP = 3_000


def _nested(levels: int, *, kind: str = "dict") -> Any:
    value: Any = "bottom"
    for _ in range(levels):
        value = {"a": value} if kind == "dict" else [value]
    return value


@pytest.mark.parametrize("kind", ["dict", "list"])
@pytest.mark.parametrize(
    "walk",
    [canonical_json, digest, encode_value, lambda v: Redactor().redact(v)],
    ids=["canonical_json", "digest", "encode_value", "redact"],
)
def test_every_walk_refuses_a_deep_value_naming_the_path(kind: str, walk: Any) -> None:
    with pytest.raises(NotSerialisable, match=f"more than {MAX_VALUE_DEPTH} levels") as caught:
        walk(_nested(DEEP, kind=kind))
    assert caught.value.path.startswith("$.a.a" if kind == "dict" else "$[0][0]")
    assert len(str(caught.value)) < 400  # the path is shortened, never 3,000 levels long


def test_the_deepest_allowed_value_passes_every_walk() -> None:
    value = _nested(MAX_VALUE_DEPTH)
    assert canonical_json(value).count(b"{") == MAX_VALUE_DEPTH
    assert encode_value(value) == value
    assert Redactor().redact(value).value == value
    assert deepest_path(value) is None
    assert deepest_path(_nested(MAX_VALUE_DEPTH + 1)) == "$" + ".a" * MAX_VALUE_DEPTH


def test_deep_json_inside_a_string_is_scanned_as_text() -> None:
    text = "[" * 500 + '"mail bob@example.com"' + "]" * 500
    redacted = Redactor().redact({"arguments": text})
    assert "bob@example.com" not in redacted.value["arguments"]
    assert "email" in redacted.fired


def test_deep_tool_arguments_are_refused_before_the_tool_runs() -> None:
    ran: list[Any] = []

    def agent(run: AgentRun, _: Any) -> str:
        try:
            run.call("search", lambda query: ran.append(query), _nested(DEEP))
        except NotSerialisable as exc:
            return str(exc)
        return "not refused"

    recorder = MemoryRecorder()
    _, said = recorder.record(agent, RunSnapshot(code_version="deep"), agent_id="deep")
    assert ran == []
    assert f"more than {MAX_VALUE_DEPTH} levels" in said
    assert said.startswith("search.arguments.args[0].a.a")
    assert [e for e in recorder.events if e.event_type == "tool.call"] == []


@pytest.mark.parametrize(
    ("result", "where"),
    [
        ({"rows": _nested(DEEP)}, "lookup.result.rows.a.a"),
        ({"v": "a\ud800b"}, "lookup.result.v: a text holds a lone surrogate (U+D800)"),
        ({"k\udc00": 1}, "lookup.result.<key>: a text holds a lone surrogate (U+DC00)"),
        (["ok", ("x", "\udfff")], "lookup.result[1][1]: a text holds a lone surrogate"),
    ],
    ids=["too-deep", "surrogate", "surrogate-key", "surrogate-in-tuple"],
)
def test_a_tool_result_that_cannot_be_recorded_is_recorded_as_its_error_and_replays(
    result: Any, where: str
) -> None:
    """Too deep, or a text that is not Unicode (a lone surrogate: a model's or a
    service's JSON may decode to one, and it has no UTF-8): the result is refused naming
    where, recorded as the tool's error (``unserialisable_result``), and replayed."""
    caught: list[NotSerialisable] = []

    def agent(run: AgentRun, _: Any) -> str:
        try:
            run.call("lookup", lambda: result)
        except NotSerialisable as exc:
            caught.append(exc)
        return "done"

    recorder = MemoryRecorder()
    recorder.record(agent, RunSnapshot(code_version="u"), agent_id="u")
    [tool] = [e for e in recorder.events if e.event_type == "tool.call"]
    body = PayloadPipeline().unpack(tool)
    assert body["result_json"] is None
    assert body["error"]["kind"] == "unserialisable_result"
    assert where in str(caught[0])
    if "surrogate" in where:
        assert "encode('utf-8', 'replace')" in str(caught[0])
    assert replay_run(list(recorder.events), agent).passed
    assert str(caught[1]) == str(caught[0])


@pytest.mark.parametrize("handled", [True, False], ids=["handled", "ends-the-run"])
@pytest.mark.parametrize(
    ("content", "where"),
    [
        ("a\ud800b", "llm.response.choices[0].message.content: a text holds a lone surrogate"),
        (_nested(DEEP), "llm.response.choices[0].message.content.a.a"),
    ],
    ids=["surrogate", "too-deep"],
)
def test_a_model_response_that_cannot_be_recorded_is_recorded_as_the_calls_error_and_replays(
    content: Any, where: str, handled: bool
) -> None:
    """A model's JSON may decode to a text with a lone surrogate: the response is refused
    naming where, the llm.call recorded with that error and raised to the code, and the
    run replays whether the code handles it or ends on it."""
    caught: list[NotSerialisable] = []

    def send(_: Any) -> dict[str, Any]:
        message = {"role": "assistant", "content": content}
        return {"id": "r", "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}

    def agent(run: AgentRun, _: Any) -> str:
        request = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
        try:
            run.llm(send, request, provider="openai")
        except NotSerialisable as exc:
            caught.append(exc)
            if not handled:
                raise
        return "done"

    recorder = MemoryRecorder()
    if handled:
        recorder.record(agent, RunSnapshot(code_version="u"), agent_id="u")
    else:
        with pytest.raises(NotSerialisable):
            recorder.record(agent, RunSnapshot(code_version="u"), agent_id="u")
    kinds = [e.event_type for e in recorder.events]
    assert kinds == ["run.started", "llm.call", "run.finished"]
    body = PayloadPipeline().unpack(recorder.events[1])
    assert body["raw_response_json"] is None
    assert body["error"]["type"] == "NotSerialisable"
    assert body["error"]["kind"] == "unserialisable_result"
    assert where in str(caught[0])
    report = replay_run(list(recorder.events), agent)
    assert report.passed, report.divergence
    assert str(caught[1]) == str(caught[0])


@pytest.mark.parametrize("write", [ordered_text, canonical_text], ids=["ordered", "canonical"])
def test_a_json_text_of_a_value_that_is_not_unicode_is_refused_naming_where(
    write: Any,
) -> None:
    with pytest.raises(NotSerialisable, match=r"^llm\.response\.choices\[0\]\.content: a text"):
        write({"choices": [{"content": "x\ud800"}]}, path="llm.response")
    assert write({"a": "ünïcode ✓"}) == '{"a":"ünïcode ✓"}'
