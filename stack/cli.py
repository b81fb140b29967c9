"""``stack up | down | status``: the command-line face of :class:`agent_blackbox.stack.LocalStack`.

The root ``blackbox`` command mounts :data:`stack_group`; ``python -m agent_blackbox.stack``
runs it alone.
Progress goes to stderr, results (endpoints, the status table) to stdout.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from agent_blackbox.stack import LocalStack, ServiceStatus, StackError, StackPorts

_Command = TypeVar("_Command", bound=Callable[..., Any])

_out = Console()
_err = Console(stderr=True, soft_wrap=True)
_STATE_STYLE = {"running": "green", "stopped": "red", "external": "cyan"}


def _stack_options(command: _Command) -> _Command:
    """The options every subcommand shares: where the stack lives and its ports."""
    defaults = StackPorts()
    options = [
        click.option(
            "--cache-dir",
            type=click.Path(file_okay=False, path_type=Path),
            default=None,
            help="Folder for data, logs and jars [default: BLACKBOX_CACHE_DIR or "
            "<project>/.cache/blackbox].",
        ),
        click.option("--postgres-port", type=int, default=defaults.postgres, show_default=True),
        click.option("--kafka-port", type=int, default=defaults.kafka, show_default=True),
        click.option("--controller-port", type=int, default=defaults.controller, show_default=True),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _open_stack(
    cache_dir: Path | None, postgres_port: int, kafka_port: int, controller_port: int
) -> LocalStack:
    try:
        ports = StackPorts(postgres=postgres_port, kafka=kafka_port, controller=controller_port)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    return LocalStack(cache_dir, ports, console=_err)


@click.group(name="stack")
def stack_group() -> None:
    """Run PostgreSQL and Kafka locally, without Docker."""


@stack_group.command()
@_stack_options
def up(cache_dir: Path | None, postgres_port: int, kafka_port: int, controller_port: int) -> None:
    """Start PostgreSQL and Kafka (a no-op for what already runs)."""
    stack = _open_stack(cache_dir, postgres_port, kafka_port, controller_port)
    try:
        endpoints = stack.up()
    except StackError as exc:
        raise click.ClickException(str(exc)) from exc
    table = Table(title="blackbox local stack", show_header=False)
    table.add_column("what")
    table.add_column("where", overflow="fold")
    table.add_row("database url", Text(endpoints.database_url))
    table.add_row("kafka bootstrap", Text(endpoints.kafka_bootstrap))
    _out.print(table)


@stack_group.command()
@_stack_options
def down(cache_dir: Path | None, postgres_port: int, kafka_port: int, controller_port: int) -> None:
    """Stop PostgreSQL and Kafka; their data is kept."""
    stack = _open_stack(cache_dir, postgres_port, kafka_port, controller_port)
    try:
        stack.down()
    except StackError as exc:
        raise click.ClickException(str(exc)) from exc


@stack_group.command()
@_stack_options
def status(
    cache_dir: Path | None, postgres_port: int, kafka_port: int, controller_port: int
) -> None:
    """Show each service's state, pid, address and data folder."""
    stack = _open_stack(cache_dir, postgres_port, kafka_port, controller_port)
    _out.print(status_table(stack.status()))


def status_table(statuses: list[ServiceStatus]) -> Table:
    """The ``stack status`` table."""
    table = Table("service")
    table.add_column("state", overflow="fold")
    table.add_column("pid")
    # Fold rather than truncate: a cut-off URL or path is useless to copy.
    table.add_column("address", overflow="fold")
    table.add_column("data dir", overflow="fold")
    for entry in statuses:
        external = entry.state == "external"
        state = f"external: {entry.address}" if external else entry.state
        table.add_row(
            entry.name,
            Text(state, style=_STATE_STYLE[entry.state]),
            str(entry.pid) if entry.pid is not None else "-",
            Text("-" if external else entry.address),
            Text(str(entry.data_dir)) if entry.data_dir is not None else "-",
        )
    return table
