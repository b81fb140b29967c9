"""Metrics of the read side's jobs.

Gauges read from the views: how replayable recent runs are, replay pass rates per code
version, effect intents still open past a threshold, integrity violations stored. The
analytics process refreshes them on a timer (``blackbox analytics --metrics-port``);
each refresh is a few aggregate queries over a recent window, served by the views'
indexes, never a scan of every run. And what each retention pass did
(:class:`RetentionGauges`, ``blackbox retention run --metrics-port``).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import timedelta

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge
from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import SQLAlchemyError

from agent_blackbox.consumers._retention import RetentionReport

log = logging.getLogger(__name__)

REPLAYABILITY = ("full", "control_flow_only", "none")

_REPLAYABILITY = text(
    "SELECT replayability, count(*) FROM blackbox_views.run_replayability "
    "WHERE started_at >= now() - :window GROUP BY 1"
)
_REPLAYS = text(
    "SELECT coalesce(code_version, ''), count(*), count(*) FILTER (WHERE passed), "
    "avg(divergence_sequence) FILTER (WHERE NOT passed) "
    "FROM blackbox_views.replay_results WHERE replayed_at >= now() - :window GROUP BY 1"
)
_OPEN_INTENTS = text(
    "SELECT count(*), coalesce(extract(epoch FROM now() - min(intent_at)), 0) "
    "FROM blackbox_views.effects WHERE receipt_sequence IS NULL AND intent_at < now() - :after"
)
_VIOLATIONS = text("SELECT count(*) FROM blackbox_views.integrity_violations")


@dataclass(frozen=True, slots=True)
class ViewFigures:
    """One reading of the views."""

    replayability: dict[str, int]
    replays: dict[str, tuple[int, int, float | None]]
    """Code version → (replays, passed, mean sequence of the first divergence)."""
    open_intents: int
    oldest_open_intent_s: float
    violations: int


def view_figures_txn(conn: Connection, *, window: timedelta, open_after: timedelta) -> ViewFigures:
    """The figures of runs started (and replays made) within ``window``, and of effect
    intents open for longer than ``open_after``."""
    replayability = dict.fromkeys(REPLAYABILITY, 0)
    for kind, count in conn.execute(_REPLAYABILITY, {"window": window}):
        replayability[str(kind)] = int(count)
    replays = {
        str(version): (int(total), int(passed), None if mean is None else float(mean))
        for version, total, passed, mean in conn.execute(_REPLAYS, {"window": window})
    }
    count, oldest = conn.execute(_OPEN_INTENTS, {"after": open_after}).one()
    violations = int(conn.execute(_VIOLATIONS).scalar_one())
    return ViewFigures(replayability, replays, int(count), float(oldest), violations)


class ViewGauges:
    """The gauges :func:`view_figures_txn` fills, in ``registry``."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.runs = Gauge(
            "blackbox_runs_recent",
            "Runs started within the window, by how replayable they are "
            "(full, control_flow_only: keys shredded, none: no input snapshot)",
            ["replayability"],
            registry=registry,
        )
        self.ratio = Gauge(
            "blackbox_runs_replayable_ratio",
            "Share of the runs started within the window in each replayability class",
            ["replayability"],
            registry=registry,
        )
        self.replays = Gauge(
            "blackbox_replays_recent",
            "Replays recorded within the window, per code version under test",
            ["code_version"],
            registry=registry,
        )
        self.pass_ratio = Gauge(
            "blackbox_replay_pass_ratio",
            "Share of the window's replays that passed, per code version under test",
            ["code_version"],
            registry=registry,
        )
        self.divergence_at = Gauge(
            "blackbox_replay_first_divergence_sequence_mean",
            "Mean sequence of the first divergence of the window's failed replays",
            ["code_version"],
            registry=registry,
        )
        self.open_intents = Gauge(
            "blackbox_effect_intents_open",
            "Effect intents without a receipt for longer than the threshold",
            registry=registry,
        )
        self.oldest_open = Gauge(
            "blackbox_effect_intent_oldest_open_seconds",
            "Age of the oldest effect intent without a receipt past the threshold (0: none)",
            registry=registry,
        )
        self.violations = Gauge(
            "blackbox_integrity_violations_stored",
            "Integrity violations recorded in the views (rows of integrity_violations)",
            registry=registry,
        )

    def show(self, figures: ViewFigures) -> None:
        total = sum(figures.replayability.values())
        for kind, count in figures.replayability.items():
            self.runs.labels(kind).set(count)
            self.ratio.labels(kind).set(count / total if total else 0.0)
        for version, (replays, passed, mean) in figures.replays.items():
            self.replays.labels(version).set(replays)
            self.pass_ratio.labels(version).set(passed / replays if replays else 0.0)
            self.divergence_at.labels(version).set(mean or 0.0)
        self.open_intents.set(figures.open_intents)
        self.oldest_open.set(figures.oldest_open_intent_s)
        self.violations.set(figures.violations)


def refresh_view_gauges(
    engine: Engine,
    stop: threading.Event,
    *,
    every_s: float,
    window: timedelta,
    open_after: timedelta,
    gauges: ViewGauges | None = None,
) -> threading.Thread:
    """A daemon thread that reads :func:`view_figures_txn` every ``every_s`` seconds into
    ``gauges`` until ``stop``; a failed reading is logged and tried again next time."""
    shown = gauges or ViewGauges()

    def loop() -> None:
        while True:
            try:
                with engine.connect() as conn:
                    shown.show(view_figures_txn(conn, window=window, open_after=open_after))
            except SQLAlchemyError as exc:
                log.warning("view metrics not refreshed: %s", str(exc).splitlines()[0])
            if stop.wait(every_s):
                return

    thread = threading.Thread(target=loop, name="blackbox-view-metrics", daemon=True)
    thread.start()
    return thread


class RetentionGauges:
    """What the retention passes did, for ``blackbox retention run --metrics-port``."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.shredded = Counter(
            "blackbox_retention_runs_shredded",
            "Runs whose bodies expired and whose data keys were destroyed",
            registry=registry,
        )
        self.metadata_deleted = Counter(
            "blackbox_retention_metadata_deleted",
            "Runs whose metadata expired and was deleted",
            registry=registry,
        )
        self.abandoned = Counter(
            "blackbox_retention_runs_abandoned",
            "Runs marked abandoned (running, silent for longer than the job allows)",
            registry=registry,
        )
        self.last_pass = Gauge(
            "blackbox_retention_last_pass_timestamp_seconds",
            "When the last retention pass finished (Unix time)",
            registry=registry,
        )
        self.pass_seconds = Gauge(
            "blackbox_retention_last_pass_seconds",
            "How long the last retention pass took",
            registry=registry,
        )

    def show(self, report: RetentionReport, *, seconds: float) -> None:
        self.shredded.inc(len(report.redacted))
        self.metadata_deleted.inc(len(report.metadata_deleted))
        self.abandoned.inc(len(report.abandoned))
        self.last_pass.set_to_current_time()
        self.pass_seconds.set(seconds)
