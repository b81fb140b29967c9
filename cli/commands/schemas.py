"""``blackbox schemas``: check that every schema version can read what came before."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from fastavro.schema import SchemaParseException

from agent_blackbox.schemas import (
    CompatibilityReport,
    MigratorRegistry,
    SchemaRegistry,
    check_registry,
    default_migrators,
    safe_console,
    safe_text,
)
from agent_blackbox.schemas._registry import AVSC_DIR


@click.group("schemas")
def schemas_group() -> None:
    """Inspect and check the Avro schemas of the events."""


@schemas_group.command("check")
@click.option(
    "--dir",
    "directory",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=AVSC_DIR,
    show_default="the shipped schemas",
    help="Folder of <event_type>.v<N>.avsc files to check.",
)
def check_command(directory: Path) -> None:
    """Check each schema version against ALL earlier versions of its type.

    A newer version must read data written with every older one by Avro resolution
    (backward transitive), unless a registered migrator covers a step in between.
    Exit status 0 when every version has a reader path, 1 otherwise.
    """
    if not any(directory.glob("*.avsc")):
        raise click.ClickException(f"no <event_type>.v<N>.avsc files in {directory}")
    try:
        report = check_directory(directory)
    except (ValueError, SchemaParseException) as exc:
        raise click.ClickException(f"cannot load the schemas of {directory}: {exc}") from exc
    console = safe_console(stderr=True)
    for problem in report.problems:
        console.print(f"[red]incompatible:[/] {safe_text(problem.describe())}")
    summary = (
        f"{len(report.resolved)} version pairs checked by Avro resolution, "
        f"{len(report.migrated)} covered by migrators"
    )
    if not report.ok:
        console.print(f"[red]FAIL[/] {summary}; {len(report.problems)} problems in {directory}")
        sys.exit(1)
    console.print(f"[green]OK[/] {summary} in {directory}")


def check_directory(
    directory: Path = AVSC_DIR, migrators: MigratorRegistry | None = None
) -> CompatibilityReport:
    """Check the schemas of ``directory`` (see :func:`agent_blackbox.schemas.check_registry`).

    Raises:
        ValueError: a file is misnamed or not JSON.
        SchemaParseException: a file is not a valid Avro schema.
    """
    registry = SchemaRegistry.from_directory(directory)
    return check_registry(registry, migrators or default_migrators())
