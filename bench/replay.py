"""Replay throughput and peak memory: one long run re-driven from an Avro archive, and
a whole history replayed from Kafka.

A run of the loop agent below is recorded with the MemoryRecorder straight into an
Avro archive, once per event count, under ``<cache>/bench/``. Recording streams: the
agent runs in a thread whose recorder sink feeds a bounded queue, which
``write_archive`` drains as it writes, so a million envelopes never sit in memory
together. Each replay then runs in a fresh process, so its peak RSS is the replay's own
(reading the archive, opening and checking every event, re-driving the agent) and not
the recording's.

Figures: ``events_per_s`` of the long run (one process, one thread; the median of
``--repeat`` fresh processes); ``peak_rss_mb`` of
that process and of one replaying a run a quarter as long, with ``replay_rss_growth_mb``,
how much of it the replay added (about the same for both: memory does not grow with the
run); ``short_run_s``, from opening the archive of a short run to its PASS report;
``hot_path_cpu_us_per_event`` by ``stage``: the CPU of reading the archive into
envelopes, checking the chain and opening the bodies, each timed alone over the first
100,000 events of the memory run's archive, and ``engine``, the rest of the long run's
CPU per event (the agent's code, the turn-taking, the digests of what it asked).

``history_events_per_s``: a generated history (``--history`` events in runs of
``--run-events``, recorded with the MemoryRecorder and produced to a fresh topic of
12 partitions under the run's key, with a lease stamp, as the relay does) replayed the
way ``blackbox replay --all`` does it: one pass over the topic, ``--workers`` processes
(one per core by default), from the start of the scan (worker start-up included) to the
last run's report; ``history_events_per_cpu_s``, the same events over the CPU time of
the scan and its workers together (what the rate would be with a core per worker and
nothing else running). The topic is deleted afterwards.

    python -m bench.replay [--events 1000000] [--bounded 250000] [--short 10000] [--repeat 3]
                           [--history 100000] [--run-events 100] [--workers N]
                           [--only archive|history]
"""

from __future__ import annotations

import argparse
import gc
import os
import queue
import resource
import statistics
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from itertools import islice
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from agent_blackbox.broker import LeaseStamp, ensure_topics, new_producer, producer_config
from agent_blackbox.cli.commands.replay import ReplayWork
from agent_blackbox.outbox import AgentRun, MemoryRecorder, RunSnapshot
from agent_blackbox.replayer import (
    HistoryScan,
    SkippedMessage,
    read_archive,
    replay_run,
    write_archive,
)
from agent_blackbox.replayer._batch import Replaying
from agent_blackbox.schemas import (
    GENESIS_CHAIN_HASH,
    Envelope,
    EnvelopeCodec,
    PayloadPipeline,
    Settings,
)
from agent_blackbox.stack import StackSettings
from bench._common import PARTITIONS, bench_settings, console, delete_topics, emit, progress, stage

BENCH = "replay"
THROUGHPUT_TARGET = 30_000.0
HISTORY_TARGET = 20_000.0
PEAK_TARGET_MB = 300.0
SHORT_TARGET_S = 1.0
CODE_VERSION = "bench-loop-agent.4"
"""Recorded in ``run.started`` and part of the archive's file name: change it whenever
:func:`loop_agent` or the archive format changes, so a cached archive of the old code
(or the old format) is not replayed."""
TRANSITION_EVERY = 1_000
QUEUE_DEPTH = 1_024
"""Envelopes in flight between the recorder and the archive writer."""


# The agent ---------------------------------------------------------------------------


class StepTool:
    """The tool the agent calls; it counts its calls, so a replay can prove it made none."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, i: int) -> int:
        self.calls += 1
        return i * 7 % 101


STEP = StepTool()


def loop_agent(run: AgentRun, input: Any) -> Any:
    """``input["events"]`` events in all: every loop turn crosses exactly one boundary
    (tool calls, clock reads, random draws, a state transition every thousand turns),
    plus ``run.started`` and ``run.finished``. Record and replay run this same code."""
    total = 0
    draws = 0.0
    for i in range(int(input["events"]) - 2):
        if i % TRANSITION_EVERY == TRANSITION_EVERY - 1:
            run.transition("working", state={"turns": i + 1, "total": total})
        elif i % 4 == 1:
            run.now()
        elif i % 4 == 3:
            draws += run.random()
        else:
            total += run.call("step", STEP, i)
    return {"total": total, "draws": round(draws, 6)}


# Recording into an archive -------------------------------------------------------------

_END = object()


class _Cancelled(Exception):
    """The archive writer failed; the recording stops at its next event."""


def record_archive(path: Path, events: int) -> None:
    """Record one run of ``events`` events of :func:`loop_agent` into the archive ``path``.

    The agent runs in a thread whose sink puts envelopes on a bounded queue; this thread
    writes them as they come. The file appears under its name only when complete.
    """
    handoff: queue.Queue[object] = queue.Queue(maxsize=QUEUE_DEPTH)
    cancelled, ended = threading.Event(), threading.Event()
    failure: list[BaseException] = []

    def sink(envelope: Envelope) -> None:
        if cancelled.is_set():
            raise _Cancelled
        handoff.put(envelope)

    def record() -> None:
        try:
            recorder = MemoryRecorder(sink=sink)
            snapshot = RunSnapshot(code_version=CODE_VERSION, input={"events": events})
            recorder.record(loop_agent, snapshot, agent_id=BENCH)
        except BaseException as exc:  # handed to the writing thread, raised there
            failure.append(exc)
        finally:
            handoff.put(_END)

    def envelopes(bar: Any, task: Any) -> Iterator[Envelope]:
        while (item := handoff.get()) is not _END:
            assert isinstance(item, Envelope)
            yield item
            if item.sequence % 10_000 == 0:
                bar.update(task, completed=item.sequence)
        ended.set()

    partial = path.with_suffix(".partial")
    recorder = threading.Thread(target=record, name="bench-recorder")
    recorder.start()
    try:
        with progress() as bar:
            task = bar.add_task(f"recording {events:,} events", total=events)
            written = write_archive(partial, envelopes(bar, task))
            bar.update(task, completed=written)
    except BaseException:
        cancelled.set()
        while not ended.is_set() and handoff.get() is not _END:  # unblock the recorder
            pass
        partial.unlink(missing_ok=True)
        raise
    finally:
        recorder.join()
    if failure:
        partial.unlink(missing_ok=True)
        raise failure[0]
    if written != events:
        raise RuntimeError(f"the loop agent recorded {written} events, expected {events}")
    partial.replace(path)


def archive_of(events: int, cache: Path) -> Path:
    """The archive of a run of ``events`` events, recorded on first use."""
    path = cache / f"{CODE_VERSION}.{events}.avro"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        with stage(f"recording a run of {events:,} events into {path}"):
            record_archive(path, events)
    return path


# Replaying in a fresh process ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Replayed:
    """What one replay process measured."""

    events: int
    seconds: float
    """From opening the archive to the finished report."""
    cpu_seconds: float
    """CPU time the process spent on it (one thread: at most ``seconds``)."""
    peak_rss_mb: float
    """The peak resident set of the process: the interpreter, the imports, the replay."""
    growth_mb: float
    """How far the replay raised that peak above what the process held before it."""
    passed: bool
    detail: str
    tool_calls: int
    """Calls the agent's tool received during the replay: zero, or the replay is wrong."""


def replay_archive(path: Path) -> Replayed:
    """Replay the run in ``path`` through :func:`loop_agent` and measure it.

    Runs in the process of its own that :func:`replay_fresh` starts.
    """
    before = _peak_rss_mb()
    started, cpu = time.perf_counter(), time.process_time()
    report = replay_run(read_archive(path), loop_agent, agent_id=BENCH)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    peak = _peak_rss_mb()
    return Replayed(
        events=report.events,
        seconds=seconds,
        cpu_seconds=cpu,
        peak_rss_mb=peak,
        growth_mb=peak - before,
        passed=report.passed,
        detail=report.divergence.describe() if report.divergence else str(report.error),
        tool_calls=STEP.calls,
    )


def replay_fresh(path: Path) -> Replayed:
    """:func:`replay_archive` in a newly spawned process (not forked: a fork would carry
    this process's memory into the child's peak RSS)."""
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        result = pool.submit(replay_archive, path).result()
    if not result.passed:
        raise RuntimeError(f"replay of {path} did not pass: {result.detail}")
    if result.tool_calls:
        raise RuntimeError(f"replay of {path} called the tool {result.tool_calls} times")
    console.log(
        f"replayed {result.events:,} events in {result.seconds:.2f}s; peak RSS "
        f"{result.peak_rss_mb:.1f} MB, {result.growth_mb:.1f} MB of it added by the replay"
    )
    return result


HOT_PATH_SAMPLE = 100_000
"""Events of the hot path's sample (the first of the memory run's archive)."""


def hot_path(path: Path, sample: int) -> dict[str, float]:
    """CPU microseconds per event of the replay's per-event stages, each timed alone over
    the first ``sample`` events of ``path``: ``read`` (the archive's Avro records into
    envelopes), ``chain`` (each event's chain hash computed again and compared) and
    ``unpack`` (each body opened, inflated and decoded). Runs in a process of its own
    (:func:`hot_path_fresh`); the sample is held in memory, which a replay never does,
    so the collector is kept out of its way (a streamed replay frees each event before
    the next)."""
    cpu = time.process_time
    gc.disable()
    started = cpu()
    envelopes = list(islice(read_archive(path), sample))
    read = cpu() - started
    gc.freeze()
    gc.enable()
    try:
        started = cpu()
        previous = GENESIS_CHAIN_HASH
        for envelope in envelopes:
            if envelope.expected_chain_hash(previous) != envelope.chain_hash:
                raise RuntimeError(f"{path}: the chain breaks at sequence {envelope.sequence}")
            previous = envelope.chain_hash
        chain = cpu() - started
        pipeline = PayloadPipeline()
        started = cpu()
        for envelope in envelopes:
            pipeline.unpack(envelope)
        unpack = cpu() - started
    finally:
        gc.unfreeze()
    per_event = 1e6 / len(envelopes)
    return {"read": read * per_event, "chain": chain * per_event, "unpack": unpack * per_event}


def hot_path_fresh(path: Path, sample: int) -> dict[str, float]:
    """:func:`hot_path` in a newly spawned process."""
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        return pool.submit(hot_path, path, sample).result()


def _peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes there, KiB here


# A history replayed from Kafka --------------------------------------------------------


def produce_history(settings: Settings, events: int, run_events: int) -> int:
    """Record ``events`` events in runs of ``run_events`` of :func:`loop_agent` and
    produce them to ``settings.topic`` as the relay would; returns how many runs."""
    ensure_topics(settings, {settings.topic: PARTITIONS})
    producer = new_producer(settings, producer_config(settings))
    codec = EnvelopeCodec()
    stamp: list[tuple[str, str | bytes | None]] = [LeaseStamp(0, 1).header()]

    def produce(envelope: Envelope) -> None:
        key = envelope.run_id.encode()
        while True:
            try:
                producer.produce(settings.topic, codec.encode(envelope), key, headers=stamp)
                return
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.1)

    recorder = MemoryRecorder(sink=produce)
    runs = max(1, events // run_events)
    with progress() as bar:
        task = bar.add_task(f"recording {runs:,} runs of {run_events} events", total=runs)
        for _ in range(runs):
            snapshot = RunSnapshot(code_version=CODE_VERSION, input={"events": run_events})
            recorder.record(loop_agent, snapshot, agent_id=BENCH)
            producer.poll(0)
            bar.advance(task)
    if producer.flush(120) != 0:
        raise RuntimeError(f"the broker did not take the history of {settings.topic}")
    return runs


def replay_history(settings: Settings, *, workers: int | None) -> tuple[int, int, float, float]:
    """Replay every run of ``settings.topic`` as ``replay --all`` does; (runs, events,
    seconds, CPU seconds of this process and its workers). Raises when a run did not
    pass."""
    how = Replaying()
    work = ReplayWork(
        (f"{BENCH}=bench.replay:loop_agent",), "bench of history replay", how, settings=settings
    )
    scan = HistoryScan(settings, work, workers=workers)
    runs, failed = 0, []
    cpu = _cpu_seconds()
    started = time.perf_counter()
    for item in scan:
        if isinstance(item, SkippedMessage):
            failed.append(item.describe())
            continue
        runs += 1
        if not item.result.passed:
            failed.append(f"{item.run_id}: {item.result.error or item.result.divergence}")
    seconds = time.perf_counter() - started
    if failed or scan.failed:
        raise RuntimeError(f"history replay did not pass: {failed[:3]} {scan.failed}")
    return runs, scan.messages, seconds, _cpu_seconds() - cpu


def _cpu_seconds() -> float:
    """CPU time of this process and of its children that ended (the scan's workers)."""
    own, children = (
        resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def history_figure(events: int, run_events: int, workers: int | None) -> None:
    settings = replace(bench_settings("history"), partitions=PARTITIONS)
    try:
        with stage(f"producing a history of {events:,} events to {settings.topic}"):
            produced_runs = produce_history(settings, events, run_events)
        with stage("replaying the history from the topic"):
            runs, read, seconds, cpu = replay_history(settings, workers=workers)
    finally:
        delete_topics(settings, [settings.topic])
    if runs != produced_runs:
        raise RuntimeError(f"replayed {runs} runs of the {produced_runs} produced")
    emit(
        BENCH,
        "history_events_per_s",
        read / seconds,
        unit="events/s",
        target=HISTORY_TARGET,
        events=read,
        runs=runs,
        workers=workers or (os.cpu_count() or 1),
        partitions=PARTITIONS,
    )
    # On a machine others are busy on, the rate above falls with the share of the cores
    # the scan gets; events per CPU-second (all workers' together) says what it costs.
    emit(BENCH, "history_events_per_cpu_s", read / cpu, unit="events/s", events=read)


# Figures -------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000, help="events of the long run")
    parser.add_argument(
        "--bounded", type=int, default=250_000, help="events of the run compared for memory"
    )
    parser.add_argument("--short", type=int, default=10_000, help="events of the short run")
    parser.add_argument(
        "--repeat", type=int, default=3, help="replays of the long run (the median counts)"
    )
    parser.add_argument(
        "--cache", type=Path, default=None, help="archive folder (default: <cache>/bench)"
    )
    parser.add_argument("--history", type=int, default=100_000, help="events of the history")
    parser.add_argument("--run-events", type=int, default=100, help="events per history run")
    parser.add_argument("--workers", type=int, default=None, help="history replay workers")
    parser.add_argument("--only", choices=("archive", "history"), default=None)
    args = parser.parse_args(argv)
    if args.only != "archive":
        history_figure(args.history, args.run_events, args.workers)
    if args.only == "history":
        return
    cache = args.cache or StackSettings.from_env().cache_dir / "bench"
    archives = [archive_of(n, cache) for n in (args.events, args.bounded, args.short)]
    results: list[Replayed] = []
    for path in [archives[0]] * args.repeat + archives[1:]:
        with stage(f"replaying {path.name} in a fresh process"):
            results.append(replay_fresh(path))
    longs, (bounded, short) = results[: args.repeat], results[args.repeat :]
    # A shared machine's speed wanders by ten percent between runs: the median of a few
    # fresh processes is the figure, the fastest and slowest are printed beside it.
    rates = sorted(r.events / r.seconds for r in longs)
    long = longs[0]
    emit(
        BENCH,
        "events_per_s",
        statistics.median(rates),
        unit="events/s",
        target=THROUGHPUT_TARGET,
        events=long.events,
        runs=len(rates),
        slowest=round(rates[0]),
        fastest=round(rates[-1]),
    )
    cpu_rates = [r.events / r.cpu_seconds for r in longs]
    emit(BENCH, "events_per_cpu_s", statistics.median(cpu_rates), unit="events/s")
    for result in (long, bounded):
        emit(
            BENCH,
            "peak_rss_mb",
            result.peak_rss_mb,
            unit="MB",
            target=PEAK_TARGET_MB,
            at_least=False,
            events=result.events,
        )
        emit(BENCH, "replay_rss_growth_mb", result.growth_mb, unit="MB", events=result.events)
    # Where an event's CPU goes: the stages timed alone, and the rest of the median
    # long run's CPU per event (the agent's code, the replay's turn-taking, the digests
    # of what the code asked and the values it is handed back).
    with stage(f"timing the hot path over {HOT_PATH_SAMPLE:,} events"):
        stages = hot_path_fresh(archives[1], HOT_PATH_SAMPLE)
    stages["engine"] = 1e6 / statistics.median(cpu_rates) - sum(stages.values())
    for name, us in stages.items():
        emit(BENCH, "hot_path_cpu_us_per_event", us, unit="us", stage=name)
    emit(
        BENCH,
        "short_run_s",
        short.seconds,
        unit="s",
        target=SHORT_TARGET_S,
        at_least=False,
        events=short.events,
    )


if __name__ == "__main__":
    main()
