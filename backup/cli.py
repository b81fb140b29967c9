"""``blackbox backup``: run the continuous backup, and check a backup in its store."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import click
from prometheus_client import start_http_server
from rich.console import Console
from rich.table import Table

from agent_blackbox.backup._drill import DrillOptions, DrillReport, run_drill
from agent_blackbox.backup._errors import BackupCorrupt, BackupError
from agent_blackbox.backup._manifest import Manifest
from agent_blackbox.backup._open import open_store
from agent_blackbox.backup._partial import RestoreRequest, named_target, restore_runs
from agent_blackbox.backup._prune import horizon_note, plan_prune, prune
from agent_blackbox.backup._store import BACKUP_URL_ENV
from agent_blackbox.backup._target import Target, drop_target
from agent_blackbox.backup._verify import StoreCheck, check_store
from agent_blackbox.backup._writer import BackupPolicy, BackupWriter
from agent_blackbox.broker import settle_heap
from agent_blackbox.consumers import RetentionPolicy
from agent_blackbox.consumers.cli import could_not_run, stop_on_signals
from agent_blackbox.schemas import (
    PUBLIC_KEYS_ENV,
    SIGNING_KEY_FILE_ENV,
    BlackboxError,
    CheckpointSigner,
    CheckpointVerifier,
    Settings,
    permission_refused,
    safe_console,
    safe_text,
    write_owner_only,
)

_STORE_HELP = f"The backup store's URL (default: {BACKUP_URL_ENV})."


def _quiet_views() -> None:
    # A restore rebuilds the copy's views with the views consumer, whose partition
    # assignments are news for a long-running consumer, not for a restore.
    logging.getLogger("agent_blackbox.consumers").setLevel(logging.WARNING)


_PROGRESS_EVERY_S = 2.0
_AT = click.DateTime(formats=["%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d"])


@click.group("backup")
def backup_group() -> None:
    """Back up the event log to object storage, and check a backup."""


@backup_group.command("run")
@click.option("--store", "url", default=None, help=_STORE_HELP)
@click.option("--once", is_flag=True, help="Back up what the topic holds now, write a cut, exit.")
@click.option(
    "--roll-seconds",
    default=60.0,
    show_default=True,
    help="Write a cut once the oldest buffered event waited this long.",
)
@click.option(
    "--roll-mb", default=64, show_default=True, help="Write a cut once this many MB are buffered."
)
@click.option("--metrics-port", default=None, type=int, help="Serve Prometheus metrics here.")
def backup_run(
    url: str | None, once: bool, roll_seconds: float, roll_mb: int, metrics_port: int | None
) -> None:
    """Back up the events topic with the write side's keys, ledger, checkpoints and
    blobs, until SIGTERM or Ctrl-C (or, with --once, up to the topic's end).

    Manifests are signed with the checkpoint signer's key (BLACKBOX_SIGNING_KEY_FILE).
    """
    console = safe_console(stderr=True, log_path=False)
    settings = Settings.from_env()
    try:
        policy = BackupPolicy(roll_bytes=roll_mb * 1024 * 1024, roll_seconds=roll_seconds)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    started = time.monotonic()
    try:
        store = open_store(url)
        signer = CheckpointSigner.from_env()
        with BackupWriter(settings, store, signer=signer, policy=policy) as writer:
            if metrics_port is not None:
                start_http_server(metrics_port, addr="127.0.0.1", registry=writer.metrics.registry)
            console.log(f"backing up [bold]{settings.topic}[/] to {safe_text(store.describe())}")
            settle_heap()
            if once:
                manifest = writer.catch_up(progress=_Progress(console, "read", "messages"))
                _say_cut(console, manifest)
            else:
                stop = threading.Event()
                with stop_on_signals(stop):
                    writer.run(stop, on_cut=lambda m: _say_cut(console, m))
    except BlackboxError as exc:
        if permission_refused(exc) is not None:
            raise
        could_not_run(console, exc)
    click.echo(f"{writer.written:,} events backed up in {time.monotonic() - started:.1f} s")


class _Progress:
    """Says ``<verb> done of total <things>`` at most every couple of seconds."""

    def __init__(self, console: Console, verb: str, things: str) -> None:
        self._console, self._verb, self._things = console, verb, things
        self._last = 0.0

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self._last >= _PROGRESS_EVERY_S or done == total:
            self._console.log(f"{self._verb} {done:,} of {total:,} {self._things}")
            self._last = now


def _say_cut(console: Console, manifest: Manifest) -> None:
    count = sum(s.count for s in manifest.segments)
    console.log(
        f"cut {manifest.number}: {count:,} events in {len(manifest.segments)} segments, "
        f"snapshot of {manifest.snapshot.tables['data_keys'].rows:,} data keys and "
        f"{manifest.snapshot.blobs:,} blobs"
    )
    for lost in manifest.lost:
        console.print(
            f"[red]lost:[/] partition {lost.partition} offsets {lost.first_offset}.."
            f"{lost.end_offset - 1} were removed by the topic's retention before the backup "
            "read them"
        )


@backup_group.command("verify")
@click.option("--store", "url", default=None, help=_STORE_HELP)
@click.option(
    "--at",
    type=_AT,
    default=None,
    help="Check the chain up to the last cut at or before this time (default: the newest).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report on stdout.")
def backup_verify(url: str | None, at: datetime | None, as_json: bool) -> None:
    """Check a backup where it is: the manifest chain and signatures, and every object's
    SHA-256 and contents. Exit 0 when all is well, 1 when something is wrong.

    Public keys: BLACKBOX_SIGNING_PUBLIC_KEYS, else the key of BLACKBOX_SIGNING_KEY_FILE.
    """
    console = safe_console(stderr=True, log_path=False)
    try:
        store = open_store(url)
        verifier = CheckpointVerifier.from_env()
        if verifier is None:
            raise BackupError(
                f"checking a backup needs the signers' public keys: set {PUBLIC_KEYS_ENV} "
                f"(or {SIGNING_KEY_FILE_ENV})"
            )
        check = check_store(
            store, verifier, at=_aware(at), progress=_Progress(console, "checked", "segments")
        )
    except BlackboxError as exc:
        could_not_run(console, exc)
    if as_json:
        click.echo(json.dumps(_check_doc(check), indent=2))
    else:
        _print_check(safe_console(), check)
    sys.exit(0 if check.passed else 1)


def _aware(at: datetime | None) -> datetime | None:
    if at is None or at.tzinfo is not None:
        return at
    return at.astimezone()


def _check_doc(check: StoreCheck) -> dict[str, object]:
    cut = check.cut
    return {
        "passed": check.passed,
        "cut": None if cut is None else {"manifest": cut.key, "created_at": cut.created_at},
        "manifests": len(check.chain.manifests),
        "segments": check.segments,
        "messages": check.messages,
        "bytes": check.bytes,
        "blobs": check.blobs,
        "problems": [{"where": p.where, "problem": p.problem} for p in check.problems],
    }


def _print_check(console: Console, check: StoreCheck) -> None:
    cut = check.cut
    where = "no cut" if cut is None else f"cut {cut.key} of {cut.created_at}"
    console.print(
        f"{len(check.chain.manifests)} manifests up to {where}: {check.segments:,} segments, "
        f"{check.messages:,} events, {check.bytes:,} bytes, {check.blobs:,} blobs"
    )
    if not check.problems:
        console.print("[green]PASS[/]: every object is the one the signed manifests name")
        return
    table = Table(title="problems")
    table.add_column("object")
    table.add_column("problem")
    for problem in check.problems:
        table.add_row(safe_text(problem.where), safe_text(problem.problem))
    console.print(table)
    console.print(f"[red]FAIL[/]: {len(check.problems)} problems")


@click.command("drill")
@click.option("--store", "url", default=None, help=_STORE_HELP)
@click.option(
    "--at",
    type=_AT,
    default=None,
    help="The disaster point: restore the last cut at or before it (default: now, newest).",
)
@click.option(
    "--sample",
    default=20,
    show_default=True,
    type=click.IntRange(min=0),
    help="Runs to replay on the restored copy (entry points from BLACKBOX_AGENTS).",
)
@click.option("--keep", is_flag=True, help="Leave the restored copy in place afterwards.")
@click.option(
    "--purpose",
    default="restore drill",
    show_default=True,
    help="Why the sample's bodies are read (audited in the restored copy).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report on stdout.")
def drill_command(
    url: str | None,
    at: datetime | None,
    sample: int,
    keep: bool,
    purpose: str,
    as_json: bool,
) -> None:
    """Rehearse a disaster recovery: check the backup, restore it into an isolated
    database and topic of its own, rebuild the views, verify everything, report RPO and
    RTO, and drop the copy (unless --keep). Production is only read.

    Exit status: 0 every check passed, 1 a check failed, 2 the drill could not run.
    """
    console = safe_console(stderr=True, log_path=False)
    _quiet_views()
    settings = Settings.from_env()
    options = DrillOptions(at=_aware(at), sample=sample, keep=keep, purpose=purpose)
    try:
        store = open_store(url)
        verifier = _required_verifier()
        report = run_drill(
            settings, store, verifier=verifier, options=options, say=lambda s: console.log(s)
        )
    except BlackboxError as exc:
        could_not_run(console, exc)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        print_drill(safe_console(), report)
    sys.exit(0 if report.passed else 1)


def _required_verifier() -> CheckpointVerifier:
    verifier = CheckpointVerifier.from_env()
    if verifier is None:
        raise BackupError(
            f"checking a backup needs the signers' public keys: set {PUBLIC_KEYS_ENV} "
            f"(or {SIGNING_KEY_FILE_ENV})"
        )
    return verifier


def print_drill(console: Console, report: DrillReport) -> None:
    """The drill's report as tables: stages, checks, RPO and RTO."""
    console.print(
        f"cut {report.cut} of {report.cut_created_at}: {report.events:,} events of "
        f"{report.runs:,} runs; target {safe_text(report.target or '-')}"
        + (" (kept)" if report.kept else "")
    )
    stages = Table(title="stages")
    stages.add_column("stage")
    stages.add_column("seconds", justify="right")
    for name, seconds in report.stages.items():
        stages.add_row(name, f"{seconds:.1f}")
    console.print(stages)
    checks = Table(title="checks")
    for column in ("check", "result", "detail"):
        checks.add_column(column)
    marks = {True: "[green]PASS[/]", False: "[red]FAIL[/]", None: "[yellow]n/a[/]"}
    for check in report.checks:
        detail = "\n".join([safe_text(check.detail), *(safe_text(w) for w in check.where)])
        checks.add_row(check.name, marks[check.passed], detail)
    console.print(checks)
    rpo = "-" if report.rpo_s is None else f"{report.rpo_s:.1f} s"
    rto = "-" if report.rto_s is None else f"{report.rto_s:.1f} s"
    console.print(f"RPO {rpo} (disaster point minus the cut's newest event), RTO {rto}")
    for left in report.left_behind:
        console.print(f"[yellow]left behind:[/] {safe_text(left)}")
    verdict = "[green]PASS[/]: the backup restores" if report.passed else "[red]FAIL[/]"
    console.print(verdict)


@click.command("restore")
@click.option("--store", "url", default=None, help=_STORE_HELP)
@click.option(
    "--into",
    required=True,
    help="Name of the restored copy (lower-case letters, digits, _): its database, role "
    "and topic prefix are blackbox_restore_<NAME>.",
)
@click.option("--runs", "run_ids", multiple=True, help="Run ids (repeatable, or comma-separated).")
@click.option("--subject", default=None, help="The runs of this data subject.")
@click.option("--since", type=_AT, default=None, help="The runs started at or after this time.")
@click.option("--at", type=_AT, default=None, help="Restore from the last cut at or before this.")
@click.option("--purpose", default=None, help="Why (one line; written to the access audit).")
@click.option(
    "--env-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Where to write the copy's credentials (default: ./<NAME>.env, owner-only).",
)
@click.option("--drop", is_flag=True, help="Drop the restored copy NAME instead.")
def restore_command(
    url: str | None,
    into: str,
    run_ids: tuple[str, ...],
    subject: str | None,
    since: datetime | None,
    at: datetime | None,
    purpose: str | None,
    env_file: Path | None,
    drop: bool,
) -> None:
    """Bring back a selection of runs from the backup into a copy of their own, for an
    investigation: --runs, --subject and/or --since (all given must hold), from the
    newest cut or the last at or before --at. Deletions are applied first, as in a
    drill; who restored what and why is written to the access audit.

    Exit status: 0 restored (or dropped), 1 the backup failed its check, 2 could not run.
    """
    console = safe_console(stderr=True, log_path=False)
    _quiet_views()
    settings = Settings.from_env()
    env_path = env_file or Path(f"{into}.env")
    if drop:
        left = drop_target(settings, named_target(settings, into))
        for line in left:
            console.print(f"[yellow]left behind:[/] {safe_text(line)}")
        env_path.unlink(missing_ok=True)
        sys.exit(2 if left else 0)
    request = RestoreRequest(
        into=into,
        purpose=purpose or "",
        run_ids=frozenset(r.strip() for given in run_ids for r in given.split(",") if r.strip()),
        subject=subject,
        since=_aware(since),
        at=_aware(at),
    )
    if (problem := request.problem()) is not None:
        raise click.UsageError(problem)
    try:
        store = open_store(url)
        result = restore_runs(
            settings, store, request, verifier=_required_verifier(), say=console.log
        )
    except BackupCorrupt as exc:
        console.print(f"[red]error:[/] {safe_text(str(exc))}", soft_wrap=True)
        sys.exit(1)
    except BlackboxError as exc:
        could_not_run(console, exc)
    _write_env(env_path, result.target)
    out = safe_console()
    out.print(
        f"restored {len(result.runs)} runs ({result.copy.events:,} events, "
        f"{result.copy.blobs} blobs) from {result.cut} into {safe_text(result.target.describe())}"
    )
    out.print(f"credentials in {env_path} (owner-only); look at it with e.g.")
    source = env_path if env_path.is_absolute() or env_path.parent != Path() else f"./{env_path}"
    out.print(f"  . {source} && blackbox timeline {result.runs[0]}")
    out.print(f"drop it with: blackbox restore --into {into} --drop")


def _write_env(path: Path, target: Target) -> None:
    settings = target.settings
    lines = [
        f"# The restored copy {target.name}: `. {path}` points the blackbox commands at it.",
        f"export BLACKBOX_DATABASE_URL='{settings.database_url}'",
        f"export BLACKBOX_TOPIC='{settings.topic}'",
        f"export BLACKBOX_PARTITIONS={settings.partitions}",
        f"export BLACKBOX_CONSUMER_GROUP='{settings.consumer_group}'",
    ]
    write_owner_only(path, ("\n".join(lines) + "\n").encode())


@backup_group.command("prune")
@click.option("--store", "url", default=None, help=_STORE_HELP)
@click.option("--dry-run", is_flag=True, help="Say what would be removed, remove nothing.")
def backup_prune(url: str | None, dry_run: bool) -> None:
    """Remove backup objects whose runs expired under their retention classes
    (BLACKBOX_RETENTION_FILE, as `blackbox retention run` reads it): segments whose
    runs production deleted, cuts older than the longest metadata period (the newest is
    kept), and the snapshots and blobs no remaining cut names. What is removed is first
    recorded, signed with BLACKBOX_SIGNING_KEY_FILE's key.
    """
    console = safe_console(stderr=True, log_path=False)
    try:
        store = open_store(url)
        policy = RetentionPolicy.from_env()
        signer = CheckpointSigner.from_env()
        verifier = CheckpointVerifier({signer.key_id: signer.public_key})
        if extra := CheckpointVerifier.from_env():
            verifier = extra
        plan = plan_prune(store, verifier, policy)
        console.log(f"keeping {horizon_note(policy)}")
        summary = (
            f"{len(plan.segments)} segments, {len(plan.cuts)} cuts, "
            f"{len(plan.objects)} objects in all"
        )
        if dry_run:
            click.echo(f"would remove {summary}")
            return
        record = prune(store, signer, plan)
    except BlackboxError as exc:
        could_not_run(console, exc)
    click.echo("nothing expired" if record is None else f"removed {summary} ({record.key})")
