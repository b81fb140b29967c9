"""``blackbox retention``, ``forget`` and ``ledger``: the read side's deletion jobs."""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import click
from rich.console import Console
from rich.table import Table

from agent_blackbox.cli._wiring import wired
from agent_blackbox.cli._workers import (
    DATABASE_DOWN,
    could_not_run,
    database_unreachable,
    metrics_port_option,
    serve_metrics,
    stop_on_signals,
)
from agent_blackbox.consumers import (
    LedgerReport,
    RetentionGauges,
    RetentionJob,
    RetentionPolicy,
    RetentionReport,
    ledger_entries,
    reapply_ledger,
)
from agent_blackbox.schemas import (
    SIGNING_KEY_FILE_ENV,
    BlackboxError,
    CheckpointSigner,
    CheckpointVerifier,
    Settings,
    permission_refused,
    safe_console,
    safe_text,
)
from agent_blackbox.wiring import COMMAND_POOL, SERVICE_POOL, Pool


def _retention_job(settings: Settings, pool: Pool) -> RetentionJob:
    """The job, signing its run.redacted notes when the signer's key is configured."""
    signer = CheckpointSigner.from_env() if os.environ.get(SIGNING_KEY_FILE_ENV) else None
    return RetentionJob(
        pool.engine(settings.database_url),
        policy=RetentionPolicy.from_env(),
        settings=settings,
        signer=signer,
    )


def _print_redactions(report: RetentionReport, console: Console, *, title: str) -> None:
    table = Table(title=title)
    for name in ("run", "reason", "keys destroyed", "note"):
        table.add_column(name)
    for item in report.redacted:
        note = "" if item.encrypted else "not encrypted: bodies stay until the topic expires them"
        table.add_row(safe_text(item.run_id), safe_text(item.reason), str(len(item.key_ids)), note)
    console.print(table)


@click.group("retention")
def retention_group() -> None:
    """Apply the retention classes (BLACKBOX_RETENTION_FILE) to recorded runs."""


@retention_group.command("run")
@click.option(
    "--every",
    type=click.FloatRange(min=1),
    default=None,
    metavar="SECONDS",
    help="Keep running, one pass every SECONDS, until SIGTERM/SIGINT (default: one pass).",
)
@metrics_port_option
def retention_run(every: float | None, metrics_port: int | None) -> None:
    """Crypto-shred runs whose bodies expired; delete metadata that expired."""
    console = safe_console(stderr=True, log_path=False)
    settings = wired().settings
    stop = threading.Event()
    gauges = RetentionGauges() if metrics_port is not None else None
    try:
        job = _retention_job(settings, COMMAND_POOL if every is None else SERVICE_POOL)
        serve_metrics(metrics_port)
        with stop_on_signals(stop):
            while True:
                started = time.monotonic()
                try:
                    report = job.run_once()
                except DATABASE_DOWN as exc:
                    if every is None:
                        raise
                    # A job that runs for good outlives an outage: the next round retries.
                    console.log(f"retention: {database_unreachable(exc)} Retrying in {every:g}s.")
                    if stop.wait(every):
                        return
                    continue
                if gauges is not None:
                    gauges.show(report, seconds=time.monotonic() - started)
                console.log(
                    f"retention: {len(report.abandoned)} runs marked abandoned, "
                    f"{len(report.redacted)} runs shredded, "
                    f"{len(report.metadata_deleted)} runs' metadata deleted"
                    + (
                        "; runs of classes the policy does not define were held to the "
                        f"standard class's periods: {safe_text(', '.join(report.unknown_classes))}"
                        if report.unknown_classes
                        else ""
                    )
                )
                if report.redacted:
                    _print_redactions(report, safe_console(), title="Runs shredded by retention")
                if every is None or stop.wait(every):
                    return
    except DATABASE_DOWN as exc:
        could_not_run(console, database_unreachable(exc))
    except BlackboxError as exc:
        if permission_refused(exc) is not None:
            raise  # the top-level command names the role to run as
        could_not_run(console, exc)


@click.command("forget")
@click.option("--subject", "subject_id", required=True, help="The data subject's id.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report on stdout.")
def forget_command(subject_id: str, as_json: bool) -> None:
    """Destroy the bodies of every run linked to a data subject, everywhere, for good.

    \b
    Exit status:
      0  every run of the subject was shredded (or had nothing left)
      1  some runs are still recording: shredded all the others; run forget again later
      2  could not run
    """
    if not subject_id.strip():
        raise click.BadParameter("is empty: give the data subject's id", param_hint="--subject")
    settings = wired().settings
    try:
        report = _retention_job(settings, COMMAND_POOL).forget(subject_id)
    except DATABASE_DOWN as exc:
        could_not_run(safe_console(stderr=True), database_unreachable(exc))
    except BlackboxError as exc:
        if permission_refused(exc) is not None:
            raise  # the top-level command names the role to run as
        could_not_run(safe_console(stderr=True), exc)
    if as_json:
        rows = [
            {"run_id": r.run_id, "key_ids": list(r.key_ids), "encrypted": r.encrypted}
            for r in report.redacted
        ]
        still = list(report.still_running)
        payload = {"subject_id": subject_id, "runs": rows, "still_running": still}
        click.echo(json.dumps(payload, indent=2))
        sys.exit(1 if still else 0)
    console = safe_console()
    if not report.linked:
        console.print(
            f"no run is linked to subject {safe_text(subject_id)}, so nothing was destroyed: "
            "check the id (a subject forgotten before has no run linked either)"
        )
    elif not report.redacted:
        console.print(f"no run of subject {safe_text(subject_id)} had bodies left to destroy")
    else:
        _print_redactions(report, console, title=f"Runs of subject {safe_text(subject_id)}")
        sealed = sum(1 for r in report.redacted if r.encrypted)
        console.print(
            f"{_runs(len(report.redacted))} redacted, each written to the deletion ledger; "
            + (
                "each announced by a run.redacted event"
                if sealed == len(report.redacted)
                else f"{sealed} announced by a run.redacted event (the runs recorded "
                "unencrypted had no data key to destroy: their labels were scrubbed)"
            )
        )
    if report.still_running:
        safe_console(stderr=True).print(
            f"{len(report.still_running)} runs of the subject are still recording and keep "
            f"their keys for now: {', '.join(safe_text(r) for r in report.still_running)}; "
            "run forget again once they end (retention marks a run abandoned after "
            "BLACKBOX_ABANDON_AFTER_HOURS without an event)"
        )
        sys.exit(1)


@click.group("ledger")
def ledger_group() -> None:
    """The deletion ledger."""


@ledger_group.command("reapply")
def ledger_reapply() -> None:
    """After restoring a database backup: destroy again every key the run.redacted notes
    in the topic say was destroyed, when the note is authentic.

    A note is applied only when the database's deletion ledger records it or it carries
    the retention job's signature (public keys: BLACKBOX_SIGNING_PUBLIC_KEYS, else the
    key of BLACKBOX_SIGNING_KEY_FILE), its run's hash chain reaches it, and every key it
    names belongs to its run. Any other note is listed with the reason and ignored.

    \b
    Exit status:
      0  every note was applied
      1  some notes were ignored (listed on stderr); the others were applied
      2  could not run
    """
    console = safe_console(stderr=True, log_path=False)
    wiring = wired()
    settings = wiring.settings
    try:
        verifier = CheckpointVerifier.from_env()
        engine = wiring.engine(COMMAND_POOL)
        with console.status(f"reading run.redacted events from {settings.topic}"):
            entries = list(ledger_entries(settings, engine=engine))
        with console.status(f"checking and re-applying {len(entries)} notes"):
            report = reapply_ledger(engine, entries, verifier=verifier)
    except DATABASE_DOWN as exc:
        could_not_run(console, database_unreachable(exc))
    except BlackboxError as exc:
        if permission_refused(exc) is not None:
            raise  # the top-level command names the role to run as
        could_not_run(console, exc)
    _print_ignored(report, console)
    click.echo(
        f"{len(entries)} run.redacted notes in {safe_text(settings.topic)}: {report.applied} "
        f"applied, {len(report.ignored)} ignored; {len(report.destroyed)} data keys a restore "
        "had brought back were destroyed again"
    )
    if report.ignored:
        sys.exit(1)


def _print_ignored(report: LedgerReport, console: Console) -> None:
    if not report.ignored:
        return
    table = Table(title="run.redacted notes ignored (nothing was changed for them)")
    for name in ("run", "sequence", "keys", "why"):
        table.add_column(name)
    for item in report.ignored:
        envelope = item.entry.envelope
        table.add_row(
            safe_text(item.entry.run_id),
            "" if envelope is None else str(envelope.sequence),
            safe_text(", ".join(item.entry.key_ids)),
            safe_text(item.why),
        )
    console.print(table)


def _runs(count: int) -> str:
    return "1 run" if count == 1 else f"{count} runs"
