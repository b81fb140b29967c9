"""``blackbox export``: recorded runs as JSON lines, metadata only unless bodies are asked
for with a purpose; or their LLM conversations as a chat dataset."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from functools import partial
from itertools import chain, groupby
from pathlib import Path
from typing import IO, Any, Literal

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from sqlalchemy import Engine

from agent_blackbox.cli._purpose import purpose_option
from agent_blackbox.cli._selection import moment_given
from agent_blackbox.cli._wiring import Wiring, wired
from agent_blackbox.keystore import AuditedKeys, request_access
from agent_blackbox.outbox.storage import PostgresBlobs
from agent_blackbox.replayer import (
    ExportTally,
    KafkaRunSource,
    RunIndex,
    SourceError,
    chat_examples,
    event_records,
    json_line,
    read_archive,
)
from agent_blackbox.replayer._access import opening
from agent_blackbox.replayer._batch import DEFAULT_LIMIT, RunFilter, nothing_matched
from agent_blackbox.schemas import (
    BlackboxError,
    Envelope,
    Settings,
    permission_refused,
    safe_console,
    safe_text,
)

Format = Literal["jsonl", "openai-chat"]
FORMATS: tuple[Format, ...] = ("jsonl", "openai-chat")
RunEvents = tuple[str, Iterable[Envelope]]
"""A run's id and its events, streamed."""
Records = Callable[[Iterable[Envelope]], Iterator[dict[str, Any]]]
"""What one run is written as: :func:`event_records` or :func:`chat_examples`."""


_SELECTING = "--since, --until, --agent, --limit and --include-forks"


@click.command("export")
@click.argument("run_ids", nargs=-1, metavar="[RUN_ID]...")
@click.option(
    "--since",
    "since_raw",
    default=None,
    help="Every finished run started since: a span back from now (30m, 1h, 2d, 1w) or "
    "an ISO time (local time when it names no zone).",
)
@click.option("--until", "until_raw", default=None, help="With --since: started before this.")
@click.option("--agent", "agent_id", default=None, help="With --since: only runs of this agent.")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=DEFAULT_LIMIT,
    show_default=True,
    help="With --since: at most N runs, the oldest first.",
)
@click.option(
    "--include-forks", is_flag=True, help="With --since: forks too (left out by default)."
)
@click.option(
    "--format",
    "form",
    type=click.Choice(FORMATS),
    default="jsonl",
    show_default=True,
    help="jsonl: one line per event. openai-chat: the LLM conversations as a chat "
    "dataset for fine-tuning and evaluation (needs --bodies).",
)
@click.option(
    "--examples",
    type=click.Choice(("conversation", "call")),
    default=None,
    help="With openai-chat: one example per conversation, whole [default], or one per "
    "LLM call (the prompt at that point and its reply, for evaluation).",
)
@click.option(
    "--bodies",
    is_flag=True,
    help="Export the recorded bodies too (needs --purpose; sealed bodies open through "
    "the audited keys, each key unwrap written to the access audit).",
)
@purpose_option(required=False)
@click.option(
    "--archive",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Read runs from an Avro archive instead of Kafka (every run in it, unless "
    "RUN_IDs or --since select some).",
)
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    default=None,
    help="Write to FILE (owner-only, replaced only once the export is whole) instead of "
    "standard output.",
)
@click.option(
    "--include-unverified",
    is_flag=True,
    help="Export events the write side does not vouch for too (of runs it never recorded, "
    "past a run's head or after its end, or off its hash chain: produced to the topic by "
    "someone other than the relay). Left out by default, each run's count on stderr.",
)
def export_command(
    run_ids: tuple[str, ...],
    since_raw: str | None,
    until_raw: str | None,
    agent_id: str | None,
    limit: int,
    include_forks: bool,
    form: Format,
    examples: str | None,
    bodies: bool,
    purpose: str | None,
    archive: Path | None,
    output: Path | None,
    include_unverified: bool,
) -> None:
    """Export RUN_IDs (or the runs --since selects) as JSON lines on standard output or
    --output FILE; progress and the summary go to standard error.

    \b
    jsonl (default): one object per event, its envelope's metadata (ids, type, time,
      attributes, digests, chain hash, trace ids) and never its payload; with
      --bodies --purpose P also "body", the body as recorded.
    openai-chat (needs --bodies --purpose P): {"messages", "tools", "metadata"} per
      conversation (--examples call: per LLM call); truncated and failed calls are
      skipped and counted.

    \b
    Exit status:
      0  exported
      1  exported, but a body was refused (a plaintext body in a sealed run, not
         written by the run's recorder: see blackbox_views.integrity_violations) or
         could not be opened (a key or blob missing); a body forgotten on purpose (its
         key destroyed) is written as null and is no finding
      2  could not export: bad options, an unknown run, nothing matched, Kafka or the
         database away, keys missing (a FILE is then left as it was)
    """
    since = moment_given(since_raw, "--since")
    until = moment_given(until_raw, "--until")
    _check(run_ids, since, until, agent_id, limit, include_forks, archive)
    if form == "openai-chat" and not bodies:
        raise click.UsageError(
            "--format openai-chat writes the recorded conversations: give --bodies and "
            "--purpose P (why they are read, written to the access audit)"
        )
    if examples is not None and form != "openai-chat":
        raise click.UsageError("--examples goes with --format openai-chat")
    if bodies and not purpose:
        raise click.UsageError(
            "--bodies reads recorded content: give --purpose (or set BLACKBOX_PURPOSE)"
        )
    selecting = since is not None or (archive is not None and not run_ids)
    scope = RunFilter(agent_id, since, limit, include_forks) if selecting else None
    err = safe_console(stderr=True, soft_wrap=True)
    wiring = wired()
    engine = wiring.engine()
    tally = ExportTally()
    sink = _Sink(output)
    try:
        read = purpose if bodies else None
        records, audit = _records(engine, form, examples == "call", read, tally)
        runs, total = _runs(
            wiring, engine, run_ids, scope, until, archive, err, everything=include_unverified
        )
        for run_id, events in _progress(runs, total, tally, err, hidden=sink.on_terminal):
            if audit is not None and archive is None:
                audit(run_id)  # the run's access request, before any of its bodies opens
            for record in records(events):
                sink.write(json_line(record))
        sink.commit()
    except BlackboxError as exc:
        if permission_refused(exc) is not None:
            raise  # the top-level command names the role to run as
        err.print(f"[red]error:[/] {safe_text(exc)}")
        err.print(_not_written(output, sink.lines))
        sys.exit(2)
    except _Closed:  # the reader went away (| head): what it took was written
        sys.exit(0)
    finally:
        sink.close()
        engine.dispose()
    _summary(tally, form, bodies=bodies, per_call=examples == "call", output=output, err=err)
    # A body that was asked for and not written (refused, or not opened: a corrupt or
    # forged payload, a destroyed key) is a finding: a dataset built from this has holes.
    sys.exit(1 if tally.refused or tally.unreadable else 0)


def _check(
    run_ids: tuple[str, ...],
    since: datetime | None,
    until: datetime | None,
    agent_id: str | None,
    limit: int,
    include_forks: bool,
    archive: Path | None,
) -> None:
    selecting = since or until or agent_id or include_forks or limit != DEFAULT_LIMIT
    if run_ids and selecting:
        raise click.UsageError(f"{_SELECTING} select runs: give them or RUN_IDs, not both")
    if archive is None and selecting and since is None:
        raise click.UsageError(f"{_SELECTING} need --since (or --archive)")
    if archive is None and not run_ids and since is None:
        raise click.UsageError("give the RUN_IDs to export, or select runs with --since")
    if since is not None and until is not None and until <= since:
        raise click.UsageError("--until is not after --since: nothing could match")


def _records(
    engine: Engine, form: Format, per_call: bool, purpose: str | None, tally: ExportTally
) -> tuple[Records, Callable[[str], object] | None]:
    """How each run is written; and, with a purpose, how reading a run is put in the
    access audit (its bodies then open through the audited keys)."""
    if purpose is None:
        return partial(event_records, tally=tally), None
    reading = opening(lambda: engine, purpose=purpose)
    keys = reading.digests

    def audit(run_id: str) -> object:
        if isinstance(keys, AuditedKeys):
            return keys.request_access(run_id)
        return request_access(engine, purpose=purpose, run_id=run_id)

    pipeline, blobs = reading.pipeline, PostgresBlobs(engine)
    if form == "openai-chat":
        chat = partial(chat_examples, pipeline=pipeline, blobs=blobs, per_call=per_call)
        return partial(chat, tally=tally), audit
    return partial(event_records, pipeline=pipeline, blobs=blobs, tally=tally), audit


# Which runs --------------------------------------------------------------------------


def _runs(
    wiring: Wiring,
    engine: Engine,
    run_ids: tuple[str, ...],
    scope: RunFilter | None,
    until: datetime | None,
    archive: Path | None,
    err: Console,
    *,
    everything: bool,
) -> tuple[Iterator[RunEvents], int | None]:
    """The runs to export, each streamed, and how many (when known up front); without
    ``everything``, the events the index marks unverified are left out (a run all of
    whose events are, whole).

    Raises:
        SourceError: a run id is not indexed (before anything is written).
        NothingMatched: --since selected no run.
    """
    wanted = list(dict.fromkeys(run_ids))  # each once, in the order given
    if archive is not None:
        return _archive_runs(archive, wanted, scope, until), len(wanted) or None
    settings, index = wiring.settings, wiring.read_side.run_index(engine)
    if scope is None:
        # Every run is located before anything is written: an unknown id stops the
        # export at once.
        sources = [KafkaRunSource(settings, index, run_id) for run_id in wanted]
        runs = ((source, source) for source in sources)
        return _read(runs, err, everything=everything), len(sources)
    ids = _indexed(index, scope, until)
    return _read(_kafka_runs(settings, index, ids, until), err, everything=everything), len(ids)


def _indexed(index: RunIndex, scope: RunFilter, until: datetime | None) -> list[str]:
    ids = index.runs(
        finished_only=True,
        since=scope.since,
        agent_id=scope.agent_id,
        limit=scope.limit,
        include_forks=scope.include_forks,
    )
    if not ids:
        before = f" (and started before {until.isoformat(sep=' ')})" if until else ""
        raise nothing_matched(
            "the run index",
            scope,
            f"Check the filters{before}, and that the view consumer has caught up "
            "(blackbox consume).",
        )
    return ids


def _read(
    runs: Iterable[tuple[KafkaRunSource, Iterable[Envelope]]], err: Console, *, everything: bool
) -> Iterator[RunEvents]:
    for source, events in runs:
        if source.unverified and not everything:
            marked = source.unverified
            err.print(
                f"[yellow]warning:[/] run {safe_text(source.run_id)}: left out "
                f"{_count(len(marked), 'event')} the write side does not vouch for "
                "(--include-unverified exports them)"
            )
            if len(marked) >= source.count:
                continue  # a run the write side never recorded: nothing of it is exported
            events = (e for e in events if e.sequence not in marked)
        yield source.run_id, events
        if source.skipped:
            err.print(
                f"[yellow]warning:[/] run {safe_text(source.run_id)}: passed over "
                f"{len(source.skipped)} messages under its key that are not its events"
            )


def _kafka_runs(
    settings: Settings, index: RunIndex, ids: list[str], until: datetime | None
) -> Iterator[tuple[KafkaRunSource, Iterable[Envelope]]]:
    """The runs ``ids`` (oldest first) read from the topic, up to the first one that
    started at or after ``until``: those after it started later still."""
    for run_id in ids:
        source = KafkaRunSource(settings, index, run_id)
        events = iter(source)
        first = next(events, None)
        if first is None:
            continue
        if until is not None and first.recorded_at >= until:
            close: Callable[[], object] | None = getattr(events, "close", None)
            if close is not None:
                close()  # its consumer, now rather than when collected
            return
        yield source, chain([first], events)


def _archive_runs(
    path: Path, wanted: list[str], scope: RunFilter | None, until: datetime | None
) -> Iterator[RunEvents]:
    """The runs of an archive the export covers, one after another, each streamed."""
    selected = set(wanted)
    found: set[str] = set()
    for run_id, group in groupby(read_archive(path), key=lambda e: e.run_id):
        if selected and run_id not in selected:
            continue
        events = iter(group)
        first = next(events)
        if scope is not None and not scope.admits(first):
            continue
        if until is not None and first.recorded_at >= until:
            continue
        if scope is not None and len(found) >= scope.limit:
            return
        found.add(run_id)
        yield run_id, chain([first], events)
    if missing := [run_id for run_id in wanted if run_id not in found]:
        raise SourceError(f"runs not in archive {path}: {', '.join(missing)}; check the run ids")
    if not found:
        raise nothing_matched(
            f"archive {path}", scope or RunFilter(), "Check the filters and the archive."
        )


# Progress, output and summary --------------------------------------------------------


def _progress(
    runs: Iterator[RunEvents], total: int | None, tally: ExportTally, err: Console, *, hidden: bool
) -> Iterator[RunEvents]:
    columns = (
        TextColumn("exporting {task.fields[events]:,} events"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(
        *columns,
        console=err,
        transient=True,
        disable=hidden or not err.is_terminal,
        redirect_stdout=False,
        redirect_stderr=False,
    ) as progress:
        task = progress.add_task("export", total=total, events=0)
        for run in runs:
            yield run
            progress.update(task, advance=1, events=tally.events)


class _Closed(Exception):
    """Standard output was closed by its reader."""


class _Sink:
    """Where the lines go: standard output, or a file written beside its final name
    (owner-only: it may hold bodies) and put in place only when the export is whole."""

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._temp: Path | None = None
        self.lines = 0
        if path is None:
            self._stream: IO[bytes] = sys.stdout.buffer
            return
        try:
            fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
        except OSError as exc:
            raise click.BadParameter(
                f"cannot write beside {path}: {exc.strerror}; check that the folder exists "
                "and is writable",
                param_hint="--output",
            ) from None
        self._temp = Path(name)
        self._stream = os.fdopen(fd, "wb")

    @property
    def on_terminal(self) -> bool:
        """Whether the lines go to a terminal (then they are the progress)."""
        return self._path is None and sys.stdout.isatty()

    def write(self, line: str) -> None:
        try:
            self._stream.write(line.encode("utf-8") + b"\n")
            self.lines += 1
        except BrokenPipeError:
            # Nothing more can reach the reader; what Python flushes at exit must not
            # fail either.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise _Closed from None

    def commit(self) -> None:
        """The export is whole: put the file in place (or flush standard output)."""
        self._stream.flush()
        if self._temp is not None and self._path is not None:
            self._stream.close()
            os.replace(self._temp, self._path)
            self._temp = None

    def close(self) -> None:
        """Drop a file not committed; the output file, if there was one, is left as it was."""
        if self._temp is not None:
            self._stream.close()
            self._temp.unlink(missing_ok=True)
            self._temp = None


def _not_written(output: Path | None, lines: int) -> str:
    if output is not None:
        return f"nothing was written to {safe_text(output)} (left as it was)"
    if not lines:
        return "nothing was written"
    return f"the {_count(lines, 'line')} written before are not a whole export"


def _count(number: int, thing: str, things: str | None = None) -> str:
    return f"{number:,} {thing if number == 1 else things or thing + 's'}"


def _summary(
    tally: ExportTally,
    form: Format,
    *,
    bodies: bool,
    per_call: bool,
    output: Path | None,
    err: Console,
) -> None:
    where = safe_text(output) if output is not None else "standard output"
    runs = _count(tally.runs, "run")
    if form == "openai-chat":
        each = "LLM call" if per_call else "conversation"
        err.print(
            f"{_count(tally.examples, 'example')} (one per {each}) from "
            f"{_count(tally.llm_calls, 'LLM call')} in {runs} written to {where}"
        )
        if tally.skipped:
            reasons = ", ".join(f"{n:,} {why}" for why, n in sorted(tally.skipped.items()))
            err.print(f"skipped {_count(tally.skipped.total(), 'LLM call')}: {reasons}")
    else:
        what = "with their bodies" if bodies else "metadata only, no bodies"
        err.print(f"{_count(tally.events, 'event')} of {runs} ({what}) written to {where}")
        if tally.unreadable:
            err.print(
                f"[yellow]{_count(tally.unreadable, 'body', 'bodies')} could not be opened[/]: "
                "written as null, with body_unavailable saying why"
            )
        if tally.forgotten:
            err.print(
                f"{_count(tally.forgotten, 'body', 'bodies')} forgotten (data key destroyed by "
                "retention or a deletion request): written as null, with body_unavailable"
            )
    if tally.refused:
        err.print(
            f"[red]{_count(tally.refused, 'body', 'bodies')} refused[/]: plaintext in a run sealed "
            "under a data key, not written by the run's recorder (see "
            "blackbox_views.integrity_violations)"
        )
    for problem in tally.problems:
        err.print(f"  {safe_text(problem)}")
