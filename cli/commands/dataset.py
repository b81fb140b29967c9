"""``blackbox dataset``: named sets of recorded runs, for experiments and exports."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from agent_blackbox.cli._purpose import purpose_option
from agent_blackbox.cli._selection import run_selection, selection_options
from agent_blackbox.cli._wiring import wired
from agent_blackbox.cli.commands.export import FORMATS, Format, export_command
from agent_blackbox.consumers import (
    Dataset,
    DatasetError,
    create_dataset_txn,
    dataset_txn,
    datasets_txn,
    delete_dataset_txn,
    select_runs_txn,
)
from agent_blackbox.replayer._batch import DEFAULT_LIMIT
from agent_blackbox.schemas import BlackboxError, permission_refused, safe_console, safe_text

__all__ = ["dataset_group"]


@click.group("dataset")
def dataset_group() -> None:
    """Datasets: named, saved sets of recorded runs (for experiments and exports)."""


@dataset_group.command("create")
@click.argument("name")
@click.argument("run_ids", nargs=-1, metavar="[RUN_ID]...")
@selection_options
@click.option("--description", default=None, help="What the dataset is for (one line).")
def create_command(
    name: str, run_ids: tuple[str, ...], description: str | None, **filters: Any
) -> None:
    """Save the runs RUN_IDs (or those the filters choose: finished runs, newest first)
    as the dataset NAME. The set is frozen: runs recorded later do not join it.

    Exit 0 created; 2 when it could not be (a name taken or malformed, no run chosen, a
    run the views do not hold, the database away or the wrong role).
    """
    selection = run_selection(run_ids, **filters)
    if description is not None and ("\n" in description or len(description) > 500):
        raise click.BadParameter("one line of at most 500 characters", param_hint="--description")
    err = safe_console(stderr=True)
    engine = wired().engine()
    try:
        with engine.begin() as conn:
            chosen = select_runs_txn(conn, selection)
            create_dataset_txn(
                conn, name=name, selection=selection.to_dict(), runs=chosen, description=description
            )
    except BlackboxError as exc:
        if permission_refused(exc) is not None:
            raise
        err.print(f"[red]error:[/] {safe_text(str(exc))}")
        sys.exit(2)
    finally:
        engine.dispose()
    err.print(f"dataset {safe_text(name)}: {len(chosen)} runs")


@dataset_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per dataset.")
def list_command(as_json: bool) -> None:
    """List the datasets this login may see (granted every tenant of their runs)."""
    with wired().connection() as conn:
        found = datasets_txn(conn)
    if as_json:
        for dataset in found:
            click.echo(json.dumps(_shown(dataset), default=str))
        return
    table = Table(title="Datasets")
    for column in ("name", "runs", "created", "by", "chosen by", "description"):
        table.add_column(column)
    for d in found:
        table.add_row(
            safe_text(d.name),
            str(d.runs),
            d.created_at.strftime("%Y-%m-%d %H:%M"),
            safe_text(d.created_by),
            safe_text(_words(d.selection)),
            safe_text(d.description or ""),
        )
    safe_console().print(table)


@dataset_group.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="The dataset and its run ids as JSON.")
def show_command(name: str, as_json: bool) -> None:
    """Show the dataset NAME and its runs (exit 2 when there is none)."""
    dataset = _found(name)
    if as_json:
        click.echo(json.dumps({**_shown(dataset), "run_ids": list(dataset.run_ids)}, indent=2))
        return
    console = safe_console()
    console.print(
        f"dataset [bold]{safe_text(dataset.name)}[/]: {dataset.runs} runs, created "
        f"{dataset.created_at:%Y-%m-%d %H:%M} by {safe_text(dataset.created_by)}; chosen by "
        f"{safe_text(_words(dataset.selection))}"
    )
    if dataset.description:
        console.print(safe_text(dataset.description))
    for run_id in dataset.run_ids:
        console.print(safe_text(run_id))


@dataset_group.command("export")
@click.argument("name")
@click.option(
    "--format",
    "form",
    type=click.Choice(FORMATS),
    default="jsonl",
    show_default=True,
    help="As blackbox export --format.",
)
@click.option(
    "--examples",
    type=click.Choice(("conversation", "call")),
    default=None,
    help="As blackbox export --examples.",
)
@click.option("--bodies", is_flag=True, help="As blackbox export --bodies (needs --purpose).")
@purpose_option(required=False)
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    default=None,
    help="Write to FILE instead of standard output.",
)
@click.pass_context
def export_dataset_command(
    ctx: click.Context,
    name: str,
    form: Format,
    examples: str | None,
    bodies: bool,
    purpose: str | None,
    output: Path | None,
) -> None:
    """Export the runs of the dataset NAME as blackbox export does (JSON lines of their
    events, or --format openai-chat), with its exit statuses."""
    dataset = _found(name)
    ctx.invoke(
        export_command,
        run_ids=dataset.run_ids,
        since_raw=None,
        until_raw=None,
        agent_id=None,
        limit=DEFAULT_LIMIT,
        include_forks=False,
        form=form,
        examples=examples,
        bodies=bodies,
        purpose=purpose,
        archive=None,
        output=output,
    )


@dataset_group.command("delete")
@click.argument("name")
def delete_command(name: str) -> None:
    """Delete the dataset NAME (its runs stay). Exit 2 when there is none."""
    with wired().connection(begin=True) as conn:
        deleted = delete_dataset_txn(conn, name)
    if not deleted:
        safe_console(stderr=True).print(f"[red]error:[/] no dataset {safe_text(name)} to delete")
        sys.exit(2)


def _found(name: str) -> Dataset:
    with wired().connection() as conn:
        dataset = dataset_txn(conn, name)
    if dataset is None:
        problem = DatasetError(
            f"no dataset {name} this login can see; blackbox dataset list shows them"
        )
        safe_console(stderr=True).print(f"[red]error:[/] {safe_text(str(problem))}")
        sys.exit(2)
    return dataset


def _shown(dataset: Dataset) -> dict[str, Any]:
    shown = dataset.to_dict()
    shown.pop("run_ids")
    return shown


def _words(selection: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in selection.items()) or "all finished runs"
