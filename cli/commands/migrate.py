"""``blackbox migrate``: create or upgrade both schemas."""

from __future__ import annotations

from dataclasses import dataclass

import click
from sqlalchemy import Connection

from agent_blackbox.cli._wiring import wired
from agent_blackbox.cli._workers import guarded
from agent_blackbox.consumers import migrate_views, runs_naming_bodies_txn, sound_runs_txn
from agent_blackbox.outbox.storage import (
    attribute_blobs_txn,
    migrate_write_side,
    tenancy_heads_txn,
    unattributed_blobs_txn,
    unclaimed_blobs_txn,
)
from agent_blackbox.schemas import safe_console


@dataclass
class _Attributed:
    """What giving bodies stored before they had a tenant to their tenants did."""

    copies: int = 0
    unclaimed: int = 0


@click.command("migrate")
def migrate_command() -> None:
    """Create or upgrade the write side and the views in BLACKBOX_DATABASE_URL.

    Bodies stored out of line before they had a tenant are given to the tenants of the
    runs whose events name them, as far as the views hold those runs whole and sound up
    to the head they had when bodies got tenants; the owner keeps its copy. Run it again
    once the views have caught up.
    """
    wiring = wired()
    console = safe_console(stderr=True)
    done = _Attributed()

    def both() -> None:
        migrate_write_side(wiring.settings.database_url)
        migrate_views(wiring.settings.database_url)
        with wiring.connection(begin=True) as conn:
            _attribute(conn, done)

    guarded(both, console)
    console.print("[green]migrated[/] the write side (blackbox) and the views (blackbox_views)")
    if done.copies or done.unclaimed:
        console.print(
            f"bodies stored out of line before they had a tenant: {done.copies:,} "
            f"{'copy' if done.copies == 1 else 'copies'} given to the tenants of the runs "
            "that name them"
            + (
                f"; {done.unclaimed:,} no tenant has yet stay readable by the owner only (a "
                "run that names one is not whole and sound in the views up to the head it "
                "had at the upgrade: run `blackbox consume` to let them catch up, "
                "`blackbox verify` to see why, then `blackbox migrate` again)"
                if done.unclaimed
                else ""
            )
        )


def _attribute(conn: Connection, done: _Attributed) -> None:
    """Give the tenants of sound runs their copies of the bodies their events name."""
    unattributed = unattributed_blobs_txn(conn)
    if not unattributed:
        return
    named = runs_naming_bodies_txn(conn, unattributed)
    heads = tenancy_heads_txn(conn, sorted({run for run, _, _ in named}))
    sound = sound_runs_txn(conn, heads)
    done.copies = attribute_blobs_txn(conn, [row for row in named if row[0] in sound])
    done.unclaimed = unclaimed_blobs_txn(conn)
