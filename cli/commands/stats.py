"""``blackbox stats``: LLM usage and cost from the analytics views."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import click
from rich.table import Table
from sqlalchemy.exc import SQLAlchemyError

from agent_blackbox.cli._wiring import wired
from agent_blackbox.cli._workers import could_not_run, views_unread
from agent_blackbox.consumers import (
    GROUPINGS,
    UsageRow,
    dollars_json,
    dollars_text,
    llm_usage_txn,
)
from agent_blackbox.schemas import moment, safe_console, safe_text


def _since(raw: str) -> datetime:
    """``1h``, ``30m``, ``2d`` ago, or an ISO time (local time without a zone)."""
    try:
        at = moment(raw, spans="mhd")
    except ValueError:
        raise click.BadParameter(
            f"{raw!r}: give a span like 30m, 1h, 2d or an ISO time", param_hint="--since"
        ) from None
    if at > datetime.now(UTC):
        raise click.BadParameter(f"{raw!r} is in the future", param_hint="--since")
    return at


@click.command("stats")
@click.option(
    "--by",
    type=click.Choice(sorted(GROUPINGS)),
    default="model",
    show_default=True,
    help="Group the LLM calls by this.",
)
@click.option(
    "--since", "since_raw", default="1h", show_default=True, help="30m, 1h, 2d, or a time."
)
@click.option("--json", "as_json", is_flag=True, help="One JSON line per group on stdout.")
@click.option(
    "--include-unverified",
    is_flag=True,
    help="Count LLM calls the write side does not vouch for too (events of runs it never "
    "recorded, past a run's head or after its end, or off its hash chain: produced to "
    "the topic by someone other than the relay). Left out by default.",
)
def stats_command(by: str, since_raw: str, as_json: bool, include_unverified: bool) -> None:
    """LLM calls, tokens, cost, latency p50/p95/p99 and error rate from the analytics
    views (built by `blackbox analytics`), grouped by one dimension. Costs are exact
    sums at the prices in force when the calls were read; calls of a model without a
    price are counted as unpriced, never as free. Read as any role that may read the
    views (the reader sees its granted tenants only)."""
    console = safe_console(stderr=True, log_path=False)
    since = _since(since_raw)
    engine = wired().engine()
    try:
        with engine.connect() as conn:
            rows = llm_usage_txn(conn, by=by, since=since, include_unverified=include_unverified)
    except SQLAlchemyError as exc:
        could_not_run(console, views_unread(exc, "the analytics views"))
    finally:
        engine.dispose()
    if as_json:
        for row in rows:
            click.echo(json.dumps({by: row.group, **_figures(row)}))
        return
    if not rows:
        console.print(
            f"no LLM call since {since.isoformat(timespec='seconds')} in the analytics views "
            "(is `blackbox analytics` running, and is the window right?)"
        )
        return
    table = Table(title=f"LLM calls since {since.isoformat(timespec='seconds')} by {by}")
    columns = (by, "calls", "errors", "tokens in", "cached", "tokens out", "cost", "unpriced")
    for column in (*columns, "p50 ms", "p95 ms", "p99 ms"):
        table.add_column(
            column,
            justify="left" if column == by else "right",
            overflow="fold",
            no_wrap=column != by,  # figures are never broken across lines
        )
    for row in rows:
        figures = _figures(row)
        table.add_row(
            safe_text(row.group if row.group is not None else "-"),
            f"{row.calls:,}",
            f"{row.errors:,} ({row.error_rate:.1%})",
            f"{row.prompt_tokens:,}",
            f"{row.cached_tokens:,}",
            f"{row.completion_tokens:,}",
            "-" if row.cost_usd is None else dollars_text(row.cost_usd),
            f"{row.unpriced_calls:,}" if row.unpriced_calls else "",
            *(_ms(figures[k]) for k in ("latency_p50_ms", "latency_p95_ms", "latency_p99_ms")),
        )
    out = safe_console()
    if not out.is_terminal:  # piped or captured: wide enough for every column whole
        out = safe_console(width=max(out.width, 140))
    out.print(table)
    _total(rows)


def _figures(row: UsageRow) -> dict[str, Any]:
    return {
        "calls": row.calls,
        "errors": row.errors,
        "error_rate": row.error_rate,
        "prompt_tokens": row.prompt_tokens,
        "completion_tokens": row.completion_tokens,
        "total_tokens": row.total_tokens,
        "cached_tokens": row.cached_tokens,
        "cost_usd": dollars_json(row.cost_usd),
        "unpriced_calls": row.unpriced_calls,
        "latency_p50_ms": row.latency_p50_ms,
        "latency_p95_ms": row.latency_p95_ms,
        "latency_p99_ms": row.latency_p99_ms,
    }


def _total(rows: list[UsageRow]) -> None:
    """The window's whole cost under the table, exact (every group's calls are in it)."""
    costs = [row.cost_usd for row in rows if row.cost_usd is not None]
    unpriced = sum(row.unpriced_calls for row in rows)
    total = dollars_text(sum(costs, Decimal(0))) if costs else "nothing priced"
    note = f" ({unpriced:,} unpriced calls not included)" if unpriced else ""
    safe_console().print(f"cost: {total}{note}")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
