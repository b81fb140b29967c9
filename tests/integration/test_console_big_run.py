"""A run too long for one page: its events table and LLM calls go a thousand at a time
with earlier/later links, its waterfall draws the first thousand spans and says so, and
its tree still lists every span (views filled by SQL, the console served in-process)."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import Engine, text
from starlette.testclient import TestClient

from agent_blackbox.console import LoopbackOnly, create_app
from agent_blackbox.consumers import migrate_views
from agent_blackbox.schemas import Settings

pytestmark = pytest.mark.integration

RUN = "run-of-2500-events"
EVENTS = 2500


@pytest.fixture
def client(settings: Settings, engine: Engine) -> TestClient:
    migrate_views(settings.database_url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO blackbox_views.runs (run_id, tenant_id, agent_id, status, "
                "event_count, last_sequence, started_at, last_event_at) VALUES "
                "(:run, 't', 'a', 'succeeded', :n, :n, now() - interval '1 hour', now())"
            ),
            {"run": RUN, "n": EVENTS},
        )
        conn.execute(
            text(
                "INSERT INTO blackbox_views.events (run_id, sequence, event_id, event_type, "
                'body_version, topic, partition, "offset", input_digest, output_digest, '
                "chain_hash, recorded_at, attributes) "
                "SELECT :run, s, 'e-' || s, CASE WHEN s % 5 = 0 THEN 'llm.call' "
                "ELSE 'tool.call' END, 1, 'topic', 0, s, 'd', 'd', 'h', "
                "now() - interval '1 hour' + s * interval '100 ms', "
                "jsonb_build_object('tool', 'lookup', 'model', 'm-1') "
                "FROM generate_series(1, :n) AS s"
            ),
            {"run": RUN, "n": EVENTS},
        )
    app = create_app(settings, engine, LoopbackOnly())
    return TestClient(app, base_url="http://127.0.0.1", client=("127.0.0.1", 50000))


def _page(client: TestClient, query: str = "") -> str:
    answer = client.get(f"/runs/{RUN}{query}")
    assert answer.status_code == 200, answer.text[-500:]
    return answer.text


def _rows(html: str, table: str) -> list[int]:
    body = html.split(f'<table id="{table}">', 1)[1].split("</table>", 1)[0]
    return [int(n) for n in re.findall(r"/events/(\d+)\">", body)]


def test_a_long_run_pages_its_events_and_keeps_its_whole_tree(client: TestClient) -> None:
    first = _page(client)
    assert _rows(first, "events") == list(range(1, 1001))
    assert _rows(first, "llm-calls") == list(range(5, 1001, 5))  # the same page's calls
    assert 'id="events-earlier"' not in first
    assert 'href="?events_from=1001#events-heading"' in first
    assert len(re.findall(r'<rect class="bar', first)) == 1000
    assert "The first 1,000 of 2,500 spans are drawn" in first
    assert len(re.findall(r'<li class="span[^"]*" id="span-\d+"', first)) == EVENTS  # the tree

    middle = _page(client, "?events_from=1001")
    assert _rows(middle, "events") == list(range(1001, 2001))
    assert 'href="?events_from=1#events-heading"' in middle
    assert 'href="?events_from=2001#events-heading"' in middle

    last = _page(client, "?events_from=1700")  # a page may start anywhere
    assert _rows(last, "events") == list(range(1700, 2501))
    assert 'href="?events_from=700#events-heading"' in last
    assert 'id="events-later"' not in last

    refused = client.get(f"/runs/{RUN}?events_from=-3")
    assert refused.status_code == 400
    assert "events_from" in refused.text
