"""``blackbox consume``: build the views from the event topic until stopped or idle."""

from __future__ import annotations

import dataclasses
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

import click
from rich.console import Console

from consumers._batch import BatchOutcome
from consumers._migrate import migrate_views
from consumers._runtime import ViewConsumer
from schemas import BlackboxError, Settings

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
@click.option(
    "--until-idle",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="SECONDS",
    help="Stop once no message arrived for this long (default: run until SIGTERM/SIGINT).",
)
def consume_command(group: str | None, until_idle: float | None) -> None:
    """Build the runs view and events index from the event topic."""
    console = Console(stderr=True, log_path=False)
    settings = Settings.from_env()
    if group:
        settings = dataclasses.replace(settings, consumer_group=group)
    stop = threading.Event()
    started = time.monotonic()
    try:
        migrate_views(settings.database_url)
        console.log(
            f"consuming [bold]{settings.topic}[/] as group [bold]{settings.consumer_group}[/]"
        )
        with _stop_on_signals(stop), ViewConsumer(settings) as consumer:
            total = consumer.run(stop, until_idle, on_batch=_Progress(console))
    except BlackboxError as exc:
        raise click.ClickException(str(exc)) from exc
    elapsed = time.monotonic() - started
    click.echo(f"{_summary(total)} in {elapsed:.1f} s")


def _summary(total: BatchOutcome) -> str:
    return (
        f"{total.messages:,} messages: {total.inserted:,} events inserted, "
        f"{total.duplicates:,} duplicates, {total.violations:,} integrity violations, "
        f"{total.dead_lettered:,} dead-lettered"
    )


@contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """Set ``stop`` on SIGTERM/SIGINT; the batch in progress is committed first."""

    def handle(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
