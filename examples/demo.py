"""The end-to-end demo: record agent runs, relay them to Kafka, build the views, show them."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from sqlalchemy import Connection, Engine, create_engine

from agent_blackbox.consumers import (
    RunRow,
    ViewConsumer,
    indexed_events_txn,
    migrate_views,
    views_summary_txn,
)
from agent_blackbox.examples.ticket_agent import KeywordModel, Notifier, TicketAgent, sample_tickets
from agent_blackbox.outbox import Recorder, migrate_write_side, pending_events_txn
from agent_blackbox.outbox.relay import Relay
from agent_blackbox.schemas import Settings, safe_text
from agent_blackbox.stack import LocalStack


def run_demo(*, runs: int, workers: int, console: Console) -> None:
    """Bring the pipeline up and push ``runs`` ticket-agent runs through all of it."""
    console.rule("agent-blackbox demo")
    endpoints = LocalStack(console=console).up()
    settings = replace(
        Settings.from_env(),
        database_url=endpoints.database_url,
        kafka_bootstrap=endpoints.kafka_bootstrap,
    )
    migrate_write_side(settings.database_url)
    migrate_views(settings.database_url)
    engine = create_engine(settings.database_url, pool_size=workers + 4)
    try:
        timings: dict[str, float] = {}
        run_ids = _record(engine, settings, runs, workers, console, timings)
        events = _count(engine, lambda conn: pending_events_txn(conn, run_ids))
        _relay(engine, settings, console, timings)
        _build_views(engine, settings, run_ids, events, console, timings)
        _show(engine, run_ids, events, timings, console)
    finally:
        engine.dispose()


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description:<26}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )


def _record(
    engine: Engine,
    settings: Settings,
    runs: int,
    workers: int,
    console: Console,
    timings: dict[str, float],
) -> list[str]:
    recorder = Recorder(engine, settings=settings)
    agent = TicketAgent(sample_tickets(runs), KeywordModel(), Notifier())

    def one(ticket_id: str) -> str:
        snapshot = agent.snapshot(ticket_id)
        run, _ = recorder.record(
            agent.run, snapshot, agent_id="ticket-agent", subject_ids=(ticket_id,)
        )
        return run.run_id

    started = time.perf_counter()
    run_ids: list[str] = []
    with _progress(console) as progress, ThreadPoolExecutor(workers) as pool:
        task = progress.add_task("recording agent runs", total=runs)
        for run_id in pool.map(one, list(agent.tickets.tickets)):
            run_ids.append(run_id)
            progress.advance(task)
    timings["record"] = time.perf_counter() - started
    return run_ids


def _relay(engine: Engine, settings: Settings, console: Console, timings: dict[str, float]) -> None:
    waiting = _count(engine, pending_events_txn)
    relay = Relay(engine, settings=settings)
    started = time.perf_counter()
    with _progress(console) as progress:
        task = progress.add_task("relaying outbox → Kafka", total=waiting)
        _in_background(
            relay.run,
            done=lambda: _count(engine, pending_events_txn) == 0,
            tick=lambda: progress.update(task, completed=relay.published),
        )
        progress.update(task, completed=relay.published)
    timings["relay"] = time.perf_counter() - started


def _build_views(
    engine: Engine,
    settings: Settings,
    run_ids: Sequence[str],
    events: int,
    console: Console,
    timings: dict[str, float],
) -> None:
    consumer = ViewConsumer(settings, engine=engine)

    def landed(conn: Connection) -> int:
        return indexed_events_txn(conn, run_ids)

    started = time.perf_counter()
    with _progress(console) as progress, consumer:
        task = progress.add_task("building views", total=events)
        _in_background(
            lambda stop: consumer.run(stop),
            done=lambda: _count(engine, landed) >= events,
            tick=lambda: progress.update(task, completed=_count(engine, landed)),
        )
        progress.update(task, completed=_count(engine, landed))
    timings["views"] = time.perf_counter() - started


def _in_background(
    work: Callable[[threading.Event], object],
    *,
    done: Callable[[], bool],
    tick: Callable[[], None],
    timeout: float = 600.0,
) -> None:
    """Run ``work(stop)`` in a thread until ``done()`` holds, calling ``tick`` meanwhile."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def target() -> None:
        try:
            work(stop)
        except BaseException as exc:  # surfaced to the caller below
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not done() and not errors and time.monotonic() < deadline:
        tick()
        stop.wait(0.2)  # refresh rate of the progress bar
    stop.set()
    thread.join()
    if errors:
        raise errors[0]
    tick()


def _count(engine: Engine, count: Callable[[Connection], int]) -> int:
    with engine.connect() as conn:
        return count(conn)


def _show(
    engine: Engine,
    run_ids: Sequence[str],
    events: int,
    timings: dict[str, float],
    console: Console,
) -> None:
    with engine.connect() as conn:
        summary = views_summary_txn(conn, run_ids)

    table = Table(title="Runs in the views", show_lines=False)
    for column in ("status", "runs", "events"):
        table.add_column(column, justify="right" if column != "status" else "left")
    for status, count, total in summary.statuses:
        table.add_row(safe_text(status), str(count), str(total))
    console.print(table)

    table = Table(title="Events by boundary type")
    table.add_column("event type")
    table.add_column("events", justify="right")
    for event_type, count in summary.event_types:
        table.add_row(safe_text(event_type), str(count))
    console.print(table)

    table = Table(title="Kafka partitions (key = run_id, murmur2)")
    for column in ("partition", "runs", "events"):
        table.add_column(column, justify="right")
    for partition, runs, count in summary.partitions:
        table.add_row(str(partition), str(runs), str(count))
    console.print(table)

    table = Table(title="First runs")
    for column in ("run", "status", "events", "last seq", "code version", "ms"):
        table.add_column(column, no_wrap=True)
    for run in summary.first_runs:
        took = _took_ms(run)
        row = (run.run_id[:8], run.status, run.event_count, run.last_sequence, run.code_version)
        table.add_row(*(safe_text(value) for value in (*row, took)))  # values from the log
    console.print(table)

    console.print(
        f"[bold]{len(run_ids)}[/] runs, [bold]{events}[/] events recorded, relayed and "
        f"indexed; integrity violations: [bold]{summary.violations}[/]"
    )
    # Wall times of the stages, connection and group-join time included; bench/ measures
    # throughput properly.
    console.print("  ".join(f"{step} {seconds:.1f}s" for step, seconds in timings.items()))


def _took_ms(run: RunRow) -> int | None:
    if run.started_at is None or run.finished_at is None:
        return None
    return round((run.finished_at - run.started_at).total_seconds() * 1000)
