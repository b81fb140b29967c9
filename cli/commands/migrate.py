"""``blackbox migrate``: create or upgrade both schemas."""

from __future__ import annotations

import click

from agent_blackbox.cli._wiring import wired
from agent_blackbox.cli._workers import guarded
from agent_blackbox.consumers import migrate_views, runs_naming_bodies_txn
from agent_blackbox.outbox.storage import (
    attribute_blobs_txn,
    migrate_write_side,
    unattributed_blobs_txn,
)
from agent_blackbox.schemas import safe_console


@click.command("migrate")
def migrate_command() -> None:
    """Create or upgrade the write side and the views in BLACKBOX_DATABASE_URL.

    Bodies stored out of line before they had a tenant are given to the tenants of the
    runs whose indexed events name them; any the views do not name stay readable by the
    schema's owner only (run `blackbox migrate` again once the views have caught up).
    """
    wiring = wired()
    console = safe_console(stderr=True)
    attributed: list[int] = []

    def both() -> None:
        migrate_write_side(wiring.settings.database_url)
        migrate_views(wiring.settings.database_url)
        with wiring.connection(begin=True) as conn:
            unattributed = unattributed_blobs_txn(conn)
            named = runs_naming_bodies_txn(conn, unattributed)
            attributed.extend((attribute_blobs_txn(conn, named), len(unattributed)))

    guarded(both, console)
    console.print("[green]migrated[/] the write side (blackbox) and the views (blackbox_views)")
    done, of = attributed or (0, 0)
    if of:
        left = of - done
        console.print(
            f"bodies stored out of line before they had a tenant: {done:,} of {of:,} given to "
            "the tenants of the runs that name them"
            + (
                f"; {left:,} that no indexed event names stay readable by the owner only "
                "(run `blackbox migrate` again once the views have caught up)"
                if left
                else ""
            )
        )
