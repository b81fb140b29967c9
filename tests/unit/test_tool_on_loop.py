"""A sync tool the agent calls on the event loop of an async run is appended by a task
of its own; the run's finish waits for it, also when the agent awaited nothing after it
(the tool was its last act), and so does the next crossing, also one that appends
without yielding to the loop: the events are in the order the code began them, which
replay follows."""

from __future__ import annotations

import asyncio
from typing import Any

import agent_blackbox as bb
from agent_blackbox.outbox import AsyncMemoryRecorder, RunSnapshot
from agent_blackbox.replayer import replay_run


@bb.tool
def lookup(city: str) -> str:
    return f"{city}: clear"


async def last_act(run: Any, city: str) -> str:
    return lookup(city)


async def then_awaits(run: Any, city: str) -> str:
    found = lookup(city)
    await asyncio.sleep(0)
    return found


@bb.tool
async def forecast(city: str) -> str:
    return f"{city}: rain tomorrow"


async def then_crosses(run: Any, city: str) -> list[str]:
    found = lookup(city)  # appended by a task of its own
    later = await forecast(city)  # appends into memory without yielding to the loop
    return [found, later]


def recorded_types(entry: Any) -> tuple[list[str], Any]:
    types, output, _ = recorded(entry)
    return types, output


def recorded(entry: Any) -> tuple[list[str], Any, list[Any]]:
    async def record() -> tuple[list[str], Any, list[Any]]:
        recorder = AsyncMemoryRecorder()
        snapshot = RunSnapshot(code_version="tools/1", input="Oslo")
        run, output = await recorder.record(entry, snapshot, agent_id="tools")
        assert run.core.unreported is None
        events = [e for e in recorder.events if e.run_id == run.run_id]
        return [str(e.event_type) for e in events], output, events

    return asyncio.run(record())


def test_a_sync_tool_called_last_on_the_loop_is_recorded_before_run_finished() -> None:
    types, output = recorded_types(last_act)
    assert output == "Oslo: clear"
    assert types == ["run.started", "tool.call", "run.finished"]


def test_a_sync_tool_followed_by_an_await_is_recorded_in_its_place() -> None:
    types, _ = recorded_types(then_awaits)
    assert types == ["run.started", "tool.call", "run.finished"]


def test_a_sync_tool_on_the_loop_is_recorded_before_the_next_crossing_and_replays() -> None:
    types, output, events = recorded(then_crosses)
    assert output == ["Oslo: clear", "Oslo: rain tomorrow"]
    assert types == ["run.started", "tool.call", "tool.call", "run.finished"]
    assert [e.attributes.get("tool") for e in events[1:3]] == ["lookup", "forecast"]
    assert all("started" not in e.attributes for e in events)  # began in sequence order
    report = replay_run(events, then_crosses)
    assert report.passed, report.divergence and report.divergence.describe()
