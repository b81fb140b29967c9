"""``agent_blackbox.tool``: a function that records itself as a ``tool.call`` whenever it
runs inside a run, however it is called (sync or async, in a sync or an async run, from
a framework's executor thread), and that replay answers from the log without calling.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import openai
import pytest

import agent_blackbox as bb
from agent_blackbox.outbox import (
    AsyncMemoryRecorder,
    MemoryRecorder,
    RunSnapshot,
    UnrecordedCallWarning,
)
from agent_blackbox.replayer import replay_run
from agent_blackbox.schemas import Envelope, PayloadPipeline
from tests.integration.frameworks._harness import instrumented
from tests.unit._api_servers import ApiServer

pytestmark = pytest.mark.timeout(60)

CALLED: list[str] = []
"""The tools' real calls, in order (each test starts it empty)."""


@pytest.fixture(autouse=True)
def _calls() -> None:
    CALLED.clear()


class LookupFailed(Exception):
    """A tool's own error: comes back in replay as itself."""


@bb.tool
def weather(city: str, unit: str = "C") -> dict[str, Any]:
    """The weather in ``city``."""
    CALLED.append(f"weather {city}")
    if city == "Atlantis":
        raise LookupFailed(city)
    return {"city": city, "temp": len(city), "unit": unit}


@bb.tool(name="geo.lookup")
async def locate(city: str) -> list[float]:
    CALLED.append(f"locate {city}")
    await asyncio.sleep(0)
    return [float(len(city)), 1.5]


@bb.tool
def trip(city: str) -> dict[str, Any]:
    """A tool built on another: only this one's call is the run's."""
    CALLED.append(f"trip {city}")
    return {"weather": weather(city), "days": 3}


class RunContextWrapper:
    """A framework's context object, as the OpenAI Agents SDK names its own."""

    def __init__(self, secret: str) -> None:
        self.secret = secret


class Desk:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    @bb.tool(exclude=("api_key",))
    def ticket(self, ctx: RunContextWrapper, subject: str, api_key: str) -> str:
        CALLED.append(f"ticket {subject}")
        return f"{self.prefix}-{len(subject)}"


# Helpers --------------------------------------------------------------------------------


def record(entry: Callable[..., Any]) -> tuple[list[Envelope], Any]:
    recorder = MemoryRecorder()
    _, output = recorder.record(entry, RunSnapshot("t", {"city": "Oslo"}), agent_id="tools")
    return recorder.events, output


def record_async(entry: Callable[..., Any]) -> tuple[list[Envelope], Any]:
    async def main() -> tuple[list[Envelope], Any]:
        recorder = AsyncMemoryRecorder()
        _, output = await recorder.record(entry, RunSnapshot("t", {"city": "Oslo"}), agent_id="a")
        return recorder.events, output

    return asyncio.run(main())


def tool_calls(events: list[Envelope]) -> list[tuple[str, dict[str, Any]]]:
    """Each tool.call: its tool and the recorded keyword arguments."""
    pipeline = PayloadPipeline()
    found = []
    for envelope in events:
        if envelope.event_type == "tool.call":
            arguments = json.loads(pipeline.unpack(envelope)["arguments_json"])
            assert arguments["args"] == []  # every argument by its name
            found.append((envelope.attributes["tool"], arguments["kwargs"]))
    return found


def replays_without_calling(events: list[Envelope], entry: Callable[..., Any]) -> None:
    CALLED.clear()
    report = replay_run(events, entry)
    assert report.passed, report.divergence and report.divergence.describe()
    assert CALLED == [], "replay called a tool"


# Sync and async, in sync and async runs -------------------------------------------------


def sync_run(run: Any, given: Any) -> Any:
    found = [weather(given["city"]), weather(city=given["city"]), weather(given["city"], "C")]
    try:
        weather("Atlantis")
    except LookupFailed as exc:
        found.append(f"failed: {exc}")
    return found


def test_a_sync_tool_in_a_sync_run_records_its_arguments_by_name_and_replays() -> None:
    events, output = record(sync_run)
    assert output[3] == "failed: Atlantis"
    assert tool_calls(events) == [
        ("weather", {"city": "Oslo"}),
        ("weather", {"city": "Oslo"}),  # by keyword: the same input
        ("weather", {"city": "Oslo", "unit": "C"}),
        ("weather", {"city": "Atlantis"}),
    ]
    assert events[1].input_digest == events[2].input_digest
    error = PayloadPipeline().unpack(events[4])["error"]
    assert error["type"] == "LookupFailed"
    replays_without_calling(events, sync_run)


async def async_run(run: Any, given: Any) -> Any:
    here = await locate(given["city"])
    sync_here = weather(given["city"])  # a sync tool, called on the run's loop
    in_thread = await asyncio.to_thread(weather, "Bergen")  # a framework's executor
    both = await asyncio.gather(locate("Rome"), asyncio.to_thread(weather, "Lima"))
    return [here, sync_here, in_thread, *both]


def test_sync_and_async_tools_in_an_async_run_record_and_replay() -> None:
    events, output = record_async(async_run)
    assert output[0] == [4.0, 1.5]
    assert sorted(tool_calls(events), key=json.dumps) == sorted(
        [
            ("geo.lookup", {"city": "Oslo"}),
            ("weather", {"city": "Oslo"}),
            ("weather", {"city": "Bergen"}),
            ("geo.lookup", {"city": "Rome"}),
            ("weather", {"city": "Lima"}),
        ],
        key=json.dumps,
    )
    assert [e.event_type for e in events][-1] == "run.finished"
    replays_without_calling(events, async_run)


def async_tool_in_a_sync_run(run: Any, given: Any) -> Any:
    return asyncio.run(locate(given["city"]))  # a sync agent driving an async tool


def test_an_async_tool_in_a_sync_run_records_and_replays() -> None:
    events, output = record(async_tool_in_a_sync_run)
    assert output == [4.0, 1.5]
    assert tool_calls(events) == [("geo.lookup", {"city": "Oslo"})]
    replays_without_calling(events, async_tool_in_a_sync_run)


# What is recorded of a call ---------------------------------------------------------------


def nested_run(run: Any, given: Any) -> Any:
    return trip(given["city"])


def test_a_tool_calling_a_tool_records_only_the_outer_call() -> None:
    events, output = record(nested_run)
    assert output == {"weather": {"city": "Oslo", "temp": 4, "unit": "C"}, "days": 3}
    assert CALLED == ["trip Oslo", "weather Oslo"]
    assert tool_calls(events) == [("trip", {"city": "Oslo"})]  # the inner is its work
    replays_without_calling(events, nested_run)


def desk_run(run: Any, given: Any) -> Any:
    context = RunContextWrapper(secret="context-secret-1")
    return Desk("T").ticket(context, subject=given["city"], api_key="sk-excluded-1")


def test_self_context_objects_and_excluded_parameters_are_left_out() -> None:
    events, output = record(desk_run)
    assert output == "T-4"
    assert tool_calls(events) == [("ticket", {"subject": "Oslo"})]
    stored = json.dumps([PayloadPipeline().unpack(e) for e in events])
    assert "context-secret-1" not in stored
    assert "sk-excluded-1" not in stored
    replays_without_calling(events, desk_run)


def test_a_tool_keeps_its_name_signature_and_docstring_for_frameworks() -> None:
    assert weather.__name__ == "weather"
    assert weather.__doc__ == "The weather in ``city``."
    assert list(inspect.signature(weather).parameters) == ["city", "unit"]
    assert asyncio.iscoroutinefunction(locate)


def test_outside_any_run_a_tool_is_a_plain_call() -> None:
    assert weather("Oslo") == {"city": "Oslo", "temp": 4, "unit": "C"}
    assert asyncio.run(locate("Oslo")) == [4.0, 1.5]
    assert CALLED == ["weather Oslo", "locate Oslo"]


@dataclass
class Briefing:
    """A tool that asks a model itself: its LLM call is the tool's own work."""

    llm: openai.OpenAI

    @bb.tool(name="brief")
    def __call__(self, city: str) -> str:
        CALLED.append(f"brief {city}")
        reply = self.llm.chat.completions.create(
            model="gpt-test", messages=[{"role": "user", "content": city}]
        )
        return reply.choices[0].message.content or ""


def test_a_model_call_inside_a_tool_is_the_tools_and_not_recorded_twice() -> None:
    with ApiServer() as server, instrumented():
        brief = Briefing(openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0))

        def entry(run: Any, given: Any) -> str:
            return brief(given["city"])

        events, output = record(entry)
        assert output == "echo: Oslo"
        assert [e.event_type for e in events] == ["run.started", "tool.call", "run.finished"]
        replays_without_calling(events, entry)
        assert len(server.requests) == 1  # replay asked neither the tool nor the model


def test_a_tool_in_a_thread_without_the_runs_context_is_said_and_never_run_by_replay() -> None:
    """A pool thread does not carry the run's context: recording says the tool went
    unrecorded, and replay refuses to run it for real; a copy of the context records it."""
    sent: list[int] = []

    @bb.tool
    def send_mail(i: int) -> dict[str, int]:
        sent.append(i)
        return {"sent": i}

    def agent(run: Any, n: int) -> list[int]:
        with ThreadPoolExecutor(2) as pool:
            return [r["sent"] for r in pool.map(send_mail, range(n))]

    recorder = MemoryRecorder()
    with pytest.warns(UnrecordedCallWarning, match="'send_mail' was called where no run"):
        recorder.record(agent, RunSnapshot(code_version="t", input=2), agent_id="pool")
    assert sent == [0, 1]
    assert not any(e.event_type == "tool.call" for e in recorder.events)
    report = replay_run(recorder.events, agent)
    assert not report.passed
    assert sent == [0, 1]  # replay ran no tool for real

    def carried(run: Any, n: int) -> list[int]:
        with ThreadPoolExecutor(2) as pool:
            calls = [pool.submit(contextvars.copy_context().run, send_mail, i) for i in range(n)]
            return [call.result()["sent"] for call in calls]

    recorder = MemoryRecorder()
    recorder.record(carried, RunSnapshot(code_version="t", input=2), agent_id="pool")
    assert sum(e.event_type == "tool.call" for e in recorder.events) == 2
    assert replay_run(recorder.events, carried).passed
    assert sent == [0, 1, 0, 1]
