"""How ``blackbox experiment`` shows an experiment: a progress bar while it runs, then
its summary and regressions as tables (or one JSON document)."""

from __future__ import annotations

import json
from collections.abc import Callable

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as Bar
from rich.table import Table

from agent_blackbox.replayer import ExperimentReport, RunResult
from agent_blackbox.schemas import safe_console, safe_text

__all__ = ["Progress", "print_report", "report"]


class Progress:
    """A progress bar on standard error over the runs forked (none when it is not a
    terminal); entering gives the function that advances it by one result."""

    def __init__(self, console: Console, total: int) -> None:
        self._bar = Bar(
            TextColumn("forking and scoring runs"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[trouble]}"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self._total = total
        self._trouble = 0

    def __enter__(self) -> Callable[[RunResult], None]:
        self._bar.__enter__()
        task = self._bar.add_task("experiment", total=self._total, trouble="")

        def advance(result: RunResult) -> None:
            self._trouble += result.outcome != "scored"
            note = f"{self._trouble} not scored" if self._trouble else ""
            self._bar.update(task, advance=1, trouble=note)

        return advance

    def __exit__(self, *exc: object) -> None:
        self._bar.__exit__(None, None, None)


def report(report: ExperimentReport, *, as_json: bool, fail_on_regression: bool) -> None:
    if as_json:
        document = report.to_dict(fail_on_regression=fail_on_regression)
        click.echo(json.dumps(document, indent=2, default=str))
        return
    print_report(report, safe_console())


_COLUMNS = ("score", "runs", "recorded", "variant", "difference", "verdict", "regressed")


def print_report(report: ExperimentReport, console: Console) -> None:
    """The experiment's summary and regressions as tables: each mean ± its interval's
    half-width, a score's name with ↑ (higher is better) or ↓ (lower is better)."""
    plan = report.plan
    console.print(_headline(report))
    table = Table(
        title=f"Scores: means ± the half-width of their {plan.confidence:.0%} t intervals; the "
        "difference (variant − recorded) is paired per run",
        title_justify="left",
    )
    for column in _COLUMNS:
        table.add_column(column, justify="right" if column in ("runs", "regressed") else "left")
    for number, made in enumerate(table.columns):
        made.no_wrap = number < 5  # a name or a figure is never broken
    for s in report.summaries:
        table.add_row(
            f"{safe_text(s.score)} {'↓' if s.lower_is_better else '↑'}",
            str(s.runs),
            _mean(s.baseline.value, s.baseline.low, s.baseline.high),
            _mean(s.variant.value, s.variant.low, s.variant.high),
            _mean(s.difference.value, s.difference.low, s.difference.high, signed=True),
            s.verdict,
            str(s.regressions),
        )
    console.print(table)
    _print_regressions(report, console)
    for result in report.results:
        if result.outcome != "scored":
            why = safe_text(result.error or "")
            console.print(f"[yellow]{result.outcome}[/] {safe_text(result.run_id)}: {why}")
    console.print(f"in the console: /experiments/{safe_text(plan.experiment_id)}")


def _headline(report: ExperimentReport) -> str:
    """``experiment ID (NAME), finished: 48 of 50 runs scored, 2 not run``."""
    plan, counts = report.plan, report.counts()
    notes = [
        f"{counts['not_run']} not run" if counts["not_run"] else "",
        f"{counts['evaluator_failed']} with an evaluator failed"
        if counts["evaluator_failed"]
        else "",
        f"{counts['variant_failed']} variants failed" if counts["variant_failed"] else "",
    ]
    scored = f"{counts['scored']} of {counts['runs']} runs scored"
    return (
        f"experiment [bold]{safe_text(plan.experiment_id)}[/] ({safe_text(plan.name)}), "
        f"{report.status}: " + ", ".join([scored, *(n for n in notes if n)])
    )


def _print_regressions(report: ExperimentReport, console: Console, shown: int = 20) -> None:
    """The runs that regressed, each with the scores it did worse on."""
    by_run: dict[str, list[str]] = {}
    for r in report.regressions:
        worse = f"{safe_text(r.score)} {_figure(r.baseline)} → {_figure(r.variant)}"
        by_run.setdefault(r.run_id, []).append(worse)
    if not by_run:
        console.print("no run regressed")
        return
    table = Table(title=f"Regressed runs ({len(by_run)})", title_justify="left")
    table.add_column("run", no_wrap=True)
    table.add_column("scored worse on (recorded → variant)")
    for run_id, scores in list(by_run.items())[:shown]:
        table.add_row(safe_text(run_id), "; ".join(scores))
    console.print(table)
    if len(by_run) > shown:
        console.print(f"and {len(by_run) - shown} more runs (--json lists them all)")


def _mean(
    value: float | None, low: float | None, high: float | None, *, signed: bool = False
) -> str:
    if value is None:
        return "-"
    text = _figure(value, signed=signed)
    if low is None or high is None:
        return text
    # A t interval is symmetric about its mean: its half-width says it in a few characters.
    return f"{text}\n± {_figure((high - low) / 2)}"


def _figure(value: float, *, signed: bool = False) -> str:
    """A score as people read it: 4 significant digits."""
    return f"{value:+.4g}" if signed else f"{value:.4g}"
