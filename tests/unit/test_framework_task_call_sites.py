"""A framework that crosses a boundary from a task of its own, started far below the
agent's line (pydantic-ai sends each model request from an anyio task some 16 frames
down), still has the divergence name the agent's line: the coroutine's origin reaches
it."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import agent_blackbox as bb
from agent_blackbox.outbox import AsyncMemoryRecorder, MemoryRecorder, RunSnapshot
from agent_blackbox.replayer import DivergenceKind, replay_run
from agent_blackbox.schemas import Envelope
from tests.unit._installed import installed, marked_line

FRAMEWORK = "blackbox_fake_tasking_framework"
FRAMEWORK_SOURCE = """
import asyncio


async def look_up(run, city, depth):
    if depth:
        return await look_up(run, city, depth - 1)
    return await asyncio.create_task(_cross(run, city))


async def _cross(run, city):
    return await run.call("weather", _weather, city)


async def _weather(city):
    return {"city": city}
"""
DEPTH = 20
"""Frames of the framework between the agent's line and the task it starts."""


@pytest.fixture
def framework(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The fake framework, installed in a site-packages folder as a distribution is."""
    yield from installed(FRAMEWORK, FRAMEWORK_SOURCE, tmp_path=tmp_path, monkeypatch=monkeypatch)


async def paris_entry(run: Any, input: Any) -> Any:
    return await sys.modules[FRAMEWORK].look_up(run, "Paris", DEPTH)


async def oslo_entry(run: Any, input: Any) -> Any:
    return await sys.modules[FRAMEWORK].look_up(run, "Oslo", DEPTH)  # mark:agent


def _recorded() -> list[Envelope]:
    async def record() -> list[Envelope]:
        recorder = AsyncMemoryRecorder()
        await recorder.record(paris_entry, RunSnapshot("weather/1", {}), agent_id="weather")
        return recorder.events

    return asyncio.run(record())


def test_a_call_from_a_task_a_framework_started_deep_down_names_the_agents_line(
    framework: ModuleType,
) -> None:
    report = replay_run(_recorded(), oslo_entry)
    divergence = report.divergence
    assert divergence is not None
    assert divergence.kind == DivergenceKind.ARGUMENT_MISMATCH
    agent_line = marked_line(Path(__file__).read_text(), "agent")
    assert divergence.call_site is not None
    site = divergence.call_site
    assert (site.function, site.file, site.line) == ("oslo_entry", __file__, agent_line)
    assert site.library is not None
    assert site.library.file == framework.__file__


NESTED = "blackbox_fake_nested_tasking_framework"
NESTED_SOURCE = """
import asyncio


async def look_up(run, city):
    return await asyncio.create_task(_outer(run, city))


async def _outer(run, city):
    return await asyncio.create_task(_cross(run, city))  # mark:inner-task


async def _cross(run, city):
    return await run.call("weather", _weather, city)


async def _weather(city):
    return {"city": city}
"""


@pytest.fixture
def nested(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    yield from installed(NESTED, NESTED_SOURCE, tmp_path=tmp_path, monkeypatch=monkeypatch)


async def _nested_paris(run: Any, input: Any) -> Any:
    return await sys.modules[NESTED].look_up(run, "Paris")


async def _nested_oslo(run: Any, input: Any) -> Any:
    return await sys.modules[NESTED].look_up(run, "Oslo")


def test_a_call_from_a_task_started_in_another_task_names_no_frame_outside_the_run(
    nested: ModuleType,
) -> None:
    """The inner task's coroutine was made in the outer task's step: past that step's
    event loop are the frames of whoever runs the replay (this test; ``blackbox`` and
    click under the command line), which are no site of the agent's. The framework's
    frame that started the task is named instead."""

    async def record() -> list[Envelope]:
        recorder = AsyncMemoryRecorder()
        await recorder.record(_nested_paris, RunSnapshot("weather/1", {}), agent_id="weather")
        return recorder.events

    report = replay_run(asyncio.run(record()), _nested_oslo)
    assert report.divergence is not None
    assert report.divergence.kind == DivergenceKind.ARGUMENT_MISMATCH
    site = report.divergence.call_site
    assert site is not None
    assert site.file == nested.__file__, site
    assert (site.function, site.line) == ("_outer", marked_line(NESTED_SOURCE, "inner-task"))


THREADING_FRAMEWORK = "blackbox_fake_threading_framework"
THREADING_SOURCE = """
import contextvars
from concurrent.futures import ThreadPoolExecutor


def run_tool(tool, city):
    context = contextvars.copy_context()  # as LangChain's executor does
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(context.run, _invoke, tool, city).result()


def _invoke(tool, city):
    return tool(city)
"""


@bb.tool  # mark:tool
def weather(city: str) -> dict[str, str]:
    return {"city": city}


def paris_by_thread(run: Any, input: Any) -> Any:
    return sys.modules[THREADING_FRAMEWORK].run_tool(weather, "Paris")


def oslo_by_thread(run: Any, input: Any) -> Any:
    return sys.modules[THREADING_FRAMEWORK].run_tool(weather, "Oslo")


def test_a_tool_a_framework_ran_on_its_own_thread_is_named_by_its_definition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No frame of the agent's is on the thread's stack (LangGraph's tool node): the
    divergence names the tool's definition, with the framework's frame second."""
    framework = next(
        installed(THREADING_FRAMEWORK, THREADING_SOURCE, tmp_path=tmp_path, monkeypatch=monkeypatch)
    )
    recorder = MemoryRecorder()
    recorder.record(paris_by_thread, RunSnapshot("weather/1", {}), agent_id="weather")
    divergence = replay_run(recorder.events, oslo_by_thread).divergence
    assert divergence is not None
    assert divergence.kind == DivergenceKind.ARGUMENT_MISMATCH
    site = divergence.call_site
    assert site is not None
    tool_line = marked_line(Path(__file__).read_text(), "tool")
    assert (site.function, site.file, site.line) == ("weather", __file__, tool_line)
    assert site.library is not None
    assert site.library.file == framework.__file__
