"""``blackbox backup``: run the continuous backup, check a backup in its store, prune it
(``blackbox drill`` and ``blackbox restore`` are in :mod:`.recovery`)."""

from __future__ import annotations

import json
import sys
import threading
import time
from datetime import datetime

import click
from rich.console import Console
from rich.table import Table

from agent_blackbox.backup import (
    BackupError,
    BackupPolicy,
    BackupStore,
    BackupWriter,
    Manifest,
    StoreCheck,
    check_backup,
    open_store,
    plan_prune,
    prune,
)
from agent_blackbox.backup._outage import GIVE_UP_ENV, RetryPolicy
from agent_blackbox.backup._prune import horizon_note
from agent_blackbox.broker import settle_heap
from agent_blackbox.cli._wiring import wired
from agent_blackbox.cli._workers import (
    could_not_run,
    metrics_port_option,
    serve_metrics,
    stop_on_signals,
)
from agent_blackbox.cli.commands.recovery import (
    AT,
    STORE_HELP,
    aware,
    cannot_run,
    required_verifier,
)
from agent_blackbox.consumers import RetentionPolicy
from agent_blackbox.schemas import (
    SPAN_SECONDS,
    BlackboxError,
    CheckpointSigner,
    CheckpointVerifier,
    permission_refused,
    safe_console,
    safe_text,
)

_PROGRESS_EVERY_S = 2.0


class _Span(click.ParamType[float]):
    """A length of time: a whole number of seconds, or a number and a unit (s, m, h)."""

    name = "span"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, (int, float)):
            return float(value)
        text = str(value).strip().lower()
        number, unit = (text, 1)
        if text[-1:] in ("s", "m", "h"):
            number, unit = text[:-1], SPAN_SECONDS[text[-1]]
        if not number.isdigit() or int(number) == 0:
            self.fail(f"{value!r}: give a length of time such as 90s, 15m or 2h", param, ctx)
        return float(int(number) * unit)


_SPAN = _Span()


@click.group("backup")
def backup_group() -> None:
    """Back up the event log to object storage, and check a backup."""


@backup_group.command("run")
@click.option("--store", "url", default=None, help=STORE_HELP)
@click.option("--once", is_flag=True, help="Back up what the topic holds now, write a cut, exit.")
@click.option(
    "--roll-seconds",
    default=60.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Write a cut once the oldest buffered event waited this long.",
)
@click.option(
    "--roll-mb",
    default=64,
    show_default=True,
    type=click.IntRange(min=1),
    help="Write a cut once this many MB are buffered.",
)
@click.option(
    "--give-up-after",
    "give_up_after",
    envvar=GIVE_UP_ENV,
    default="15m",
    show_default=True,
    type=_SPAN,
    help="While the store is unreachable the backup retries with back-off (up to 10 s "
    "apart), logging once a minute; it exits 2 once an outage lasted this long (90s, "
    f"15m, 2h; env {GIVE_UP_ENV}).",
)
@metrics_port_option
def backup_run(
    url: str | None,
    once: bool,
    roll_seconds: float,
    roll_mb: int,
    give_up_after: float,
    metrics_port: int | None,
) -> None:
    """Back up the events topic with the write side's keys, ledger, checkpoints and
    blobs, until SIGTERM or Ctrl-C (or, with --once, up to the topic's end).

    Manifests are signed with the checkpoint signer's key (BLACKBOX_SIGNING_KEY_FILE).
    An outage of the store is ridden out (see --give-up-after): the cut that failed is
    written once the store answers, and the backup goes on from there. Gauges:
    blackbox_backup_store_up, blackbox_backup_store_outage_seconds.
    """
    console = safe_console(stderr=True, log_path=False)
    settings = wired().settings
    try:
        policy = BackupPolicy(
            roll_bytes=roll_mb * 1024 * 1024,
            roll_seconds=roll_seconds,
            retry=RetryPolicy(give_up_after_s=give_up_after),
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    started = time.monotonic()
    written = 0
    try:
        store = open_store(url)
        signer = CheckpointSigner.from_env()
        writer = BackupWriter(settings, store, signer=signer, policy=policy)
        serve_metrics(metrics_port, writer.metrics.registry)
        if once:
            written = _once(console, settings.topic, writer, store)
        else:
            written = _continuously(console, settings.topic, writer, store)
    except BlackboxError as exc:
        if permission_refused(exc) is not None:
            raise
        could_not_run(console, exc)
    click.echo(f"{written:,} events backed up in {time.monotonic() - started:.1f} s")


def _once(console: Console, topic: str, writer: BackupWriter, store: BackupStore) -> int:
    """Back up the topic up to its end and write a cut; an unreachable store is waited
    for as in continuous mode (see --give-up-after); a signal interrupts it."""
    stop = threading.Event()
    with stop_on_signals(stop):
        if not writer.open_riding_outages(stop):
            raise BackupError("interrupted while waiting for the store; nothing was written")
        try:
            console.log(f"backing up [bold]{topic}[/] to {safe_text(store.describe())}")
            settle_heap()
            progress = _Progress(console, "read", "messages")
            manifest = writer.catch_up(progress=progress, stop=stop)
        finally:
            writer.close()
    _say_cut(console, manifest)
    return writer.written


def _continuously(console: Console, topic: str, writer: BackupWriter, store: BackupStore) -> int:
    """Run ``writer`` until a signal; an unreachable store is waited for, also at the
    start (see --give-up-after)."""
    stop = threading.Event()
    with stop_on_signals(stop):
        if not writer.open_riding_outages(stop):
            return 0
        try:
            console.log(f"backing up [bold]{topic}[/] to {safe_text(store.describe())}")
            settle_heap()
            writer.run(stop, on_cut=lambda m: _say_cut(console, m))
        finally:
            writer.close()
    return writer.written


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
@click.option("--store", "url", default=None, help=STORE_HELP)
@click.option(
    "--at",
    type=AT,
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
    settings = wired().settings
    when = aware(at)
    try:
        store = open_store(url)
        verifier = required_verifier()
        check = check_backup(
            settings, store, verifier, at=when, progress=_Progress(console, "checked", "segments")
        )
    except BlackboxError as exc:
        cannot_run(console, exc, as_json=as_json)
    if as_json:
        click.echo(json.dumps(_check_doc(check), indent=2))
    else:
        _print_check(safe_console(), check)
    sys.exit(0 if check.passed else 1)


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
        "unchecked": list(check.unchecked),
    }


def _print_check(console: Console, check: StoreCheck) -> None:
    cut = check.cut
    where = "no cut" if cut is None else f"cut {cut.key} of {cut.created_at}"
    console.print(
        f"{len(check.chain.manifests)} manifests up to {where}: {check.segments:,} segments, "
        f"{check.messages:,} events, {check.bytes:,} bytes, {check.blobs:,} blobs"
    )
    for note in check.unchecked:
        console.print(f"[yellow]{safe_text(note)}[/]")
    if not check.problems:
        console.print("[green]PASS[/]: every object is the one the signed manifests name")
        return
    table = Table(title="problems")
    table.add_column("object")
    table.add_column("problem")
    for problem in check.problems:
        table.add_row(safe_text(problem.where), safe_text(problem.problem))
    console.print(table)
    count = len(check.problems)
    console.print(f"[red]FAIL[/]: {count} problem{'' if count == 1 else 's'}")


@backup_group.command("prune")
@click.option("--store", "url", default=None, help=STORE_HELP)
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
        console.log(horizon_note(policy))
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
