"""Experiments on recorded runs: make a variant of each run, score both, keep the results.

For each recorded run the :class:`Experimenter` reads the run, makes its variant (a
:class:`ForkVariant`: the agent run again from the run's input snapshot with a changed
model, prompt, code or entry point, tools answered from the recording while the fork
asks what the run asked and live after, effects sandboxed; or a
:class:`ReexecuteVariant`: the run's LLM requests re-sent to another model or provider,
through a request mapper where the API differs) and scores both with the evaluators
(``_evaluators.py``). :func:`run_experiment` does that for every run of an
:class:`ExperimentPlan`, a few at a time, handing each result to an
:class:`ExperimentStore` as it comes (the read side keeps them in its views), and sums
them up (``_experiment_stats.py``).

A run whose variant cannot be made (its events cannot be read, the factory fails, a
tool call cannot be answered) is a result of its own, ``not_run``, and the experiment
goes on; so is one an evaluator fails on (``evaluator_failed``, the other evaluators'
scores kept).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol
from urllib.parse import urlsplit, urlunsplit

from sqlalchemy import Engine

from agent_blackbox.keystore import DataKeyStore
from agent_blackbox.replayer._access import Opening
from agent_blackbox.replayer._evaluators import ScorePair, Scorer, score_run
from agent_blackbox.replayer._experiment_stats import (
    METHOD,
    Regression,
    ScoreSummary,
    regressions,
    summarize,
)
from agent_blackbox.replayer._fork import ForkFactory, ToolMode, fork_run
from agent_blackbox.replayer._opening import BlobReader
from agent_blackbox.replayer._outcomes import (
    LlmCall,
    Outcome,
    Pricing,
    forked_outcome,
    priced,
    recorded_outcome,
)
from agent_blackbox.replayer._reexecute import (
    RequestMapper,
    _mapped,
    _with_stream_usage,
    api_of,
    endpoints_for,
    route,
)
from agent_blackbox.schemas import TAG_PREFIX, Envelope, EventType, Settings

RunOutcome = Literal["scored", "not_run", "evaluator_failed"]
_LABELS = ("model", "code_version")


@dataclass(frozen=True, slots=True)
class ForkVariant:
    """The variant as a fork of each run: the agent built by ``factory`` from the run's
    snapshot with ``changes`` applied, calling the model at ``base_url``.

    ``tools`` says how its tool calls are answered (from the recording while they are
    the run's, live from the first that differs, by default); its effects are
    sandboxed (written down, never sent) or refused. ``in_memory`` records the forks in
    memory only, not as runs of their own.
    """

    factory: ForkFactory
    factory_name: str
    base_url: str
    api_key: str = field(repr=False)
    changes: Mapping[str, str] = field(default_factory=dict)
    tools: ToolMode = "recorded-then-live"
    effects: Literal["refuse", "sandbox"] = "sandbox"
    in_memory: bool = False

    def describe(self) -> dict[str, Any]:
        """What the variant is, for the reader: no key, and no free text (a change that
        is not a label is shown as its digest and length)."""
        return {
            "kind": "fork",
            "agent": self.factory_name,
            "changes": shown_changes(self.changes),
            "base_url": shown_url(self.base_url),
            "tools": self.tools,
            "effects": self.effects,
            "forks_recorded": "in memory" if self.in_memory else "as runs",
        }


@dataclass(frozen=True, slots=True)
class ReexecuteVariant:
    """The variant as the run's LLM requests re-sent (the agent is not run): to
    ``base_url`` (or one per API), speaking the API of each call or ``api``. Every
    request goes through ``request_mapper`` when there is one (to change its model or
    wording, or turn it into a request of the endpoint's other API); a call of another
    API than the endpoint's needs one."""

    base_url: str | Mapping[str, str]
    api_keys: Mapping[str, str] = field(repr=False)
    api: str | None = None
    request_mapper: RequestMapper | None = None
    mapper_name: str | None = None

    def describe(self) -> dict[str, Any]:
        urls = (
            shown_url(self.base_url)
            if isinstance(self.base_url, str)
            else {k: shown_url(v) for k, v in self.base_url.items()}
        )
        return {
            "kind": "reexecute",
            "base_url": urls,
            "api": self.api or "each call's own",
            "request_mapper": self.mapper_name,
        }


Variant = ForkVariant | ReexecuteVariant


def shown_changes(changes: Mapping[str, str]) -> dict[str, str]:
    """``changes`` as they may be shown to any reader: a model, a code version, a tag or
    a flag as given; anything else (a prompt) as ``sha256:<12 hex> (N characters)``."""
    shown = {}
    for key, value in changes.items():
        if key in _LABELS or key.startswith((TAG_PREFIX, "flag.")):
            shown[key] = value
        else:
            digest = hashlib.sha256(value.encode("utf-8")).hexdigest()[:12]
            shown[key] = f"sha256:{digest} ({len(value)} characters)"
    return shown


def shown_url(url: str) -> str:
    """``url`` without a user, password or query (where credentials may hide)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = host + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


@dataclass(frozen=True, slots=True)
class SelectedRun:
    """A recorded run an experiment covers."""

    run_id: str
    tenant_id: str


@dataclass(frozen=True, slots=True)
class ExperimentPlan:
    """What an experiment runs on and how it is summed up."""

    experiment_id: str
    name: str
    runs: tuple[SelectedRun, ...]
    selection: Mapping[str, Any]
    """How the runs were chosen (filters, or a dataset), for the reader."""
    variant: Mapping[str, Any]
    """The variant's :meth:`ForkVariant.describe`."""
    evaluators: tuple[str, ...]
    confidence: float = 0.95
    tolerances: Mapping[str, float] = field(default_factory=dict)
    """Score → how much worse a run's variant may do before it is a regression."""
    dataset: str | None = None

    @property
    def tenants(self) -> list[str]:
        return sorted({run.tenant_id for run in self.runs})


@dataclass(frozen=True, slots=True)
class ScoreRow:
    """One score of one run, both sides (what the summary is computed from)."""

    run_id: str
    score: str
    evaluator: str
    lower_is_better: bool
    baseline: float | None
    variant: float | None


@dataclass(frozen=True, slots=True)
class RunResult:
    """What an experiment made of one recorded run."""

    run_id: str
    tenant_id: str
    outcome: RunOutcome
    fork_run_id: str | None = None
    fork_status: str | None = None
    """The variant's status (``succeeded``, ``failed``); None when it was not made."""
    error: str | None = None
    """Why it was not scored (or not wholly), in full: for the one who ran it."""
    scores: tuple[ScorePair, ...] = ()
    reason: str | None = None
    """Why, as the views keep it: the kind of failure, never a message that may quote
    recorded content (an agent's exception, an evaluator's)."""

    def rows(self) -> list[ScoreRow]:
        return [
            ScoreRow(self.run_id, p.score, p.evaluator, p.lower_is_better, p.baseline, p.variant)
            for p in self.scores
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "outcome": self.outcome,
            "fork_run_id": self.fork_run_id,
            "fork_status": self.fork_status,
            "error": self.error,
            "reason": self.reason,
            "scores": {
                p.score: {"baseline": p.baseline, "variant": p.variant} for p in self.scores
            },
        }


class ExperimentStore(Protocol):
    """Where an experiment's plan and results are kept (the read side's
    ``ViewExperiments``)."""

    def begin(self, plan: ExperimentPlan) -> None:
        """Keep the plan, before any run is scored."""
        ...

    def record(self, experiment_id: str, result: RunResult) -> None:
        """Keep one run's result."""
        ...

    def end(self, experiment_id: str, status: str) -> None:
        """Mark the experiment ``finished``, ``interrupted`` or ``failed``."""
        ...


RunEvents = Callable[[str], Sequence[Envelope]]
"""Reads a recorded run's events by its id (from the topic, an archive, memory)."""


@dataclass(frozen=True, slots=True)
class Experimenter:
    """Makes and scores the variant of one recorded run at a time; safe to call from
    several threads at once.

    Args:
        variant: what to change.
        scorers: the evaluators.
        events: reads a recorded run.
        reading: opens the recorded bodies (with the purpose stated for them).
        pricing: puts a price on each LLM call (cost stays unknown without it).
        blobs: reads bodies stored out of line.
        engine: the database forks are recorded into (unless the variant keeps them
            in memory).
        settings: the recorder's settings for forks.
        keys: the data keys forks are sealed with.
    """

    variant: Variant
    scorers: tuple[Scorer, ...]
    events: RunEvents
    reading: Opening
    pricing: Pricing | None = None
    blobs: BlobReader | None = None
    engine: Engine | None = None
    settings: Settings | None = None
    keys: DataKeyStore | None = None

    def run(self, selected: SelectedRun) -> RunResult:
        """The result of one run; never raises for a problem of the run's own."""
        run_id, tenant = selected.run_id, selected.tenant_id
        try:
            events = list(self.events(run_id))
            baseline = recorded_outcome(
                events, pipeline=self.reading.pipeline, pricing=self.pricing, blobs=self.blobs
            )
            variant, fork_id = self._variant(events, baseline)
        except Exception as exc:  # the run's own problem (the factory's code, a source)
            return RunResult(run_id, tenant, "not_run", error=_failure(exc), reason=_reason(exc))
        scored = score_run(self.scorers, baseline, variant)
        if not scored.errors:
            return RunResult(run_id, tenant, "scored", fork_id, variant.status, None, scored.pairs)
        reason = f"evaluators failed: {', '.join(scored.failed)}; the messages are not kept"
        error = "; ".join(scored.errors)
        return RunResult(
            run_id, tenant, "evaluator_failed", fork_id, variant.status, error, scored.pairs, reason
        )

    def _variant(self, events: list[Envelope], baseline: Outcome) -> tuple[Outcome, str | None]:
        if isinstance(self.variant, ReexecuteVariant):
            return self._reexecuted(events, baseline), None
        v = self.variant
        result = fork_run(
            events,
            v.factory,
            changes=v.changes,
            base_url=v.base_url,
            api_key=v.api_key,
            tools=v.tools,
            effects=v.effects,
            engine=None if v.in_memory else self.engine,
            settings=self.settings,
            pipeline=self.reading.pipeline,
            keys=None if v.in_memory else self.keys,
            digests=self.reading.digests,
        )
        if result.unrecorded_tool is not None:
            raise _NotRun(result.unrecorded_tool)
        return forked_outcome(result, events[0], pricing=self.pricing), result.run_id

    def _reexecuted(self, events: list[Envelope], baseline: Outcome) -> Outcome:
        assert isinstance(self.variant, ReexecuteVariant)
        v = self.variant
        send = endpoints_for(events, v.base_url, api_key=v.api_keys, api=v.api)
        calls = [e for e in events if e.event_type == EventType.LLM_CALL]
        fresh = [
            self._resent(envelope, recorded, send, v.request_mapper)
            for envelope, recorded in zip(calls, baseline.llm_calls, strict=True)
        ]
        failed = any(call.error is not None for call in fresh)
        return Outcome(
            run_id=baseline.run_id,
            status="failed" if failed else "succeeded",
            llm_calls=tuple(fresh),
            input=baseline.input,
            has_output=False,
        )

    def _resent(
        self, envelope: Envelope, recorded: LlmCall, send: Any, mapper: RequestMapper | None
    ) -> LlmCall:
        """The recorded call sent again (kept as recorded when it has no request to send
        or its answer is not a reply: an embeddings call)."""
        if recorded.request is None:
            return recorded  # kept truncated: there is nothing to send
        if recorded.response is not None and not recorded.answer["text"]:
            return recorded  # no choices: not a reply (an embeddings call)
        target, api, _ = route(envelope.sequence, recorded.provider, send, request_mapper=mapper)
        # Here the mapper is the variant: every request goes through it (a model changed,
        # a prompt reworded), not only those of the endpoint's other API.
        request = dict(_mapped(envelope.sequence, recorded.request, mapper))
        if request.get("stream"):
            request = _with_stream_usage(request, api)
        provider = recorded.provider if api == api_of(recorded.provider) else api
        model = str(request.get("model") or recorded.model)
        started = time.perf_counter()
        try:
            answer: Mapping[str, Any] | None = dict(target(request))
            error = None
        except Exception as exc:  # the endpoint's failure is the variant's result
            answer, error = None, _failure(exc)
        took = (time.perf_counter() - started) * 1000
        call = LlmCall(provider, model, request, answer, error, took)
        return priced(call, self.pricing)


class _NotRun(Exception):
    """The variant could not be made as asked (the message says why)."""


def _failure(exc: BaseException) -> str:
    if isinstance(exc, _NotRun):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def _reason(exc: BaseException) -> str:
    """What the views keep of why a run was not run: the message only when this code
    wrote it without values; else the exception's class."""
    if isinstance(exc, _NotRun):
        return str(exc)
    return f"{type(exc).__name__}; the message is not kept (blackbox experiment run shows it)"


@dataclass(frozen=True, slots=True)
class ExperimentReport:
    """An experiment's results and their summary."""

    plan: ExperimentPlan
    results: tuple[RunResult, ...]
    status: str
    """``finished``, ``interrupted`` or ``failed`` (``running`` while it runs)."""
    planned: int | None = None
    """The runs it was to cover, when not all of them are in ``plan.runs``."""

    @classmethod
    def kept(cls, experiment: Any, results: Iterable[Any]) -> ExperimentReport:
        """The report of an experiment as the read side keeps it (its
        ``ExperimentRow`` and ``KeptResult`` rows), summed up as when it ran."""
        found = tuple(
            RunResult(
                r.run_id,
                r.tenant_id,
                r.outcome,
                r.fork_run_id,
                r.fork_status,
                r.reason,
                reason=r.reason,
                scores=tuple(
                    ScorePair(s.score, s.evaluator, s.lower_is_better, s.baseline, s.variant)
                    for s in r.scores
                ),
            )
            for r in results
        )
        plan = ExperimentPlan(
            experiment_id=experiment.experiment_id,
            name=experiment.name,
            runs=tuple(SelectedRun(r.run_id, r.tenant_id) for r in found),
            selection=experiment.selection,
            variant=experiment.variant,
            evaluators=tuple(experiment.evaluators),
            confidence=experiment.confidence,
            tolerances=experiment.tolerances,
            dataset=experiment.dataset,
        )
        return cls(plan, found, experiment.status, experiment.planned)

    @property
    def rows(self) -> list[ScoreRow]:
        return [row for result in self.results for row in result.rows()]

    @property
    def summaries(self) -> list[ScoreSummary]:
        return summarize(
            self.rows, confidence=self.plan.confidence, tolerances=self.plan.tolerances
        )

    @property
    def regressions(self) -> list[Regression]:
        return regressions(self.rows, tolerances=self.plan.tolerances)

    def counts(self) -> dict[str, int]:
        """Runs by what became of them: ``scored``, ``not_run``, ``evaluator_failed``,
        and how many variants ``failed``."""
        planned = len(self.plan.runs) if self.planned is None else self.planned
        found = {"runs": planned, "scored": 0, "not_run": 0, "evaluator_failed": 0}
        for result in self.results:
            found[result.outcome] += 1
        found["variant_failed"] = sum(r.fork_status == "failed" for r in self.results)
        return found

    def exit_code(self, *, fail_on_regression: bool) -> int:
        """1 when asked to fail on a regression and one was found; else 2 when the
        experiment did not finish, or a run could not be made or scored; else 0."""
        if fail_on_regression and self.regressions:
            return 1
        counts = self.counts()
        incomplete = counts["not_run"] or counts["evaluator_failed"] or not self.results
        return 2 if self.status != "finished" or incomplete else 0

    def to_dict(self, *, fail_on_regression: bool = False) -> dict[str, Any]:
        plan = self.plan
        return {
            "experiment_id": plan.experiment_id,
            "name": plan.name,
            "status": self.status,
            "dataset": plan.dataset,
            "selection": dict(plan.selection),
            "variant": dict(plan.variant),
            "evaluators": list(plan.evaluators),
            "confidence": plan.confidence,
            "method": METHOD,
            "tolerances": dict(plan.tolerances),
            "runs": self.counts(),
            "scores": [s.to_dict() for s in self.summaries],
            "regressions": [r.to_dict() for r in self.regressions],
            "not_scored": [
                {"run_id": r.run_id, "outcome": r.outcome, "error": r.error}
                for r in self.results
                if r.outcome != "scored"
            ],
            "results": [r.to_dict() for r in sorted(self.results, key=lambda r: r.run_id)],
            "exit_code": self.exit_code(fail_on_regression=fail_on_regression),
        }


def run_experiment(
    plan: ExperimentPlan,
    experimenter: Experimenter,
    store: ExperimentStore,
    *,
    workers: int = 4,
    done: Callable[[RunResult], object] | None = None,
) -> ExperimentReport:
    """Run ``plan``: every run's variant made and scored by ``experimenter``, ``workers``
    at a time, each result kept in ``store`` as it comes and handed to ``done`` (a
    progress bar). An interruption (Ctrl-C) marks the experiment ``interrupted`` in the
    store and goes on; a store that fails marks it ``failed`` if it can, and raises.

    Raises:
        BlackboxError: the store could not keep the plan or a result.
    """
    store.begin(plan)
    results: list[RunResult] = []
    status = "failed"
    try:
        for result in _each(plan.runs, experimenter, workers):
            store.record(plan.experiment_id, result)
            results.append(result)
            if done is not None:
                done(result)
        status = "finished"
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        store.end(plan.experiment_id, status)
    return ExperimentReport(plan, tuple(results), status)


def _each(
    runs: Iterable[SelectedRun], experimenter: Experimenter, workers: int
) -> Iterator[RunResult]:
    """Each run's result, as the runs finish (several at once: each waits on a model)."""
    pool = ThreadPoolExecutor(max(1, workers), thread_name_prefix="experiment")
    try:
        pending: list[Future[RunResult]] = [pool.submit(experimenter.run, r) for r in runs]
        for future in as_completed(pending):
            yield future.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def describe_selection(filters: Mapping[str, Any]) -> str:
    """A selection in words: ``agent=ticket-agent, tag.prompt_version=v1, limit=50``."""
    return ", ".join(f"{k}={v}" for k, v in filters.items() if v not in (None, (), [], {}))
