"""``blackbox demo``: the whole pipeline, end to end, on the local stack."""

from __future__ import annotations

import sys

import click

from agent_blackbox.cli._wiring import wired
from agent_blackbox.cli._workers import guarded
from agent_blackbox.schemas import safe_console


@click.command("demo")
@click.option("--runs", default=300, show_default=True, help="How many agent runs to record.")
@click.option("--workers", default=4, show_default=True, help="Agents recording at once.")
def demo_command(runs: int, workers: int) -> None:
    """Start the stack, record agent runs, relay them, build the views, show them, back
    them up and end with a restore drill. Exit 1 when the drill found a problem."""
    from agent_blackbox.examples.demo import run_demo

    settings = wired().settings
    console = safe_console(stderr=True)
    outcome: list[bool] = []

    def demo() -> None:
        outcome.append(run_demo(settings, runs=runs, workers=workers, console=console))

    guarded(demo, console)
    if outcome != [True]:
        sys.exit(1)
