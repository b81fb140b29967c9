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
from sqlalchemy import Engine, create_engine, text

from agent_blackbox.consumers import ViewConsumer, migrate_views
from agent_blackbox.examples.ticket_agent import KeywordModel, Notifier, TicketAgent, sample_tickets
from agent_blackbox.outbox import Recorder, migrate_write_side
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
        events = _count(
            engine, "SELECT count(*) FROM blackbox.outbox WHERE run_id = ANY(:ids)", run_ids
        )
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
    waiting = _count(engine, "SELECT count(*) FROM blackbox.outbox", [])
    relay = Relay(engine, settings=settings)
    started = time.perf_counter()
    with _progress(console) as progress:
        task = progress.add_task("relaying outbox → Kafka", total=waiting)
        _in_background(
            relay.run,
            done=lambda: _count(engine, "SELECT count(*) FROM blackbox.outbox", []) == 0,
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
    landed = "SELECT count(*) FROM blackbox_views.events WHERE run_id = ANY(:ids)"
    started = time.perf_counter()
    with _progress(console) as progress, consumer:
        task = progress.add_task("building views", total=events)
        _in_background(
            lambda stop: consumer.run(stop),
            done=lambda: _count(engine, landed, run_ids) >= events,
            tick=lambda: progress.update(task, completed=_count(engine, landed, run_ids)),
        )
        progress.update(task, completed=_count(engine, landed, run_ids))
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


def _count(engine: Engine, sql: str, ids: Sequence[str]) -> int:
    with engine.connect() as conn:
        params = {"ids": list(ids)} if ":ids" in sql else {}
        return int(conn.execute(text(sql), params).scalar_one())


def _show(
    engine: Engine,
    run_ids: Sequence[str],
    events: int,
    timings: dict[str, float],
    console: Console,
) -> None:
    ids = {"ids": list(run_ids)}
    with engine.connect() as conn:
        statuses = conn.execute(
            text(
                "SELECT status, count(*), sum(event_count) FROM blackbox_views.runs "
                "WHERE run_id = ANY(:ids) GROUP BY status ORDER BY status"
            ),
            ids,
        ).all()
        types = conn.execute(
            text(
                "SELECT event_type, count(*) FROM blackbox_views.events "
                "WHERE run_id = ANY(:ids) GROUP BY event_type ORDER BY count(*) DESC, event_type"
            ),
            ids,
        ).all()
        partitions = conn.execute(
            text(
                "SELECT partition, count(DISTINCT run_id), count(*) FROM blackbox_views.events "
                "WHERE run_id = ANY(:ids) GROUP BY partition ORDER BY partition"
            ),
            ids,
        ).all()
        sample = conn.execute(
            text(
                "SELECT left(run_id, 8), status, event_count, last_sequence, code_version, "
                "round(extract(epoch FROM finished_at - started_at) * 1000) "
                "FROM blackbox_views.runs "
                "WHERE run_id = ANY(:ids) ORDER BY started_at LIMIT 5"
            ),
            ids,
        ).all()
        violations = conn.execute(
            text("SELECT count(*) FROM blackbox_views.integrity_violations")
        ).scalar_one()

    table = Table(title="Runs in the views", show_lines=False)
    for column in ("status", "runs", "events"):
        table.add_column(column, justify="right" if column != "status" else "left")
    for status, count, total in statuses:
        table.add_row(safe_text(status), str(count), str(total))
    console.print(table)

    table = Table(title="Events by boundary type")
    table.add_column("event type")
    table.add_column("events", justify="right")
    for event_type, count in types:
        table.add_row(safe_text(event_type), str(count))
    console.print(table)

    table = Table(title="Kafka partitions (key = run_id, murmur2)")
    for column in ("partition", "runs", "events"):
        table.add_column(column, justify="right")
    for partition, runs, count in partitions:
        table.add_row(str(partition), str(runs), str(count))
    console.print(table)

    table = Table(title="First runs")
    for column in ("run", "status", "events", "last seq", "code version", "ms"):
        table.add_column(column, no_wrap=True)
    for row in sample:
        table.add_row(*(safe_text(value) for value in row))  # values from the log
    console.print(table)

    console.print(
        f"[bold]{len(run_ids)}[/] runs, [bold]{events}[/] events recorded, relayed and "
        f"indexed; integrity violations: [bold]{violations}[/]"
    )
    # Wall times of the stages, connection and group-join time included; bench/ measures
    # throughput properly.
    console.print("  ".join(f"{step} {seconds:.1f}s" for step, seconds in timings.items()))
