"""Recorder overhead: the latency one ``run.call`` adds around a tool that costs nothing.

Each writer is a thread with its own run; every call is one Postgres transaction. After
a warm-up, all writers start together and time each call; the figures are p50 and p99
per call and the events per second of all writers together.

    python bench/recorder.py [--events 3000] [--warmup 200] [--writers 1 8]
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from rich.progress import Progress, TaskID

from agent_blackbox.outbox import Recorder, RunSnapshot
from bench._common import bench_settings, drop_runs, emit, percentile, progress, stage

BENCH = "recorder"
P50_TARGET_MS = 2.0
P99_TARGET_MS = 10.0


@dataclass(frozen=True, slots=True)
class WriterResult:
    run_id: str
    latencies_ms: list[float]
    started: float
    ended: float


def noop(value: int) -> int:
    """The tool: returns its argument, so the recorder is all that is measured."""
    return value


def write(
    recorder: Recorder,
    *,
    events: int,
    warmup: int,
    start: threading.Barrier,
    bar: tuple[Progress, TaskID],
) -> WriterResult:
    """One writer: warm up, wait for the others, then time ``events`` calls."""
    run = recorder.start_run(RunSnapshot(code_version="bench"), agent_id="bench")
    for i in range(warmup):
        run.call("noop", noop, i)
    start.wait()
    latencies: list[float] = []
    started = time.perf_counter()
    for i in range(events):
        before = time.perf_counter_ns()
        run.call("noop", noop, i)
        latencies.append((time.perf_counter_ns() - before) / 1e6)
        if i % 100 == 99:
            bar[0].advance(bar[1], 100)
    ended = time.perf_counter()
    run.finish()
    return WriterResult(run.run_id, latencies, started, ended)


def measure(recorder: Recorder, *, writers: int, events: int, warmup: int) -> list[WriterResult]:
    """Run ``writers`` concurrent writers and collect their timings."""
    start = threading.Barrier(writers)
    with progress() as display, ThreadPoolExecutor(max_workers=writers) as pool:
        task = display.add_task(f"{writers} writer(s)", total=writers * events)
        futures = [
            pool.submit(
                write, recorder, events=events, warmup=warmup, start=start, bar=(display, task)
            )
            for _ in range(writers)
        ]
        return [f.result() for f in futures]


def report(writers: int, results: Sequence[WriterResult]) -> None:
    latencies = [ms for r in results for ms in r.latencies_ms]
    wall = max(r.ended for r in results) - min(r.started for r in results)
    one = writers == 1
    emit(
        BENCH,
        "p50_ms",
        percentile(latencies, 50),
        unit="ms",
        target=P50_TARGET_MS if one else None,
        at_least=False,
        writers=writers,
    )
    emit(
        BENCH,
        "p99_ms",
        percentile(latencies, 99),
        unit="ms",
        target=P99_TARGET_MS if one else None,
        at_least=False,
        writers=writers,
    )
    emit(BENCH, "events_per_s", len(latencies) / wall, unit="events/s", writers=writers)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=3_000, help="timed calls per writer")
    parser.add_argument("--warmup", type=int, default=200, help="untimed calls per writer")
    parser.add_argument("--writers", type=int, nargs="+", default=[1, 8])
    args = parser.parse_args(argv)
    recorder = Recorder.from_settings(bench_settings(BENCH))
    run_ids: list[str] = []
    try:
        for writers in args.writers:
            with stage(f"recorder, {writers} writer(s)"):
                results = measure(recorder, writers=writers, events=args.events, warmup=args.warmup)
            run_ids += [r.run_id for r in results]
            report(writers, results)
    finally:
        drop_runs(recorder.engine, run_ids)
        recorder.engine.dispose()


if __name__ == "__main__":
    main()
