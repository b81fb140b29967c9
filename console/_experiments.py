"""The console's experiment pages: the list of experiments (and datasets), and one
experiment's comparison of its recorded runs with their variants.

The page shows what ``blackbox experiment show`` prints, from the same kept rows and
the same summary code: per score both sides' means and the paired difference, each
with its t interval, the runs that regressed, and every run with its fork.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from agent_blackbox.consumers import (
    STALLED_AFTER_MINUTES,
    datasets_txn,
    experiment_txn,
    experiments_txn,
)
from agent_blackbox.replayer import METHOD, ExperimentReport
from agent_blackbox.replayer._experiment_stats import Mean, ScoreSummary
from agent_blackbox.schemas import driver_cause

log = logging.getLogger(__name__)

Render = Callable[..., Response]
"""The console's page renderer: ``render(request, template, *, status=200, **values)``."""

_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
_BAR_WIDTH = 160


def experiment_routes(render: Render, engine: Engine) -> list[Route]:
    """The routes of the experiment pages, read through ``engine`` and drawn by
    ``render``."""
    pages = _ExperimentPages(render, engine)
    return [
        Route("/experiments", pages.listed),
        Route("/experiments/{experiment_id}", pages.experiment),
    ]


class _ExperimentPages:
    def __init__(self, render: Render, engine: Engine) -> None:
        self.render = render
        self.engine = engine

    def listed(self, request: Request) -> Response:
        try:
            with self.engine.connect() as conn:
                experiments = experiments_txn(conn)
                datasets = datasets_txn(conn)
        except SQLAlchemyError as exc:
            return self._unreadable(request, exc)
        return self.render(request, "experiments.html", experiments=experiments, datasets=datasets)

    def experiment(self, request: Request) -> Response:
        wanted = request.path_params["experiment_id"]
        try:
            with self.engine.connect() as conn:
                kept = experiment_txn(conn, wanted) if _ID.fullmatch(wanted) else None
        except SQLAlchemyError as exc:
            return self._unreadable(request, exc)
        if kept is None:
            return self.render(
                request,
                "error.html",
                status=404,
                message=f"no experiment {wanted} in the views this console's login can see",
            )
        report = ExperimentReport.kept(kept.experiment, kept.results)
        regressed = _by_run(report)
        return self.render(
            request,
            "experiment.html",
            x=kept.experiment,
            report=report,
            counts=report.counts(),
            scores=[_score_row(s) for s in report.summaries],
            regressions=regressed,
            regressed={r["run_id"]: [w["score"] for w in r["worse"]] for r in regressed},
            method=METHOD,
            bar_width=_BAR_WIDTH,
            stalled_after=STALLED_AFTER_MINUTES,
        )

    def _unreadable(self, request: Request, exc: SQLAlchemyError) -> Response:
        detail = driver_cause(exc)
        log.warning("console: the experiments could not be read: %s", detail)
        return self.render(
            request,
            "error.html",
            status=503,
            message=f"the experiments could not be read ({detail}); is the database up, "
            "migrated (blackbox migrate), and does this console's login have the "
            "blackbox_reader role?",
        )


def _score_row(summary: ScoreSummary) -> dict[str, Any]:
    """One score's row: its figures as shown, the exact ones for the page's data
    attributes, and the difference's interval drawn as a bar around zero."""
    return {
        "summary": summary,
        "better": "lower" if summary.lower_is_better else "higher",
        "baseline": _shown(summary.baseline),
        "variant": _shown(summary.variant),
        "difference": _shown(summary.difference, signed=True),
        "bar": _bar(summary),
    }


def _shown(mean: Mean, *, signed: bool = False) -> dict[str, Any]:
    return {
        "mean": mean.value,
        "low": mean.low,
        "high": mean.high,
        "text": "-" if mean.value is None else _figure(mean.value, signed),
        "interval": None
        if mean.low is None or mean.high is None
        else f"[{_figure(mean.low, signed)}, {_figure(mean.high, signed)}]",
    }


def _figure(value: float, signed: bool = False) -> str:
    """4 significant digits (a cost of $0.000234 stays readable)."""
    return f"{value:+.4g}" if signed else f"{value:.4g}"


def _by_run(report: ExperimentReport) -> list[dict[str, Any]]:
    """The regressions by run (in run order): each run, its fork, and the scores it
    did worse on, each with both sides and the change as shown."""
    forks = {r.run_id: r.fork_run_id for r in report.results}
    runs: dict[str, dict[str, Any]] = {}
    for r in report.regressions:
        run = runs.setdefault(
            r.run_id, {"run_id": r.run_id, "fork_run_id": forks.get(r.run_id), "worse": []}
        )
        run["worse"].append(
            {
                "score": r.score,
                "baseline": _figure(r.baseline),
                "variant": _figure(r.variant),
                "change": _figure(r.variant - r.baseline, True),
            }
        )
    return list(runs.values())


def _bar(summary: ScoreSummary) -> dict[str, Any] | None:
    """The difference's interval on a scale centred on zero (the widest end at the
    edge), and its colour class by the verdict."""
    d = summary.difference
    if d.value is None or d.low is None or d.high is None:
        return None
    reach = max(abs(d.low), abs(d.high)) or 1.0
    half = _BAR_WIDTH / 2

    def x(value: float) -> float:
        return round(half + value / reach * (half - 4), 1)

    kind = {"worse": "worse", "better": "better"}.get(summary.verdict, "even")
    return {"low": x(d.low), "high": x(d.high), "mean": x(d.value), "zero": half, "kind": kind}
