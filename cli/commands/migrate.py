"""``blackbox migrate``: create or upgrade both schemas."""

from __future__ import annotations

import click

from agent_blackbox.cli._wiring import wired
from agent_blackbox.cli._workers import guarded
from agent_blackbox.consumers import migrate_views
from agent_blackbox.outbox.storage import migrate_write_side
from agent_blackbox.schemas import safe_console


@click.command("migrate")
def migrate_command() -> None:
    """Create or upgrade the write side and the views in BLACKBOX_DATABASE_URL."""
    url = wired().settings.database_url
    console = safe_console(stderr=True)

    def both() -> None:
        migrate_write_side(url)
        migrate_views(url)

    guarded(both, console)
    console.print("[green]migrated[/] the write side (blackbox) and the views (blackbox_views)")
