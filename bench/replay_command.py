"""``blackbox replay --all`` over many short runs, as a user runs it: process start,
the run index's query, one pass over the topic, each run's replay and the keeping of
every result included.

``--runs`` runs of the demo's ticket agent (eleven events each) are recorded with the
MemoryRecorder and produced to a fresh topic of 12 partitions under the run's key, with
a lease stamp, as the relay does, under an agent id of this run's own (so the command's
``--agent-id`` covers them and nothing else in the database). The view consumer indexes
them in a group of its own. Then the command runs in a fresh process once per worker
count and repeat, the worker counts interleaved, so a machine that gets busier
during the bench slows each alike.

Figures, per worker count (the median of the repeats): ``command_events_per_s``, events
over the command's wall time; ``command_events_per_cpu_s``, the same events over the CPU
time of the command and its worker processes (from the kernel's counters of the
children this bench waited for), which a busy machine moves less. The topic and the
consumer group are deleted afterwards; the runs' rows in the views and their replay
results stay (under the bench's agent id).

    python -m bench.replay_command [--runs 2000] [--workers 1 2] [--repeat 3]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace

from sqlalchemy import Engine, create_engine

from agent_blackbox.broker import LeaseStamp, ensure_topics, new_producer, producer_config
from agent_blackbox.consumers import ViewConsumer, ViewRunIndex, migrate_views
from agent_blackbox.examples.ticket_agent import KeywordModel, Notifier, TicketAgent, sample_tickets
from agent_blackbox.outbox import MemoryRecorder
from agent_blackbox.schemas import Envelope, EnvelopeCodec, Settings
from bench._common import bench_settings, delete_group, delete_topics, emit, progress, stage
from bench._pipeline import worker_env

BENCH = "replay_command"
TARGET = 20_000.0
"""Events per second with two workers on a quiet machine (issue 33)."""
ENTRY = "agent_blackbox.examples.ticket_agent:replay_entry"


def produce_runs(settings: Settings, runs: int, agent_id: str) -> int:
    """Record ``runs`` ticket-agent runs and produce them as the relay would; the
    events produced."""
    ensure_topics(settings, {settings.topic: settings.partitions})
    producer = new_producer(settings, producer_config(settings))
    codec = EnvelopeCodec()
    stamp: list[tuple[str, str | bytes | None]] = [LeaseStamp(0, 1).header()]
    produced = 0

    def produce(envelope: Envelope) -> None:
        nonlocal produced
        while True:
            try:
                producer.produce(
                    settings.topic, codec.encode(envelope), envelope.run_id.encode(), headers=stamp
                )
                produced += 1
                return
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.1)

    agent = TicketAgent(sample_tickets(runs), KeywordModel(), Notifier())
    recorder = MemoryRecorder(sink=produce)
    with progress() as bar:
        task = bar.add_task(f"recording {runs:,} runs", total=runs)
        for ticket_id in list(agent.tickets.tickets):
            recorder.record(agent.run, agent.snapshot(ticket_id), agent_id=agent_id)
            producer.poll(0)
            bar.advance(task)
    if producer.flush(120) != 0:
        raise RuntimeError(f"the broker did not take the runs of {settings.topic}")
    return produced


def index_runs(settings: Settings, engine: Engine, runs: int, agent_id: str) -> None:
    """Consume the topic into the views until the run index lists all ``runs``."""
    index = ViewRunIndex(engine)
    deadline = time.monotonic() + 600
    with ViewConsumer(settings, engine=engine) as consumer:
        while len(index.runs(finished_only=True, agent_id=agent_id)) < runs:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the views did not index {runs} runs in 10 minutes")
            consumer.poll_once(0.5)


def replay_command(settings: Settings, agent_id: str, workers: int) -> tuple[float, float]:
    """Run ``blackbox replay --all`` over the bench's runs; (wall s, CPU s of it and
    its workers). Raises when it did not pass every run."""
    args = ["replay", "--all", "--agent-id", agent_id, "--agent", f"{agent_id}={ENTRY}"]
    args += ["--workers", str(workers), "--purpose", "bench of batch replay"]
    before = _children_cpu()
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "agent_blackbox.cli", *args],
        env=worker_env(settings),
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"replay --all exited {done.returncode}: {done.stderr[-2000:]}")
    return wall, _children_cpu() - before


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2_000, help="ticket-agent runs")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeat", type=int, default=3, help="runs of the command per count")
    args = parser.parse_args(argv)
    settings = bench_settings(BENCH)
    settings = replace(settings, consumer_group=f"{settings.topic}.views")
    migrate_views(settings.database_url)
    agent_id = f"bench-{uuid.uuid4().hex[:12]}"
    engine = create_engine(settings.database_url)
    measured: dict[int, list[tuple[float, float]]] = {w: [] for w in args.workers}
    try:
        with stage(f"recording {args.runs:,} runs to {settings.topic}"):
            events = produce_runs(settings, args.runs, agent_id)
        with stage("indexing them in the views"):
            index_runs(settings, engine, args.runs, agent_id)
        for _ in range(args.repeat):
            for workers in args.workers:
                with stage(f"replay --all with {workers} workers"):
                    measured[workers].append(replay_command(settings, agent_id, workers))
    finally:
        engine.dispose()
        delete_topics(settings, [settings.topic])
        delete_group(settings, settings.consumer_group)
    for workers, runs in measured.items():
        emit(
            BENCH,
            "command_events_per_s",
            events / statistics.median(wall for wall, _ in runs),
            unit="events/s",
            target=TARGET if workers == 2 else None,
            events=events,
            runs=args.runs,
            workers=workers,
        )
        emit(
            BENCH,
            "command_events_per_cpu_s",
            events / statistics.median(cpu for _, cpu in runs),
            unit="events/s",
            events=events,
            workers=workers,
        )


if __name__ == "__main__":
    main()
