"""``blackbox``: the stack, migrations, the relay, the consumers and the demo."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from dataclasses import replace
from types import FrameType

import click
from prometheus_client import start_http_server
from rich.console import Console
from rich.logging import RichHandler
from sqlalchemy import create_engine

from agent_blackbox.consumers import ViewRunIndex, migrate_views
from agent_blackbox.consumers.cli import (
    consume_command,
    forget_command,
    ledger_group,
    retention_group,
    sign_command,
)
from agent_blackbox.keystore.cli import keys_group
from agent_blackbox.outbox import migrate_write_side
from agent_blackbox.outbox.relay import Relay, RelayOptions
from agent_blackbox.replayer import ReadSide
from agent_blackbox.replayer.cli import (
    fork_command,
    reexecute_command,
    replay_command,
    timeline_command,
    verify_command,
)
from agent_blackbox.schemas import BlackboxError, Settings
from agent_blackbox.schemas.cli import schemas_group
from agent_blackbox.stack.cli import stack_group

console = Console(stderr=True)


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Log debug detail.")
@click.pass_context
def main(ctx: click.Context, verbose: bool) -> None:
    """agent-blackbox: a flight recorder for AI agents."""
    # The composition root: the replayer reads runs through the read side's run index.
    ctx.obj = ReadSide(run_index=ViewRunIndex)
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(message)s",
        handlers=[RichHandler(console=console, show_path=False)],
    )
    # Alembic narrates every step at INFO; the commands say what was migrated.
    logging.getLogger("alembic").setLevel(logging.WARNING)


main.add_command(stack_group, "stack")
main.add_command(consume_command, "consume")
main.add_command(replay_command, "replay")
main.add_command(fork_command, "fork")
main.add_command(reexecute_command, "reexecute")
main.add_command(schemas_group, "schemas")
main.add_command(retention_group, "retention")
main.add_command(forget_command, "forget")
main.add_command(ledger_group, "ledger")
main.add_command(verify_command, "verify")
main.add_command(timeline_command, "timeline")
main.add_command(sign_command, "sign")
main.add_command(keys_group, "keys")


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
@click.option("--lease-ttl", default=10.0, show_default=True, help="Shard lease seconds.")
@click.option("--metrics-port", default=None, type=int, help="Serve Prometheus metrics here.")
def relay(
    relay_id: str | None, batch_size: int, lease_ttl: float, metrics_port: int | None
) -> None:
    """Publish the outbox to Kafka until SIGTERM or Ctrl-C."""
    settings = Settings.from_env()
    engine = create_engine(settings.database_url, pool_size=4)
    options = replace(RelayOptions(), batch_size=batch_size, lease_ttl_s=lease_ttl)
    worker = Relay(engine, settings=settings, owner=relay_id, options=options)
    if metrics_port is not None:
        start_http_server(metrics_port, addr="127.0.0.1", registry=worker.metrics.registry)
    stop = _stop_on_signals()
    console.print(
        f"relay {worker.owner}: outbox → {settings.kafka_bootstrap} topic {settings.topic}"
    )
    _guarded(lambda: worker.run(stop))
    console.print(f"relay {worker.owner} stopped after publishing {worker.published} events")


@main.command()
@click.option("--runs", default=300, show_default=True, help="How many agent runs to record.")
@click.option("--workers", default=4, show_default=True, help="Agents recording at once.")
def demo(runs: int, workers: int) -> None:
    """Start the stack, record agent runs, relay them, build the views, show them."""
    from agent_blackbox.examples.demo import run_demo

    _guarded(lambda: run_demo(runs=runs, workers=workers, console=console))


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()

    def handle(signum: int, frame: FrameType | None) -> None:
        console.print(f"received {signal.Signals(signum).name}: finishing in-flight work")
        stop.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
    return stop


def _guarded(work: Callable[[], object]) -> None:
    try:
        work()
    except BlackboxError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise SystemExit(1) from exc
