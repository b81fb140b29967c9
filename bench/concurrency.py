"""Replay throughput of concurrent work: an asyncio agent whose every round fans out
parallel tool calls, beside the loop agent's, measured in the same process.

Both runs are recorded in memory (``AsyncMemoryRecorder`` and ``MemoryRecorder``) with
about the same number of events, then replayed from their envelopes ``--repeat`` times
each, alternately, so a shared machine's drift hits both alike. The tools of the
parallel agent yield to the event loop a varying number of times, so its children
complete in another order than they started, and replay has to hand their results back
in the recorded completion order.

Figures: ``loop_events_per_s`` (the loop agent of ``bench/replay.py``, here from
memory rather than an archive), ``parallel_events_per_s``, and ``parallel_floor_events_per_s``:
the same parallel agent driven by a run that answers every call at once after one turn
of the event loop (what its asyncio work alone costs, the ceiling of any replay of it).
No release before this one could replay concurrent work, so the parallel figure has no
earlier figure to stay within 10% of: it is printed with the loop agent's beside it, as
the baseline later releases are held to.

    python -m bench.concurrency [--events 100000] [--fanout 8] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from agent_blackbox.outbox import AsyncMemoryRecorder, MemoryRecorder, RunSnapshot
from agent_blackbox.replayer import replay_run
from agent_blackbox.schemas import Envelope
from bench._common import console, emit, stage
from bench.replay import loop_agent

BENCH = "concurrency"


class LookupTool:
    """The parallel agent's tool: it counts its calls, so a replay can prove it made none."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, item: int) -> dict[str, int]:
        self.calls += 1
        for _ in range(item % 3):  # children finish in another order than they start
            await asyncio.sleep(0)
        return {"item": item, "stock": item * 7 % 101}


LOOKUP = LookupTool()


async def _child(run: Any, item: int) -> int:
    found: dict[str, int] = await run.call("lookup", LOOKUP, item)
    return found["stock"]


async def parallel_agent(run: Any, input: Any) -> Any:
    """Rounds of ``input["fanout"]`` tool calls run with ``asyncio.gather``, each round
    followed by a clock read; a state transition every hundred rounds."""
    fanout = int(input["fanout"])
    rounds = (int(input["events"]) - 2) // (fanout + 1)
    total = 0
    for round_ in range(rounds):
        stocks = await asyncio.gather(*(_child(run, round_ * fanout + i) for i in range(fanout)))
        total += sum(stocks)
        if round_ % 100 == 99:
            await run.transition("working", state={"rounds": round_ + 1, "total": total})
        else:
            await run.now()
    return {"total": total}


class _Answering:
    """A run that answers each call after one turn of the loop and checks nothing: the
    floor of the parallel agent's cost."""

    async def call(self, tool: str, fn: Any, *args: Any) -> dict[str, int]:
        await asyncio.sleep(0)
        return {"item": 0, "stock": 1}

    async def now(self) -> None:
        return None

    async def transition(self, to_state: str, *, state: Any) -> None:
        return None


def floor_rate(events: int, fanout: int) -> float:
    """Events per second of the parallel agent on a run that checks nothing."""
    started = time.perf_counter()
    asyncio.run(parallel_agent(_Answering(), {"events": events, "fanout": fanout}))
    return events / (time.perf_counter() - started)


def record_parallel(events: int, fanout: int) -> list[Envelope]:
    recorder = AsyncMemoryRecorder()
    snapshot = RunSnapshot(
        code_version="bench-parallel.1", input={"events": events, "fanout": fanout}
    )
    asyncio.run(recorder.record(parallel_agent, snapshot, agent_id=BENCH))
    return recorder.events


def record_loop(events: int) -> list[Envelope]:
    recorder = MemoryRecorder()
    snapshot = RunSnapshot(code_version="bench-loop.1", input={"events": events})
    recorder.record(loop_agent, snapshot, agent_id=BENCH)
    return recorder.events


def replay_rate(events: list[Envelope], entry: Callable[..., Any]) -> float:
    """Events per second of one replay of ``events``; raises unless it passed."""
    started = time.perf_counter()
    report = replay_run(events, entry, agent_id=BENCH)
    seconds = time.perf_counter() - started
    if not report.passed:
        detail = report.divergence.describe() if report.divergence else report.error
        raise RuntimeError(f"replay of the {entry.__name__} run did not pass: {detail}")
    return report.events / seconds


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000, help="events of each run")
    parser.add_argument("--fanout", type=int, default=8, help="parallel tool calls per round")
    parser.add_argument("--repeat", type=int, default=3, help="replays of each (median counts)")
    args = parser.parse_args(argv)
    with stage(f"recording a parallel run of ~{args.events:,} events (fan-out {args.fanout})"):
        parallel = record_parallel(args.events, args.fanout)
    concurrent = sum(1 for e in parallel if "started" in e.attributes)
    console.log(f"{concurrent:,} of {len(parallel):,} events completed out of start order")
    with stage(f"recording a loop run of {args.events:,} events"):
        loop = record_loop(args.events)
    loop_rates: list[float] = []
    parallel_rates: list[float] = []
    floor_rates: list[float] = []
    calls_before = LOOKUP.calls
    for attempt in range(1, args.repeat + 1):
        with stage(f"replay {attempt}/{args.repeat}: loop run, then parallel run"):
            loop_rates.append(replay_rate(loop, loop_agent))
            parallel_rates.append(replay_rate(parallel, parallel_agent))
            floor_rates.append(floor_rate(len(parallel), args.fanout))
    if LOOKUP.calls != calls_before:
        raise RuntimeError(f"replay called the tool {LOOKUP.calls - calls_before} times")
    loop_rate = statistics.median(loop_rates)
    emit(BENCH, "loop_events_per_s", loop_rate, unit="events/s", events=len(loop))
    emit(
        BENCH,
        "parallel_events_per_s",
        statistics.median(parallel_rates),
        unit="events/s",
        events=len(parallel),
        fanout=args.fanout,
        out_of_order=concurrent,
    )
    emit(
        BENCH,
        "parallel_floor_events_per_s",
        statistics.median(floor_rates),
        unit="events/s",
        events=len(parallel),
    )


if __name__ == "__main__":
    main()
