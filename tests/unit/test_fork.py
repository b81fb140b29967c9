"""Forks and re-execution, recorded in memory with a local stand-in model."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agent_blackbox.examples.ticket_agent import (
    KeywordModel,
    Notifier,
    OfflineModel,
    OfflineNotifier,
    OfflineTickets,
    TicketAgent,
    replay_entry,
    sample_tickets,
)
from agent_blackbox.outbox import MemoryRecorder, RunSnapshot
from agent_blackbox.replayer import (
    ForkError,
    ReexecuteSetupError,
    endpoints_for,
    fork_diff,
    fork_replay_entry,
    fork_run,
    reexecute,
    replay_run,
)
from agent_blackbox.schemas import EventType, PayloadPipeline


class _CountingModel(KeywordModel):
    def __init__(self) -> None:
        super().__init__()
        self.requests: list[dict[str, Any]] = []

    def complete(self, request: Any) -> dict[str, Any]:
        self.requests.append(dict(request))
        return super().complete(request)


def _parent() -> tuple[MemoryRecorder, str]:
    recorder = MemoryRecorder()
    agent = TicketAgent(sample_tickets(1), KeywordModel(), Notifier())
    run, _ = recorder.record(agent.run, agent.snapshot("T-00000"), agent_id="ticket-agent")
    return recorder, run.run_id


def _body(envelope: Any) -> dict[str, Any]:
    return PayloadPipeline().unpack(envelope)


def test_fork_runs_from_the_parent_snapshot_with_changes_and_refuses_effects() -> None:
    parent, parent_id = _parent()
    model = _CountingModel()

    def factory(snapshot: RunSnapshot, *, base_url: str, api_key: str) -> Any:
        agent = TicketAgent.from_snapshot(
            snapshot, tickets=OfflineTickets(), model=model, notifier=OfflineNotifier()
        )
        return agent.run

    result = fork_run(
        parent.events,
        factory,
        changes={"model": "bigger-2", "prompt": "Be terse."},
        base_url="http://127.0.0.1:9",
        api_key="k",
    )
    assert result.parent_run_id == parent_id
    assert result.run_id != parent_id
    # The notification was refused, so the agent failed there, and says so.
    assert result.status == "failed"
    assert result.error is not None
    assert "refused" in result.error
    started = _body(result.events[0])
    assert started["parent_run_id"] == parent_id
    assert started["changes"] == {"model": "bigger-2", "prompt": "Be terse."}
    assert started["model_ids"] == ["bigger-2"]
    # The model was called for real, with the changed model and prompt.
    assert [r["model"] for r in model.requests] == ["bigger-2"]
    assert model.requests[0]["messages"][0]["content"] == "Be terse."
    # The ticket came from the parent's recording: the offline ticket store was not called.
    types = [e.event_type for e in result.events]
    assert EventType.TOOL_CALL in types
    receipt = next(e for e in result.events if e.event_type == EventType.EFFECT_RECEIPT)
    assert receipt.attributes["status"] == "failed"


def test_fork_with_sandboxed_effects_completes_and_lists_them() -> None:
    parent, _ = _parent()

    def factory(snapshot: RunSnapshot, *, base_url: str, api_key: str) -> Any:
        return TicketAgent.from_snapshot(
            snapshot, tickets=OfflineTickets(), model=KeywordModel(), notifier=OfflineNotifier()
        ).run

    result = fork_run(
        parent.events,
        factory,
        changes={"flag.escalation": "off"},
        base_url="x",
        api_key="k",
        effects="sandbox",
    )
    assert result.status == "succeeded"
    assert [e["effect"] for e in result.sandboxed_effects] == ["send_notification"]
    assert _body(result.events[0])["flags"]["escalation"] == "off"


def test_reexecute_diffs_each_call_ignoring_ids_and_times() -> None:
    parent, _ = _parent()
    same = reexecute(
        parent.events,
        lambda request: {**KeywordModel().complete(request), "id": "other", "created": 1},
    )
    assert [d.same for d in same] == [True]

    def different(request: Any) -> dict[str, Any]:
        answer = KeywordModel().complete(request)
        answer["choices"][0]["message"]["content"] = json.dumps({"category": "outage"})
        answer["usage"]["completion_tokens"] = 99
        return answer

    [diff] = reexecute(parent.events, different)
    assert not diff.same
    assert set(diff.changed) == {"text", "usage"}
    assert diff.sequence == 4


# Tools of a fork: recorded, live, recorded then live ----------------------------------

CITIES = {"small-1": ["Paris", "Rome"], "large-2": ["Paris", "Oslo", "Rome"]}


class _Weather:
    """A live tool that remembers being called."""

    def __init__(self) -> None:
        self.called: list[str] = []

    def get(self, city: str) -> dict[str, Any]:
        self.called.append(city)
        return {"city": city, "temp_c": len(city) * 3}


def _planner(request: Any) -> dict[str, Any]:
    """A model whose plan (which cities to look up) depends on the model asked."""
    cities = CITIES[request["model"]]
    return {
        "id": f"plan-{request['model']}",
        "created": 1,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": json.dumps({"cities": cities})},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": len(cities), "total_tokens": 9},
    }


def _weather_entry(model_id: str, weather: _Weather) -> Any:
    def entry(run: Any, input: Any) -> dict[str, Any]:
        request = {"model": model_id, "messages": [{"role": "user", "content": input["q"]}]}
        reply = run.llm(_planner, request, provider="local")
        cities = json.loads(reply["choices"][0]["message"]["content"])["cities"]
        return {"model": model_id, "temps": [run.call("weather", weather.get, c) for c in cities]}

    return entry


def _weather_parent() -> MemoryRecorder:
    recorder = MemoryRecorder()
    snapshot = RunSnapshot(code_version="w/1", input={"q": "trip"}, model_ids=("small-1",))
    recorder.record(_weather_entry("small-1", _Weather()), snapshot, agent_id="weather")
    return recorder


def _weather_fork(tools: Any, model: str = "large-2") -> tuple[Any, _Weather]:
    weather = _Weather()

    def factory(snapshot: RunSnapshot, *, base_url: str, api_key: str) -> Any:
        return _weather_entry(snapshot.model_ids[0], weather)

    result = fork_run(
        _weather_parent().events,
        factory,
        changes={"model": model},
        base_url="x",
        api_key="k",
        tools=tools,
    )
    return result, weather


def test_recorded_tools_stop_at_the_first_call_the_parent_never_made() -> None:
    result, weather = _weather_fork("recorded")
    assert weather.called == []  # nothing live
    assert result.status == "failed"
    assert result.unrecorded_tool is not None
    assert "weather" in result.unrecorded_tool
    assert "--tools live" in result.unrecorded_tool
    assert "recorded-then-live" in result.unrecorded_tool
    assert [(u.arguments["args"], u.source) for u in result.tool_calls] == [
        (["Paris"], "recorded"),
        (["Oslo"], "unrecorded"),
    ]


def test_recorded_tools_answer_an_unchanged_fork_entirely_from_the_recording() -> None:
    result, weather = _weather_fork("recorded", model="small-1")
    assert (result.status, result.unrecorded_tool, weather.called) == ("succeeded", None, [])
    assert result.output == {
        "model": "small-1",
        "temps": [{"city": "Paris", "temp_c": 15}, {"city": "Rome", "temp_c": 12}],
    }


def test_live_tools_call_every_tool() -> None:
    result, weather = _weather_fork("live")
    assert result.status == "succeeded"
    assert weather.called == ["Paris", "Oslo", "Rome"]
    assert {u.source for u in result.tool_calls} == {"live"}


def test_recorded_then_live_goes_live_from_the_first_difference_on() -> None:
    result, weather = _weather_fork("recorded-then-live")
    assert result.status == "succeeded"
    # Paris is the parent's first call; Oslo differs; Rome was recorded, but after the
    # first difference the recording no longer describes the fork's world.
    assert weather.called == ["Oslo", "Rome"]
    assert [u.source for u in result.tool_calls] == ["recorded", "live", "live"]


def test_an_unknown_tool_mode_is_refused_before_anything_runs() -> None:
    with pytest.raises(ForkError, match="recorded-then-live"):
        _weather_fork("sometimes")


# The fork next to its parent ----------------------------------------------------------


def test_the_diff_shows_output_tool_and_llm_changes() -> None:
    parent = _weather_parent()
    result, _ = _weather_fork("live")
    diff = fork_diff(parent.events, result)
    assert not diff.same
    assert diff.status == ("succeeded", "succeeded")
    assert [c.path for c in diff.output_changes] == ["$.model", "$.temps"]
    first, second, third = diff.tool_calls
    assert first.same
    assert second.changed == ["arguments", "result"]
    assert (second.parent or {})["arguments"]["args"] == ["Rome"]
    assert (second.fork or {})["arguments"]["args"] == ["Oslo"]
    assert (third.parent, (third.fork or {}).get("source")) == (None, "live")
    [llm] = diff.llm_calls
    assert set(llm.changed) == {"model", "text", "usage"}
    document = json.loads(json.dumps(diff.to_dict()))
    assert document["output"]["changes"][0] == {
        "path": "$.model",
        "parent": "small-1",
        "fork": "large-2",
        "missing": None,
    }
    assert [p["same"] for p in document["tool_calls"]] == [True, False, False]


def test_an_unchanged_fork_shows_no_difference() -> None:
    parent = _weather_parent()
    result, _ = _weather_fork("recorded", model="small-1")
    diff = fork_diff(parent.events, result)
    assert diff.same, diff.to_dict()


# A fork replays with its changes ------------------------------------------------------


def _offline_factory(snapshot: RunSnapshot, *, base_url: str, api_key: str) -> Any:
    return TicketAgent.from_snapshot(
        snapshot, tickets=OfflineTickets(), model=OfflineModel(), notifier=OfflineNotifier()
    ).run


def _ticket_fork() -> Any:
    parent, _ = _parent()

    def factory(snapshot: RunSnapshot, *, base_url: str, api_key: str) -> Any:
        return TicketAgent.from_snapshot(
            snapshot, tickets=OfflineTickets(), model=KeywordModel(), notifier=OfflineNotifier()
        ).run

    return fork_run(
        parent.events,
        factory,
        changes={"model": "bigger-2", "prompt": "Be terse."},
        base_url="x",
        api_key="k",
        effects="sandbox",
    )


def test_a_fork_replays_through_its_factory_with_the_changes_it_was_recorded_with() -> None:
    fork = _ticket_fork()
    assert fork.status == "succeeded"
    # The agent's plain replay entry knows nothing of the fork's model and prompt.
    plain = replay_run(fork.events, replay_entry)
    assert not plain.passed
    report = replay_run(fork.events, fork_replay_entry(_offline_factory, runs=replay_entry))
    assert report.passed, report
    assert report.events == len(fork.events)


def test_runs_that_are_not_forks_replay_through_their_own_entry() -> None:
    parent, _ = _parent()
    calls: list[str] = []

    def counting(run: Any, input: Any) -> Any:
        calls.append(run.run_id)
        return replay_entry(run, input)

    report = replay_run(parent.events, fork_replay_entry(_offline_factory, runs=counting))
    assert report.passed
    assert len(calls) == 1
    # Without an entry of their own, they are built by the factory from their snapshot.
    assert replay_run(parent.events, fork_replay_entry(_offline_factory)).passed


def test_a_factory_that_cannot_build_the_agent_is_a_setup_error_not_a_divergence() -> None:
    fork = _ticket_fork()

    def broken(snapshot: RunSnapshot, *, base_url: str, api_key: str) -> Any:
        raise RuntimeError("no model client configured")

    report = replay_run(fork.events, fork_replay_entry(broken))
    assert report.divergence is None
    assert report.error is not None
    assert "no model client configured" in report.error
    assert fork.run_id in report.error


# Re-execution of streamed calls -------------------------------------------------------


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-9",
        "created": 5,
        "system_fingerprint": "fp_then",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def _stream(request: Any, *, call_city: str = "Paris") -> dict[str, Any]:
    """A streamed answer: some text, one tool call in two fragments, and usage when the
    request asked for it."""
    arguments = json.dumps({"city": call_city})
    start = {"index": 0, "id": "c1", "type": "function"}
    chunks = [
        _chunk({"role": "assistant", "content": "Looking"}),
        _chunk({"content": " it up"}),
        _chunk({"tool_calls": [{**start, "function": {"name": "get", "arguments": ""}}]}),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": arguments[:5]}}]}),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": arguments[5:]}}]}),
        _chunk({}, "tool_calls"),
    ]
    if (request.get("stream_options") or {}).get("include_usage"):
        usage = {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11}
        chunks.append({**_chunk({}), "choices": [], "usage": usage})
    return {"stream": chunks}


def _streamed_parent(*, include_usage: bool) -> MemoryRecorder:
    request: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    request["stream"] = True
    if include_usage:
        request["stream_options"] = {"include_usage": True}

    def entry(run: Any, input: Any) -> Any:
        return run.llm(_stream, request, provider="openai")["stream"][-1]

    recorder = MemoryRecorder()
    recorder.record(entry, RunSnapshot(code_version="s/1", input={}), agent_id="streamer")
    return recorder


def test_a_streamed_call_is_re_sent_streamed_and_usage_is_not_compared_when_not_recorded() -> None:
    sent: list[Any] = []

    def send(request: Any) -> dict[str, Any]:
        sent.append(request)
        answer = _stream(request)
        for chunk in answer["stream"]:  # what changes on every call is ignored
            chunk.update(id="chatcmpl-other", created=99, system_fingerprint="fp_now")
        return answer

    [diff] = reexecute(_streamed_parent(include_usage=False).events, send)
    assert diff.same, diff.to_dict()
    assert diff.streamed
    assert sent[0]["stream"] is True
    assert sent[0]["stream_options"] == {"include_usage": True}
    document = diff.to_dict()
    assert document["fields"]["usage"]["compared"] is False
    assert document["fields"]["usage"]["recorded"] is None
    assert document["fields"]["usage"]["now"] == {
        "prompt_tokens": 7,
        "completion_tokens": 4,
        "total_tokens": 11,
    }
    assert document["fields"]["text"] == {
        "recorded": ["Looking it up"],
        "now": ["Looking it up"],
        "compared": True,
        "same": True,
    }
    assert document["fields"]["tool_calls"]["now"] == [
        [{"name": "get", "arguments": {"city": "Paris"}}]
    ]


def test_recorded_stream_usage_is_compared_and_tool_call_arguments_parsed() -> None:
    parent = _streamed_parent(include_usage=True)
    [same] = reexecute(parent.events, _stream)
    assert same.same
    assert same.to_dict()["fields"]["usage"]["compared"] is True

    [moved] = reexecute(parent.events, lambda request: _stream(request, call_city="Oslo"))
    assert set(moved.changed) == {"tool_calls"}
    changed = moved.to_dict()["changed"]["tool_calls"]
    assert changed["recorded"] == [[{"name": "get", "arguments": {"city": "Paris"}}]]
    assert changed["now"] == [[{"name": "get", "arguments": {"city": "Oslo"}}]]


def test_an_endpoint_failure_is_reported_per_call() -> None:
    def down(request: Any) -> dict[str, Any]:
        raise ConnectionError("refused")

    [diff] = reexecute(_streamed_parent(include_usage=False).events, down)
    assert not diff.same
    assert diff.error == "ConnectionError: refused"
    assert diff.to_dict()["fields"] == {}


def test_a_call_answered_differently_over_the_run_gets_its_answers_in_order() -> None:
    """A status polled until done: the fork must see it done, not pending for ever."""
    answers = iter(["pending", "pending", "done"])

    def poll(run: Any, input: Any) -> int:
        polls = 1
        while run.call("status", lambda job: next(answers), "job-1") != "done":
            polls += 1
            if polls > 10:
                raise RuntimeError("still pending after 10 polls")
        return polls

    parent = MemoryRecorder()
    parent.record(poll, RunSnapshot(code_version="p/1", input={}), agent_id="poller")

    def factory(snapshot: RunSnapshot, *, base_url: str, api_key: str) -> Any:
        return poll

    result = fork_run(parent.events, factory, changes={}, base_url="x", api_key="k")
    assert (result.status, result.output) == ("succeeded", 3)
    assert [u.result for u in result.tool_calls] == ["pending", "pending", "done"]


def test_a_fork_of_a_fork_keeps_its_parents_changes() -> None:
    first = _ticket_fork()

    def factory(snapshot: RunSnapshot, *, base_url: str, api_key: str) -> Any:
        return TicketAgent.from_snapshot(
            snapshot, tickets=OfflineTickets(), model=KeywordModel(), notifier=OfflineNotifier()
        ).run

    second = fork_run(
        first.events,
        factory,
        changes={"model": "bigger-3"},
        base_url="x",
        api_key="k",
        effects="sandbox",
    )
    started = _body(second.events[0])
    assert started["parent_run_id"] == first.run_id
    assert started["changes"] == {"model": "bigger-3", "prompt": "Be terse."}
    assert started["model_ids"] == ["bigger-3"]


def test_a_call_that_fails_again_as_it_failed_when_recorded_is_the_same() -> None:
    def agent(run: Any, _: Any) -> Any:
        try:
            run.llm(_rate_limited, {"model": "m", "messages": []}, provider="openai")
        except TimeoutError:
            return "gave up"
        return "answered"

    recorder = MemoryRecorder()
    recorder.record(agent, RunSnapshot(code_version="c1"), agent_id="a")
    [again] = reexecute(recorder.events, _rate_limited)
    assert again.same
    assert (
        again.uncompared["text"] == "the call failed with TimeoutError when recorded, and again now"
    )
    [now_other] = reexecute(recorder.events, _refused)
    assert not now_other.same
    assert now_other.error == "PermissionError: refused"


def _rate_limited(request: Any) -> dict[str, Any]:
    raise TimeoutError("the model timed out")


def _refused(request: Any) -> dict[str, Any]:
    raise PermissionError("refused")


async def _weather(city: str) -> dict[str, Any]:
    return {"city": city, "temp_c": len(city) * 3}


def test_an_async_fork_is_awaited_and_its_async_live_tools_noted_with_their_results() -> None:
    parent = MemoryRecorder()
    parent.record(
        lambda run, _: run.call("weather", lambda city: {"city": city}, "Paris"),
        RunSnapshot("weather/1", {}),
        agent_id="weather",
    )

    async def agent(run: Any, input: Any) -> Any:
        return await run.call("weather", _weather, "Oslo")

    fork = fork_run(
        parent.events,
        lambda snapshot, **_: agent,
        changes={},
        base_url="http://model.invalid/v1",
        api_key="k",
        tools="live",
    )
    assert (fork.status, fork.output) == ("succeeded", {"city": "Oslo", "temp_c": 12})
    assert [(use.source, use.result) for use in fork.tool_calls] == [("live", fork.output)]
    assert fork.events[-1].attributes["status"] == "succeeded"


def _both_apis() -> list[Any]:
    recorder = MemoryRecorder()

    def agent(run: Any, _: Any) -> Any:
        chat = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}
        run.llm(lambda request: KeywordModel().complete(request), chat, provider="openai")
        run.llm(lambda request: {"content": []}, {"model": "claude"}, provider="anthropic")

    recorder.record(agent, RunSnapshot("both/1", {}), agent_id="both")
    return recorder.events


def test_endpoints_take_a_url_per_api_and_refuse_one_url_for_both() -> None:
    events = _both_apis()
    endpoints = endpoints_for(
        events,
        {"openai": "http://gpt.invalid/v1", "anthropic": "http://claude.invalid"},
        api_key="k",
    )
    assert {name: endpoint.api for name, endpoint in endpoints.items()} == {
        "anthropic": "anthropic",
        "openai": "openai",
    }
    with pytest.raises(ReexecuteSetupError, match="--base-url anthropic=URL --base-url openai=URL"):
        endpoints_for(events, "http://one.invalid/v1", api_key="k")
    with pytest.raises(ReexecuteSetupError, match="--base-url anthropic="):
        endpoints_for(events, {"openai": "http://gpt.invalid/v1"}, api_key="k")
    # One URL keeps its meaning for an endpoint of one API (the other's calls are mapped).
    [only] = endpoints_for(events, "http://claude.invalid", api_key="k", api="anthropic").values()
    assert only.api == "anthropic"
