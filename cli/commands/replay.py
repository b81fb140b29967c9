"""``blackbox replay``, ``fork``, ``reexecute``, ``verify``, ``timeline`` and ``export``:
the replayer's commands."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial
from itertools import chain, groupby
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from sqlalchemy import Engine

from agent_blackbox.cli._purpose import purpose_option
from agent_blackbox.cli._selection import moment_given
from agent_blackbox.cli._wiring import Wiring, wired
from agent_blackbox.outbox import NondeterminismGuard
from agent_blackbox.outbox.storage import PostgresBlobs
from agent_blackbox.replayer import (
    AgentRegistry,
    AssembledRun,
    Handled,
    HistoryScan,
    NondeterminismPolicy,
    ReplayReport,
    ReplayResults,
    RunHandler,
    RunIndex,
    SkippedMessage,
    SourceError,
    UnknownAgent,
    read_archive,
)
from agent_blackbox.replayer._access import opening
from agent_blackbox.replayer._batch import (
    DEFAULT_LIMIT,
    BatchReplayer,
    OpenedRun,
    Replaying,
    RunFilter,
    Tally,
    nothing_matched,
    run_line,
)
from agent_blackbox.replayer._indexed import replay_indexed
from agent_blackbox.replayer._registry import load_replay_entry
from agent_blackbox.replayer._sandbox import POLICIES
from agent_blackbox.schemas import (
    BlackboxError,
    Envelope,
    Settings,
    permission_refused,
    safe_console,
    safe_text,
)
from agent_blackbox.wiring import COMMAND_POOL

T = TypeVar("T")


@click.command("replay")
@click.argument("run_id", required=False)
@click.option("--all", "every", is_flag=True, help="Replay every finished run (batch).")
@click.option(
    "--agent",
    "agent_paths",
    multiple=True,
    help="Entry point: module:function replays every run whose agent has no entry of its "
    "own; NAME=module:function replays the runs of agent NAME (repeatable). With several "
    "agents in the runs, name them, or keep --all to one with --agent-id.",
)
@click.option("--agent-id", default=None, help="With --all: only runs of this agent.")
@click.option(
    "--since",
    "since_raw",
    default=None,
    help="With --all: started since: a span back from now (30m, 1h, 2d, 1w) or an ISO "
    "time (local without a zone).",
)
@click.option(
    "--limit",
    default=DEFAULT_LIMIT,
    show_default=True,
    type=click.IntRange(min=1),
    help="With --all: at most N runs.",
)
@click.option(
    "--random",
    "draw",
    is_flag=True,
    help="With --all: a random draw of --limit runs instead of the oldest (a sample across "
    "the history; not with --archive).",
)
@click.option(
    "--include-forks",
    is_flag=True,
    help="With --all: replay forks too (runs re-executed from a parent; left out by default).",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    help="With --all from the topic: processes replaying partitions in parallel, this one "
    "included [default: one per core, fewer for a short history].",
)
@click.option(
    "--archive",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Read runs from an Avro archive instead of Kafka.",
)
@purpose_option(required=True)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="JSON lines on stdout: one per run, then a summary (docs/reference/replay-json.md).",
)
@click.option(
    "--nondeterminism",
    type=click.Choice(POLICIES),
    default="warn",
    show_default=True,
    help="Direct reads of the clock, random, UUIDs or the environment by the agent's "
    "code: a warning in the report, or a failed run.",
)
@click.option(
    "--agent-module",
    "agent_modules",
    multiple=True,
    help="A module or package of the agent's own, besides the entry point's package "
    "(repeatable): its direct reads are reported too.",
)
@click.option(
    "--show-values",
    is_flag=True,
    help="An argument mismatch lists the changed values, not only their paths (they may "
    "be personal data: the purpose is audited).",
)
@click.option(
    "--allow-network",
    is_flag=True,
    help="Let the agent's code reach the network through no boundary (a client the run "
    "does not record): each call goes out and is noted, and the run is LIMITED. By "
    "default replay never goes online: such a call is refused and the run diverges "
    "with unrecorded_call.",
)
@click.option(
    "--code-version",
    envvar="BLACKBOX_CODE_VERSION",
    default=None,
    help="The version of the code under test, kept with each result in the views' "
    "replay_results (default: BLACKBOX_CODE_VERSION).",
)
def replay_command(
    run_id: str | None,
    every: bool,
    agent_paths: tuple[str, ...],
    agent_id: str | None,
    since_raw: str | None,
    limit: int,
    draw: bool,
    include_forks: bool,
    workers: int | None,
    archive: Path | None,
    purpose: str,
    as_json: bool,
    nondeterminism: NondeterminismPolicy,
    agent_modules: tuple[str, ...],
    show_values: bool,
    allow_network: bool,
    code_version: str | None,
) -> None:
    """Replay RUN_ID (or --all) through the agent's own code, offline. Each result is
    kept in the views' replay_results, with its --code-version when given (a pass rate
    per code version is then a query).

    Entry points come from --agent or BLACKBOX_AGENTS (name=module:function,...). With
    --all, runs of an agent without an entry point are SKIPPED and the batch goes on.

    With --all, the runs the events index lists are read from the topic in one pass,
    partition by partition, by --workers processes; a message that is not an event
    (undecodable) is skipped and listed in the summary.

    \b
    Exit status:
      0  every run passed (PASS or LIMITED)
      1  a run diverged (a finding; also when other runs were errors or skipped)
      2  replay could not run: bad options or entry point, nothing matched, or no
         divergence but a run was an ERROR (setup or access problem) or SKIPPED
    """
    if every == (run_id is not None):
        raise click.UsageError("give either a RUN_ID or --all (exactly one of them)")
    since = moment_given(since_raw, "--since")
    if not every and (
        agent_id or since or include_forks or draw or limit != DEFAULT_LIMIT or workers is not None
    ):
        raise click.UsageError(
            "--agent-id, --since, --limit, --random, --include-forks and --workers need --all"
        )
    if draw and archive is not None:
        raise click.UsageError("--random draws from the run index: not with --archive")
    scope = RunFilter(agent_id, since, limit, include_forks, draw) if every else None
    out = _Output(as_json, Tally(filters=scope.describe() if scope else None))
    wiring = wired()
    results = _ResultKeeper(code_version, None if archive is not None else wiring)
    try:
        how = Replaying(nondeterminism, agent_modules, show_values, allow_network)
        work = ReplayWork(
            agent_paths, purpose, how, skip_unknown=scope is not None, settings=wiring.settings
        )
        for item in _reports(wiring, run_id, scope, archive, work, workers):
            if isinstance(item, SkippedMessage):
                out.skip(item)
            else:
                out.run(item)
                results.keep(item, out)
    except BlackboxError as exc:
        if permission_refused(exc) is not None:
            raise  # the top-level command names the role to run as
        out.fail(str(exc))
    except KeyboardInterrupt:
        out.fail(f"interrupted after {out.replayed} runs; the summary covers those")
    finally:
        results.close(out)
    sys.exit(out.finish())


class _ResultKeeper:
    """Keeps each report in the read side's replay results, when the command was wired
    with them (``wiring``: none for runs read from an archive); a result that cannot be
    kept is said once, and replay goes on.

    Reports are kept in batches (:data:`KEEP_BATCH` runs, or what came in
    :data:`KEEP_EVERY_S`), one transaction each: a transaction per run made the
    database's round trips, not the replay, the bound of a batch of short runs. A batch
    the database refuses is kept run by run, so the runs before the refused one are kept
    as they were before batching.
    """

    def __init__(self, code_version: str | None, wiring: Wiring | None) -> None:
        self._code_version = code_version
        self._engine: Engine | None = None
        self._results: ReplayResults | None = None
        self._failed = False
        self._waiting: list[ReplayReport] = []
        self._since = 0.0
        side = None if wiring is None else wiring.read_side
        if wiring is not None and side is not None and side.replay_results is not None:
            self._engine = wiring.engine()
            self._results = side.replay_results(self._engine)

    def keep(self, report: ReplayReport, out: _Output) -> None:
        if self._results is None or self._failed:
            return
        if report.error is not None and report.error.startswith(_UNREAD):
            return  # the run was not found to read: the views have no run to keep it with
        if not self._waiting:
            self._since = time.monotonic()
        self._waiting.append(report)
        if len(self._waiting) >= KEEP_BATCH or time.monotonic() - self._since >= KEEP_EVERY_S:
            self.flush(out)

    def flush(self, out: _Output) -> None:
        """Keep the reports waiting, in the order they came."""
        waiting, self._waiting = self._waiting, []
        if self._results is None or self._failed or not waiting:
            return
        try:
            self._results.record_many(waiting, code_version=self._code_version)
            return
        except BlackboxError:
            pass  # kept one by one below, to keep those before the refused one
        for report in waiting:
            try:
                self._results.record(report, code_version=self._code_version)
            except BlackboxError as exc:
                self._failed = True
                out.warn(f"replay results are not kept: {exc}")
                return

    def close(self, out: _Output) -> None:
        """Keep what is waiting, and let the connections go."""
        try:
            self.flush(out)
        finally:
            if self._engine is not None:
                self._engine.dispose()


KEEP_BATCH = 500
"""Replay results kept per transaction."""
KEEP_EVERY_S = 1.0
"""At most this long between a result and its keeping, however slowly runs come."""


def _registry(agent_paths: tuple[str, ...]) -> AgentRegistry:
    """The entry points of ``--agent`` (and ``BLACKBOX_AGENTS``).

    Raises:
        UnknownAgent: an entry point cannot be loaded, or two serve every agent.
    """
    named = [path.partition("=") for path in agent_paths if "=" in path.partition(":")[0]]
    plain = [path for path in agent_paths if "=" not in path.partition(":")[0]]
    if len(plain) > 1:
        raise UnknownAgent(
            f"--agent given {len(plain)} entry points for every agent ({', '.join(plain)}); "
            "give one, and name the others' agents: --agent NAME=module:function"
        )
    registry = AgentRegistry.from_env(load_replay_entry(plain[0]) if plain else None)
    given: dict[str, str] = {}
    for name, _, path in named:
        if not name.strip():
            raise UnknownAgent(f"--agent {name}={path}: the agent's name is empty")
        if (earlier := given.setdefault(name.strip(), path.strip())) != path.strip():
            raise UnknownAgent(
                f"--agent names agent {name.strip()} twice ({earlier}, {path.strip()}); "
                "give each agent one entry point"
            )
        registry.register(name.strip(), load_replay_entry(path.strip()))
    return registry


def _reports(
    wiring: Wiring,
    run_id: str | None,
    scope: RunFilter | None,
    archive: Path | None,
    work: ReplayWork,
    workers: int | None,
) -> Iterator[ReplayReport | SkippedMessage]:
    """Each run's report as it is replayed, and each message of the topic passed over.

    Raises:
        BlackboxError: the batch could not start (no run matched, the index or the
            keys cannot be read, the topic cannot be listed); a problem of one run is
            that run's report instead.
    """
    settings = wiring.settings
    engine = wiring.engine()
    console = safe_console(stderr=True)
    try:
        registry = _registry(work.agent_paths)
        reading = opening(lambda: engine, purpose=work.purpose)
        if archive is not None:
            replayer = BatchReplayer(
                registry, reading, skip_unknown=work.skip_unknown, how=work.how
            )
            runs = _archive_runs(archive, run_id, scope)
            with NondeterminismGuard.installed():
                for rid, opened in _progress(runs, None, console):
                    yield replayer.replay(rid, opened)
            return
        index = wiring.read_side.run_index(engine)
        if scope is not None:
            ids = _indexed_runs(index, scope)
            scan = HistoryScan(settings, work, wanted=frozenset(ids), workers=workers)
            for item in _scanning(scan, console):
                yield item if isinstance(item, SkippedMessage) else item.result
            return
        assert run_id is not None
        yield from replay_indexed(
            [run_id], registry, reading, settings=settings, engine=engine, index=index, how=work.how
        )
    finally:
        engine.dispose()


@dataclass(frozen=True, slots=True)
class ReplayWork:
    """What a worker of ``replay --all`` needs to replay runs (picklable: each worker
    process builds its own registry, keys and database connection from it, with the
    settings of the command that started it)."""

    agent_paths: tuple[str, ...]
    purpose: str
    how: Replaying
    skip_unknown: bool = True
    settings: Settings = field(kw_only=True)

    def start(self) -> RunHandler[ReplayReport]:
        # A command's pool: every run of the worker may read blobs or unwrap a key.
        engine = COMMAND_POOL.engine(self.settings.database_url)
        replayer = BatchReplayer(
            _registry(self.agent_paths),
            opening(lambda: engine, purpose=self.purpose),
            PostgresBlobs(engine),
            skip_unknown=self.skip_unknown,
            how=self.how,
        )
        # Each run replays under a guard of its own: the wrappers it needs are installed
        # once for the worker, not once a run (a tenth of a short run's replay).
        held = ExitStack()
        held.enter_context(NondeterminismGuard.installed())
        return _ReplayHandler(replayer, engine, held)


_UNREAD = "SourceError:"
"""How the report of a run that could not be found to read begins."""


@dataclass(frozen=True, slots=True)
class _ReplayHandler:
    replayer: BatchReplayer
    engine: Engine
    held: ExitStack

    def close(self) -> None:
        self.held.close()
        self.engine.dispose()

    def handle(self, run: AssembledRun) -> ReplayReport:
        return self.replayer.replay(run.run_id, partial(_opened, run.events, run.agent_id))

    def missing(self, run_id: str, why: str, *, unread: bool) -> ReplayReport:
        return ReplayReport(run_id, None, 0, error=f"{_UNREAD} run {run_id} {why}")

    def late(self, run_id: str) -> None:
        return None  # the agent's run ended at run.finished; what follows is not replayed


def _scanning(scan: HistoryScan[T], console: Console) -> Iterator[Handled[T] | SkippedMessage]:
    """The scan's items, with a progress bar of the messages read."""
    columns = (
        TextColumn("reading the topic"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("scan", total=None)

        def advanced(messages: int) -> None:
            progress.update(task, total=scan.total or None, completed=messages)

        scan.on_progress = advanced
        yield from scan
    for failed in scan.failed:
        console.print(
            f"[red]error:[/] partition {failed.partition} of {safe_text(scan.settings.topic)} "
            f"was not read to its end: {safe_text(failed.reason)}"
        )
    if scan.dropped:
        console.print(
            f"{scan.dropped} stale copies (from a relay that had lost its lease) were dropped"
        )


def _indexed_runs(index: RunIndex, scope: RunFilter | None) -> list[str]:
    scope = scope or RunFilter()
    ids = index.runs(
        finished_only=True,
        since=scope.since,
        agent_id=scope.agent_id,
        limit=scope.limit,
        include_forks=scope.include_forks,
        random=scope.random,
    )
    if not ids:
        raise nothing_matched(
            "the run index",
            scope,
            "Check the filters, and that the view consumer has caught up (blackbox consume).",
        )
    return ids


def _archive_runs(
    path: Path, run_id: str | None, scope: RunFilter | None
) -> Iterator[tuple[str, Callable[[], OpenedRun]]]:
    """The runs of an archive the command covers, one after another, each streamed."""
    found = False
    for rid, group in groupby(read_archive(path, run_id=run_id), key=lambda e: e.run_id):
        events = iter(group)  # streamed: the first envelope is read here, the rest by replay
        first = next(events)
        if scope is not None and not scope.admits(first):
            continue
        found = True
        yield rid, partial(_opened, chain([first], events), first.agent_id)
    if found:
        return
    if scope is not None:
        raise nothing_matched(f"archive {path}", scope, "Check the filters and the archive.")
    # A single run the archive does not hold is that run's error, like a run not indexed.
    yield run_id or "", partial(_not_in_archive, path, run_id or "")


def _opened(events: Iterable[Envelope], agent_id: str | None) -> OpenedRun:
    return events, agent_id


def _not_in_archive(path: Path, run_id: str) -> OpenedRun:
    raise SourceError(f"run {run_id} is not in archive {path}; check the run id")


def _progress(items: Iterator[T], total: int | None, console: Console) -> Iterator[T]:
    columns = (TextColumn("replaying"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=total is None) as progress:
        task = progress.add_task("replay", total=total)
        for item in items:
            yield item
            progress.advance(task)


class _Output:
    """Writes each run's result as it comes, then the summary: JSON lines on stdout, or
    text (results on stdout, errors on stderr)."""

    def __init__(self, as_json: bool, tally: Tally) -> None:
        self._json = as_json
        self._tally = tally
        self._error: str | None = None
        self._out = safe_console()
        self._err = safe_console(stderr=True, soft_wrap=True)

    def skip(self, message: SkippedMessage) -> None:
        """A message of the topic that is not an event was passed over."""
        self._tally.unreadable.append(message)
        self._err.print(
            f"[yellow]skipped[/] a message that is not an event: {safe_text(message.describe())}"
        )

    def run(self, report: ReplayReport) -> None:
        self._tally.add(report)
        single = self._tally.filters is None
        if self._json:
            click.echo(json.dumps(run_line(report), default=str))
            if single and report.error is not None:
                self._err.print(
                    f"[red]ERROR[/] run {safe_text(report.run_id)}: {safe_text(report.error)}"
                )
        elif single:
            _print_report(report, self._out, self._err)

    @property
    def replayed(self) -> int:
        return self._tally.runs

    def warn(self, message: str) -> None:
        """Something the user should know that does not change the outcome."""
        self._err.print(f"[yellow]warning:[/] {safe_text(message)}")

    def fail(self, error: str) -> None:
        """The command could not run (or go on): say why, exit 2 unless a run diverged."""
        self._error = error
        self._err.print(f"[red]error:[/] {safe_text(error)}")

    def finish(self) -> int:
        """Write the summary; the exit status."""
        line = self._tally.line(error=self._error)
        if self._json:
            click.echo(json.dumps(line, default=str))
        elif self._tally.filters is not None and self._tally.runs:
            _print_summary(line, self._tally.reasons, self._out)
        if not self._json and (skipped := len(self._tally.unreadable)):
            self._err.print(
                f"{skipped} messages of the topic were skipped: they are not events "
                "(listed above; --json lists them in the summary)"
            )
        return int(line["exit_code"])


def _print_report(report: ReplayReport, out: Console, err: Console) -> None:
    if report.error is not None:
        err.print(f"[red]ERROR[/] run {safe_text(report.run_id)}: {safe_text(report.error)}")
        return
    levels = ", ".join(f"{name.replace('_', ' ')} {state}" for name, state in report.levels.items())
    if report.limited:
        out.print(f"[yellow]LIMITED[/] {safe_text(report.limited)}")
    for finding in report.nondeterminism:
        label = "[red]NONDETERMINISTIC[/]" if report.nondeterminism_fails else "[yellow]warning[/]"
        err.print(f"{label} {safe_text(finding.describe())}")
    recorded = report.recorded_ending()
    if recorded is not None:
        levels += f"; recorded run {safe_text(recorded)}"
    if report.passed:
        label = "[yellow]LIMITED[/]" if report.limited else "[green]PASS[/]"
        out.print(f"{label} run {safe_text(report.run_id)} ({report.events} events): {levels}")
        return
    if report.divergence is None:
        out.print(
            f"[red]NONDETERMINISTIC[/] run {safe_text(report.run_id)}: the agent's code read "
            "the clock, randomness or the environment directly (--nondeterminism fail)"
        )
        return
    out.print(
        f"[red]DIVERGED[/] run {safe_text(report.run_id)} after {report.events} events: {levels}"
    )
    for divergence in report.divergences:
        table = Table(show_header=False, box=None)
        site = divergence.call_site
        rows = {
            "kind": str(divergence.kind),
            "level": divergence.level,
            "sequence": str(divergence.sequence),
            "expected": _side(
                divergence.expected_type, divergence.expected_name, divergence.expected_digest
            ),
            "actual": _side(
                divergence.actual_type, divergence.actual_name, divergence.actual_digest
            ),
            "call site": str(site or "(unknown)"),
            **({"library frame": str(site.library)} if site and site.library else {}),
            "detail": divergence.detail or "",
        }
        if divergence.changes:
            rows["changed"] = ", ".join(c.describe(divergence.revealed) for c in divergence.changes)
        for name, value in rows.items():
            table.add_row(name, safe_text(value))
        out.print(table)


def _side(event_type: str | None, name: str | None, digest: str | None) -> str:
    return " ".join(part for part in (event_type or "-", name, digest) if part)


_LISTED = 50
"""Failing runs listed by name in the text summary (--json lists them all)."""


def _print_summary(summary: dict[str, Any], reasons: dict[str, str], console: Console) -> None:
    rate = summary["pass_rate"]
    console.print(
        f"{summary['passed']}/{summary['runs']} runs passed"
        + (f" ({float(rate):.1%})" if isinstance(rate, float) else "")
        + f": {summary['diverged']} diverged, {summary['errors']} errors, "
        f"{summary['skipped']} skipped ({safe_text(str(summary['filters']))})",
        soft_wrap=True,
    )
    if summary["recorded_failed"]:
        console.print(
            f"{summary['recorded_failed']} of the recorded runs had failed; "
            f"{summary['passed_recorded_failed']} of them passed, reproducing their failure"
        )
    kinds = summary["divergence_kinds"]
    if kinds:
        table = Table(title="First divergences")
        for column in ("kind", "runs"):
            table.add_column(column)
        for kind, count in kinds.items():
            table.add_row(kind, str(count))
        console.print(table)
        console.print(f"first divergence at sequence: {summary['first_divergence_sequence']}")
    listed = [*summary["failing_run_ids"], *summary["skipped_run_ids"]]
    if listed:
        table = Table(title="Runs that did not pass")
        for column in ("run", "why"):
            table.add_column(column, overflow="fold")
        for rid in listed[:_LISTED]:
            table.add_row(safe_text(rid), safe_text(reasons.get(rid, "")))
        console.print(table)
        if len(listed) > _LISTED:
            console.print(f"... and {len(listed) - _LISTED} more (--json lists them all)")
