"""``blackbox timeline``: one run, event by event, safe to print whatever it holds."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from agent_blackbox.cli._purpose import purpose_option
from agent_blackbox.cli._wiring import wired
from agent_blackbox.outbox.storage import PostgresBlobs
from agent_blackbox.replayer import KafkaRunSource, read_archive
from agent_blackbox.replayer._access import opening
from agent_blackbox.replayer._timeline import timeline_table
from agent_blackbox.schemas import BlackboxError, permission_refused, safe_console, safe_text


@click.command("timeline")
@click.argument("run_id")
@click.option("--bodies", is_flag=True, help="Show each event's body (needs --purpose).")
@purpose_option(required=False)
@click.option("--archive", type=click.Path(exists=True, path_type=Path), default=None)
@click.option(
    "--include-unverified",
    is_flag=True,
    help="Show the events the write side does not vouch for too, marked (produced to the "
    "topic by someone other than the relay). Left out by default, counted on stderr.",
)
def timeline_command(
    run_id: str, bodies: bool, purpose: str | None, archive: Path | None, include_unverified: bool
) -> None:
    """Show RUN_ID event by event (metadata only, unless --bodies)."""
    console = safe_console(stderr=True)
    if bodies and not purpose:
        raise click.UsageError(
            "--bodies reads recorded content: give --purpose (or set BLACKBOX_PURPOSE)"
        )
    wiring = wired()
    engine = wiring.engine()
    try:
        marked: frozenset[int] = frozenset()
        if archive is not None:
            events = list(read_archive(archive, run_id=run_id))
        else:
            source = KafkaRunSource(wiring.settings, wiring.read_side.run_index(engine), run_id)
            marked = source.unverified
            events = list(source if include_unverified else source.vouched())
        if marked and not include_unverified:
            console.print(
                f"[yellow]warning:[/] left out {len(marked)} event(s) the write side does not "
                "vouch for (--include-unverified shows them, marked)"
            )
        pipeline = opening(lambda: engine, purpose=purpose).pipeline if bodies and purpose else None
        # From the database, bodies stored out of line are read too (an archive has none).
        blobs = PostgresBlobs(engine) if archive is None else None
        table = timeline_table(run_id, events, pipeline=pipeline, unverified=marked, blobs=blobs)
        safe_console().print(table)
    except BlackboxError as exc:
        if permission_refused(exc) is not None:
            raise  # the top-level command names the role to run as
        console.print(f"[red]error:[/] {safe_text(exc)}")
        sys.exit(2)
    finally:
        engine.dispose()
