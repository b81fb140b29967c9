"""Recorder overhead: the latency one ``run.call`` adds around a tool that costs nothing.

Each writer is a thread with its own run; every call is one Postgres transaction. After
a warm-up, all writers start together and time each call; the figures are p50 and p99
per call and the events per second of all writers together.

Beside every writer count, the database's floor (``bench._floor``): pgbench with as
many clients, running the transaction of one recorded tool call (the same
``append_event`` call with the same envelope bytes) on the same database, just before
the writers, so both see the same machine. Each recorder figure is printed with its
ratio to the floor: 8 writers should reach 70% of 8 pgbench clients' transactions per
second, and 1 writer's p50 stay within 1.15x of pgbench's average latency. With
``--rounds`` above 1 the pairs are repeated (floor, writers, floor, writers, ...), each
round's figures labelled with it. The CPU the writers' process spent per event (all its
threads, warm-up included) is printed beside the wall-clock figures.

Then group commit mode against per-event mode, one writer each, in the same process:
the events per second of each (a group run's last buffer is written inside the timing)
and their ratio, whose target is 5.

    python bench/recorder.py [--events 3000] [--warmup 200] [--writers 1 8]
                             [--rounds 1] [--group-events 20000]
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from rich.progress import Progress, TaskID

from agent_blackbox.outbox import GroupCommit, Recorder, RunSnapshot
from bench._common import bench_settings, drop_runs, emit, percentile, progress, stage
from bench._floor import Floor, FloorResult, record_template

BENCH = "recorder"
P50_TARGET_MS = 2.0
P99_TARGET_MS = 10.0
GROUP_SPEEDUP_TARGET = 5.0
RATE_OF_FLOOR_TARGET = 0.70
"""8 writers' events/s over 8 pgbench clients' transactions/s (at least)."""
P50_OVER_FLOOR_TARGET = 1.15
"""1 writer's p50 over pgbench's average latency with 1 client (at most)."""


@dataclass(frozen=True, slots=True)
class WriterResult:
    run_id: str
    latencies_ms: list[float]
    started: float
    ended: float
    cpu_s: float = 0.0
    """CPU time of the whole process while the writers ran (set on the first result)."""


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
    run.flush()  # group commit: what is still buffered is part of the work timed
    ended = time.perf_counter()
    run.finish()
    return WriterResult(run.run_id, latencies, started, ended)


def measure(
    recorder: Recorder, *, writers: int, events: int, warmup: int, label: str = ""
) -> list[WriterResult]:
    """Run ``writers`` concurrent writers and collect their timings."""
    start = threading.Barrier(writers)
    cpu_before = time.process_time()
    with progress() as display, ThreadPoolExecutor(max_workers=writers) as pool:
        task = display.add_task(f"{writers} writer(s){label}", total=writers * events)
        futures = [
            pool.submit(
                write, recorder, events=events, warmup=warmup, start=start, bar=(display, task)
            )
            for _ in range(writers)
        ]
        results = [f.result() for f in futures]
    first = replace(results[0], cpu_s=time.process_time() - cpu_before)
    return [first, *results[1:]]


def report(writers: int, results: Sequence[WriterResult], *, warmup: int, **labels: int) -> None:
    """The writers' latency percentiles, rate and CPU per event."""
    latencies = [ms for r in results for ms in r.latencies_ms]
    one = writers == 1
    emit(
        BENCH,
        "p50_ms",
        percentile(latencies, 50),
        unit="ms",
        target=P50_TARGET_MS if one else None,
        at_least=False,
        writers=writers,
        **labels,
    )
    emit(
        BENCH,
        "p99_ms",
        percentile(latencies, 99),
        unit="ms",
        target=P99_TARGET_MS if one else None,
        at_least=False,
        writers=writers,
        **labels,
    )
    emit(
        BENCH,
        "events_per_s",
        rate(results),
        unit="events/s",
        writers=writers,
        mode="per-event",
        **labels,
    )
    recorded = sum(len(r.latencies_ms) + warmup for r in results)
    emit(
        BENCH,
        "cpu_us_per_event",
        results[0].cpu_s / recorded * 1e6,
        unit="us",
        writers=writers,
        mode="per-event",
        **labels,
    )


def report_floor(
    floor: FloorResult, results: Sequence[WriterResult], *, writers: int, **labels: int
) -> None:
    """pgbench's figures with as many clients as ``writers``, and the writers' ratios to
    them (the targets: 8 writers' rate, 1 writer's p50)."""
    clients = {"clients": floor.clients, **labels}
    emit(BENCH, "floor_tx_per_s", floor.tx_per_s, unit="tx/s", **clients)
    emit(BENCH, "floor_latency_avg_ms", floor.average_ms, unit="ms", **clients)
    emit(BENCH, "floor_p50_ms", floor.p50_ms, unit="ms", **clients)
    emit(BENCH, "floor_client_cpu_us_per_tx", floor.client_cpu_us, unit="us", **clients)
    p50 = percentile([ms for r in results for ms in r.latencies_ms], 50)
    emit(
        BENCH,
        "events_per_s_of_floor",
        rate(results) / floor.tx_per_s,
        unit="ratio",
        target=RATE_OF_FLOOR_TARGET if writers == 8 else None,
        writers=writers,
        **labels,
    )
    emit(
        BENCH,
        "p50_over_floor_avg",
        p50 / floor.average_ms,
        unit="ratio",
        target=P50_OVER_FLOOR_TARGET if writers == 1 else None,
        at_least=False,
        writers=writers,
        **labels,
    )


def rate(results: Sequence[WriterResult]) -> float:
    """Events per second of all writers together."""
    wall = max(r.ended for r in results) - min(r.started for r in results)
    return sum(len(r.latencies_ms) for r in results) / wall


def compare_group(
    group: Recorder, single: Sequence[WriterResult], *, events: int, warmup: int
) -> list[WriterResult]:
    """One writer in group commit mode, against ``single``, one writer's results in
    per-event mode: its rate and the ratio of the two."""
    with stage("recorder, 1 writer, group commit mode"):
        grouped = measure(group, writers=1, events=events, warmup=warmup, label=", group")
    per_event_rate, group_rate = rate(single), rate(grouped)
    emit(BENCH, "events_per_s", group_rate, unit="events/s", writers=1, mode="group")
    emit(
        BENCH,
        "group_speedup",
        group_rate / per_event_rate,
        unit="x",
        target=GROUP_SPEEDUP_TARGET,
        writers=1,
        max_delay_ms=int(GroupCommit().max_delay_ms),
        max_events=GroupCommit().max_events,
    )
    return grouped


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=3_000, help="timed calls per writer")
    parser.add_argument("--warmup", type=int, default=200, help="untimed calls per writer")
    parser.add_argument("--writers", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--rounds", type=int, default=1, help="floor and writers pairs")
    parser.add_argument(
        "--group-events", type=int, default=20_000, help="timed calls in group commit mode"
    )
    args = parser.parse_args(argv)
    settings = bench_settings(BENCH)
    base = Recorder.from_settings(settings)
    # Each mode chosen here, whatever BLACKBOX_GROUP_COMMIT says.
    recorder = Recorder(base.engine, settings=settings, keys=base.keys, group_commit=None)
    group = Recorder(base.engine, settings=settings, keys=base.keys, group_commit=GroupCommit())
    floor = Floor(recorder.engine, record_template(recorder), shards=settings.outbox_shards)
    run_ids: list[str] = []
    single: list[WriterResult] = []
    try:
        with floor.opened():
            for round_ in range(1, args.rounds + 1):
                labels = {"round": round_} if args.rounds > 1 else {}
                # One writer last, so that group commit mode runs right after it.
                for writers in sorted(set(args.writers) | {1}, reverse=True):
                    with stage(f"pgbench floor, {writers} client(s)"):
                        floored = floor.measure(
                            clients=writers, events=args.events, warmup=args.warmup
                        )
                    with stage(f"recorder, {writers} writer(s)"):
                        results = measure(
                            recorder, writers=writers, events=args.events, warmup=args.warmup
                        )
                    run_ids += [r.run_id for r in results]
                    report(writers, results, warmup=args.warmup, **labels)
                    report_floor(floored, results, writers=writers, **labels)
                    single = results
        grouped = compare_group(group, single, events=args.group_events, warmup=args.warmup)
        run_ids += [r.run_id for r in grouped]
    finally:
        drop_runs(recorder.engine, run_ids)
        recorder.engine.dispose()


if __name__ == "__main__":
    main()
