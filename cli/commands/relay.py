"""``blackbox relay``: publish the outbox to Kafka."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import click
from rich.console import Console

from agent_blackbox.broker import settle_heap
from agent_blackbox.cli._wiring import wired
from agent_blackbox.cli._workers import (
    could_not_run,
    idle_notice,
    metrics_port_option,
    serve_metrics,
    stop_on_signals,
    until_idle_option,
)
from agent_blackbox.outbox.relay import Relay, RelayOptions
from agent_blackbox.schemas import BlackboxError, permission_refused, safe_console
from agent_blackbox.wiring import SERVICE_POOL


@click.command("relay")
@click.option("--relay-id", default=None, help="Lease owner id (default host:pid).")
@click.option("--batch-size", default=5_000, show_default=True, help="Rows per batch.")
@click.option(
    "--lease-ttl",
    default=2.0,
    show_default=True,
    help="Seconds a shard lease lasts without renewal: a relay that dies is replaced "
    "about this long after its last heartbeat.",
)
@click.option(
    "--heartbeat",
    default=None,
    type=float,
    help="Seconds between lease renewals (default: a fifth of the lease).",
)
@metrics_port_option
@until_idle_option
def relay_command(
    relay_id: str | None,
    batch_size: int,
    lease_ttl: float,
    heartbeat: float | None,
    metrics_port: int | None,
    until_idle: float | None,
) -> None:
    """Publish the outbox to Kafka until SIGTERM or Ctrl-C.

    With --until-idle S it drains and exits: it stops once its shards stayed empty for S
    seconds (exit 0). A relay that cannot publish (database or Kafka away) is not idle:
    it retries, and gives up after S more seconds (at least 10) with exit 2.
    """
    log = safe_console(stderr=True, log_path=False)
    wiring = wired()
    settings = wiring.settings
    stop = threading.Event()
    started = time.monotonic()
    try:
        engine = wiring.engine(SERVICE_POOL)
        options = replace(
            RelayOptions(), batch_size=batch_size, lease_ttl_s=lease_ttl, heartbeat_s=heartbeat
        )
        try:
            worker = Relay(engine, settings=settings, owner=relay_id, options=options)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from exc
        serve_metrics(metrics_port, worker.metrics.registry)
        log.log(f"relay {worker.owner}: outbox → {settings.kafka_bootstrap} topic {settings.topic}")
        with stop_on_signals(stop), _RelayWatch(worker, stop, until_idle, log) as watch:
            settle_heap()
            worker.run(stop)
    except BlackboxError as exc:
        if permission_refused(exc) is not None:
            raise  # the top-level command names the role to run as
        could_not_run(log, exc)
    if watch.idle:
        idle_notice(log, watch.idle)
    elapsed = time.monotonic() - started
    click.echo(f"{worker.published:,} events published in {elapsed:.1f} s")
    if watch.stuck:
        could_not_run(
            log,
            BlackboxError(
                f"the outbox could not be drained: nothing was published for "
                f"{watch.stuck:.0f} s and the relay never found its shards empty (see the "
                "errors and warnings above: an event the producer refused, or the database "
                "or Kafka out of reach)"
            ),
        )


class _RelayWatch:
    """Beside a running relay: prints progress every few seconds and, with a limit, stops
    it once nothing was published for that long and the relay waits for work (its last
    look at its shards found them empty).

    A relay that published nothing and is not waiting for work is busy with a batch or
    retrying (database or Kafka away, deliveries refused). It gets as long again (at
    least ``_STUCK_GRACE_S``); then it is stopped as ``stuck``: the outbox could not be
    drained, which the command reports as an error.
    """

    _TICK_S = 0.1
    _PROGRESS_EVERY_S = 2.0
    _STUCK_GRACE_S = 10.0

    def __init__(
        self, worker: Relay, stop: threading.Event, limit: float | None, log: Console
    ) -> None:
        self._worker, self._stop, self._limit, self._log = worker, stop, limit, log
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="relay-watch", daemon=True)
        self.idle: float | None = None
        """The limit, once it stopped an idle relay."""
        self.stuck: float | None = None
        """Seconds without progress, once it stopped a relay that could not drain."""

    def __enter__(self) -> _RelayWatch:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _watch(self) -> None:
        seen = printed = self._worker.published
        last_change = last_print = time.monotonic()
        while not self._done.wait(self._TICK_S) and not self._stop.is_set():
            now, published = time.monotonic(), self._worker.published
            if published != seen:
                seen, last_change = published, now
            if now - last_print >= self._PROGRESS_EVERY_S and published != printed:
                rate = (published - printed) / (now - last_print)
                self._log.log(f"{published:,} events published ({rate:,.0f} events/s)")
                printed, last_print = published, now
            if self._limit is not None:
                self._judge(now - last_change, self._limit)

    def _judge(self, quiet: float, limit: float) -> None:
        if quiet < limit:
            return
        if self._worker.idle:
            self.idle = limit
            self._stop.set()
        elif quiet >= limit + max(limit, self._STUCK_GRACE_S):
            self.stuck = quiet
            self._stop.set()
