"""``blackbox consume``, ``analytics`` and ``sign``: the consumers that build the views
and sign the runs' chain heads."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import click
from rich.console import Console

from agent_blackbox.broker import settle_heap
from agent_blackbox.cli._wiring import wired
from agent_blackbox.cli._workers import (
    could_not_run,
    idle_notice,
    membership,
    membership_options,
    metrics_port_option,
    serve_metrics,
    stop_on_signals,
    until_idle_option,
)
from agent_blackbox.consumers import (
    ANALYTICS_GROUP,
    TEXT_INDEX_GROUP,
    AnalyticsConsumer,
    BatchOutcome,
    CheckpointConsumer,
    CheckpointPolicy,
    ConsumerRuntime,
    PriceFileError,
    PriceTable,
    TextIndexConsumer,
    ViewConsumer,
    migrate_views,
    refresh_view_gauges,
)
from agent_blackbox.schemas import (
    BlackboxError,
    CheckpointSigner,
    CheckpointVerifier,
    Settings,
    permission_refused,
    safe_console,
    safe_text,
)
from agent_blackbox.wiring import SERVICE_POOL

_PROGRESS_EVERY_S = 2.0


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
    event topic, as `consume` builds the runs view; --until-idle as there. Each LLM call
    is priced with the shipped prices and BLACKBOX_PRICE_FILE over them (`blackbox
    prices`)."""
    try:  # a bad price file stops the command before it touches anything
        prices = PriceTable.load(wired().settings.price_file)
    except PriceFileError as exc:
        could_not_run(safe_console(stderr=True, log_path=False), exc)

    def analytics(settings: Settings) -> ConsumerRuntime:
        return AnalyticsConsumer(
            settings,
            group_id=settings.consumer_group,
            verifier=CheckpointVerifier.from_env(),
            prices=prices,
        )

    def gauges(settings: Settings, stop: threading.Event) -> None:
        if metrics_port is None:
            return
        refresh_view_gauges(
            SERVICE_POOL.engine(settings.database_url),
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
    settings = wired().settings
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
            wired().settings,
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


@click.command("index-text")
@click.option("--group", default=None, help=f"Consumer group (default: {TEXT_INDEX_GROUP}).")
@until_idle_option
@metrics_port_option
@membership_options("text-index")
def index_text_command(
    group: str | None,
    until_idle: float | None,
    metrics_port: int | None,
    instance_id: str | None,
    session_timeout: float | None,
) -> None:
    """Keep the full-text index of LLM messages for the tenants that opted in (`blackbox
    tenants search TENANT --on`): the words of each call's messages and answer, as
    recorded (so redacted), never the text. Sealed runs are opened with
    BLACKBOX_KEK_FILE's keys, each unwrap in the access audit; --until-idle as for
    `consume`."""

    def indexer(settings: Settings) -> ConsumerRuntime:
        return TextIndexConsumer(
            settings, group_id=settings.consumer_group, verifier=CheckpointVerifier.from_env()
        )

    chosen = group or TEXT_INDEX_GROUP
    _consume("text-index", indexer, chosen, until_idle, metrics_port, instance_id, session_timeout)
