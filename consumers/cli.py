"""``blackbox consume``, ``retention``, ``forget`` and ``ledger``: the read side's jobs."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from datetime import UTC, datetime, timedelta
from types import FrameType
from typing import Any, NoReturn, TypeVar

import click
from prometheus_client import REGISTRY, CollectorRegistry, start_http_server
from rich.console import Console
from rich.table import Table
from sqlalchemy import create_engine
from sqlalchemy.exc import SQLAlchemyError

from agent_blackbox.broker import settle_heap
from agent_blackbox.consumers._analytics import ANALYTICS_GROUP, AnalyticsConsumer
from agent_blackbox.consumers._batch import BatchOutcome
from agent_blackbox.consumers._checkpoints import CheckpointConsumer
from agent_blackbox.consumers._ledger import LedgerReport, ledger_entries, reapply_ledger
from agent_blackbox.consumers._membership import host_member_id
from agent_blackbox.consumers._migrate import migrate_views
from agent_blackbox.consumers._retention import (
    RetentionJob,
    RetentionPolicy,
    RetentionReport,
)
from agent_blackbox.consumers._runtime import ConsumerRuntime, ViewConsumer
from agent_blackbox.consumers._signing import CheckpointPolicy
from agent_blackbox.consumers._stats import GROUPINGS, UsageRow, llm_usage_txn
from agent_blackbox.consumers._view_metrics import RetentionGauges, refresh_view_gauges
from agent_blackbox.schemas import (
    BlackboxError,
    CheckpointSigner,
    CheckpointVerifier,
    Settings,
    moment,
    permission_refused,
    safe_console,
    safe_text,
)

_PROGRESS_EVERY_S = 2.0


until_idle_option = click.option(
    "--until-idle",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="SECONDS",
    help="Drain and exit: stop once nothing came to do for SECONDS (default: run until "
    "SIGTERM/SIGINT). Exit 0 when stopped, 2 when the work could not run.",
)
"""``--until-idle`` of every long-running worker (``consume``, ``sign``, ``relay``): the
same meaning, the same output (progress on stderr, one summary line on stdout) and the
same exit statuses for all."""

metrics_port_option = click.option(
    "--metrics-port",
    type=click.IntRange(min=1, max=65535),
    default=None,
    help="Serve Prometheus metrics on 127.0.0.1:PORT (/metrics).",
)
"""``--metrics-port`` of every long-running worker (``relay``, ``consume``, ``analytics``,
``sign``, ``retention run``, ``backup run``): one convention for all."""


def serve_metrics(port: int | None, registry: CollectorRegistry = REGISTRY) -> None:
    """Serve ``registry`` on 127.0.0.1:``port`` (nothing when ``port`` is None).

    Raises:
        BlackboxError: the port cannot be bound (taken, or not allowed).
    """
    if port is None:
        return
    try:
        start_http_server(port, addr="127.0.0.1", registry=registry)
    except OSError as exc:
        raise BlackboxError(
            f"cannot serve metrics on 127.0.0.1:{port}: {exc.strerror}; choose another "
            "--metrics-port"
        ) from exc


F = TypeVar("F", bound=Callable[..., Any])


def membership_options(name: str) -> Callable[[F], F]:
    """``--instance-id`` and ``--session-timeout`` of a consumer command; ``name`` is the
    consumer's name, the default instance id's first part."""

    def decorate(command: F) -> F:
        return _membership_options(command, name)

    return decorate


def _membership_options(command: F, name: str) -> F:
    command = click.option(
        "--session-timeout",
        type=click.FloatRange(min=1),
        default=None,
        metavar="SECONDS",
        help="How long the group waits for a silent member before moving its partitions "
        "(default BLACKBOX_CONSUMER_SESSION_TIMEOUT_MS, 6 s; the broker's "
        "group.min.session.timeout.ms is the floor).",
    )(command)
    return click.option(
        "--instance-id",
        default=None,
        help="Static group membership: restarted with the same id, the consumer gets its "
        "partitions back at once. Unique per consumer of a group (default "
        f"BLACKBOX_CONSUMER_INSTANCE_ID, else {name}@HOST, {name}@HOST#2 for a second one "
        "running on the host, ...); an empty value joins without one.",
    )(command)


@contextmanager
def membership(
    settings: Settings, *, name: str, instance_id: str | None, session_timeout: float | None
) -> Iterator[Settings]:
    """``settings`` with the group membership the command line asked for; without an
    instance id, this process's slot on the host (see :func:`host_member_id`) is held
    while the block runs."""
    timeout_ms = settings.consumer_session_timeout_ms
    if session_timeout is not None:
        timeout_ms = round(session_timeout * 1000)
    chosen = settings.consumer_instance_id if instance_id is None else instance_id
    slot = (
        nullcontext(chosen) if chosen is not None else host_member_id(name, settings.consumer_group)
    )
    with slot as member:
        yield dataclasses.replace(
            settings, consumer_instance_id=member, consumer_session_timeout_ms=timeout_ms
        )


def idle_notice(console: Console, seconds: float, *, detail: str = "") -> None:
    """What a worker says when ``--until-idle`` stops it (``detail``: what it had
    finished, e.g. " (3 assigned partitions read to their end)")."""
    console.log(f"idle for {seconds:g} s: stopping{detail}")


def could_not_run(console: Console, exc: BlackboxError) -> NoReturn:
    """Say why a worker could not run, and exit 2."""
    console.print(f"[red]error:[/] {safe_text(str(exc))}", soft_wrap=True)
    sys.exit(2)


class _Progress:
    """Prints a running total at most every couple of seconds."""

    def __init__(self, console: Console) -> None:
        self._console = console
        self._total = BatchOutcome()
        self._since_print = BatchOutcome()
        self._last_print = time.monotonic()

    def __call__(self, outcome: BatchOutcome) -> None:
        self._total += outcome
        self._since_print += outcome
        now = time.monotonic()
        if now - self._last_print >= _PROGRESS_EVERY_S:
            rate = self._since_print.messages / (now - self._last_print)
            self._console.log(f"{_summary(self._total)} ({rate:,.0f} messages/s)")
            self._since_print = BatchOutcome()
            self._last_print = now


@click.command("consume")
@click.option("--group", default=None, help="Consumer group (default: BLACKBOX_CONSUMER_GROUP).")
@until_idle_option
@metrics_port_option
@membership_options("views")
def consume_command(
    group: str | None,
    until_idle: float | None,
    metrics_port: int | None,
    instance_id: str | None,
    session_timeout: float | None,
) -> None:
    """Build the runs view and events index from the event topic.

    With --until-idle it stops only once it holds partitions, nothing came for SECONDS
    and the broker shows nothing left to read in them.
    """

    def views(settings: Settings) -> ConsumerRuntime:
        return ViewConsumer(settings, verifier=CheckpointVerifier.from_env())

    _consume("views", views, group, until_idle, metrics_port, instance_id, session_timeout)


@click.command("analytics")
@click.option("--group", default=None, help=f"Consumer group (default: {ANALYTICS_GROUP}).")
@until_idle_option
@metrics_port_option
@click.option(
    "--view-metrics-every",
    type=click.FloatRange(min=1),
    default=60.0,
    show_default=True,
    metavar="SECONDS",
    help="With --metrics-port: how often the gauges read from the views are refreshed "
    "(replayability, replay pass rates, open effect intents, integrity violations).",
)
@click.option(
    "--metrics-window",
    type=click.FloatRange(min=0.1),
    default=24.0,
    show_default=True,
    metavar="HOURS",
    help="The runs and replays those gauges count: the ones of the last HOURS.",
)
@click.option(
    "--open-intent-after",
    type=click.FloatRange(min=0),
    default=300.0,
    show_default=True,
    metavar="SECONDS",
    help="An effect intent without a receipt for longer than this counts as open.",
)
@membership_options("analytics")
def analytics_command(
    group: str | None,
    until_idle: float | None,
    metrics_port: int | None,
    view_metrics_every: float,
    metrics_window: float,
    open_intent_after: float,
    instance_id: str | None,
    session_timeout: float | None,
) -> None:
    """Build the analytics views (llm_calls, tool_calls, effects, run_rollups) from the
    event topic, as `consume` builds the runs view; --until-idle as there."""

    def analytics(settings: Settings) -> ConsumerRuntime:
        return AnalyticsConsumer(
            settings, group_id=settings.consumer_group, verifier=CheckpointVerifier.from_env()
        )

    def gauges(settings: Settings, stop: threading.Event) -> None:
        if metrics_port is None:
            return
        engine = create_engine(settings.database_url, pool_size=1, pool_pre_ping=True)
        refresh_view_gauges(
            engine,
            stop,
            every_s=view_metrics_every,
            window=timedelta(hours=metrics_window),
            open_after=timedelta(seconds=open_intent_after),
        )

    chosen = group or ANALYTICS_GROUP
    _consume(
        "analytics",
        analytics,
        chosen,
        until_idle,
        metrics_port,
        instance_id,
        session_timeout,
        also=gauges,
    )


def _consume(
    name: str,
    make: Callable[[Settings], ConsumerRuntime],
    group: str | None,
    until_idle: float | None,
    metrics_port: int | None,
    instance_id: str | None,
    session_timeout: float | None,
    *,
    also: Callable[[Settings, threading.Event], None] | None = None,
) -> None:
    """Run the consumer ``make`` builds until a signal, or idle for ``until_idle``;
    ``also(settings, stop)`` starts whatever runs beside it (until ``stop``)."""
    console = safe_console(stderr=True, log_path=False)
    settings = Settings.from_env()
    if group:
        settings = dataclasses.replace(settings, consumer_group=group)
    stop = threading.Event()
    started = time.monotonic()
    try:
        with membership(
            settings, name=name, instance_id=instance_id, session_timeout=session_timeout
        ) as settings:
            migrate_views(settings.database_url)
            serve_metrics(metrics_port)
            if also is not None:
                also(settings, stop)
            console.log(
                f"consuming [bold]{settings.topic}[/] as group "
                f"[bold]{settings.consumer_group}[/]" + _member(settings)
            )
            with stop_on_signals(stop), make(settings) as consumer:
                settle_heap()
                total = consumer.run(stop, until_idle, on_batch=_Progress(console))
    except BlackboxError as exc:
        if permission_refused(exc) is not None:
            raise  # the top-level command names the role to run as
        could_not_run(console, exc)
    if until_idle is not None and not stop.is_set():
        idle_notice(console, until_idle, detail=_drained(consumer))
    elapsed = time.monotonic() - started
    click.echo(f"{_summary(total)} in {elapsed:.1f} s")


def _summary(total: BatchOutcome) -> str:
    passed = f", {total.passed_over:,} of kinds not kept here" if total.passed_over else ""
    return (
        f"{total.messages:,} messages: {total.inserted:,} events inserted, "
        f"{total.duplicates:,} duplicates, {total.violations:,} integrity violations, "
        f"{total.dead_lettered:,} dead-lettered, {total.stale:,} stale relay copies dropped"
        f"{passed}"
    )


def _drained(consumer: ConsumerRuntime) -> str:
    held = consumer.drained
    return f" ({len(held)} assigned partitions read to their end)" if held else ""


def _member(settings: Settings) -> str:
    member = settings.consumer_instance_id
    return f" (member [bold]{safe_text(member)}[/])" if member else ""


@contextmanager
def stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """Set ``stop`` on SIGTERM/SIGINT (in-flight work finishes first: a view batch is
    committed, a backup cut written); the handlers that were there come back after."""

    def handle(signum: int, _frame: FrameType | None) -> None:
        safe_console(stderr=True).print(
            f"received {signal.Signals(signum).name}: finishing in-flight work"
        )
        stop.set()

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


SIGNING_KEY_FILE_ENV = "BLACKBOX_SIGNING_KEY_FILE"


def _retention_job(settings: Settings) -> RetentionJob:
    """The job, signing its run.redacted notes when the signer's key is configured."""
    engine = create_engine(settings.database_url, pool_size=2)
    signer = CheckpointSigner.from_env() if os.environ.get(SIGNING_KEY_FILE_ENV) else None
    return RetentionJob(engine, policy=RetentionPolicy.from_env(), settings=settings, signer=signer)


def _print_redactions(report: RetentionReport, console: Console, *, title: str) -> None:
    table = Table(title=title)
    for name in ("run", "reason", "keys destroyed", "note"):
        table.add_column(name)
    for item in report.redacted:
        note = "" if item.encrypted else "not encrypted: bodies stay until the topic expires them"
        table.add_row(safe_text(item.run_id), safe_text(item.reason), str(len(item.key_ids)), note)
    console.print(table)


@click.group("retention")
def retention_group() -> None:
    """Apply the retention classes (BLACKBOX_RETENTION_FILE) to recorded runs."""


@retention_group.command("run")
@click.option(
    "--every",
    type=click.FloatRange(min=1),
    default=None,
    metavar="SECONDS",
    help="Keep running, one pass every SECONDS, until SIGTERM/SIGINT (default: one pass).",
)
@metrics_port_option
def retention_run(every: float | None, metrics_port: int | None) -> None:
    """Crypto-shred runs whose bodies expired; delete metadata that expired."""
    console = safe_console(stderr=True, log_path=False)
    settings = Settings.from_env()
    stop = threading.Event()
    gauges = RetentionGauges() if metrics_port is not None else None
    try:
        job = _retention_job(settings)
        serve_metrics(metrics_port)
        with stop_on_signals(stop):
            while True:
                started = time.monotonic()
                report = job.run_once()
                if gauges is not None:
                    gauges.show(report, seconds=time.monotonic() - started)
                console.log(
                    f"retention: {len(report.abandoned)} runs marked abandoned, "
                    f"{len(report.redacted)} runs shredded, "
                    f"{len(report.metadata_deleted)} runs' metadata deleted"
                    + (
                        "; runs of classes the policy does not define were held to the "
                        f"standard class's periods: {safe_text(', '.join(report.unknown_classes))}"
                        if report.unknown_classes
                        else ""
                    )
                )
                if report.redacted:
                    _print_redactions(report, safe_console(), title="Runs shredded by retention")
                if every is None or stop.wait(every):
                    return
    except BlackboxError as exc:
        if permission_refused(exc) is not None:
            raise  # the top-level command names the role to run as
        could_not_run(console, exc)


@click.command("forget")
@click.option("--subject", "subject_id", required=True, help="The data subject's id.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report on stdout.")
def forget_command(subject_id: str, as_json: bool) -> None:
    """Destroy the bodies of every run linked to a data subject, everywhere, for good.

    \b
    Exit status:
      0  every run of the subject was shredded (or had nothing left)
      1  some runs are still recording: shredded all the others; run forget again later
      2  could not run
    """
    settings = Settings.from_env()
    try:
        report = _retention_job(settings).forget(subject_id)
    except BlackboxError as exc:
        if permission_refused(exc) is not None:
            raise  # the top-level command names the role to run as
        could_not_run(safe_console(stderr=True), exc)
    if as_json:
        rows = [
            {"run_id": r.run_id, "key_ids": list(r.key_ids), "encrypted": r.encrypted}
            for r in report.redacted
        ]
        still = list(report.still_running)
        payload = {"subject_id": subject_id, "runs": rows, "still_running": still}
        click.echo(json.dumps(payload, indent=2))
        sys.exit(1 if still else 0)
    console = safe_console()
    if not report.redacted:
        console.print(f"no run of subject {safe_text(subject_id)} had bodies left to destroy")
    else:
        _print_redactions(report, console, title=f"Runs of subject {safe_text(subject_id)}")
        console.print(
            f"{len(report.redacted)} runs redacted; each was announced by a run.redacted "
            "event and written to the deletion ledger"
        )
    if report.still_running:
        safe_console(stderr=True).print(
            f"{len(report.still_running)} runs of the subject are still recording and keep "
            f"their keys for now: {', '.join(safe_text(r) for r in report.still_running)}; "
            "run forget again once they end (retention marks a run abandoned after "
            "BLACKBOX_ABANDON_AFTER_HOURS without an event)"
        )
        sys.exit(1)


@click.group("ledger")
def ledger_group() -> None:
    """The deletion ledger."""


@ledger_group.command("reapply")
def ledger_reapply() -> None:
    """After restoring a database backup: destroy again every key the run.redacted notes
    in the topic say was destroyed, when the note is authentic.

    A note is applied only when the database's deletion ledger records it or it carries
    the retention job's signature (public keys: BLACKBOX_SIGNING_PUBLIC_KEYS, else the
    key of BLACKBOX_SIGNING_KEY_FILE), its run's hash chain reaches it, and every key it
    names belongs to its run. Any other note is listed with the reason and ignored.

    \b
    Exit status:
      0  every note was applied
      1  some notes were ignored (listed on stderr); the others were applied
      2  could not run
    """
    console = safe_console(stderr=True, log_path=False)
    settings = Settings.from_env()
    try:
        verifier = CheckpointVerifier.from_env()
        engine = create_engine(settings.database_url)
        with console.status(f"reading run.redacted events from {settings.topic}"):
            entries = list(ledger_entries(settings))
        with console.status(f"checking and re-applying {len(entries)} notes"):
            report = reapply_ledger(engine, entries, verifier=verifier)
    except BlackboxError as exc:
        if permission_refused(exc) is not None:
            raise  # the top-level command names the role to run as
        could_not_run(console, exc)
    _print_ignored(report, console)
    click.echo(
        f"{len(entries)} run.redacted notes in {safe_text(settings.topic)}: {report.applied} "
        f"applied, {len(report.ignored)} ignored; {len(report.destroyed)} data keys a restore "
        "had brought back were destroyed again"
    )
    if report.ignored:
        sys.exit(1)


def _print_ignored(report: LedgerReport, console: Console) -> None:
    if not report.ignored:
        return
    table = Table(title="run.redacted notes ignored (nothing was changed for them)")
    for name in ("run", "sequence", "keys", "why"):
        table.add_column(name)
    for item in report.ignored:
        envelope = item.entry.envelope
        table.add_row(
            safe_text(item.entry.run_id),
            "" if envelope is None else str(envelope.sequence),
            safe_text(", ".join(item.entry.key_ids)),
            safe_text(item.why),
        )
    console.print(table)


@click.command("sign")
@until_idle_option
@metrics_port_option
@membership_options("checkpoints")
@click.option(
    "--every-events",
    type=click.IntRange(min=1),
    default=None,
    help="Sign a running run's head again after this many events "
    "(default BLACKBOX_CHECKPOINT_EVERY_EVENTS, 1000).",
)
@click.option(
    "--every-seconds",
    type=click.IntRange(min=1),
    default=None,
    help="Sign a head left unsigned this long, e.g. a crashed run's "
    "(default BLACKBOX_CHECKPOINT_EVERY_SECONDS, 60).",
)
def sign_command(
    until_idle: float | None,
    metrics_port: int | None,
    every_events: int | None,
    every_seconds: int | None,
    instance_id: str | None,
    session_timeout: float | None,
) -> None:
    """Sign each run's chain head when it ends, and mid-run, when blackbox.runs holds
    the same head (key: BLACKBOX_SIGNING_KEY_FILE)."""
    console = safe_console(stderr=True, log_path=False)
    stop = threading.Event()
    try:
        with membership(
            Settings.from_env(),
            name="checkpoints",
            instance_id=instance_id,
            session_timeout=session_timeout,
        ) as settings:
            signer = CheckpointSigner.from_env()
            default = CheckpointPolicy.from_settings(settings)
            policy = CheckpointPolicy(
                every_events or default.every_events,
                float(every_seconds or default.every_seconds),
            )
            migrate_views(settings.database_url)
            serve_metrics(metrics_port)
            console.log(
                f"signing chain heads of [bold]{settings.topic}[/] as {signer.key_id}"
                + _member(settings)
            )
            consumer = CheckpointConsumer(settings, signer, policy=policy)
            with stop_on_signals(stop), consumer:
                settle_heap()
                total = consumer.run(stop, until_idle, on_batch=_Progress(console))
    except BlackboxError as exc:
        if permission_refused(exc) is not None:
            raise  # the top-level command names the role to run as
        could_not_run(console, exc)
    if until_idle is not None and not stop.is_set():
        idle_notice(console, until_idle, detail=_drained(consumer))
    click.echo(
        f"{total.messages:,} messages: {total.inserted:,} chained, {total.duplicates:,} "
        f"repeats, {total.violations:,} integrity violations (those runs are not signed; "
        f"see blackbox_views.integrity_violations), {total.stale:,} stale relay copies "
        "dropped"
    )


def _since(raw: str) -> datetime:
    """``1h``, ``30m``, ``2d`` ago, or an ISO time (local time without a zone)."""
    try:
        at = moment(raw, spans="mhd")
    except ValueError:
        raise click.BadParameter(
            f"{raw!r}: give a span like 30m, 1h, 2d or an ISO time", param_hint="--since"
        ) from None
    if at > datetime.now(UTC):
        raise click.BadParameter(f"{raw!r} is in the future", param_hint="--since")
    return at


@click.command("stats")
@click.option(
    "--by",
    type=click.Choice(sorted(GROUPINGS)),
    default="model",
    show_default=True,
    help="Group the LLM calls by this.",
)
@click.option(
    "--since", "since_raw", default="1h", show_default=True, help="30m, 1h, 2d, or a time."
)
@click.option("--json", "as_json", is_flag=True, help="One JSON line per group on stdout.")
def stats_command(by: str, since_raw: str, as_json: bool) -> None:
    """LLM calls, tokens, latency p50/p95/p99 and error rate from the analytics views
    (built by `blackbox analytics`), grouped by one dimension. Read as any role that may
    read the views (the reader sees its granted tenants only)."""
    console = safe_console(stderr=True, log_path=False)
    since = _since(since_raw)
    settings = Settings.from_env()
    engine = create_engine(settings.database_url, pool_size=1)
    try:
        with engine.connect() as conn:
            rows = llm_usage_txn(conn, by=by, since=since)
    except SQLAlchemyError as exc:
        could_not_run(console, BlackboxError(f"cannot read the analytics views: {exc}"))
    finally:
        engine.dispose()
    if as_json:
        for row in rows:
            click.echo(json.dumps({by: row.group, **_figures(row)}))
        return
    if not rows:
        console.print(
            f"no LLM call since {since.isoformat(timespec='seconds')} in the analytics views "
            "(is `blackbox analytics` running, and is the window right?)"
        )
        return
    table = Table(title=f"LLM calls since {since.isoformat(timespec='seconds')} by {by}")
    for column in (by, "calls", "errors", "tokens in", "tokens out", "p50 ms", "p95 ms", "p99 ms"):
        table.add_column(
            column,
            justify="left" if column == by else "right",
            overflow="fold",
            no_wrap=column != by,  # figures are never broken across lines
        )
    for row in rows:
        figures = _figures(row)
        table.add_row(
            safe_text(row.group if row.group is not None else "-"),
            f"{row.calls:,}",
            f"{row.errors:,} ({row.error_rate:.1%})",
            f"{row.prompt_tokens:,}",
            f"{row.completion_tokens:,}",
            *(_ms(figures[k]) for k in ("latency_p50_ms", "latency_p95_ms", "latency_p99_ms")),
        )
    safe_console().print(table)


def _figures(row: UsageRow) -> dict[str, Any]:
    return {
        "calls": row.calls,
        "errors": row.errors,
        "error_rate": row.error_rate,
        "prompt_tokens": row.prompt_tokens,
        "completion_tokens": row.completion_tokens,
        "total_tokens": row.total_tokens,
        "latency_p50_ms": row.latency_p50_ms,
        "latency_p95_ms": row.latency_p95_ms,
        "latency_p99_ms": row.latency_p99_ms,
    }


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
