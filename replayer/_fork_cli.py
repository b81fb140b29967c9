"""``blackbox fork`` and ``blackbox reexecute``: start again from a recorded run."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table
from sqlalchemy import Engine, create_engine

from agent_blackbox.replayer._access import opening, purpose_option, recording_keys
from agent_blackbox.replayer._index import read_side
from agent_blackbox.replayer._registry import load_entry
from agent_blackbox.replayer._sources import KafkaRunSource, read_archive
from agent_blackbox.schemas import BlackboxError, Envelope, Settings, safe_text

__all__ = ["fork_command", "reexecute_command"]


def _parent_events(run_id: str, archive: Path | None) -> tuple[list[Envelope], Engine | None]:
    if archive is not None:
        events = list(read_archive(archive, run_id=run_id))
        if not events:
            raise BlackboxError(f"run {run_id} is not in {archive}")
        return events, None
    settings = Settings.from_env()
    engine = create_engine(settings.database_url)
    return list(KafkaRunSource(settings, read_side().run_index(engine), run_id)), engine


def _changes(pairs: tuple[str, ...]) -> dict[str, str]:
    changes = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not key=value", param_hint="--set")
        changes[key] = value
    return changes


@click.command("fork")
@click.argument("run_id")
@click.option(
    "--agent",
    "factory_path",
    required=True,
    help="Fork factory module:function, called as factory(snapshot, base_url=, api_key=).",
)
@click.option("--set", "pairs", multiple=True, help="A change: model=…, prompt=…, flag.X=…")
@click.option("--base-url", required=True, help="OpenAI-compatible endpoint of the model.")
@click.option(
    "--api-key-env",
    default="OPENAI_API_KEY",
    show_default=True,
    help="Environment variable holding the endpoint's key (never recorded).",
)
@click.option(
    "--effects", type=click.Choice(["refuse", "sandbox"]), default="refuse", show_default=True
)
@click.option("--archive", type=click.Path(exists=True, path_type=Path), default=None)
@click.option("--dry-run", is_flag=True, help="Record the fork in memory, not in the outbox.")
@purpose_option(required=True)
@click.option("--json", "as_json", is_flag=True)
def fork_command(
    run_id: str,
    factory_path: str,
    pairs: tuple[str, ...],
    base_url: str,
    api_key_env: str,
    effects: str,
    archive: Path | None,
    dry_run: bool,
    purpose: str,
    as_json: bool,
) -> None:
    """Re-execute RUN_ID as a new run from its input snapshot, with changes."""

    from agent_blackbox.replayer._fork import fork_run

    console = Console(stderr=True)
    changes = _changes(pairs)
    try:
        factory = load_entry(factory_path)
        parent, engine = _parent_events(run_id, archive)
        engine = engine or create_engine(Settings.from_env().database_url)
        reading = opening(lambda: engine, purpose=purpose)
        result = fork_run(
            parent,
            factory,
            changes=changes,
            base_url=base_url,
            api_key=os.environ.get(api_key_env, "not-set"),
            effects="sandbox" if effects == "sandbox" else "refuse",
            engine=None if dry_run else engine,
            settings=Settings.from_env(),
            pipeline=reading.pipeline,
            digests=reading.digests,
            keys=recording_keys(),
        )
    except BlackboxError as exc:
        console.print(f"[red]error:[/] {safe_text(str(exc))}")
        sys.exit(2)
    summary = {
        "run_id": result.run_id,
        "parent_run_id": result.parent_run_id,
        "changes": dict(result.changes),
        "status": result.status,
        "error": result.error,
        "sandboxed_effects": len(result.sandboxed_effects),
        "recorded": "memory" if dry_run else "outbox",
    }
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        Console().print(
            f"fork {result.run_id} of {result.parent_run_id}: {result.status}"
            + (f" ({safe_text(result.error)})" if result.error else "")
            + f"; changes {safe_text(json.dumps(dict(result.changes)))}"
        )
    sys.exit(0 if result.status == "succeeded" else 1)


@click.command("reexecute")
@click.argument("run_id")
@click.option("--base-url", required=True, help="OpenAI-compatible endpoint to re-send to.")
@click.option("--api-key-env", default="OPENAI_API_KEY", show_default=True)
@click.option("--archive", type=click.Path(exists=True, path_type=Path), default=None)
@purpose_option(required=True)
@click.option("--json", "as_json", is_flag=True)
def reexecute_command(
    run_id: str, base_url: str, api_key_env: str, archive: Path | None, purpose: str, as_json: bool
) -> None:
    """Re-send each recorded LLM request of RUN_ID and diff the answers per call."""

    from agent_blackbox.replayer._fork import openai_sender, reexecute

    console = Console(stderr=True)
    try:
        events, engine = _parent_events(run_id, archive)
        opened = engine or create_engine(Settings.from_env().database_url)
        pipeline = opening(lambda: opened, purpose=purpose).pipeline
        send = openai_sender(base_url, os.environ.get(api_key_env, "not-set"))
        diffs = reexecute(events, send, pipeline=pipeline)
    except BlackboxError as exc:
        console.print(f"[red]error:[/] {safe_text(str(exc))}")
        sys.exit(2)
    if as_json:
        rows = [
            {
                "sequence": d.sequence,
                "model": d.model,
                "same": d.same,
                "error": d.error,
                "changed": {k: {"recorded": v[0], "now": v[1]} for k, v in d.changed.items()},
            }
            for d in diffs
        ]
        click.echo(json.dumps({"run_id": run_id, "calls": rows}, indent=2, default=str))
    else:
        table = Table(title=f"LLM calls of {run_id}, re-sent to {safe_text(base_url)}")
        for column in ("sequence", "model", "result", "changed"):
            table.add_column(column)
        for d in diffs:
            result = "same" if d.same else ("error" if d.error else "differs")
            detail = d.error or ", ".join(d.changed)
            table.add_row(str(d.sequence), safe_text(d.model), result, safe_text(detail))
        Console().print(table)
    sys.exit(0 if all(d.same for d in diffs) else 1)
