"""``blackbox verify``: tamper evidence for one run or a whole history, without keys."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from functools import partial
from itertools import groupby
from pathlib import Path

import click
from rich.console import Console
from rich.progress import track
from rich.table import Table
from sqlalchemy import Engine, create_engine
from sqlalchemy.exc import SQLAlchemyError

from agent_blackbox.outbox import PostgresBlobs, pending_events_txn, run_heads_txn
from agent_blackbox.replayer._index import RunIndex, read_side
from agent_blackbox.replayer._sources import KafkaRunSource, read_archive
from agent_blackbox.replayer._verify import (
    DatabaseCheck,
    RecordedHead,
    VerifyReport,
    verify_run,
)
from agent_blackbox.replayer._verify_report import Problem
from agent_blackbox.schemas import (
    BlackboxError,
    CheckpointSigner,
    CheckpointVerifier,
    Envelope,
    Settings,
    permission_refused,
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
@click.option(
    "--strict",
    is_flag=True,
    help="An unverified run (sound, but no checkpoint covers its last event) fails too.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output on stdout.")
def verify_command(
    run_id: str | None,
    every: bool,
    archive: Path | None,
    require_checkpoint: bool,
    strict: bool,
    as_json: bool,
) -> None:
    """Check contiguous sequences, chain hashes, out-of-line bodies and the signed
    checkpoint of RUN_ID (or --all) against blackbox.runs and the events index; name the
    first bad event. Needs no data key.

    A run is ok when it is sound and a checkpoint covers its last event; unverified
    when it is sound but none does (no checkpoint yet, or a mid-run one); otherwise the
    problem found, e.g. truncated when the database or the index knows more events.

    With --all, a run that cannot be read (its index entry or its log) is reported as
    unreadable, with the reason, and the others are still verified.

    Exit status: 0 when no run has a problem (unverified runs are reported; with
    --strict they fail), 1 when one does, 2 when it cannot run.
    """
    console = safe_console(stderr=True)
    if every == (run_id is not None):
        raise click.UsageError("give either a RUN_ID or --all (exactly one of them)")
    try:
        verifier = checkpoint_verifier()
        if require_checkpoint and verifier is None:
            raise BlackboxError(
                f"--require-checkpoint needs the signers' public keys: set {PUBLIC_KEYS_ENV}"
            )
        settings = Settings.from_env()
        engine = create_engine(settings.database_url)
        try:
            index = read_side().run_index(engine)
            check = _Check(engine, index, verifier, require_checkpoint, archive is None)
            runs = _runs(settings, index, archive, run_id)
            if every:
                reports = [
                    check.each(rid, opened)
                    for rid, opened in track(runs, "verifying", console=console)
                ]
            else:
                reports = [check.run(rid, opened()) for rid, opened in runs]
        finally:
            engine.dispose()
    except BlackboxError as exc:
        if permission_refused(exc) is not None:
            raise  # the top-level command names the role to run as
        console.print(f"[red]error:[/] {safe_text(exc)}")
        sys.exit(2)
    if not reports:
        console.print("[red]error:[/] no run to verify")
        sys.exit(2)
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in reports], indent=2))
    else:
        _print(reports, safe_console())
    failed = any(r.problem is not None or (strict and not r.ok) for r in reports)
    sys.exit(1 if failed else 0)


Opener = Callable[[], Iterator[Envelope]]
"""Opens one run's log (the index is asked where it is only then)."""


def _runs(
    settings: Settings, index: RunIndex, archive: Path | None, run_id: str | None
) -> Iterator[tuple[str, Opener]]:
    if archive is not None:
        for rid, events in groupby(read_archive(archive, run_id=run_id), key=lambda e: e.run_id):
            yield rid, partial(iter, list(events))
        return
    ids = [run_id] if run_id is not None else index.runs(finished_only=False)
    for rid in ids:
        yield rid, partial(_topic_log, settings, index, rid)


def _topic_log(settings: Settings, index: RunIndex, run_id: str) -> Iterator[Envelope]:
    return iter(KafkaRunSource(settings, index, run_id))


class _Check:
    """One run's verification with everything the command knows of it."""

    def __init__(
        self,
        engine: Engine,
        index: RunIndex,
        verifier: CheckpointVerifier | None,
        require_checkpoint: bool,
        with_blobs: bool,
    ) -> None:
        self._engine = engine
        self._index = index
        self._verifier = verifier
        self._require_checkpoint = require_checkpoint
        self._blobs = PostgresBlobs(engine) if with_blobs else None

    def run(self, run_id: str, events: Iterator[Envelope]) -> VerifyReport:
        """1. The database's head before the log is read. 2. The index and the
        checkpoint. 3. The walk, with the database's head after it."""
        before = self._head(run_id)
        pending = self._pending(run_id)
        location = self._index.locate(run_id)
        checkpoint = None if self._verifier is None else self._index.checkpoint(run_id)

        def database() -> DatabaseCheck:  # called once the log was read
            return DatabaseCheck(before, self._head(run_id), pending)

        return verify_run(
            events,
            run_id=run_id,
            blobs=self._blobs,
            checkpoint=checkpoint,
            verifier=self._verifier if checkpoint is not None else None,
            require_checkpoint=self._require_checkpoint,
            indexed_events=None if location is None else location.events,
            database=database,
        )

    def each(self, run_id: str, opened: Opener) -> VerifyReport:
        """:meth:`run` as one run among many: a run whose log or index entry cannot be
        read is reported as such, so that the others are still verified."""
        try:
            return self.run(run_id, opened())
        except BlackboxError as exc:
            return VerifyReport(
                run_id,
                0,
                problem=Problem.UNREADABLE,
                detail=f"cannot read the run: {safe_text(exc, limit=300)}",
            )

    def _head(self, run_id: str) -> RecordedHead | None:
        try:
            with self._engine.connect() as conn:
                head = run_heads_txn(conn, [run_id]).get(run_id)
        except SQLAlchemyError as exc:
            cause = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
            raise BlackboxError(
                f"cannot read blackbox.runs to cross-check run {safe_text(run_id)}: {cause}; "
                "connect as a role that may read runs (blackbox_reader, granted the run's "
                "tenant)"
            ) from exc
        if head is None:
            return None
        return RecordedHead(head.last_sequence, head.chain_head, ended=not head.running)

    def _pending(self, run_id: str) -> int | None:
        try:  # the reader may not see the outbox: then it is not known
            with self._engine.connect() as conn:
                return pending_events_txn(conn, [run_id])
        except SQLAlchemyError:
            return None


def _print(reports: list[VerifyReport], console: Console) -> None:
    table = Table(title="Tamper evidence")
    for column in ("run", "result", "events", "first bad event", "checkpoint", "detail"):
        table.add_column(column)
    for r in reports:
        if r.ok:
            result = "[green]OK[/]"
        elif r.problem is None:
            result = "[yellow]unverified[/]"
        else:
            result = f"[red]{r.problem}[/]"
        where = "" if r.sequence is None else str(r.sequence)
        # detail is escaped already (safe_text in verify_run)
        table.add_row(
            safe_text(r.run_id), result, str(r.events), where, str(r.checkpoint), r.detail
        )
    console.print(table)
    bad = sum(r.problem is not None for r in reports)
    unverified = sum(r.problem is None and not r.ok for r in reports)
    console.print(
        f"{len(reports) - bad - unverified}/{len(reports)} runs verified, "
        f"{unverified} unverified, {bad} with a problem"
    )
