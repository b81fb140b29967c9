"""``blackbox migrate``: create or upgrade both schemas."""

from __future__ import annotations

from dataclasses import dataclass, field

import click

from agent_blackbox.cli._wiring import Wiring, wired
from agent_blackbox.cli._workers import guarded
from agent_blackbox.consumers import (
    migrate_views,
    runs_in_conflict_txn,
    runs_naming_bodies_txn,
)
from agent_blackbox.outbox.storage import (
    attribute_blobs_txn,
    migrate_write_side,
    tenancy_heads_txn,
    unattributed_blobs_txn,
    unclaimed_blobs_txn,
)
from agent_blackbox.replayer import KafkaRunSource, chained_references
from agent_blackbox.schemas import BlackboxError, safe_console, safe_text


@dataclass
class _Attributed:
    """What giving bodies stored before they had a tenant to their tenants did."""

    copies: int = 0
    unclaimed: int = 0
    unread: list[str] = field(default_factory=list)
    """Why runs that may name such bodies could not be read from the topic or proven."""


@click.command("migrate")
def migrate_command() -> None:
    """Create or upgrade the write side and the views in BLACKBOX_DATABASE_URL.

    Bodies stored out of line before they had a tenant are given to the tenants of the
    runs whose events name them, as far as those events, read from the topic, chain from
    the run's first event to the head the write side held for it when bodies got
    tenants; the owner keeps its copy. Run it again once the topic and the views have
    caught up.
    """
    wiring = wired()
    console = safe_console(stderr=True)
    done = _Attributed()

    def both() -> None:
        migrate_write_side(wiring.settings.database_url)
        migrate_views(wiring.settings.database_url)
        _attribute(wiring, done)

    guarded(both, console)
    console.print("[green]migrated[/] the write side (blackbox) and the views (blackbox_views)")
    if done.unread:
        console.print(
            f"[yellow]warning:[/] {len(done.unread):,} runs that may name bodies stored "
            "before they had a tenant could not be read from the topic or proven by it "
            f"(first: {safe_text(done.unread[0])}); run `blackbox migrate` again once Kafka "
            "is reachable, or look at the run with `blackbox verify`"
        )
    if done.copies or done.unclaimed:
        console.print(
            f"bodies stored out of line before they had a tenant: {done.copies:,} "
            f"{'copy' if done.copies == 1 else 'copies'} given to the tenants of the runs "
            "that name them"
            + (
                f"; {done.unclaimed:,} no tenant has yet stay readable by the owner only (no "
                "run's events, read from the topic, chain to the head the run had at the "
                "upgrade and name it: `blackbox verify` shows why; run `blackbox migrate` "
                "again once the topic and the views have caught up)"
                if done.unclaimed
                else ""
            )
        )


def _attribute(wiring: Wiring, done: _Attributed) -> None:
    """Give the tenants of runs whose chained events name a body their copies of it."""
    with wiring.connection() as conn:
        unattributed = unattributed_blobs_txn(conn)
        if not unattributed:
            return
        named = runs_naming_bodies_txn(conn, unattributed)
        # And runs a conflicting copy was indexed of: a forged copy indexed first may
        # hide that the real event names one of the bodies.
        candidates = {run for run, _, _ in named} | set(runs_in_conflict_txn(conn))
        heads = tenancy_heads_txn(conn, sorted(candidates))
    wanted = set(unattributed)
    proven: list[tuple[str, int, str]] = []
    engine = wiring.engine()
    try:
        index = wiring.read_side.run_index(engine)
        for run_id, (last_sequence, chain_head) in heads.items():
            try:
                copies = KafkaRunSource(wiring.settings, index, run_id).every_copy()
                refs = chained_references(copies, last_sequence, chain_head)
            except BlackboxError as exc:
                done.unread.append(f"{run_id}: {exc}")
                continue
            proven += [(run_id, seq, ref) for seq, ref in refs or () if ref in wanted]
    finally:
        engine.dispose()
    with wiring.connection(begin=True) as conn:
        done.copies = attribute_blobs_txn(conn, proven)
        done.unclaimed = unclaimed_blobs_txn(conn)
