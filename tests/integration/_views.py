"""Building the views from a topic, for assertions on what landed."""

from __future__ import annotations

from sqlalchemy import Engine, func, select

from agent_blackbox.consumers import (
    AnalyticsConsumer,
    BatchOutcome,
    ViewConsumer,
    events_index,
    runs_view,
)
from agent_blackbox.schemas import Settings
from tests.integration._wait import eventually


def build_views(settings: Settings, engine: Engine, *, expect: int, timeout: float = 60.0) -> None:
    """Consume ``settings.topic`` into the views until ``expect`` events are indexed."""

    def indexed() -> int:
        with engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(events_index)).scalar_one())

    with ViewConsumer(settings, engine=engine) as consumer:
        total = BatchOutcome()

        def caught_up() -> bool:
            nonlocal total
            outcome = consumer.poll_once(0.5)
            if outcome is not None:
                total += outcome
            return indexed() >= expect

        try:
            eventually(caught_up, timeout=timeout, what=f"{expect} events in the views")
        except AssertionError as exc:  # what the consumer holds, for a failure seen once
            raise AssertionError(
                f"{exc}; indexed {indexed()}, assigned {consumer.assigned}, lag "
                f"{consumer.lag(timeout_s=5.0)}, stale dropped {consumer.stale_dropped}, "
                f"batches came to {total}"
            ) from None
    assert indexed() == expect


def build_analytics(
    settings: Settings, engine: Engine, *, group: str, expect: int, timeout: float = 60.0
) -> BatchOutcome:
    """Consume ``settings.topic`` into the analytics tables until ``expect`` messages
    went through (consumer group ``group``); what the batches came to."""
    total = BatchOutcome()
    with AnalyticsConsumer(settings, group_id=group, engine=engine) as consumer:

        def caught_up() -> bool:
            nonlocal total
            outcome = consumer.poll_once(0.5)
            total = total + outcome if outcome is not None else total
            return total.messages >= expect

        eventually(caught_up, timeout=timeout, what=f"{expect} messages through the analytics")
    return total


def view_runs(engine: Engine) -> dict[str, tuple[str, int, int, str | None]]:
    """run_id → (status, event_count, last_sequence, code_version) from the runs view."""
    with engine.connect() as conn:
        columns = ("run_id", "status", "event_count", "last_sequence", "code_version")
        rows = conn.execute(select(*(runs_view.c[name] for name in columns))).all()
    return {r[0]: (r[1], int(r[2]), int(r[3]), r[4]) for r in rows}
