"""A sync tool the agent calls on the event loop of an async run is appended by a task
of its own; the run's finish waits for it, also when the agent awaited nothing after it
(the tool was its last act)."""

from __future__ import annotations

import asyncio
from typing import Any

import agent_blackbox as bb
from agent_blackbox.outbox import AsyncMemoryRecorder, RunSnapshot


@bb.tool
def lookup(city: str) -> str:
    return f"{city}: clear"


async def last_act(run: Any, city: str) -> str:
    return lookup(city)


async def then_awaits(run: Any, city: str) -> str:
    found = lookup(city)
    await asyncio.sleep(0)
    return found


def recorded_types(entry: Any) -> tuple[list[str], Any]:
    async def record() -> tuple[list[str], Any]:
        recorder = AsyncMemoryRecorder()
        snapshot = RunSnapshot(code_version="tools/1", input="Oslo")
        run, output = await recorder.record(entry, snapshot, agent_id="tools")
        assert run.core.unreported is None
        return [str(e.event_type) for e in recorder.events if e.run_id == run.run_id], output

    return asyncio.run(record())


def test_a_sync_tool_called_last_on_the_loop_is_recorded_before_run_finished() -> None:
    types, output = recorded_types(last_act)
    assert output == "Oslo: clear"
    assert types == ["run.started", "tool.call", "run.finished"]


def test_a_sync_tool_followed_by_an_await_is_recorded_in_its_place() -> None:
    types, _ = recorded_types(then_awaits)
    assert types == ["run.started", "tool.call", "run.finished"]
