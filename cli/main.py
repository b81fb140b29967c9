"""``blackbox``: the stack, migrations, the relay, the consumers and the demo."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace

import click
from rich.console import Console
from rich.logging import RichHandler
from sqlalchemy import Engine, create_engine

from agent_blackbox.backup.cli import backup_group, drill_command, restore_command
from agent_blackbox.broker import settle_heap
from agent_blackbox.cli._roles import RoleCheckedGroup
from agent_blackbox.console.cli import web_command
from agent_blackbox.consumers import ViewReplayResults, ViewRunIndex, migrate_views
from agent_blackbox.consumers.cli import (
    analytics_command,
    consume_command,
    could_not_run,
    forget_command,
    idle_notice,
    ledger_group,
    metrics_port_option,
    retention_group,
    serve_metrics,
    sign_command,
    stats_command,
    stop_on_signals,
    until_idle_option,
)
from agent_blackbox.keystore.cli import keys_group
from agent_blackbox.outbox.cli import tenants_group
from agent_blackbox.outbox.relay import Relay, RelayOptions
from agent_blackbox.outbox.storage import migrate_write_side
from agent_blackbox.replayer import ReadSide
from agent_blackbox.replayer.cli import (
    export_command,
    fork_command,
    reexecute_command,
    replay_command,
    timeline_command,
    verify_command,
)
from agent_blackbox.schemas import (
    BlackboxError,
    Settings,
    env_flag,
    permission_refused,
    safe_console,
)
from agent_blackbox.schemas.cli import schemas_group
from agent_blackbox.stack.cli import stack_group

console = safe_console(stderr=True)


@click.group(cls=RoleCheckedGroup)
@click.option("-v", "--verbose", is_flag=True, help="Log debug detail.")
@click.pass_context
def main(ctx: click.Context, verbose: bool) -> None:
    """agent-blackbox: a flight recorder for AI agents."""
    try:  # a BLACKBOX_* variable with a bad value is named once, before any command runs
        Settings.from_env()
        for name in ("BLACKBOX_OTEL", "BLACKBOX_OTEL_CONTENT"):
            env_flag(name)
    except ValueError as exc:
        raise click.UsageError(f"{exc}; fix the variable or unset it") from None
    # The composition root: the replayer reads runs through the read side's run index.
    ctx.obj = ReadSide(run_index=_run_index, replay_results=ViewReplayResults)
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(message)s",
        handlers=[RichHandler(console=console, show_path=False)],
    )
    # Alembic narrates every step at INFO; the commands say what was migrated.
    logging.getLogger("alembic").setLevel(logging.WARNING)
    # boto3 says where it found credentials on every client; nothing to act on.
    logging.getLogger("botocore").setLevel(logging.WARNING)


def _run_index(engine: Engine) -> ViewRunIndex:
    """The views' run index, which asks the broker for a topic's partition count when a
    run is indexed on several partitions (to read the one its key maps to)."""
    return ViewRunIndex.from_settings(engine, Settings.from_env())


main.add_command(stack_group, "stack")
main.add_command(consume_command, "consume")
main.add_command(analytics_command, "analytics")
main.add_command(stats_command, "stats")
main.add_command(replay_command, "replay")
main.add_command(fork_command, "fork")
main.add_command(reexecute_command, "reexecute")
main.add_command(schemas_group, "schemas")
main.add_command(retention_group, "retention")
main.add_command(forget_command, "forget")
main.add_command(ledger_group, "ledger")
main.add_command(verify_command, "verify")
main.add_command(timeline_command, "timeline")
main.add_command(export_command, "export")
main.add_command(sign_command, "sign")
main.add_command(keys_group, "keys")
main.add_command(tenants_group, "tenants")
main.add_command(backup_group, "backup")
main.add_command(drill_command, "drill")
main.add_command(restore_command, "restore")
main.add_command(web_command, "web")


@main.command()
def migrate() -> None:
    """Create or upgrade the write side and the views in BLACKBOX_DATABASE_URL."""
    url = Settings.from_env().database_url

    def both() -> None:
        migrate_write_side(url)
        migrate_views(url)

    _guarded(both)
    console.print("[green]migrated[/] the write side (blackbox) and the views (blackbox_views)")


@main.command()
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
def relay(
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
    settings = Settings.from_env()
    stop = threading.Event()
    started = time.monotonic()
    try:
        engine = create_engine(settings.database_url, pool_size=4)
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
                "warnings above: is the database or Kafka reachable?)"
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


@main.command()
@click.option("--runs", default=300, show_default=True, help="How many agent runs to record.")
@click.option("--workers", default=4, show_default=True, help="Agents recording at once.")
def demo(runs: int, workers: int) -> None:
    """Start the stack, record agent runs, relay them, build the views, show them, back
    them up and end with a restore drill. Exit 1 when the drill found a problem."""
    from agent_blackbox.examples.demo import run_demo

    outcome: list[bool] = []
    _guarded(lambda: outcome.append(run_demo(runs=runs, workers=workers, console=console)))
    if outcome != [True]:
        sys.exit(1)


def _guarded(work: Callable[[], object]) -> None:
    try:
        work()
    except BlackboxError as exc:
        if permission_refused(exc) is not None:
            raise  # the top-level command names the role to run as
        could_not_run(console, exc)
