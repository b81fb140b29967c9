"""Concurrent work inside a run: recorded with its branches and its completion order,
replayed deterministically, and another set of children, or the same children started in
another order, diverges with the boundary named and a call site in the agent's code."""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from agent_blackbox.outbox import AsyncMemoryRecorder, MemoryRecorder, RunSnapshot
from agent_blackbox.outbox.contract import BRANCH, STARTED
from agent_blackbox.replayer import DivergenceKind, ReplayReport, replay_run, replay_run_async
from agent_blackbox.schemas import Envelope

AsyncEntry = Callable[[Any, Any], Awaitable[Any]]


async def lookup(item: str, delay: float) -> dict[str, Any]:
    await asyncio.sleep(delay)
    return {"item": item, "stock": len(item)}


def _reply(calls: list[str]) -> dict[str, Any]:
    tool_calls = [
        {"id": f"call_{i}", "type": "function", "function": {"name": "lookup", "arguments": c}}
        for i, c in enumerate(calls)
    ]
    message = {"role": "assistant", "content": None, "tool_calls": tool_calls}
    choice = {"index": 0, "message": message, "finish_reason": "tool_calls"}
    return {"id": "r1", "choices": [choice]}


async def _child(run: Any, item: str, delay: float) -> dict[str, Any]:
    found: dict[str, Any] = await run.call("lookup", lookup, item, delay)
    # A second boundary in the same child: its start comes after others' in record.
    found["at"] = (await run.now()).isoformat()
    return found


async def parallel_agent(run: Any, input: Any) -> Any:
    """Parallel tool calls from one LLM response, each child with two boundaries."""
    items: list[str] = input["items"]
    reply = await run.llm(lambda request: _reply(items), {"model": "m"}, provider="openai")
    calls = reply["choices"][0]["message"]["tool_calls"]
    delays: list[float] = input["delays"]
    found = await asyncio.gather(
        *(_child(run, c["function"]["arguments"], d) for c, d in zip(calls, delays, strict=True))
    )
    await run.transition("answered", state={"found": found})
    return {"found": found}


def _record(entry: AsyncEntry, items: list[str], delays: list[float]) -> list[Envelope]:
    recorder = AsyncMemoryRecorder()
    snapshot = RunSnapshot(code_version="1", input={"items": items, "delays": delays})
    asyncio.run(recorder.record(entry, snapshot, agent_id="parallel"))
    return recorder.events


def _shuffled_delays(count: int, rng: random.Random) -> list[float]:
    return [rng.uniform(0.0, 0.004) for _ in range(count)]


def test_parallel_tool_calls_replay_the_same_way_a_hundred_times() -> None:
    rng = random.Random(7)
    items = ["apple", "kiwi", "banana", "fig", "cherry"]
    events = _record(parallel_agent, items, _shuffled_delays(len(items), rng))
    concurrent = [e for e in events if STARTED in e.attributes]
    assert concurrent, "the children completed in another order than they started"
    assert {e.attributes.get(BRANCH) for e in events} >= {"1", "2", "3", "4", "5"}
    for _ in range(100):
        report = replay_run(events, parallel_agent)
        assert report.passed, report.divergence and report.divergence.describe()


def _reverse_children(run: Any, input: Any) -> Any:
    return parallel_agent(run, {**input, "items": input["items"][::-1]})


def _mutated(reply_items: Callable[[list[str]], list[str]]) -> AsyncEntry:
    async def agent(run: Any, input: Any) -> Any:
        items = reply_items(list(input["items"]))
        delays = list(input["delays"]) + [0.0] * (len(items) - len(input["delays"]))
        found = await asyncio.gather(
            *(_child(run, item, d) for item, d in zip(items, delays, strict=False))
        )
        return {"found": found}

    async def entry(run: Any, input: Any) -> Any:
        await run.llm(lambda request: _reply(input["items"]), {"model": "m"}, provider="openai")
        return await agent(run, input)

    return entry


def _baseline() -> list[Envelope]:
    async def entry(run: Any, input: Any) -> Any:
        return await _mutated(lambda items: items)(run, input)

    # The last child finishes first: every other child waits behind it in replay.
    return _record(entry, ["a1", "b22", "c333"], [0.006, 0.004, 0.0])


def test_the_baseline_of_the_mutations_passes() -> None:
    report = replay_run(_baseline(), _mutated(lambda items: items))
    assert report.passed, report.divergence and report.divergence.describe()


def test_children_started_in_another_order_diverge_in_the_agents_code() -> None:
    report = replay_run(_baseline(), _mutated(lambda items: items[::-1]))
    divergence = _diverged(report, DivergenceKind.ARGUMENT_MISMATCH)
    assert divergence.expected_name == "lookup"
    assert divergence.call_site is not None
    assert divergence.call_site.file == __file__
    assert divergence.call_site.function == "_child"


def test_a_changed_argument_names_the_tool_and_the_path() -> None:
    report = replay_run(
        _baseline(), _mutated(lambda items: [items[0], "b2X", items[2]]), reveal_values=True
    )
    divergence = _diverged(report, DivergenceKind.ARGUMENT_MISMATCH)
    assert [c.path for c in divergence.changes] == ["args[0]"]
    assert divergence.changes[0].expected == "b22"
    assert divergence.changes[0].actual == "b2X"
    text = divergence.describe()
    assert "expected tool.call lookup, got tool.call lookup" in text
    assert "args[0] (expected 'b22', got 'b2X')" in text


def test_values_are_not_shown_unless_asked() -> None:
    report = replay_run(_baseline(), _mutated(lambda items: [items[0], "b2X", items[2]]))
    divergence = _diverged(report, DivergenceKind.ARGUMENT_MISMATCH)
    assert "b2X" not in divergence.describe()
    assert divergence.to_dict()["changes"] == [{"path": "args[0]"}]


def test_an_extra_child_task_diverges() -> None:
    report = replay_run(_baseline(), _mutated(lambda items: [*items, "d4444"]))
    _diverged(report, DivergenceKind.MISSING_EVENT)


def test_a_left_out_child_others_wait_behind_is_a_concurrency_mismatch() -> None:
    report = replay_run(_baseline(), _mutated(lambda items: items[:2]), stall_timeout=0.3)
    divergence = _diverged(report, DivergenceKind.CONCURRENCY_MISMATCH)
    assert "started a different set of concurrent children" in divergence.detail


def test_a_left_out_child_nobody_waits_for_leaves_its_events_unconsumed() -> None:
    report = replay_run(_baseline(), _mutated(lambda items: items[1:]), stall_timeout=0.3)
    assert report.divergence is not None
    assert report.divergence.level == "control_flow"


def _diverged(report: ReplayReport, kind: DivergenceKind) -> Any:
    assert report.divergence is not None, "the mutation was not caught"
    assert report.divergence.kind == kind, report.divergence.describe()
    return report.divergence


# Threads ----------------------------------------------------------------------------


def _threaded_agent(run: Any, input: Any) -> Any:
    rng = random.Random()

    def fetch(item: str) -> str:
        threading.Event().wait(rng.uniform(0, 0.003))  # a tool that takes its time
        return item.upper()

    def job(item: str) -> str:
        upper: str = run.call("fetch", fetch, item)
        return f"{upper}:{run.randint(1, 6)}"

    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(job, input["items"]))
    run.transition("done", state={"results": results})
    return results


def test_a_thread_pool_replays_whichever_thread_runs_which_item() -> None:
    recorder = MemoryRecorder()
    snapshot = RunSnapshot(code_version="1", input={"items": list("abcdefgh")})
    recorder.record(_threaded_agent, snapshot, agent_id="threads")
    events = recorder.events
    assert any(BRANCH in e.attributes for e in events)
    for _ in range(20):
        report = replay_run(events, _threaded_agent)
        assert report.passed, report.divergence and report.divergence.describe()


# Async entry points ------------------------------------------------------------------


async def _sequential(run: Any, input: Any) -> Any:
    first = await run.call("lookup", lookup, input, 0.0)
    drawn = await run.uuid()
    await run.transition("done", state={"first": first}, connection=None)
    return {"first": first, "drawn": str(drawn)}


def test_an_async_entry_is_detected_and_replayed() -> None:
    events = _record(_sequential, "pear", [])  # type: ignore[arg-type]
    assert replay_run(events, _sequential).passed


def test_an_async_entry_replays_inside_a_running_loop() -> None:
    events = _record(_sequential, "pear", [])  # type: ignore[arg-type]

    async def main() -> tuple[ReplayReport, ReplayReport]:
        inside = await replay_run_async(events, _sequential)
        # The sync entry point, called from a loop, runs the replay in a loop of its own.
        return inside, replay_run(events, _sequential)

    inside, beside = asyncio.run(main())
    assert inside.passed
    assert beside.passed


def test_a_sync_entry_that_returns_a_coroutine_is_a_setup_error() -> None:
    events = _record(_sequential, "pear", [])  # type: ignore[arg-type]

    def wrapped(run: Any, input: Any) -> Any:
        return _sequential(run, input)

    report = replay_run(events, wrapped)
    assert report.result == "ERROR"
    assert report.error is not None
    assert "async def" in report.error


def test_a_type_mismatch_names_both_boundaries() -> None:
    events = _record(_sequential, "pear", [])  # type: ignore[arg-type]

    async def changed(run: Any, input: Any) -> Any:
        await run.uuid()
        return None

    report = replay_run(events, changed)
    divergence = _diverged(report, DivergenceKind.TYPE_MISMATCH)
    assert "expected tool.call lookup, got random.draw uuid4" in divergence.describe()


def test_a_divergence_found_after_the_entry_returned_names_the_entry() -> None:
    events = _record(_sequential, "pear", [])  # type: ignore[arg-type]

    async def ends_early(run: Any, input: Any) -> Any:
        await run.call("lookup", lookup, input, 0.0)
        return None

    report = replay_run(events, ends_early)
    divergence = _diverged(report, DivergenceKind.UNCONSUMED_EVENTS)
    assert divergence.call_site is not None
    assert divergence.call_site.function == "ends_early"
    assert divergence.call_site.file == __file__


def test_a_caught_divergence_still_fails_the_replay() -> None:
    events = _record(_sequential, "pear", [])  # type: ignore[arg-type]

    async def swallows(run: Any, input: Any) -> Any:
        with contextlib.suppress(Exception):  # agent code that swallows every error
            await run.call("lookup", lookup, "plum", 0.0)
        return await _sequential(run, input)

    report = replay_run(events, swallows)
    _diverged(report, DivergenceKind.ARGUMENT_MISMATCH)


@pytest.mark.parametrize("attempt", range(3))
def test_the_sync_run_takes_the_agents_connection_and_leaves_it_alone(attempt: int) -> None:
    class Untouchable:
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"replay touched the agent's connection: {name}")

    def agent(run: Any, input: Any) -> Any:
        connection = Untouchable()
        with run.joined(connection):
            run.transition("paid", state={"n": attempt}, connection=connection)
        return attempt

    recorder = MemoryRecorder()

    def recording(run: Any, input: Any) -> Any:
        run.transition("paid", state={"n": attempt})
        return attempt

    recorder.record(recording, RunSnapshot(code_version="1"), agent_id="tx")
    assert replay_run(recorder.events, agent).passed


async def _gathering(run: Any, input: Any) -> Any:
    items: list[str] = input["items"]
    return await asyncio.gather(*(run.call("lookup", lookup, i, 0.0) for i in items))  # gather


def test_a_boundary_coroutine_run_as_its_own_task_names_the_agent_line_that_made_it() -> None:
    events = _record(_gathering, ["a", "b", "c"], [])

    async def changed(run: Any, input: Any) -> Any:
        return await _gathering(run, {"items": ["a", "B", "c"]})

    report = replay_run(events, changed)
    divergence = _diverged(report, DivergenceKind.ARGUMENT_MISMATCH)
    assert divergence.call_site is not None
    lines = Path(__file__).read_text().splitlines()
    line = next(n for n, text in enumerate(lines, 1) if text.endswith("# gather"))
    assert (divergence.call_site.file, divergence.call_site.line) == (__file__, line)
    # Origin tracking is the replay's only: it is off again.
    assert sys.get_coroutine_origin_tracking_depth() == 0


def test_a_run_the_code_now_ends_with_an_exception_says_so_at_the_raise() -> None:
    events = _record(_sequential, "pear", [])  # type: ignore[arg-type]

    async def raises(run: Any, input: Any) -> Any:
        await run.call("lookup", lookup, input, 0.0)
        raise RuntimeError("inventory failed")  # raise here

    report = replay_run(events, raises)
    divergence = _diverged(report, DivergenceKind.UNCONSUMED_EVENTS)
    assert "raising RuntimeError" in divergence.detail
    assert "inventory failed" not in divergence.detail  # messages only with reveal_values
    lines = Path(__file__).read_text().splitlines()
    line = next(n for n, text in enumerate(lines, 1) if text.endswith("# raise here"))
    assert divergence.call_site is not None
    assert (divergence.call_site.function, divergence.call_site.line) == ("raises", line)
    revealed = replay_run(events, raises, reveal_values=True)
    assert revealed.divergence is not None
    assert "inventory failed" in revealed.divergence.detail


def test_a_call_the_run_itself_adds_before_its_children_names_what_the_run_still_holds() -> None:
    async def children(run: Any, input: Any) -> Any:
        found = await asyncio.gather(*(_child(run, item, 0.0) for item in input["items"]))
        return {"found": found}

    async def checks_first(run: Any, input: Any) -> Any:
        await run.call("lookup", lookup, "first", 0.0)  # the run's own thread: branch 0
        return await children(run, input)

    events = _record(children, ["a1", "b22"], [0.0, 0.0])
    assert all(e.attributes.get(BRANCH, "0") != "0" for e in events[1:-1])  # all children's
    divergence = _diverged(replay_run(events, checks_first), DivergenceKind.MISSING_EVENT)
    assert "no more boundary events of the run itself" in divergence.detail
    assert "still holds a tool.call at sequence 2, recorded on branch 1" in divergence.detail
