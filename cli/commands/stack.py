"""``stack up | down | status | promote``: the command-line face of
:class:`agent_blackbox.stack.LocalStack`.

The root ``blackbox`` command mounts :data:`stack_group`. Progress goes to stderr, results
(endpoints, the status table) to stdout.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, TypeVar

import click
from click.core import ParameterSource
from rich.table import Table
from rich.text import Text

from agent_blackbox.schemas import safe_console
from agent_blackbox.stack import (
    Endpoints,
    LocalStack,
    ServiceStatus,
    StackError,
    StackPorts,
    StackSettings,
)
from agent_blackbox.stack._settings import (
    BACKUP_URL_ENV,
    DATABASE_URL_ENV,
    KAFKA_BOOTSTRAP_ENV,
    redact_url,
)

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
        click.option("--s3-port", type=int, default=defaults.s3, show_default=True),
        click.option("--console-port", type=int, default=defaults.console, show_default=True),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _open_stack(
    cache_dir: Path | None,
    postgres_port: int,
    kafka_port: int,
    controller_port: int,
    s3_port: int,
    console_port: int,
) -> LocalStack:
    """The stack the options name. Explicit ports or ``--cache-dir`` ask for the local
    services there, so the variables pointing at external ones are set aside (and the
    command says so). A port not given is the one ``stack up`` last started that
    service on in the cache folder (see :func:`_remember_ports`), else the default."""
    environ: Mapping[str, str] = os.environ
    given = _explicit_options()
    chosen = {
        "postgres": postgres_port,
        "kafka": kafka_port,
        "controller": controller_port,
        "s3": s3_port,
        "console": console_port,
    }
    local = {k: v for k, v in environ.items() if k not in _EXTERNAL}  # the folder alone
    saved = _remembered_ports(StackSettings.from_env(local, cache_dir=cache_dir).cache_dir)
    for name, port in saved.items():
        if f"--{name}-port" not in given:
            chosen[name] = port
    try:
        ports = StackPorts(**chosen)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    overridden = [name for name in _EXTERNAL if environ.get(name)]
    if given and overridden:
        _err.print(
            f"{' and '.join(given)} given: ignoring {' and '.join(overridden)}; "
            "managing the local services"
        )
        environ = {k: v for k, v in environ.items() if k not in _EXTERNAL}
    return LocalStack(cache_dir, ports, console=_err, environ=environ)


_EXTERNAL = (DATABASE_URL_ENV, KAFKA_BOOTSTRAP_ENV, BACKUP_URL_ENV)
_LOCAL_OPTIONS = (
    *("cache_dir", "postgres_port", "kafka_port", "controller_port", "s3_port", "console_port"),
)


_PORTS_FILE = "ports.json"
"""In the cache folder: the ports ``stack up`` last started the services on."""


def _remember_ports(cache_dir: Path, ports: StackPorts) -> None:
    """Keep the ports ``stack up`` used, for ``status``, ``down`` and the next ``up``
    of the same folder."""
    (cache_dir / _PORTS_FILE).write_text(json.dumps(asdict(ports)) + "\n")


def _remembered_ports(cache_dir: Path) -> dict[str, int]:
    """The ports kept by :func:`_remember_ports` in ``cache_dir`` (none when the file is
    missing or not what it writes)."""
    try:
        saved = json.loads((cache_dir / _PORTS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    names = {f.name for f in fields(StackPorts)}
    if not isinstance(saved, dict):
        return {}
    return {
        name: port
        for name, port in saved.items()
        if name in names and type(port) is int and 1 <= port <= 65535
    }


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
    """Run PostgreSQL, Kafka and (optionally) S3Proxy and the run console locally,
    without Docker.

    A port not given is the one `stack up` last started that service on in the cache
    folder, else the default shown.
    """


@stack_group.command()
@_stack_options
@click.option(
    "--with-s3",
    is_flag=True,
    help="Also start S3Proxy, a local S3-compatible object store for backups.",
)
@click.option(
    "--with-console",
    is_flag=True,
    help="Also start the run console (blackbox web) on the stack, for this machine only.",
)
@click.option(
    "--brokers",
    type=click.Choice(["1", "3"]),
    default=None,
    help="1: one Kafka broker. 3: a KRaft cluster of three nodes on the Kafka and "
    "controller ports and the next four (replication factor 3, min.insync.replicas 2). "
    "[default: the cluster when it runs, else 1]",
)
@click.option(
    "--pg-standby",
    is_flag=True,
    help="Also start a streaming standby of PostgreSQL on the next port (commits wait "
    "for it); the database URL then names both. `blackbox stack promote` makes it the "
    "primary.",
)
def up(
    cache_dir: Path | None,
    postgres_port: int,
    kafka_port: int,
    controller_port: int,
    s3_port: int,
    console_port: int,
    with_s3: bool,
    with_console: bool,
    brokers: str | None,
    pg_standby: bool,
) -> None:
    """Start PostgreSQL and Kafka, and S3Proxy with --with-s3 (a no-op for what already
    runs, and it says so).

    BLACKBOX_DATABASE_URL / BLACKBOX_KAFKA_BOOTSTRAP / BLACKBOX_BACKUP_URL mark a service
    as external (not started), unless --cache-dir or a port is given: those ask for the
    local services.
    """
    stack = _open_stack(
        cache_dir, postgres_port, kafka_port, controller_port, s3_port, console_port
    )
    try:
        endpoints = stack.up(
            with_s3=with_s3, brokers=int(brokers) if brokers else None, pg_standby=pg_standby
        )
        web = (
            stack.web.start(
                database_url=endpoints.database_url, kafka_bootstrap=endpoints.kafka_bootstrap
            )
            if with_console
            else None
        )
    except StackError as exc:
        raise click.ClickException(str(exc)) from exc
    _remember_ports(stack.settings.cache_dir, stack.settings.ports)
    table = Table(title="blackbox local stack", show_header=False)
    table.add_column("what")
    table.add_column("where", overflow="fold")
    table.add_row("database url", Text(endpoints.database_url))
    table.add_row("kafka bootstrap", Text(endpoints.kafka_bootstrap))
    if with_s3:
        for what, where in _backup_rows(endpoints, stack.settings.external_backup_url):
            table.add_row(what, Text(where))
    if web is not None:
        table.add_row("run console", Text(web))
    _out.print(table)
    if endpoints.backup is not None:
        _err.print(f"to point the backup commands at S3Proxy: . {endpoints.backup.env_file}")


def _backup_rows(endpoints: Endpoints, external_url: str | None) -> list[tuple[str, str]]:
    """The object store's rows of the ``up`` table: the URL and where the credentials
    are, never the secret itself."""
    if endpoints.backup is not None:
        credentials = str(endpoints.backup.env_file)
        return [("backup url", endpoints.backup.backup_url), ("backup credentials", credentials)]
    shown = redact_url(external_url or "")
    return [("backup url", shown), ("backup credentials", "external: AWS_* variables")]


@stack_group.command()
@_stack_options
def down(
    cache_dir: Path | None,
    postgres_port: int,
    kafka_port: int,
    controller_port: int,
    s3_port: int,
    console_port: int,
) -> None:
    """Stop PostgreSQL, Kafka, S3Proxy and the run console; their data is kept (says so
    when nothing runs).

    External services (BLACKBOX_DATABASE_URL / BLACKBOX_KAFKA_BOOTSTRAP /
    BLACKBOX_BACKUP_URL) are left alone, unless --cache-dir or a port is given: those name
    the local services to stop. A local S3Proxy or console that runs is always stopped.
    """
    stack = _open_stack(
        cache_dir, postgres_port, kafka_port, controller_port, s3_port, console_port
    )
    try:
        stack.down()
    except StackError as exc:
        raise click.ClickException(str(exc)) from exc


@stack_group.command()
@_stack_options
def promote(
    cache_dir: Path | None,
    postgres_port: int,
    kafka_port: int,
    controller_port: int,
    s3_port: int,
    console_port: int,
) -> None:
    """Promote the PostgreSQL standby (from `stack up --pg-standby`) to primary, once the
    primary is lost. Clients on the URL `stack up` printed reconnect to it by themselves.

    Never promote while the primary still accepts writes: both would. The old primary is
    not started again by `stack up` (its data is behind the promoted server).
    """
    stack = _open_stack(
        cache_dir, postgres_port, kafka_port, controller_port, s3_port, console_port
    )
    try:
        url = stack.promote()
    except StackError as exc:
        raise click.ClickException(str(exc)) from exc
    _out.print(Text(url))


@stack_group.command()
@_stack_options
def status(
    cache_dir: Path | None,
    postgres_port: int,
    kafka_port: int,
    controller_port: int,
    s3_port: int,
    console_port: int,
) -> None:
    """Show each service's state, pid, address and data folder."""
    stack = _open_stack(
        cache_dir, postgres_port, kafka_port, controller_port, s3_port, console_port
    )
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
        if entry.role is not None:
            state = f"{state} ({entry.role})"
        table.add_row(
            entry.name,
            Text(state, style=_STATE_STYLE[entry.state]),
            str(entry.pid) if entry.pid is not None else "-",
            Text("-" if external else entry.address),
            Text(str(entry.data_dir)) if entry.data_dir is not None else "-",
        )
    return table
