"""``blackbox verify``: tamper evidence for one run or a whole history, without keys."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import partial
from itertools import groupby
from pathlib import Path

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    track,
)
from rich.table import Table
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from agent_blackbox.cli._wiring import wired
from agent_blackbox.outbox.storage import PostgresBlobs, pending_events_txn, run_heads_txn
from agent_blackbox.replayer import (
    AssembledRun,
    DatabaseCheck,
    HistoryScan,
    KafkaRunSource,
    Problem,
    ReadSide,
    RecordedHead,
    RunHandler,
    RunIndex,
    SkippedMessage,
    VerifyReport,
    read_archive,
    verify_run,
)
from agent_blackbox.schemas import (
    PUBLIC_KEYS_ENV,
    BlackboxError,
    CheckpointVerifier,
    Envelope,
    Settings,
    driver_cause,
    permission_refused,
    safe_console,
    safe_text,
)
from agent_blackbox.wiring import COMMAND_POOL


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
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    help="With --all from the topic: processes verifying partitions in parallel, this one "
    "included [default: one per core, fewer for a short history].",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output on stdout.")
def verify_command(
    run_id: str | None,
    every: bool,
    archive: Path | None,
    require_checkpoint: bool,
    strict: bool,
    workers: int | None,
    as_json: bool,
) -> None:
    """Check contiguous sequences, chain hashes, out-of-line bodies and the signed
    checkpoint of RUN_ID (or --all) against blackbox.runs and the events index; name the
    first bad event. Needs no data key.

    A run is ok when it is sound and a checkpoint covers its last event; unverified
    when it is sound but none does (no checkpoint yet, or a mid-run one); otherwise the
    problem found, e.g. truncated when the database or the index knows more events.

    With --all, the runs the events index lists are read from the topic in one pass,
    partition by partition, by --workers processes; a run that cannot be read is
    reported as unreadable, with the reason, and the others are still verified. A
    message of the topic that is not an event (undecodable, or an envelope under
    another run's key) is skipped and listed: a finding.

    Exit status: 0 when no run has a problem and no message was skipped (unverified
    runs are reported; with --strict they fail), 1 when one does or one was, 2 when it
    cannot run.
    """
    console = safe_console(stderr=True)
    if every == (run_id is not None):
        raise click.UsageError("give either a RUN_ID or --all (exactly one of them)")
    if workers is not None and not every:
        raise click.UsageError("--workers needs --all")
    try:
        verifier = CheckpointVerifier.from_env()
        if require_checkpoint and verifier is None:
            raise BlackboxError(
                f"--require-checkpoint needs the signers' public keys: set {PUBLIC_KEYS_ENV}"
            )
        wiring = wired()
        settings, side = wiring.settings, wiring.read_side
        engine = wiring.engine()
        try:
            index = side.run_index(engine)
            check = _Check(engine, index, verifier, require_checkpoint, archive is None)
            if every and archive is None:
                work = VerifyWork(side, require_checkpoint, settings)
                reports = _scanned(settings, index, work, workers, console)
            elif every:
                assert archive is not None
                runs = _runs(archive, run_id)
                reports = [
                    check.each(rid, opened)
                    for rid, opened in track(runs, "verifying", console=console)
                ]
            elif archive is None:
                assert run_id is not None
                reports = [check.single(run_id, settings)]
            else:
                reports = [check.run(rid, opened()) for rid, opened in _runs(archive, run_id)]
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
        _print_skipped([m for r in reports for m in r.skipped_messages], safe_console())
    failed = any(
        r.problem is not None or r.skipped_messages or (strict and not r.ok) for r in reports
    )
    sys.exit(1 if failed else 0)


def _scanned(
    settings: Settings,
    index: RunIndex,
    work: VerifyWork,
    workers: int | None,
    console: Console,
) -> list[VerifyReport]:
    """Every indexed run verified in one pass over the topic, in the index's order.

    A message passed over is listed in the report of the run whose key it carries; one
    under no verified run's key makes a row of its own (``unreadable``, by key).

    Raises:
        BlackboxError: the index or the topic's partitions cannot be read.
    """
    ids = index.runs(finished_only=False)
    if not ids:
        return []
    scan = HistoryScan(settings, work, wanted=frozenset(ids), workers=workers)
    found: dict[str, VerifyReport] = {}
    skipped: dict[str, list[SkippedMessage]] = {}
    columns = (TextColumn("verifying"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("verify", total=None)
        scan.on_progress = lambda n: progress.update(task, total=scan.total or None, completed=n)
        for item in scan:
            if isinstance(item, SkippedMessage):
                skipped.setdefault(item.key or "", []).append(item)
            else:
                found[item.run_id] = item.result  # a late re-read replaces the first
    for failed in scan.failed:
        console.print(
            f"[red]error:[/] partition {failed.partition} was not read to its end: "
            f"{safe_text(failed.reason)}"
        )
    if scan.dropped:
        console.print(f"{scan.dropped} stale copies (a relay past its lease) were dropped")
    reports = [found[rid] for rid in ids]
    for i, report in enumerate(reports):
        if passed_over := skipped.pop(report.run_id, None):
            reports[i] = replace(report, skipped_messages=tuple(passed_over))
    for key, messages in skipped.items():
        reports.append(
            VerifyReport(
                key,
                0,
                problem=Problem.UNREADABLE,
                detail=f"{len(messages)} messages under this key are not events of any run",
                skipped_messages=tuple(messages),
            )
        )
    return reports


@dataclass(frozen=True, slots=True)
class VerifyWork:
    """What a worker of ``verify --all`` needs (picklable: each worker process makes
    its own connection, run index and checkpoint verifier from it, with the settings of
    the command that started it)."""

    side: ReadSide
    require_checkpoint: bool
    settings: Settings

    def start(self) -> RunHandler[VerifyReport]:
        settings = self.settings
        # A command's pool: every run is checked against blackbox.runs and the index.
        engine = COMMAND_POOL.engine(settings.database_url)
        index = self.side.run_index(engine)
        check = _Check(engine, index, CheckpointVerifier.from_env(), self.require_checkpoint, True)
        return _VerifyHandler(check, settings, index, engine)


@dataclass(frozen=True, slots=True)
class _VerifyHandler:
    check: _Check
    settings: Settings
    index: RunIndex
    engine: Engine

    def close(self) -> None:
        self.engine.dispose()

    def handle(self, run: AssembledRun) -> VerifyReport:
        return self.check.each(run.run_id, partial(iter, run.events))

    def missing(self, run_id: str, why: str, *, unread: bool) -> VerifyReport:
        if unread:  # the run may well be in the part that could not be read
            detail = f"cannot read the run: {safe_text(why, limit=300)}"
            return VerifyReport(run_id, 0, problem=Problem.UNREADABLE, detail=detail)
        # Not in the topic where the scan looked: judged as a single verify judges it
        # (not indexed: unreadable; indexed, but its events are gone: truncated).
        return self.check.each(run_id, partial(_topic_log, self.settings, self.index, run_id))

    def late(self, run_id: str) -> VerifyReport:
        # Rare (retention appended run.redacted after run.finished): read the run whole
        # through the index, as a single verify does.
        return self.check.each(run_id, partial(_topic_log, self.settings, self.index, run_id))


Opener = Callable[[], Iterator[Envelope]]
"""Opens one run's log (the index is asked where it is only then)."""


def _runs(archive: Path, run_id: str | None) -> Iterator[tuple[str, Opener]]:
    for rid, events in groupby(read_archive(archive, run_id=run_id), key=lambda e: e.run_id):
        yield rid, partial(iter, list(events))


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

    def single(self, run_id: str, settings: Settings) -> VerifyReport:
        """:meth:`run` on the run's stretch of the topic, found through the index; the
        messages under its key that are not its events are listed in the report.

        Raises:
            BlackboxError: the index does not know the run, or its log cannot be read.
        """
        source = KafkaRunSource(settings, self._index, run_id)
        report = self.run(run_id, iter(source))
        return replace(report, skipped_messages=tuple(source.skipped))

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
            cause = driver_cause(exc)
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


def _print_skipped(skipped: list[SkippedMessage], console: Console) -> None:
    if not skipped:
        return
    table = Table(title="Messages skipped: not events (a finding)")
    for column in ("partition", "offset", "key", "reason"):
        table.add_column(column, overflow="fold")
    for m in skipped:
        table.add_row(str(m.partition), str(m.offset), safe_text(m.key or ""), safe_text(m.reason))
    console.print(table)


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
    if unchecked := sum(r.unchecked_blobs for r in reports):
        console.print(
            f"{unchecked} {'body' if unchecked == 1 else 'bodies'} stored out of line "
            f"{'was' if unchecked == 1 else 'were'} not checked (an archive holds "
            "none, or this login may not read them: a blackbox_replayer login granted "
            "their tenants checks them)"
        )
