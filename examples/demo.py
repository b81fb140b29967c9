"""The end-to-end demo: record agent runs, relay them to Kafka, build the views, show them,
back them up to the local object store and end with a restore drill's report."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from sqlalchemy import Connection, Engine

from agent_blackbox.backup import (
    BACKUP_URL_ENV,
    BackupWriter,
    DrillOptions,
    open_store,
    print_drill,
    run_drill,
)
from agent_blackbox.consumers import (
    AnalyticsConsumer,
    CheckpointConsumer,
    RunRow,
    ViewConsumer,
    indexed_events_txn,
    load_checkpoint,
    migrate_views,
    views_summary_txn,
)
from agent_blackbox.examples.ticket_agent import KeywordModel, Notifier, TicketAgent, sample_tickets
from agent_blackbox.outbox import Recorder
from agent_blackbox.outbox.relay import Relay
from agent_blackbox.outbox.storage import migrate_write_side, pending_events_txn
from agent_blackbox.schemas import (
    PUBLIC_KEYS_ENV,
    SIGNING_KEY_FILE_ENV,
    CheckpointSigner,
    CheckpointVerifier,
    Settings,
    safe_text,
    write_owner_only,
)
from agent_blackbox.stack import Endpoints, LocalStack, StackError
from agent_blackbox.wiring import AGENT_POOL

AGENTS_ENV = "BLACKBOX_AGENTS"
DEMO_AGENTS = "ticket-agent=agent_blackbox.examples.ticket_agent:replay_entry"


def run_demo(settings: Settings, *, runs: int, workers: int, console: Console) -> bool:
    """Bring the pipeline up and push ``runs`` ticket-agent runs through all of it; whether
    the closing restore drill passed. ``settings`` are the command's; the database and
    the broker are the stack's."""
    console.rule("agent-blackbox demo")
    stack = LocalStack(console=console)
    endpoints = stack.up(with_s3=True)
    settings = replace(
        settings,
        database_url=endpoints.database_url,
        kafka_bootstrap=endpoints.kafka_bootstrap,
    )
    migrate_write_side(settings.database_url)
    migrate_views(settings.database_url)
    # The pool of an agent's recorder: the demo's agents record from `workers` threads.
    engine = AGENT_POOL.engine(settings.database_url)
    try:
        timings: dict[str, float] = {}
        run_ids = _record(engine, settings, runs, workers, console, timings)
        events = _count(engine, lambda conn: pending_events_txn(conn, run_ids))
        _relay(engine, settings, console, timings)
        _build_views(engine, settings, run_ids, events, console, timings)
        _build_analytics(settings, engine, events, console, timings)
        _show(engine, run_ids, events, timings, console)
        passed = _back_up_and_drill(engine, settings, run_ids, stack, endpoints, console)
        console.rule("run console")
        url = stack.web.start(
            database_url=endpoints.database_url, kafka_bootstrap=endpoints.kafka_bootstrap
        )
        console.print(
            f"the run console: [bold]{url}[/] (runs, waterfalls, bodies on a stated purpose, "
            "charts; this machine only; `make down` stops it with the stack)"
        )
        return passed
    finally:
        engine.dispose()


def _back_up_and_drill(
    engine: Engine,
    settings: Settings,
    run_ids: Sequence[str],
    stack: LocalStack,
    endpoints: Endpoints,
    console: Console,
) -> bool:
    """Sign the runs' checkpoints and the backup's manifests (with a key of the demo's own,
    kept in the stack's cache folder), back the log up and rehearse a restore of it."""
    console.rule("backup and restore drill")
    # The operator's signer when one is configured (a store holds one signer's chain),
    # else the demo's own.
    if os.environ.get(SIGNING_KEY_FILE_ENV):
        signer = CheckpointSigner.from_env()
        public = stack.settings.cache_dir / "demo" / "operator-signing-key.pub"
        public.parent.mkdir(parents=True, exist_ok=True)
        public.write_bytes(signer.public_key_pem())
    else:
        signer = _demo_signer(stack.settings.cache_dir / "demo")
        public = stack.settings.cache_dir / "demo" / "signing-key.pub"
    url = os.environ.get(BACKUP_URL_ENV)
    if url is None:
        if endpoints.backup is None:
            raise StackError("no object store: set BLACKBOX_BACKUP_URL or let the demo start one")
        os.environ.setdefault("AWS_ACCESS_KEY_ID", endpoints.backup.access_key)
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", endpoints.backup.secret_key)
        url = endpoints.backup.backup_url.replace("/?", "/demo?", 1)
    _sign(engine, settings, signer, run_ids, console)
    store = open_store(url)
    with BackupWriter(settings, store, signer=signer, engine=engine) as writer:
        manifest = writer.catch_up()
    console.print(
        f"backup cut {manifest.number}: {writer.written:,} new events to {store.describe()}"
    )
    # The drill's verify and replay run as child processes, as an operator would run them.
    os.environ.setdefault(AGENTS_ENV, DEMO_AGENTS)
    os.environ.setdefault(PUBLIC_KEYS_ENV, str(public))
    verifier = CheckpointVerifier({signer.key_id: signer.public_key})
    report = run_drill(
        settings,
        store,
        verifier=verifier,
        options=DrillOptions(sample=10),
        say=lambda stage: console.print(f"  drill: {stage}"),
    )
    print_drill(console, report)
    return report.passed


def _sign(
    engine: Engine,
    settings: Settings,
    signer: CheckpointSigner,
    run_ids: Sequence[str],
    console: Console,
) -> None:
    """Run the checkpoint signer until each of ``run_ids`` has a signed checkpoint."""
    consumer = CheckpointConsumer(settings, signer, engine=engine)
    with _progress(console) as progress, consumer:
        task = progress.add_task("signing checkpoints", total=len(run_ids))

        def signed() -> int:
            return sum(load_checkpoint(engine, run_id) is not None for run_id in run_ids)

        _in_background(
            lambda stop: consumer.run(stop),
            done=lambda: signed() >= len(run_ids),
            tick=lambda: progress.update(task, completed=signed()),
        )


def _demo_signer(folder: Path) -> CheckpointSigner:
    """The demo's manifest signer: made once, then read from ``folder``."""
    private, public = folder / "signing-key.pem", folder / "signing-key.pub"
    if not private.exists():
        signer = CheckpointSigner.generate()
        folder.mkdir(parents=True, exist_ok=True)
        write_owner_only(private, signer.private_key_pem())
        public.write_bytes(signer.public_key_pem())
    return CheckpointSigner.from_pem_file(private)


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
        # Half the runs tagged with one prompt version, half with the other: an A/B to
        # compare in the console's charts or with `blackbox stats --by prompt_version`.
        arm = "v1" if sum(map(ord, ticket_id)) % 2 else "v2"
        snapshot = replace(agent.snapshot(ticket_id), tags={"prompt_version": arm})
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


def _build_analytics(
    settings: Settings,
    engine: Engine,
    events: int,
    console: Console,
    timings: dict[str, float],
) -> None:
    """The analytics views (LLM calls, tool calls, effects, per-run rollups) from the
    same topic, in a group of their own."""
    started = time.perf_counter()
    seen = 0
    deadline = time.monotonic() + 600
    with _progress(console) as progress, AnalyticsConsumer(settings, engine=engine) as consumer:
        task = progress.add_task("building analytics", total=events)
        while seen < events and time.monotonic() < deadline:
            outcome = consumer.poll_once(0.5)
            seen += outcome.messages if outcome is not None else 0
            progress.update(task, completed=min(seen, events))
    if seen < events:
        raise StackError(f"the analytics consumer read {seen} of {events} events in 10 minutes")
    timings["analytics"] = time.perf_counter() - started


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
