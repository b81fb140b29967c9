"""Replaying recorded runs one after another, as ``blackbox replay`` does: each run's
result, the batch's summary and its exit status.

A run that cannot be replayed (its source cannot be read, its agent's code does not
import, a key is missing) is a result of its own, ``ERROR``, and the batch goes on; a run
whose agent has no entry point at all is ``SKIPPED``. Only divergences are findings.

The ``--json`` form of both is one JSON-lines stream (documented in
``docs/reference/replay-json.md``): a ``run`` line per run as it finishes, then one
``summary`` line.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from agent_blackbox.replayer._access import Opening
from agent_blackbox.replayer._driver import replay_run
from agent_blackbox.replayer._history import SkippedMessage
from agent_blackbox.replayer._kept import kept_values
from agent_blackbox.replayer._opening import BlobReader
from agent_blackbox.replayer._registry import AgentRegistry, MissingEntryPoint
from agent_blackbox.replayer._report import ReplayReport
from agent_blackbox.replayer._sandbox import NondeterminismPolicy
from agent_blackbox.schemas import BlackboxError, Envelope

DEFAULT_LIMIT = 100_000

EXIT_PASSED = 0
EXIT_DIVERGED = 1
EXIT_NOT_RUN = 2


OpenedRun = tuple[Iterable[Envelope], str | None]
"""A run's events (streamed) and the id of the agent that recorded it."""


class NothingMatched(BlackboxError):
    """``replay --all`` found no run to replay."""


@dataclass(frozen=True, slots=True)
class RunFilter:
    """Which recorded runs ``replay --all`` covers (finished runs only)."""

    agent_id: str | None = None
    since: datetime | None = None
    limit: int = DEFAULT_LIMIT
    include_forks: bool = False
    """Forks (runs whose ``run.started`` names a parent) are left out unless asked for."""
    random: bool = False
    """A random draw of ``limit`` runs, not the oldest (needs the run index)."""

    def describe(self) -> str:
        """The filter in words, for messages and the summary: ``finished runs of agent
        'a' started since 2026-12-01 00:00:00, at most 10, forks excluded``."""
        words = "finished runs"
        if self.agent_id is not None:
            words += f" of agent {self.agent_id!r}"
        if self.since is not None:
            words += f" started since {self.since.isoformat(sep=' ')}"
        if self.limit != DEFAULT_LIMIT or self.random:
            words += f", {'a random draw of' if self.random else 'at most'} {self.limit}"
        return words + (", forks included" if self.include_forks else ", forks excluded")

    def admits(self, first: Envelope) -> bool:
        """Whether a run, judged by its first envelope (``run.started``), is covered.

        Archives hold whole runs, so every run in one counts as finished.
        """
        if self.agent_id is not None and first.agent_id != self.agent_id:
            return False
        if not self.include_forks and first.attributes.get("parent_run_id"):
            return False
        if self.since is None:
            return True
        since = self.since if self.since.tzinfo else self.since.replace(tzinfo=UTC)
        return first.recorded_at >= since


def nothing_matched(where: str, scope: RunFilter, hint: str) -> NothingMatched:
    """The error of a batch that found no run: what was looked for, where, what to try."""
    forks = "" if scope.include_forks else " (--include-forks adds forks)"
    return NothingMatched(f"nothing matched in {where}: no {scope.describe()}{forks}. {hint}")


def failure(exc: BaseException) -> str:
    """How a report states an error: ``ExceptionName: message``."""
    return f"{type(exc).__name__}: {exc}"


@dataclass(slots=True)
class _Watched:
    """A run's events, remembering a read failure even if the agent's code caught it."""

    events: Iterable[Envelope]
    failed: BlackboxError | None = None
    first: Envelope | None = None
    """The run's first event read (its tenant and data key)."""

    def __iter__(self) -> Iterator[Envelope]:
        try:
            for envelope in self.events:
                if self.first is None:
                    self.first = envelope
                yield envelope
        except BlackboxError as exc:
            self.failed = exc
            raise


_FAILING = ("DIVERGED", "NONDETERMINISTIC", "ERROR")
"""Results listed among the failing runs."""


@dataclass(frozen=True, slots=True)
class Replaying:
    """How each run is replayed (see :func:`~agent_blackbox.replayer.replay_run`)."""

    nondeterminism: NondeterminismPolicy = "warn"
    agent_modules: tuple[str, ...] = ()
    reveal_values: bool = False
    allow_network: bool = False


@dataclass(frozen=True, slots=True)
class BatchReplayer:
    """Replays runs one by one, turning every setup or access problem into the run's
    ``ERROR`` result (and a missing entry point into ``SKIPPED`` when ``skip_unknown``).

    Args:
        registry: which code replays which agent.
        reading: the payload pipeline and digest keys.
        blobs: reads bodies stored out of line (None: such runs are errors).
        skip_unknown: a batch skips runs of agents without an entry point; a single
            replay reports them as errors.
        how: the replay's options.
    """

    registry: AgentRegistry
    reading: Opening
    blobs: BlobReader | None = None
    skip_unknown: bool = True
    how: Replaying = Replaying()

    def replay(self, run_id: str, source: Callable[[], OpenedRun]) -> ReplayReport:
        """Replay one run; never raises for a problem of the run's own. The report says
        how long opening and replaying it took.

        Args:
            run_id: the run's id, named in the report whatever happens.
            source: opens the run: its events and its agent (opening may fail; the run
                is then an error).
        """
        started = time.perf_counter()
        report = self._replay(run_id, source)
        return replace(report, duration_ms=(time.perf_counter() - started) * 1000)

    def _replay(self, run_id: str, source: Callable[[], OpenedRun]) -> ReplayReport:
        try:
            events, agent = source()
        except BlackboxError as exc:
            return ReplayReport(run_id, None, 0, error=failure(exc))
        try:
            entry = self.registry.resolve(agent)
        except MissingEntryPoint as exc:
            if self.skip_unknown:
                return ReplayReport(run_id, agent, 0, skipped=str(exc))
            return ReplayReport(run_id, agent, 0, error=failure(exc))
        except BlackboxError as exc:
            return ReplayReport(run_id, agent, 0, error=failure(exc))
        watched = _Watched(events)
        try:
            report = replay_run(
                watched,
                entry,
                pipeline=self.reading.pipeline,
                digests=self.reading.digests,
                blobs=self.blobs,
                agent_id=agent,
                nondeterminism=self.how.nondeterminism,
                agent_modules=self.how.agent_modules,
                reveal_values=self.how.reveal_values,
                allow_network=self.how.allow_network,
            )
        except BlackboxError as exc:
            report = ReplayReport(run_id, agent, 0, error=failure(exc))
        if watched.failed is not None:
            # A source that failed mid-run explains whatever the replay saw after it.
            report = ReplayReport(run_id, agent, report.events, error=failure(watched.failed))
        if report.run_id != run_id:
            report = replace(report, run_id=run_id)
        return self._with_values(report, watched.first)

    def _with_values(self, report: ReplayReport, run: Envelope | None) -> ReplayReport:
        """``report`` with the values behind its divergence, to be kept for a purpose;
        a replay that cannot seal them keeps none (its result says so all the same)."""
        if report.divergence is None:
            return report
        try:
            kept = kept_values(report.divergence, run, self.reading.keys)
        except BlackboxError:
            return report
        return replace(report, kept=kept)


@dataclass(slots=True)
class Tally:
    """The batch summary, built run by run (reports are not kept)."""

    filters: str | None = None
    """What ``--all`` covered, in words; None for a single run."""
    results: Counter[str] = field(default_factory=Counter)
    kinds: Counter[str] = field(default_factory=Counter)
    positions: list[int] = field(default_factory=list)
    failing: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)
    """Failing or skipped run id → why, in a few words."""
    unreadable: list[SkippedMessage] = field(default_factory=list)
    """Messages of the topic passed over because they are not events (reported, not
    findings of a replay: the run's own events were all read)."""
    recorded_failed: int = 0
    """Runs whose recording had failed (``run.finished`` status ``failed``), whatever
    their replay found."""
    passed_recorded_failed: int = 0
    """Of the passed runs, those that reproduced a failed recording."""

    def add(self, report: ReplayReport) -> None:
        self.results[report.result] += 1
        if report.recorded_failed:
            self.recorded_failed += 1
            if report.passed:
                self.passed_recorded_failed += 1
        if report.divergence is not None:
            self.kinds[str(report.divergence.kind)] += 1
            self.positions.append(report.divergence.sequence)
            self.reasons[report.run_id] = report.divergence.describe()
        if report.result in _FAILING:
            self.failing.append(report.run_id)
        if report.result == "NONDETERMINISTIC":
            self.reasons[report.run_id] = "; ".join(n.describe() for n in report.nondeterminism)
        if report.error is not None:
            self.reasons[report.run_id] = report.error
        if report.skipped is not None:
            self.skipped.append(report.run_id)
            self.reasons[report.run_id] = report.skipped

    @property
    def runs(self) -> int:
        return sum(self.results.values())

    @property
    def passed(self) -> int:
        return self.results["PASS"] + self.results["LIMITED"]

    def exit_code(self, *, error: str | None = None) -> int:
        """1 when a run diverged or read nondeterminism that fails it (a finding, whatever
        else happened); else 2 when the command could not run, nothing was replayed, or a
        run was an error or skipped; else 0."""
        if self.results["DIVERGED"] or self.results["NONDETERMINISTIC"]:
            return EXIT_DIVERGED
        if error is not None or self.runs == 0 or self.results["ERROR"] or self.skipped:
            return EXIT_NOT_RUN
        return EXIT_PASSED

    def line(self, *, error: str | None = None) -> dict[str, Any]:
        """The ``summary`` line of the JSON-lines stream."""
        runs = self.runs
        return {
            "type": "summary",
            "runs": runs,
            "passed": self.passed,
            "limited": self.results["LIMITED"],
            "diverged": self.results["DIVERGED"],
            "nondeterministic": self.results["NONDETERMINISTIC"],
            "errors": self.results["ERROR"],
            "skipped": self.results["SKIPPED"],
            "pass_rate": self.passed / runs if runs else None,
            "recorded_failed": self.recorded_failed,
            "passed_recorded_failed": self.passed_recorded_failed,
            "divergence_kinds": dict(sorted(self.kinds.items())),
            "first_divergence_sequence": {
                "min": min(self.positions, default=None),
                "median": statistics.median(self.positions) if self.positions else None,
                "max": max(self.positions, default=None),
            },
            "failing_run_ids": list(self.failing),
            "skipped_run_ids": list(self.skipped),
            "skipped_messages": [m.to_dict() for m in self.unreadable],
            "filters": self.filters,
            "error": error,
            "exit_code": self.exit_code(error=error),
        }


def run_line(report: ReplayReport) -> dict[str, Any]:
    """The ``run`` line of the JSON-lines stream."""
    return {"type": "run", **report.to_dict()}
