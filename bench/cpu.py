"""CPU per event of every process of the pipeline, from the processes' own counters, so
figures compare across machines (wall time on two shared cores does not).

On a database and topic of the bench's own, for each writer mode (per-event, then group
commit): ``blackbox relay``, ``blackbox consume`` (the views) and ``blackbox analytics``
run as processes; a warm-up run goes through them all (imports, connections, prepared
statements, the group joins); then an agent process records ``--events`` tool calls
(a 1 KB result each) in ``--runs`` threads, each recording runs of ``--run-length``
calls one after another (0: one run a thread), and the bench waits until
both consumers committed the topic's last offset. Over that window, per event on the
topic:

- ``agent``: the writer process's CPU (all its threads: the group commit writer's too)
  over the recording, from the process itself (``time.process_time``);
- ``postgres``: the Postgres backends serving each of them (``pg_stat_activity`` names
  them by ``application_name``; ``/proc/<pid>/stat`` utime + stime of each, sampled
  through the window). Postgres's own background processes (WAL writer, checkpointer,
  autovacuum) are not counted;
- ``relay``, ``views``, ``analytics``: each process's ``/proc/<pid>/stat``;
- ``broker``: the Kafka JVM listening on the bootstrap port. On a broker other work
  shares, its figure counts that work too (``broker_background_cpu_ms_per_s``, its rate
  in the seconds before the window, says how much).

Then the relay's floor: a plain confluent-kafka producer in a process of its own, with
the relay's producer settings, sends the same messages (keys, values, headers, read back
from the per-event topic) to a fresh topic, without delivery reports; its CPU per message
against the relay's.

Budgets: views consumer <= 20 us per event, relay <= 1.2x the plain producer per
message, agent <= 150 us per recorded tool call.

    python -m bench.cpu [--events 20000] [--runs 8] [--run-length 50]
                        [--modes per-event group]
"""

from __future__ import annotations

import argparse
import multiprocessing
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import Engine, create_engine, make_url, text

from agent_blackbox.broker import ensure_topics, new_producer, producer_config, watermarks
from agent_blackbox.outbox import GroupCommit, Recorder, RunSnapshot
from agent_blackbox.schemas import Settings
from bench import _processes
from bench._common import (
    console,
    delete_group,
    delete_topics,
    emit,
    fresh_topic,
    own_database,
    stage,
)
from bench._pipeline import Worker, wait_for, worker_env

BENCH = "cpu"
VIEWS_BUDGET_US = 20.0
RELAY_OVER_PLAIN_BUDGET = 1.2
AGENT_BUDGET_US = 150.0
CONSUMERS = ("views", "analytics")
_COMMANDS = {"relay": ["relay"], "views": ["consume"], "analytics": ["analytics"]}
DEADLINE_S = 600.0
RUN_LENGTH = 50
"""Tool calls per run. The relay holds one unacknowledged message per run, so a backlog
of a few long runs drains a few messages per acknowledgement; runs of an agent are many
and short."""
_DESCRIPTION = "x" * 900
"""The tool result's text: with its other fields, about 1 KB."""


@dataclass(frozen=True, slots=True)
class Recorded:
    """What the agent process did: events it recorded, its CPU and wall seconds."""

    events: int
    cpu_s: float
    wall_s: float
    agent_id: str


# The database of the bench's own --------------------------------------------------------


def named(settings: Settings, role: str) -> Settings:
    """``settings`` whose database sessions carry ``bench-cpu-<role>`` as their
    ``application_name``, so their backends can be told apart."""
    url = make_url(settings.database_url)
    url = url.update_query_dict({"application_name": f"bench-cpu-{role}"})
    return replace(settings, database_url=url.render_as_string(hide_password=False))


# The agent ------------------------------------------------------------------------------


def lookup(item: int) -> dict[str, Any]:
    """The tool: a record of about 1 KB."""
    return {"item": item, "name": f"item-{item}", "stock": item * 7 % 101, "text": _DESCRIPTION}


def record(
    settings: Settings,
    *,
    events: int,
    runs: int,
    group: bool,
    agent_id: str,
    run_length: int = 0,
) -> Recorded:
    """Record ``events`` tool calls in ``runs`` threads (run in the agent process): each
    thread runs of ``run_length`` calls one after another, or (0) one run."""
    engine = create_engine(settings.database_url, pool_size=runs + 1)
    recorder = Recorder(engine, settings=settings, group_commit=GroupCommit() if group else None)
    per_thread = events // runs
    length = run_length or per_thread
    recorded: list[int] = []  # the events of each run (list.append: safe between threads)

    def one(index: int) -> None:
        done = 0
        while done < per_thread:
            calls = min(length, per_thread - done)
            snapshot = RunSnapshot(code_version="bench", input={"index": index, "at": done})
            with recorder.start_run(snapshot, agent_id=agent_id) as run:
                for i in range(calls):
                    run.call("lookup", lookup, i)
            recorded.append(calls + 2)  # with run.started and run.finished
            done += calls

    cpu, wall = time.process_time(), time.perf_counter()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(runs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    engine.dispose()
    return Recorded(sum(recorded), cpu, wall, agent_id)


def _record_in_child(settings: Settings, kwargs: dict[str, Any], results: Any) -> None:
    try:
        results.put(record(settings, **kwargs))
    except Exception as exc:  # reported to the parent, which raises it
        results.put(f"{type(exc).__name__}: {exc}")


def record_elsewhere(settings: Settings, **kwargs: Any) -> Recorded:
    """:func:`record` in a process of its own (spawned: a fresh interpreter).

    Raises:
        RuntimeError: the process failed.
    """
    context = multiprocessing.get_context("spawn")
    results: Any = context.Queue()
    process = context.Process(target=_record_in_child, args=(settings, kwargs, results))
    process.start()
    outcome = results.get(timeout=DEADLINE_S)
    process.join(30)
    if isinstance(outcome, str):
        raise RuntimeError(f"the agent process failed: {outcome}")
    return outcome  # type: ignore[no-any-return]


# The pipeline ---------------------------------------------------------------------------


def start_workers(stack: ExitStack, settings: Settings, group: str) -> dict[str, Worker]:
    """The relay and the consumers, each a ``blackbox`` process with its own database
    sessions' name; stopped when ``stack`` closes."""
    workers: dict[str, Worker] = {}
    for role, command in _COMMANDS.items():
        # The relay's lease outlives its pause (see pipeline).
        relay = ["--relay-id", f"bench-cpu-{group}", "--lease-ttl", "3600"]
        extra = relay if role == "relay" else ["--group", f"{group}.{role}"]
        worker = Worker([*command, *extra], worker_env(named(settings, role)), name=role)
        stack.callback(worker.stop)
        workers[role] = worker
    return workers


def caught_up(
    engine: Engine, settings: Settings, group: str, *, at_least: int = 1
) -> Callable[[], bool]:
    """Whether the topic holds ``at_least`` messages and each consumer committed, for
    every partition, the topic's end."""

    def check() -> bool:
        ends = sum(high for _, high in watermarks(settings, settings.topic).values())
        if ends < at_least:
            return False
        query = text(
            "SELECT group_id, sum(next_offset) FROM blackbox_views.consumer_offsets "
            "WHERE topic = :topic GROUP BY group_id"
        )
        with engine.connect() as conn:
            done = dict(conn.execute(query, {"topic": settings.topic}).all())
        return all(done.get(f"{group}.{c}") == ends for c in CONSUMERS)

    return check


def pipeline(
    settings: Settings, *, events: int, runs: int, group: bool, run_length: int = 0
) -> dict[str, float]:
    """One writer mode through the whole pipeline: CPU seconds per role, with ``events``
    (what reached the topic) and the agent's figures.

    1. Start the relay and the consumers; pass a warm-up run through all of them.
    2. Pause the relay (SIGSTOP; its lease outlives the pause) and record in the agent
       process: the agent's window, with its backends sampled.
    3. Resume the relay and wait until both consumers committed the topic's end: the
       drain's window, for the relay, the consumers, the broker and their backends.
    """
    group_id = f"blackbox.bench.cpu.{uuid.uuid4().hex[:8]}"
    engine = create_engine(settings.database_url, pool_size=1)
    with ExitStack() as stack:
        stack.callback(engine.dispose)
        for consumer in CONSUMERS:  # once the workers stopped (callbacks run last first)
            stack.callback(delete_group, settings, f"{group_id}.{consumer}")
        workers = start_workers(stack, settings, group_id)
        with stage("warm-up run through the pipeline"):
            record(named(settings, "agent"), events=50, runs=1, group=group, agent_id="warm")
            wait_for(caught_up(engine, settings, group_id), timeout=120, what="the warm-up")
        pids: dict[str, int | None] = {role: worker.pid for role, worker in workers.items()}
        broker = _processes.listening_pid(settings.kafka_bootstrap)
        spent = {"broker_background_s_per_s": _processes.cpu_rate(broker, seconds=2.0)}
        start_offsets = sum(high for _, high in watermarks(settings, settings.topic).values())
        with _processes.BackendSampler(settings.database_url) as backends:
            with _processes.paused(workers["relay"].pid), stage(f"agent: {events} tool calls"):
                agent = record_elsewhere(
                    named(settings, "agent"),
                    events=events,
                    runs=runs,
                    group=group,
                    agent_id="cpu",
                    run_length=run_length,
                )
                spent["postgres.agent"] = backends.split().get("bench-cpu-agent", 0.0)
                pids["broker"] = broker
                before = {role: _processes.cpu_seconds(pid) for role, pid in pids.items()}
            with stage("drain: relay and consumers"):
                expected = start_offsets + agent.events
                caught = caught_up(engine, settings, group_id, at_least=expected)
                wait_for(caught, timeout=DEADLINE_S, what="consumers")
        after = {role: _processes.cpu_seconds(pid) for role, pid in pids.items()}
        on_topic = sum(high for _, high in watermarks(settings, settings.topic).values())
        spent.update({role: after[role] - before[role] for role in pids})
        for name, seconds in backends.by_application().items():
            if name != "bench-cpu-agent":
                spent[f"postgres.{name.removeprefix('bench-cpu-')}"] = seconds
        spent.update(agent=agent.cpu_s, agent_events=agent.events, agent_wall_s=agent.wall_s)
        spent["events"] = on_topic - start_offsets
    return spent


def report(spent: Mapping[str, float], *, mode: str) -> float:
    """One line per role: CPU microseconds per event, with its budget; the relay's."""
    events = spent["events"]
    emit(BENCH, "events", events, unit="events", mode=mode)
    emit(
        BENCH,
        "agent_cpu_us_per_event",
        spent["agent"] / spent["agent_events"] * 1e6,
        unit="us",
        target=AGENT_BUDGET_US,
        at_least=False,
        mode=mode,
    )
    emit(
        BENCH,
        "agent_events_per_s",
        spent["agent_events"] / spent["agent_wall_s"],
        unit="events/s",
        mode=mode,
    )
    for role in ("relay", *CONSUMERS, "broker"):
        budget = VIEWS_BUDGET_US if role == "views" else None
        emit(
            BENCH,
            f"{role}_cpu_us_per_event",
            spent[role] / events * 1e6,
            unit="us",
            target=budget,
            at_least=False,
            mode=mode,
        )
    for role in sorted(r for r in spent if r.startswith("postgres.")):
        emit(
            BENCH,
            "postgres_cpu_us_per_event",
            spent[role] / events * 1e6,
            unit="us",
            mode=mode,
            serving=role.removeprefix("postgres."),
        )
    emit(
        BENCH,
        "broker_background_cpu_ms_per_s",
        spent["broker_background_s_per_s"] * 1e3,
        unit="ms/s",
        mode=mode,
    )
    return spent["relay"] / events * 1e6


# The relay's floor ----------------------------------------------------------------------


def plain_producer(settings: Settings, source: str, results: Any) -> None:
    """Read every message of ``source``, then send them again with the relay's producer
    settings to a fresh topic and flush; the CPU per message of the sending (run in a
    process of its own)."""
    try:
        messages = _processes.read_topic(settings, source)
        target = replace(settings, topic=fresh_topic("cpu.plain"))
        ensure_topics(target, {target.topic: target.partitions})
        producer = new_producer(target, producer_config(target))
        cpu = time.process_time()
        for key, value, headers in messages:
            producer.produce(target.topic, value=value, key=key, headers=headers)
            producer.poll(0)
        producer.flush(60)
        cpu = time.process_time() - cpu
        results.put((len(messages), cpu, target.topic))
    except Exception as exc:  # reported to the parent, which raises it
        results.put(f"{type(exc).__name__}: {exc}")


def plain_floor(settings: Settings) -> tuple[int, float]:
    """Messages and CPU microseconds per message of :func:`plain_producer`."""
    context = multiprocessing.get_context("spawn")
    results: Any = context.Queue()
    process = context.Process(target=plain_producer, args=(settings, settings.topic, results))
    process.start()
    outcome = results.get(timeout=DEADLINE_S)
    process.join(30)
    if isinstance(outcome, str):
        raise RuntimeError(f"the plain producer failed: {outcome}")
    count, cpu, topic = outcome
    delete_topics(settings, [topic])
    return count, cpu / count * 1e6


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000, help="tool calls recorded")
    parser.add_argument("--runs", type=int, default=8, help="runs at a time (agent threads)")
    parser.add_argument(
        "--run-length",
        type=int,
        default=RUN_LENGTH,
        help="tool calls per run: each thread records runs of this many one after another "
        "(0: one run per thread)",
    )
    parser.add_argument(
        "--modes", nargs="+", choices=("per-event", "group"), default=["per-event", "group"]
    )
    args = parser.parse_args(argv)
    base = Settings.from_env()
    topics: list[str] = []
    try:
        measure_modes(base, args, topics)
    finally:
        delete_topics(base, topics)
    console.log("done")


def measure_modes(base: Settings, args: argparse.Namespace, topics: list[str]) -> None:
    """Each writer mode through the pipeline, then the plain producer; the topics made
    are added to ``topics``."""
    with own_database(base, "cpu", views=True) as settings:
        relay_us: dict[str, float] = {}
        for mode in args.modes:
            mine = replace(settings, topic=fresh_topic(f"cpu.{mode}"), partitions=12)
            topics += [mine.topic, mine.dlq_topic]
            ensure_topics(mine)
            with stage(f"pipeline, {mode} writer"):
                spent = pipeline(
                    mine,
                    events=args.events,
                    runs=args.runs,
                    group=mode == "group",
                    run_length=args.run_length,
                )
            relay_us[mode] = report(spent, mode=mode)
            floor_settings = replace(settings, topic=topics[0], partitions=12)
        if relay_us:
            with stage("plain producer on the same messages"):
                count, plain_us = plain_floor(floor_settings)
            emit(BENCH, "plain_producer_cpu_us_per_message", plain_us, unit="us", messages=count)
            for mode, relay in relay_us.items():
                emit(
                    BENCH,
                    "relay_over_plain_producer",
                    relay / plain_us,
                    unit="ratio",
                    target=RELAY_OVER_PLAIN_BUDGET,
                    at_least=False,
                    mode=mode,
                )


if __name__ == "__main__":
    main()
