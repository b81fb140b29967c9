"""``blackbox verify``: tamper evidence for one run or a whole history, without keys."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from itertools import chain, groupby
from pathlib import Path

import click
from rich.console import Console
from rich.progress import track
from rich.table import Table
from sqlalchemy import Engine, create_engine

from agent_blackbox.outbox import PostgresBlobs
from agent_blackbox.replayer._index import RunIndex, read_side
from agent_blackbox.replayer._sources import KafkaRunSource, read_archive
from agent_blackbox.replayer._verify import VerifyReport, verify_run
from agent_blackbox.schemas import (
    BlackboxError,
    Checkpoint,
    CheckpointSigner,
    CheckpointVerifier,
    Envelope,
    Settings,
    safe_console,
    safe_text,
)

PUBLIC_KEYS_ENV = "BLACKBOX_SIGNING_PUBLIC_KEYS"


def checkpoint_verifier() -> CheckpointVerifier | None:
    """The signers' public keys: the PEM files in ``BLACKBOX_SIGNING_PUBLIC_KEYS``
    (comma-separated), else the key of ``BLACKBOX_SIGNING_KEY_FILE``; None if neither."""
    if files := os.environ.get(PUBLIC_KEYS_ENV):
        return CheckpointVerifier.from_pem_files([f.strip() for f in files.split(",") if f])
    if os.environ.get("BLACKBOX_SIGNING_KEY_FILE"):
        signer = CheckpointSigner.from_env()
        return CheckpointVerifier({signer.key_id: signer.public_key})
    return None


@click.command("verify")
@click.argument("run_id", required=False)
@click.option("--all", "every", is_flag=True, help="Verify every run in the views.")
@click.option(
    "--archive",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="Verify runs in an Avro archive instead of the topic.",
)
@click.option("--require-checkpoint", is_flag=True, help="A run without a signed checkpoint fails.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output on stdout.")
def verify_command(
    run_id: str | None, every: bool, archive: Path | None, require_checkpoint: bool, as_json: bool
) -> None:
    """Check contiguous sequences, chain hashes, out-of-line bodies and the signed
    checkpoint of RUN_ID (or --all); name the first bad event. Needs no data key.

    Exit status: 0 when every run verifies, 1 when one does not, 2 when it cannot run.
    """
    console = safe_console(stderr=True)
    if every == (run_id is not None):
        raise click.UsageError("give either a RUN_ID or --all (exactly one of them)")
    try:
        verifier = checkpoint_verifier()
        settings = Settings.from_env()
        engine = create_engine(settings.database_url)
        try:
            index = read_side().run_index(engine)
            runs = _runs(settings, index, archive, run_id)
            reports = [
                _verify(events, engine, index, verifier, require_checkpoint, archive is None)
                for events in (track(runs, "verifying", console=console) if every else runs)
            ]
        finally:
            engine.dispose()
    except BlackboxError as exc:
        console.print(f"[red]error:[/] {safe_text(exc)}")
        sys.exit(2)
    if not reports:
        console.print("[red]error:[/] no run to verify")
        sys.exit(2)
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in reports], indent=2))
    else:
        _print(reports, safe_console())
    sys.exit(0 if all(r.ok for r in reports) else 1)


def _runs(
    settings: Settings, index: RunIndex, archive: Path | None, run_id: str | None
) -> Iterator[Iterator[Envelope]]:
    if archive is not None:
        for _, events in groupby(read_archive(archive, run_id=run_id), key=lambda e: e.run_id):
            yield events
        return
    ids = [run_id] if run_id is not None else index.runs(finished_only=False)
    for rid in ids:
        yield iter(KafkaRunSource(settings, index, rid))


def _verify(
    events: Iterator[Envelope],
    engine: Engine,
    index: RunIndex,
    verifier: CheckpointVerifier | None,
    require_checkpoint: bool,
    with_blobs: bool,
) -> VerifyReport:
    first = next(events, None)
    if first is None:
        return verify_run(iter(()))
    checkpoint: Checkpoint | None = None
    if verifier is not None:
        checkpoint = index.checkpoint(first.run_id)
    elif require_checkpoint:
        raise BlackboxError(
            f"--require-checkpoint needs the signers' public keys: set {PUBLIC_KEYS_ENV}"
        )
    return verify_run(
        chain([first], events),
        run_id=first.run_id,
        blobs=PostgresBlobs(engine) if with_blobs else None,
        checkpoint=checkpoint,
        verifier=verifier if checkpoint is not None else None,
        require_checkpoint=require_checkpoint,
    )


def _print(reports: list[VerifyReport], console: Console) -> None:
    table = Table(title="Tamper evidence")
    for column in ("run", "result", "events", "first bad event", "checkpoint", "detail"):
        table.add_column(column)
    for r in reports:
        result = "[green]OK[/]" if r.ok else f"[red]{r.problem}[/]"
        where = "" if r.sequence is None else str(r.sequence)
        # detail is escaped already (safe_text in verify_run)
        table.add_row(
            safe_text(r.run_id), result, str(r.events), where, str(r.checkpoint), r.detail
        )
    console.print(table)
    bad = sum(not r.ok for r in reports)
    console.print(f"{len(reports) - bad}/{len(reports)} runs verified")
