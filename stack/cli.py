"""``stack up | down | status``: the command-line face of :class:`agent_blackbox.stack.LocalStack`.

The root ``blackbox`` command mounts :data:`stack_group`; ``python -m agent_blackbox.stack``
runs it alone.
Progress goes to stderr, results (endpoints, the status table) to stdout.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import click
from click.core import ParameterSource
from rich.table import Table
from rich.text import Text

from agent_blackbox.schemas import safe_console
from agent_blackbox.stack import LocalStack, ServiceStatus, StackError, StackPorts
from agent_blackbox.stack._settings import DATABASE_URL_ENV, KAFKA_BOOTSTRAP_ENV

_Command = TypeVar("_Command", bound=Callable[..., Any])

_out = safe_console()
_err = safe_console(stderr=True, soft_wrap=True)
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
    """The stack the options name. Explicit ports or ``--cache-dir`` ask for the local
    services there, so the variables pointing at external ones are set aside (and the
    command says so)."""
    try:
        ports = StackPorts(postgres=postgres_port, kafka=kafka_port, controller=controller_port)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    environ: Mapping[str, str] = os.environ
    given = _explicit_options()
    overridden = [name for name in _EXTERNAL if environ.get(name)]
    if given and overridden:
        _err.print(
            f"{' and '.join(given)} given: ignoring {' and '.join(overridden)}; "
            "managing the local services"
        )
        environ = {k: v for k, v in environ.items() if k not in _EXTERNAL}
    return LocalStack(cache_dir, ports, console=_err, environ=environ)


_EXTERNAL = (DATABASE_URL_ENV, KAFKA_BOOTSTRAP_ENV)
_LOCAL_OPTIONS = ("cache_dir", "postgres_port", "kafka_port", "controller_port")


def _explicit_options() -> list[str]:
    """The stack options given on the command line, as they are spelled there."""
    context = click.get_current_context()
    return [
        "--" + name.replace("_", "-")
        for name in _LOCAL_OPTIONS
        if context.get_parameter_source(name) is ParameterSource.COMMANDLINE
    ]


@click.group(name="stack")
def stack_group() -> None:
    """Run PostgreSQL and Kafka locally, without Docker."""


@stack_group.command()
@_stack_options
def up(cache_dir: Path | None, postgres_port: int, kafka_port: int, controller_port: int) -> None:
    """Start PostgreSQL and Kafka (a no-op for what already runs, and it says so).

    BLACKBOX_DATABASE_URL / BLACKBOX_KAFKA_BOOTSTRAP mark a service as external (not
    started), unless --cache-dir or a port is given: those ask for the local services.
    """
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
    """Stop PostgreSQL and Kafka; their data is kept (says so when nothing runs).

    External services (BLACKBOX_DATABASE_URL / BLACKBOX_KAFKA_BOOTSTRAP) are left alone,
    unless --cache-dir or a port is given: those name the local services to stop.
    """
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
