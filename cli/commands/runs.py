"""``blackbox runs``: the run list of the views, with the console's filters and search."""

from __future__ import annotations

import json
from typing import Any

import click
from rich.table import Table
from sqlalchemy.exc import SQLAlchemyError

from agent_blackbox.cli._wiring import wired
from agent_blackbox.cli._workers import could_not_run, views_unread
from agent_blackbox.consumers import (
    ListedRun,
    RunFilter,
    SearchError,
    dollars_json,
    dollars_text,
    list_runs_txn,
    parse_search,
    with_search,
)
from agent_blackbox.schemas import moment, safe_console, safe_text


@click.command("runs")
@click.argument("query", nargs=-1)
@click.option("--session", default=None, help="Only the runs of this session id.")
@click.option("--user", default=None, help="Only the runs of this user id (as recorded).")
@click.option("--agent", default=None, help="Only the runs of this agent.")
@click.option("--since", "since_raw", default=None, help="30m, 1h, 2d, or a time.")
@click.option(
    "--limit",
    type=click.IntRange(1, 200),
    default=50,
    show_default=True,
    help="How many runs, newest first.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON line per run on stdout.")
def runs_command(
    query: tuple[str, ...],
    session: str | None,
    user: str | None,
    agent: str | None,
    since_raw: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """The newest runs in the views, narrowed by QUERY: the console's search
    (`model:gpt-4o tool:lookup status:failed tag:team=billing "refund"`; terms run:,
    tag:, tool:, model:, error:, status:, code:, prompt:, session:, user:, agent:; other
    words are found in the LLM messages of tenants that opted in). Read as any role that
    may read the views (a reader sees its granted tenants only).

    Exit codes: 0 runs listed, 1 no run matched, 2 the query or the views could not be
    read."""
    console = safe_console(stderr=True, log_path=False)
    try:
        since = moment(since_raw, spans="mhd") if since_raw else None
    except ValueError:
        raise click.BadParameter(
            "give a span like 30m, 1h, 2d or an ISO time", param_hint="--since"
        ) from None
    where = RunFilter(since=since, session=session, user=user, agent=agent)
    try:
        where = with_search(where, parse_search(" ".join(query)))
    except SearchError as exc:
        raise click.UsageError(f"search: {exc}") from None
    engine = wired().engine()
    try:
        with engine.connect() as conn:
            page = list_runs_txn(conn, where, limit=limit)
    except SQLAlchemyError as exc:
        could_not_run(console, views_unread(exc, "the views"))
    finally:
        engine.dispose()
    if as_json:
        for run in page.runs:
            click.echo(json.dumps(_json(run)))
    elif page.runs:
        _table(page.runs)
    if not page.runs:
        console.print("no run matches (is `blackbox consume` running, and are the filters right?)")
        raise SystemExit(1)


def _json(run: ListedRun) -> dict[str, Any]:
    return {
        "run_id": run.run_id,
        "started_at": run.started_at.isoformat() if run.started_at else None,
        "agent_id": run.agent_id,
        "tenant_id": run.tenant_id,
        "status": run.status,
        "session_id": run.session_id,
        "user_id": run.user_id,
        "events": run.event_count,
        "llm_calls": run.llm_calls,
        "total_tokens": run.total_tokens,
        "cost_usd": dollars_json(run.cost_usd),
        "unpriced_calls": run.unpriced_calls,
        "models": list(run.models),
        "code_version": run.code_version,
        "prompt_version": run.prompt_version,
        "unverified": run.unverified,
        "unverified_events": run.unverified_events,
    }


def _table(runs: list[ListedRun]) -> None:
    table = Table()
    for column in ("started (UTC)", "run", "agent", "status", "session", "user"):
        table.add_column(column, overflow="fold")
    for column in ("events", "LLM calls", "tokens", "cost"):
        table.add_column(column, justify="right", no_wrap=True)
    for run in runs:
        table.add_row(
            run.started_at.strftime("%Y-%m-%d %H:%M:%S") if run.started_at else "-",
            safe_text(run.run_id),
            safe_text(run.agent_id),
            safe_text(run.status) + (" (unverified)" if run.unverified else ""),
            safe_text(run.session_id or ""),
            safe_text(run.user_id or ""),
            f"{run.event_count:,}",
            f"{run.llm_calls:,}",
            f"{run.total_tokens:,}",
            "-" if run.cost_usd is None else dollars_text(run.cost_usd),
        )
    out = safe_console()
    if not out.is_terminal:  # piped or captured: wide enough for every column whole
        out = safe_console(width=max(out.width, 160))
    out.print(table)
