"""A restore drill's report as a person reads it: its stages, checks, RPO and RTO."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from agent_blackbox.backup._drill import DrillReport
from agent_blackbox.schemas import safe_text


def print_drill(console: Console, report: DrillReport) -> None:
    """The drill's report as tables: stages, checks, RPO and RTO."""
    console.print(
        f"cut {report.cut} of {report.cut_created_at}: {report.events:,} events of "
        f"{report.runs:,} runs; target {safe_text(report.target or '-')}"
        + (" (kept)" if report.kept else "")
    )
    if report.duplicates:
        console.print(
            f"{report.duplicates:,} re-delivered copies in the topic (a relay restart "
            "publishes again what it had not deleted): each counted once"
        )
    if report.skipped:
        console.print(f"{report.skipped:,} runs left out of the replay sample: no entry point")
    stages = Table(title="stages")
    stages.add_column("stage")
    stages.add_column("seconds", justify="right")
    for name, seconds in report.stages.items():
        stages.add_row(name, f"{seconds:.1f}")
    console.print(stages)
    checks = Table(title="checks")
    for column in ("check", "result", "detail"):
        checks.add_column(column, overflow="fold")
    marks = {True: "[green]PASS[/]", False: "[red]FAIL[/]", None: "[yellow]n/a[/]"}
    for check in report.checks:
        detail = "\n".join([safe_text(check.detail), *(safe_text(w) for w in check.where)])
        checks.add_row(check.name, marks[check.passed], detail)
    console.print(checks)
    rpo = "-" if report.rpo_s is None else f"{report.rpo_s:.1f} s"
    rto = "-" if report.rto_s is None else f"{report.rto_s:.1f} s"
    console.print(f"RPO {rpo} (disaster point minus the cut's newest event), RTO {rto}")
    for left in report.left_behind:
        console.print(f"[yellow]left behind:[/] {safe_text(left)}")
    verdict = "[green]PASS[/]: the backup restores" if report.passed else "[red]FAIL[/]"
    console.print(verdict)
