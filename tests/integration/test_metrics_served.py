"""The long-running commands serve their metrics on --metrics-port: the analytics
consumer its gauges read from the views, retention what its passes did, the relay its
outbox backlog (depth and oldest age)."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import Engine

from agent_blackbox.consumers import migrate_views
from agent_blackbox.outbox import Recorder
from agent_blackbox.outbox.storage import outbox_backlog_txn
from agent_blackbox.schemas import Settings
from tests.integration._agents import record_ticket_runs, ticket_ids
from tests.integration._backups import relay
from tests.integration._browser import free_port
from tests.integration._relays import ROOT, relay_env
from tests.integration._views import build_views
from tests.integration._wait import eventually

pytestmark = pytest.mark.integration


@contextmanager
def _serving(settings: Settings, log: Path, *argv: str) -> Iterator[str]:
    """``blackbox ARGV --metrics-port P`` as a child; yields its metrics URL."""
    port = free_port()
    command = [sys.executable, "-m", "cli", *argv, "--metrics-port", str(port)]
    with log.open("wb") as out:
        child = subprocess.Popen(
            command, env=relay_env(settings), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        yield f"http://127.0.0.1:{port}/metrics"
    finally:
        child.terminate()
        child.wait(timeout=30)


def _scrape(url: str, *lines: str) -> str | None:
    """The metrics page once it holds every one of ``lines``."""
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            text = answer.read().decode()
    except OSError:
        return None
    return text if all(line in text for line in lines) else None


def test_the_outbox_backlog_is_its_depth_and_its_oldest_row_s_age(
    settings: Settings, engine: Engine
) -> None:
    record_ticket_runs(Recorder(engine, settings=settings), ticket_ids(2))
    with engine.connect() as conn:
        depth, oldest = outbox_backlog_txn(conn)
    assert depth > 0
    assert oldest > 0
    relay(engine, settings)
    with engine.connect() as conn:
        assert outbox_backlog_txn(conn) == (0, 0.0)


def test_analytics_and_retention_serve_their_metrics(
    settings: Settings, engine: Engine, tmp_path: Path
) -> None:
    migrate_views(settings.database_url)
    runs = record_ticket_runs(Recorder(engine, settings=settings), ticket_ids(3))
    relay(engine, settings)
    build_views(settings, engine, expect=sum(r.events for r in runs))

    analytics = ("analytics", "--group", "metrics-test", "--view-metrics-every", "1")
    with _serving(settings, tmp_path / "analytics.log", *analytics) as url:
        # The gauges read the views (built above); the counter waits for the consumer
        # to have joined and read: both are waited for, not one assumed with the other.
        page = eventually(
            lambda: _scrape(
                url,
                'blackbox_runs_recent{replayability="full"} 3.0',
                "blackbox_consumer_messages_total{",
            ),
            timeout=60,
            what="the replayability gauge of three runs and the consumer's message count",
        )
    assert 'blackbox_runs_replayable_ratio{replayability="full"} 1.0' in page
    assert "blackbox_effect_intents_open 0.0" in page

    with _serving(settings, tmp_path / "retention.log", "retention", "run", "--every", "60") as url:
        page = eventually(
            lambda: _scrape(url, "blackbox_retention_last_pass_timestamp_seconds"),
            timeout=60,
            what="the retention pass gauges",
        )
    assert "blackbox_retention_runs_shredded_total 0.0" in page
