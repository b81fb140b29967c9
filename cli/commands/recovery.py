"""``blackbox drill`` and ``blackbox restore``: restoring a backup into a copy of its own."""

from __future__ import annotations

import json
import logging
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import NoReturn

import click
from rich.console import Console

from agent_blackbox.backup import (
    BACKUP_URL_ENV,
    TRUST_CUT_OPTION,
    BackupCorrupt,
    BackupError,
    DrillOptions,
    RestoreRequest,
    Target,
    drop_target,
    open_store,
    parse_cut,
    print_drill,
    restore_runs,
    run_drill,
)
from agent_blackbox.backup._drill_sample import EntryPoints
from agent_blackbox.backup._partial import RESTORE_PREFIX
from agent_blackbox.backup._tally import EventTally
from agent_blackbox.backup._target import copy_exists, existing_target
from agent_blackbox.cli._wiring import wired
from agent_blackbox.keystore import purpose_problem
from agent_blackbox.schemas import (
    PUBLIC_KEYS_ENV,
    SIGNING_KEY_FILE_ENV,
    BlackboxError,
    CheckpointVerifier,
    Settings,
    safe_console,
    safe_text,
    write_owner_only,
)

STORE_HELP = f"The backup store's URL (default: {BACKUP_URL_ENV})."
AT = click.DateTime(formats=["%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d"])
"""A time on the command line; one without a zone is local time."""
_ENV_MARK = "# The restored copy "


def _cut_number(_ctx: click.Context, _param: click.Parameter, value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return parse_cut(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def trust_cut_option(command: Callable[..., None]) -> Callable[..., None]:
    """``--trust-cut N``: the option of ``drill`` and ``restore`` naming the cut to trust."""
    return click.option(
        TRUST_CUT_OPTION,
        "trust_cut",
        default=None,
        callback=_cut_number,
        help="Restore this cut (its manifest number, or key as `backup verify` prints it) "
        "although the database records backing up past the store's newest manifest "
        "(removed manifests are refused otherwise).",
    )(command)


def aware(at: datetime | None, option: str = "--at") -> datetime | None:
    """``at`` with a zone (local time when it has none).

    Raises:
        click.BadParameter: it is in the future (nothing is backed up there yet).
    """
    if at is None:
        return None
    zoned = at if at.tzinfo is not None else at.astimezone()
    if zoned > datetime.now(UTC):
        raise click.BadParameter(f"{zoned.isoformat()} is in the future", param_hint=option)
    return zoned


def required_verifier() -> CheckpointVerifier:
    """The signers' public keys from the environment.

    Raises:
        BackupError: none are configured.
    """
    verifier = CheckpointVerifier.from_env()
    if verifier is None:
        raise BackupError(
            f"checking a backup needs the signers' public keys: set {PUBLIC_KEYS_ENV} to "
            f"their PEM files, comma-separated (or {SIGNING_KEY_FILE_ENV} to the signer's key)"
        )
    return verifier


def cannot_run(console: Console, exc: BaseException, *, as_json: bool) -> NoReturn:
    """Say why the command could not run (also as JSON on stdout with ``--json``), exit 2."""
    message = safe_text(str(exc))
    if as_json:
        click.echo(json.dumps({"passed": False, "error": str(exc)}, indent=2))
    console.print(f"[red]error:[/] {message}", soft_wrap=True)
    sys.exit(2)


def quiet_views() -> None:
    """A restore rebuilds the copy's views with the views consumer, whose partition
    assignments are news for a long-running consumer, not for a restore."""
    logging.getLogger("agent_blackbox.consumers").setLevel(logging.WARNING)


@contextmanager
def interrupted_as_keyboard() -> Iterator[None]:
    """SIGTERM interrupts like Ctrl-C, so the copy being made is dropped on the way out."""

    def handle(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handle)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@click.command("drill")
@click.option("--store", "url", default=None, help=STORE_HELP)
@click.option(
    "--at",
    type=AT,
    default=None,
    help="The disaster point: restore the last cut at or before it (default: now, newest).",
)
@click.option(
    "--sample",
    default=20,
    show_default=True,
    type=click.IntRange(min=0),
    help="Runs to replay on the restored copy, drawn from the agents with an entry point "
    "(BLACKBOX_AGENTS or --agent; the others' runs are counted as skipped; 0: none).",
)
@click.option(
    "--agent",
    "agents",
    multiple=True,
    help="An entry point for the replay sample: module:function for every agent, or "
    "NAME=module:function for one (repeatable; besides BLACKBOX_AGENTS).",
)
@click.option(
    "--keep", is_flag=True, help="Leave the restored copy in place (credentials to a file)."
)
@click.option(
    "--purpose",
    default="restore drill",
    show_default=True,
    help="Why the sample's bodies are read (audited in the restored copy).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report on stdout.")
@click.option("--drop", "drop_name", default=None, help="Drop the kept copy of this name instead.")
@trust_cut_option
def drill_command(
    url: str | None,
    at: datetime | None,
    sample: int,
    agents: tuple[str, ...],
    keep: bool,
    purpose: str,
    as_json: bool,
    drop_name: str | None,
    trust_cut: int | None,
) -> None:
    """Rehearse a disaster recovery: check the backup, restore it into an isolated
    database and topic of its own, rebuild the views, verify everything, report RPO and
    RTO, and drop the copy (unless --keep). Production is only read. Interrupted, it drops
    the copy it was making.

    The backup is checked as `backup verify` checks it; a store whose newest manifests
    were removed fails the drill unless --trust-cut names the cut to restore.

    Exit status: 0 every check passed, 1 a check failed, 2 the drill could not run (or
    its only failed checks could not run: a service away, no entry points).
    """
    console = safe_console(stderr=True, log_path=False)
    quiet_views()
    settings = wired().settings
    if drop_name is not None:
        _drop(console, settings, drop_name, prefix="blackbox_drill_")
    if (problem := purpose_problem(purpose)) is not None:
        raise click.BadParameter(problem, param_hint="--purpose")
    options = DrillOptions(
        at=aware(at),
        sample=sample,
        keep=keep,
        purpose=purpose,
        trust_cut=trust_cut,
        agents=agents,
    )
    if sample > 0 and EntryPoints.of(agents).empty:
        # Said before the restore, not after it: the sample could not run anyway.
        raise click.UsageError(
            f"--sample {sample} replays runs with the agents' entry points, and none is "
            "given: set BLACKBOX_AGENTS (name=module:function,...) or give --agent, or "
            "give --sample 0"
        )
    try:
        store = open_store(url)
        verifier = required_verifier()
        with interrupted_as_keyboard():
            report = run_drill(settings, store, verifier=verifier, options=options, say=console.log)
    except KeyboardInterrupt:
        cannot_run(console, BackupError("interrupted; the copy was dropped"), as_json=as_json)
    except BlackboxError as exc:
        cannot_run(console, exc, as_json=as_json)
    if report.kept_target is not None:
        _write_env(Path(f"{report.kept_target.name}.env"), report.kept_target)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        print_drill(safe_console(), report)
    if report.kept_target is not None:
        name = report.kept_target.name
        console.print(f"kept: . ./{name}.env to use it; blackbox drill --drop {name} to drop it")
    # A drill whose only failures are checks that could not run found nothing: exit 2.
    sys.exit(0 if report.passed else 2 if report.unrun else 1)


@click.command("restore")
@click.option("--store", "url", default=None, help=STORE_HELP)
@click.option(
    "--into",
    required=True,
    help="Name of the restored copy (lower-case letters, digits, _; at most 24): its "
    "database, role and topic prefix are blackbox_restore_<NAME>.",
)
@click.option("--runs", "run_ids", multiple=True, help="Run ids (repeatable, or comma-separated).")
@click.option("--subject", default=None, help="The runs of this data subject.")
@click.option("--since", type=AT, default=None, help="The runs started at or after this time.")
@click.option("--at", type=AT, default=None, help="Restore from the last cut at or before this.")
@click.option("--purpose", default=None, help="Why (one line; written to the access audit).")
@click.option(
    "--env-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Where to write the copy's credentials (default: ./<NAME>.env, owner-only).",
)
@click.option("--drop", is_flag=True, help="Drop the restored copy NAME instead.")
@trust_cut_option
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
    trust_cut: int | None,
) -> None:
    """Bring back a selection of runs from the backup into a copy of their own, for an
    investigation: --runs, --subject and/or --since (all given must hold), from the
    newest cut or the last at or before --at. Deletions are applied first, as in a
    drill; who restored what and why is written to the access audit.

    The backup is checked first, as `backup verify` checks it; a store whose newest
    manifests were removed is refused unless --trust-cut names the cut to restore.

    Exit status: 0 restored (or dropped), 1 the backup failed its check or holds a
    conflicting copy of an event (the copy is kept to look at), 2 could not run.
    """
    console = safe_console(stderr=True, log_path=False)
    quiet_views()
    settings = wired().settings
    env_path = env_file or Path(f"{into}.env")
    if drop:
        _drop(console, settings, RESTORE_PREFIX + into, prefix=RESTORE_PREFIX, env=env_path)
    request = RestoreRequest(
        into=into,
        purpose=purpose or "",
        run_ids=frozenset(r.strip() for given in run_ids for r in given.split(",") if r.strip()),
        subject=subject,
        since=aware(since, "--since"),
        at=aware(at),
        trust_cut=trust_cut,
    )
    if (problem := request.problem()) is not None:
        raise click.UsageError(problem)
    if env_path.exists():
        raise click.UsageError(f"{env_path} exists; remove it or give --env-file")
    try:
        store = open_store(url)
        with interrupted_as_keyboard():
            result = restore_runs(
                settings, store, request, verifier=required_verifier(), say=console.log
            )
    except BackupCorrupt as exc:
        console.print(f"[red]error:[/] {safe_text(str(exc))}", soft_wrap=True)
        sys.exit(1)
    except KeyboardInterrupt:
        cannot_run(console, BackupError("interrupted; the copy was dropped"), as_json=False)
    except BlackboxError as exc:
        cannot_run(console, exc, as_json=False)
    _write_env(env_path, result.target)
    out = safe_console()
    out.print(
        f"restored {len(result.runs)} runs ({result.copy.events:,} events, "
        f"{result.copy.blobs} blobs) from {result.cut} into {safe_text(result.target.describe())}"
    )
    _say_copies(out, result.copy.tally)
    if missing := sorted(request.run_ids - set(result.runs)):
        out.print(f"[yellow]not in the backup:[/] {safe_text(', '.join(missing))}")
    out.print(f"credentials in {env_path} (owner-only); look at it with e.g.")
    source = env_path if env_path.is_absolute() or env_path.parent != Path() else f"./{env_path}"
    out.print(f"  . {source} && blackbox timeline {result.runs[0]}")
    out.print(f"drop it with: blackbox restore --into {into} --drop")
    if result.copy.tally.conflicting:
        sys.exit(1)


def _say_copies(out: Console, tally: EventTally) -> None:
    """The re-delivered copies (a figure) and the conflicting ones (a finding)."""
    if tally.duplicates:
        out.print(f"{tally.duplicates:,} re-delivered copies in the backup, each counted once")
    if tally.conflicting:
        out.print(
            f"[red]conflicting copies:[/] {tally.conflicting:,} messages claim a run's "
            "sequence with another event id or other bytes (the views keep the first and "
            "list the others as integrity violations):"
        )
        for line in tally.conflicts:
            out.print(f"  {safe_text(line)}")


def _drop(
    console: Console, settings: Settings, name: str, *, prefix: str, env: Path | None = None
) -> NoReturn:
    """Drop the copy ``name`` (and the env file written for it), then exit."""
    if not name.startswith(prefix):
        raise click.UsageError(f"{name!r} is not a copy this command made ({prefix}...)")
    try:
        exists = copy_exists(settings, name)
    except BackupError as exc:
        cannot_run(console, exc, as_json=False)
    if not exists:
        cannot_run(
            console,
            BackupError(f"no copy named {name} to drop: no database or role of that name"),
            as_json=False,
        )
    target = existing_target(settings, name)
    left = drop_target(settings, target)
    for line in left:
        console.print(f"[yellow]left behind:[/] {safe_text(line)}")
    env = env or Path(f"{name}.env")
    if env.exists() and env.read_text(encoding="utf-8", errors="replace").startswith(
        _ENV_MARK + name
    ):
        env.unlink()
    if not left:
        console.print(f"dropped {name} (its database, role and topics)")
    sys.exit(2 if left else 0)


def _write_env(path: Path, target: Target) -> None:
    settings = target.settings
    lines = [
        f"{_ENV_MARK}{target.name}: `. {path}` points the blackbox commands at it.",
        f"export BLACKBOX_DATABASE_URL='{settings.database_url}'",
        f"export BLACKBOX_TOPIC='{settings.topic}'",
        f"export BLACKBOX_KAFKA_BOOTSTRAP='{settings.kafka_bootstrap}'",
        f"export BLACKBOX_PARTITIONS={settings.partitions}",
        f"export BLACKBOX_CONSUMER_GROUP='{settings.consumer_group}'",
    ]
    write_owner_only(path, ("\n".join(lines) + "\n").encode())
