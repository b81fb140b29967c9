"""``blackbox replay``, ``fork``, ``reexecute`` and ``verify``: the replayer's commands."""

from __future__ import annotations

import json
import os
import statistics
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from itertools import chain, groupby
from pathlib import Path
from typing import TypeVar

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from sqlalchemy import Engine, create_engine

from agent_blackbox.outbox import PostgresBlobs
from agent_blackbox.replayer._access import Opening, opening, purpose_option, recording_keys
from agent_blackbox.replayer._driver import replay_run
from agent_blackbox.replayer._index import RunIndex, read_side
from agent_blackbox.replayer._registry import AgentRegistry, load_entry
from agent_blackbox.replayer._report import ReplayReport
from agent_blackbox.replayer._sandbox import POLICIES, NondeterminismPolicy
from agent_blackbox.replayer._sources import KafkaRunSource, read_archive
from agent_blackbox.replayer._timeline import timeline_command
from agent_blackbox.replayer._verify_cli import verify_command
from agent_blackbox.schemas import BlackboxError, Envelope, Settings, safe_text

__all__ = [
    "fork_command",
    "reexecute_command",
    "replay_command",
    "timeline_command",
    "verify_command",
]

T = TypeVar("T")


@click.command("replay")
@click.argument("run_id", required=False)
@click.option("--all", "every", is_flag=True, help="Replay every finished run (batch).")
@click.option("--agent", "agent_path", default=None, help="Entry point module:function.")
@click.option("--agent-id", default=None, help="With --all: only runs of this agent.")
@click.option("--since", type=click.DateTime(), default=None, help="With --all: started after.")
@click.option("--limit", default=100_000, show_default=True, help="With --all: at most N runs.")
@click.option(
    "--archive",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="Read runs from an Avro archive instead of Kafka.",
)
@purpose_option(required=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output on stdout.")
@click.option(
    "--nondeterminism",
    type=click.Choice(POLICIES),
    default="warn",
    show_default=True,
    help="Direct reads of the clock, random, UUIDs or the environment by the agent's "
    "code: a warning in the report, or a failed run.",
)
@click.option(
    "--agent-module",
    "agent_modules",
    multiple=True,
    help="A module or package of the agent's own, besides the entry point's package "
    "(repeatable): its direct reads are reported too.",
)
def replay_command(
    run_id: str | None,
    every: bool,
    agent_path: str | None,
    agent_id: str | None,
    since: datetime | None,
    limit: int,
    archive: Path | None,
    purpose: str,
    as_json: bool,
    nondeterminism: NondeterminismPolicy,
    agent_modules: tuple[str, ...],
) -> None:
    """Replay RUN_ID (or --all) through the agent's own code, offline.

    Exit status: 0 when every run passes, 1 when one diverged, 2 when replay could not
    run. Entry points come from --agent or BLACKBOX_AGENTS (name=module:function,...).
    """
    console = Console(stderr=True)
    if every == (run_id is not None):
        raise click.UsageError("give either a RUN_ID or --all (exactly one of them)")
    try:
        registry = AgentRegistry.from_env(load_entry(agent_path) if agent_path else None)
        scope = _Scope(agent_id, since, limit, every, purpose, nondeterminism, agent_modules)
        reports = _reports(run_id, archive, registry, scope, console)
    except BlackboxError as exc:
        console.print(f"[red]error:[/] {safe_text(str(exc))}")
        sys.exit(2)
    if as_json:
        payload = _summary(reports) if every else reports[0].to_dict()
        click.echo(json.dumps(payload, indent=2))
    elif every:
        _print_summary(reports, Console())
    else:
        _print_report(reports[0], Console())
    sys.exit(0 if all(r.passed for r in reports) else 1)


@dataclass(frozen=True, slots=True)
class _Scope:
    """Which runs a replay command covers, and why it reads them."""

    agent_id: str | None
    since: datetime | None
    limit: int
    every: bool
    purpose: str
    nondeterminism: NondeterminismPolicy = "warn"
    agent_modules: tuple[str, ...] = ()


def _reports(
    run_id: str | None,
    archive: Path | None,
    registry: AgentRegistry,
    scope: _Scope,
    console: Console,
) -> list[ReplayReport]:
    settings = Settings.from_env()
    engine = create_engine(settings.database_url)
    try:
        reading = opening(lambda: engine, purpose=scope.purpose)
        if archive is not None:
            runs = _progress(_archive_runs(archive, run_id), None, console)
            return [_replay_events(events, registry, reading, scope) for events in runs]
        index = read_side().run_index(engine)
        ids = [run_id] if run_id else _indexed_runs(index, scope)
        blobs = PostgresBlobs(engine)
        reports = []
        for rid in _progress(iter(ids), len(ids) if scope.every else None, console):
            source = KafkaRunSource(settings, index, rid)
            entry = registry.resolve(source.agent_id)
            reports.append(
                replay_run(
                    source,
                    entry,
                    pipeline=reading.pipeline,
                    digests=reading.digests,
                    blobs=blobs,
                    agent_id=source.agent_id,
                    nondeterminism=scope.nondeterminism,
                    agent_modules=scope.agent_modules,
                )
            )
        return reports
    finally:
        engine.dispose()


def _archive_runs(path: Path, run_id: str | None) -> Iterator[Iterator[Envelope]]:
    # Archives hold runs one after another; each run streams, however long it is.
    for _, events in groupby(read_archive(path, run_id=run_id), key=lambda e: e.run_id):
        yield events


def _replay_events(
    events: Iterator[Envelope], registry: AgentRegistry, reading: Opening, scope: _Scope
) -> ReplayReport:
    first = next(events)
    agent = first.agent_id
    entry = registry.resolve(agent)
    return replay_run(
        chain([first], events),
        entry,
        pipeline=reading.pipeline,
        digests=reading.digests,
        agent_id=agent,
        nondeterminism=scope.nondeterminism,
        agent_modules=scope.agent_modules,
    )


def _indexed_runs(index: RunIndex, scope: _Scope) -> list[str]:
    return index.runs(
        finished_only=True, since=scope.since, agent_id=scope.agent_id, limit=scope.limit
    )


def _progress(items: Iterator[T], total: int | None, console: Console) -> Iterator[T]:
    columns = (TextColumn("replaying"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=total is None) as progress:
        task = progress.add_task("replay", total=total)
        for item in items:
            yield item
            progress.advance(task)


def _summary(reports: list[ReplayReport]) -> dict[str, object]:
    diverged = [r for r in reports if r.divergence is not None]
    positions = [r.divergence.sequence for r in diverged if r.divergence]
    return {
        "runs": len(reports),
        "passed": sum(r.passed for r in reports),
        "limited": sum(r.limited is not None for r in reports),
        "pass_rate": (sum(r.passed for r in reports) / len(reports)) if reports else None,
        "errors": sum(r.error is not None for r in reports),
        "divergence_kinds": dict(Counter(str(r.divergence.kind) for r in diverged if r.divergence)),
        "first_divergence_sequence": {
            "min": min(positions, default=None),
            "median": statistics.median(positions) if positions else None,
            "max": max(positions, default=None),
        },
        "results": [r.to_dict() for r in reports],
    }


def _print_report(report: ReplayReport, console: Console) -> None:
    levels = ", ".join(f"{name.replace('_', ' ')} {state}" for name, state in report.levels.items())
    if report.limited:
        console.print(f"[yellow]LIMITED[/] {safe_text(report.limited)}")
    if report.passed:
        label = "[yellow]LIMITED[/]" if report.limited else "[green]PASS[/]"
        console.print(f"{label} run {report.run_id} ({report.events} events): {levels}")
        return
    console.print(f"[red]DIVERGED[/] run {report.run_id} after {report.events} events: {levels}")
    for divergence in report.divergences:
        table = Table(show_header=False, box=None)
        rows = {
            "kind": str(divergence.kind),
            "level": divergence.level,
            "sequence": str(divergence.sequence),
            "expected": f"{divergence.expected_type or '-'} {divergence.expected_digest or ''}",
            "actual": f"{divergence.actual_type or '-'} {divergence.actual_digest or ''}",
            "call site": str(divergence.call_site or "(unknown)"),
            "detail": divergence.detail or "",
        }
        for name, value in rows.items():
            table.add_row(name, safe_text(value))
        console.print(table)


def _print_summary(reports: list[ReplayReport], console: Console) -> None:
    summary = _summary(reports)
    rate = summary["pass_rate"]
    console.print(
        f"{summary['passed']}/{summary['runs']} runs passed"
        + (f" ({float(rate):.1%})" if isinstance(rate, float) else "")
    )
    kinds = summary["divergence_kinds"]
    if isinstance(kinds, dict) and kinds:
        table = Table(title="First divergences")
        for column in ("kind", "runs"):
            table.add_column(column)
        for kind, count in sorted(kinds.items()):
            table.add_row(kind, str(count))
        console.print(table)
        console.print(f"first divergence at sequence: {summary['first_divergence_sequence']}")


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
