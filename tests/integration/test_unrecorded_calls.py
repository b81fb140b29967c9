"""A run whose code reaches outside through no boundary, through the whole pipeline:
``run.finished`` names the hole, the runs view counts it, replayability says
``incomplete``, the console's run page and list show it, and a replay read back from
Kafka refuses the call as an ``unrecorded_call`` divergence naming the agent's line."""

from __future__ import annotations

import re
import urllib.error
import urllib.request
import warnings
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select, text

from agent_blackbox.consumers import migrate_views, runs_view
from agent_blackbox.outbox import AgentRun, Recorder, RunSnapshot, UnrecordedCallWarning
from agent_blackbox.replayer import DivergenceKind
from agent_blackbox.schemas import Settings
from tests.conftest import Login
from tests.integration._browser import console, fetch
from tests.integration.frameworks._harness import publish, replay_from_kafka
from tests.integration.frameworks._model import AgentOpenAIServer

pytestmark = pytest.mark.integration


def holey_agent(run: AgentRun, given: Any) -> str:
    total = run.call("add", lambda a, b: a + b, 2, 3)
    # A call no boundary records: what it answers is not in the log.
    request = urllib.request.Request(given["url"] + "/status", data=b"{}", method="POST")
    try:
        urllib.request.urlopen(request, timeout=5).close()
    except urllib.error.HTTPError as answered:  # the server says 404: answered all the same
        answered.close()
    return f"sum {total}"


def test_a_hole_is_counted_shown_and_refused_in_replay(
    settings: Settings, engine: Engine, login: Login, tmp_path: Path
) -> None:
    migrate_views(settings.database_url)
    with AgentOpenAIServer() as server:
        snapshot = RunSnapshot(code_version="holey/1", input={"url": server.base_url})
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            run, _ = Recorder(engine, settings=settings).record(
                holey_agent, snapshot, agent_id="holey-agent"
            )
        assert len(server.requests) == 1
    holes = [w for w in warned if issubclass(w.category, UnrecordedCallWarning)]
    assert len(holes) == 1
    assert str(holes[0].message).startswith("unrecorded call: connection to 127.0.0.1:")
    assert holes[0].filename == __file__  # the agent's line, not urllib's
    publish(settings, engine)

    with engine.connect() as conn:
        count, first = conn.execute(
            select(runs_view.c.unrecorded_calls, runs_view.c.unrecorded_call).where(
                runs_view.c.run_id == run.run_id
            )
        ).one()
        replayability = conn.execute(
            text("SELECT replayability FROM blackbox_views.run_replayability WHERE run_id = :r"),
            {"r": run.run_id},
        ).scalar_one()
    assert count == 1
    assert re.search(r"connection to 127\.0\.0\.1:\d+ at holey_agent \(.*test_unrecorded", first)
    assert replayability == "incomplete"

    with console(
        settings, _url(login("blackbox_reader", tenant="*")), tmp_path / "web.log"
    ) as base:
        status, page = fetch(f"{base}/runs/{run.run_id}")
        listed_status, listed = fetch(f"{base}/runs")
    assert status == 200
    assert 'id="unrecorded"' in page
    assert "a replay refuses these calls" in page
    assert listed_status == 200
    assert "1 unrecorded" in listed

    report = replay_from_kafka(settings, engine, run.run_id, holey_agent)
    assert report.result == "DIVERGED"
    assert report.divergence is not None
    assert report.divergence.kind == DivergenceKind.UNRECORDED_CALL
    assert report.divergence.call_site is not None
    assert report.divergence.call_site.function == "holey_agent"
    assert "connection to 127.0.0.1:" in report.divergence.describe()


def _url(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=False)
