"""The read side's keeping of experiments (the replayer's ``ExperimentStore`` port), and
reading them back for the console and ``blackbox experiment show``.

An experiment's row says what it ran on and how; a row per recorded run says what
became of its variant; a row per run and score holds both sides' scores. Only numbers
and labels are kept: no body, no output, no prompt text.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, Protocol

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import SQLAlchemyError

from agent_blackbox.consumers._errors import ViewStoreUnavailable
from agent_blackbox.consumers._prices import PriceTable, TokenCounts
from agent_blackbox.schemas import cache_write_tokens, driver_cause, llm_usage

# What is kept of a plan, a result and its scores (the replayer's ExperimentPlan,
# RunResult and ScorePair have these; the read side does not import the replayer).


class _Run(Protocol):
    @property
    def run_id(self) -> str: ...
    @property
    def tenant_id(self) -> str: ...


class _Plan(Protocol):
    @property
    def experiment_id(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def dataset(self) -> str | None: ...
    @property
    def selection(self) -> Mapping[str, Any]: ...
    @property
    def variant(self) -> Mapping[str, Any]: ...
    @property
    def evaluators(self) -> tuple[str, ...]: ...
    @property
    def confidence(self) -> float: ...
    @property
    def tolerances(self) -> Mapping[str, float]: ...
    @property
    def runs(self) -> Sequence[_Run]: ...
    @property
    def tenants(self) -> list[str]: ...


class _Score(Protocol):
    @property
    def score(self) -> str: ...
    @property
    def evaluator(self) -> str: ...
    @property
    def lower_is_better(self) -> bool: ...
    @property
    def baseline(self) -> float | None: ...
    @property
    def variant(self) -> float | None: ...


class _Result(Protocol):
    @property
    def run_id(self) -> str: ...
    @property
    def tenant_id(self) -> str: ...
    @property
    def outcome(self) -> str: ...
    @property
    def fork_run_id(self) -> str | None: ...
    @property
    def fork_status(self) -> str | None: ...
    @property
    def reason(self) -> str | None: ...
    @property
    def scores(self) -> Sequence[_Score]: ...


_BEGIN = text(
    """
    INSERT INTO blackbox_views.experiments
        (experiment_id, name, dataset, selection, variant, evaluators, confidence,
         tolerances, tenants, runs)
    VALUES (:experiment_id, :name, :dataset, CAST(:selection AS jsonb),
            CAST(:variant AS jsonb), :evaluators, :confidence, CAST(:tolerances AS jsonb),
            :tenants, :runs)
    """
)
_RUN = text(
    """
    INSERT INTO blackbox_views.experiment_runs
        (experiment_id, run_id, tenant_id, fork_run_id, outcome, fork_status, reason)
    VALUES (:experiment_id, :run_id, :tenant_id, :fork_run_id, :outcome, :fork_status, :reason)
    """
)
_SCORE = text(
    """
    INSERT INTO blackbox_views.experiment_scores
        (experiment_id, run_id, tenant_id, score, evaluator, lower_is_better, baseline, variant)
    VALUES (:experiment_id, :run_id, :tenant_id, :score, :evaluator, :lower_is_better,
            :baseline, :variant)
    """
)
_END = text(
    "UPDATE blackbox_views.experiments SET status = :status, finished_at = now() "
    "WHERE experiment_id = :experiment_id"
)


class ViewExperiments:
    """Keeps experiments in ``blackbox_views`` (as the replayer role: a role keeps only
    runs of its granted tenants)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def begin(self, plan: _Plan) -> None:
        """Keep the plan.

        Raises:
            ViewStoreUnavailable: the database refused it.
        """
        params = {
            "experiment_id": plan.experiment_id,
            "name": plan.name,
            "dataset": plan.dataset,
            "selection": json.dumps(dict(plan.selection), sort_keys=True, default=str),
            "variant": json.dumps(dict(plan.variant), sort_keys=True, default=str),
            "evaluators": list(plan.evaluators),
            "confidence": plan.confidence,
            "tolerances": json.dumps(dict(plan.tolerances), sort_keys=True),
            "tenants": plan.tenants,
            "runs": len(plan.runs),
        }
        self._write(f"experiment {plan.experiment_id}", [(_BEGIN, params)])

    def record(self, experiment_id: str, result: _Result) -> None:
        """Keep one run's result and its scores, in one transaction.

        Raises:
            ViewStoreUnavailable: the database refused them.
        """
        run = {
            "experiment_id": experiment_id,
            "run_id": result.run_id,
            "tenant_id": result.tenant_id,
            "fork_run_id": result.fork_run_id,
            "outcome": result.outcome,
            "fork_status": result.fork_status,
            "reason": None if result.reason is None else result.reason[:2000],
        }
        scores = [
            {
                "experiment_id": experiment_id,
                "run_id": result.run_id,
                "tenant_id": result.tenant_id,
                "score": s.score,
                "evaluator": s.evaluator,
                "lower_is_better": s.lower_is_better,
                "baseline": s.baseline,
                "variant": s.variant,
            }
            for s in result.scores
        ]
        writes: list[tuple[Any, Any]] = [(_RUN, run)]
        if scores:
            writes.append((_SCORE, scores))
        self._write(f"the result of run {result.run_id}", writes)

    def end(self, experiment_id: str, status: str) -> None:
        """Mark the experiment ``status`` (``finished``, ``interrupted``, ``failed``).

        Raises:
            ViewStoreUnavailable: the database refused it.
        """
        params = {"experiment_id": experiment_id, "status": status}
        self._write(f"the end of experiment {experiment_id}", [(_END, params)])

    def _write(self, what: str, writes: Iterable[tuple[Any, Any]]) -> None:
        try:
            with self._engine.begin() as conn:
                for statement, params in writes:
                    conn.execute(statement, params)
        except SQLAlchemyError as exc:
            cause = driver_cause(exc)
            raise ViewStoreUnavailable(
                f"cannot keep {what}: {cause}. Check that the views are migrated "
                "(blackbox migrate) and that this login has the blackbox_replayer role"
            ) from exc


@dataclass(frozen=True, slots=True)
class ExperimentRow:
    """An experiment as kept: what it ran on and how, and how far it got."""

    experiment_id: str
    name: str
    dataset: str | None
    selection: dict[str, Any]
    variant: dict[str, Any]
    evaluators: tuple[str, ...]
    confidence: float
    tolerances: dict[str, float]
    tenants: list[str]
    runs: tuple[_KeptRun, ...]
    """The runs it covers (those scored so far, while it runs)."""
    planned: int
    status: str
    created_at: datetime
    created_by: str
    finished_at: datetime | None


@dataclass(frozen=True, slots=True)
class _KeptRun:
    run_id: str
    tenant_id: str


@dataclass(frozen=True, slots=True)
class KeptResult:
    """One run's result as kept."""

    run_id: str
    tenant_id: str
    outcome: str
    fork_run_id: str | None
    fork_status: str | None
    reason: str | None
    """Why it was not scored (or not wholly): the kind of failure only."""
    scores: tuple[KeptScore, ...]


@dataclass(frozen=True, slots=True)
class KeptScore:
    """One run's score as kept (both sides)."""

    run_id: str
    score: str
    evaluator: str
    lower_is_better: bool
    baseline: float | None
    variant: float | None


@dataclass(frozen=True, slots=True)
class KeptExperiment:
    """An experiment and every result of it the caller may see."""

    experiment: ExperimentRow
    results: tuple[KeptResult, ...]


STALLED_AFTER_MINUTES = 15
"""An experiment still ``running`` that has kept no run's result for this long is shown
``stalled``: the process that ran it was killed, or is stuck (one fork takes seconds to
a few minutes)."""
_HEADER = f"""
    SELECT experiment_id, name, dataset, selection, variant, evaluators, confidence,
           tolerances, tenants, runs,
           CASE WHEN status = 'running' AND coalesce(
                    (SELECT max(r.scored_at) FROM blackbox_views.experiment_runs r
                      WHERE r.experiment_id = e.experiment_id), created_at)
                    < now() - interval '{STALLED_AFTER_MINUTES} minutes'
                THEN 'stalled' ELSE status END,
           created_at, created_by, finished_at
      FROM blackbox_views.experiments e
"""


def experiments_txn(conn: Connection, *, limit: int = 200) -> list[tuple[ExperimentRow, int]]:
    """The newest experiments the caller may see (granted all their tenants), each with
    how many runs it has scored so far."""
    rows = conn.execute(text(f"{_HEADER} ORDER BY created_at DESC LIMIT :limit"), {"limit": limit})
    found = [_header(row, ()) for row in rows]
    counted = conn.execute(
        text(
            "SELECT experiment_id, count(*) FROM blackbox_views.experiment_runs "
            "WHERE experiment_id = ANY (:ids) GROUP BY experiment_id"
        ),
        {"ids": [e.experiment_id for e in found]},
    )
    counts = {str(row[0]): int(row[1]) for row in counted}
    return [(e, int(counts.get(e.experiment_id, 0))) for e in found]


def experiment_txn(conn: Connection, experiment_id: str) -> KeptExperiment | None:
    """The experiment ``experiment_id`` whole; None when there is none the caller may
    see."""
    row = conn.execute(text(f"{_HEADER} WHERE experiment_id = :id"), {"id": experiment_id}).first()
    if row is None:
        return None
    scores: dict[str, list[KeptScore]] = {}
    for s in conn.execute(
        text(
            "SELECT run_id, score, evaluator, lower_is_better, baseline, variant "
            "FROM blackbox_views.experiment_scores WHERE experiment_id = :id "
            "ORDER BY run_id, score"
        ),
        {"id": experiment_id},
    ):
        scores.setdefault(s[0], []).append(KeptScore(s[0], s[1], s[2], s[3], s[4], s[5]))
    results = tuple(
        KeptResult(r[0], r[1], r[2], r[3], r[4], r[5], tuple(scores.get(r[0], ())))
        for r in conn.execute(
            text(
                "SELECT run_id, tenant_id, outcome, fork_run_id, fork_status, reason "
                "FROM blackbox_views.experiment_runs WHERE experiment_id = :id ORDER BY run_id"
            ),
            {"id": experiment_id},
        )
    )
    runs = tuple(_KeptRun(r.run_id, r.tenant_id) for r in results)
    return KeptExperiment(_header(row, runs), results)


def fork_experiment_txn(conn: Connection, fork_run_id: str) -> tuple[str, str, str] | None:
    """The experiment that made the fork ``fork_run_id``: (experiment id, its name, the
    recorded run it forked); None when no experiment made it."""
    row = conn.execute(
        text(
            "SELECT x.experiment_id, x.name, r.run_id FROM blackbox_views.experiment_runs r "
            "JOIN blackbox_views.experiments x USING (experiment_id) "
            "WHERE r.fork_run_id = :fork"
        ),
        {"fork": fork_run_id},
    ).first()
    return None if row is None else (str(row[0]), str(row[1]), str(row[2]))


def _header(row: Any, runs: tuple[_KeptRun, ...]) -> ExperimentRow:
    return ExperimentRow(
        experiment_id=row[0],
        name=row[1],
        dataset=row[2],
        selection=dict(row[3]),
        variant=dict(row[4]),
        evaluators=tuple(row[5]),
        confidence=float(row[6]),
        tolerances={k: float(v) for k, v in dict(row[7]).items()},
        tenants=list(row[8]),
        runs=runs,
        planned=int(row[9]),
        status=row[10],
        created_at=row[11],
        created_by=row[12],
        finished_at=row[13],
    )


def call_pricing(prices: PriceTable) -> Callable[[str, str, Any], Decimal | None]:
    """What a call cost by ``prices``, as the analytics views price it: ``(provider,
    model, usage JSON) -> dollars``, None without a price or without usage."""

    def cost(provider: str, model: str, usage: Any) -> Decimal | None:
        price = prices.price(provider, model)
        counted = llm_usage(usage)
        if price is None or counted is None:
            return None
        return price.cost(
            TokenCounts(
                input_tokens=counted["input_tokens"],
                output_tokens=counted["output_tokens"],
                cached_tokens=counted["cached_tokens"],
                cache_write_tokens=cache_write_tokens(usage),
            )
        )

    return cost
