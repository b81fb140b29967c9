"""Sessions, users and search on the real stack: runs recorded with session and user ids
through the recorder and the OpenAI SDK against the local server, relayed, and built
into the views, the analytics views and the full-text index; the run list's filters and
search, the session totals checked against SQL, the words found (never the secret the
recorder redacted), another tenant's reader finding nothing, and ``forget`` clearing
the ids and the words."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, text

from agent_blackbox.cli import main
from agent_blackbox.consumers import (
    INDEX_PURPOSE,
    RetentionJob,
    RunFilter,
    list_runs_txn,
    parse_search,
    session_txn,
    with_search,
)
from agent_blackbox.consumers._search import walk_or_bitmaps
from agent_blackbox.schemas import Settings
from tests.conftest import Login
from tests.integration._sessions import SECRET, Recorded, record_sessions

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture
def recorded(settings: Settings, engine: Engine) -> Recorded:
    return record_sessions(settings, engine)


def _listed(engine: Engine, query: str = "", **where: Any) -> list[str]:
    with engine.connect() as conn:
        page = list_runs_txn(conn, with_search(RunFilter(**where), parse_search(query)))
    return [run.run_id for run in page.runs]


def test_sessions_and_users_are_filters_and_a_session_adds_up(
    recorded: Recorded, engine: Engine
) -> None:
    runs = recorded.runs
    chat_1 = [runs["tools"], runs["refund"], runs["first"]]
    assert _listed(engine, session="chat-1", tenant="acme") == chat_1
    assert _listed(engine, user="u-7") == [runs["failed"]]
    assert _listed(engine, "session:chat-1 user:u-42 agent:support tag:team=globex") == [
        runs["globex"]
    ]
    with engine.connect() as conn:
        stored = dict(conn.execute(text("SELECT run_id, user_id FROM blackbox_views.runs")).all())
        # The sensitive run's user is the tenant's keyed digest, nowhere in clear.
        assert stored[runs["sensitive"]].startswith("hmac-sha256:")
        assert not conn.execute(
            text("SELECT count(*) FROM blackbox_views.events WHERE attributes::text LIKE :s"),
            {"s": "%u-secret%"},
        ).scalar_one()
        detail = session_txn(conn, "chat-1")
        expected = conn.execute(
            text(
                """
                SELECT count(DISTINCT r.run_id),
                       (SELECT count(*) FROM blackbox_views.events e JOIN blackbox_views.runs x
                           ON x.run_id = e.run_id WHERE x.session_id = 'chat-1'),
                       count(c.sequence), coalesce(sum(c.total_tokens), 0), sum(c.cost_usd),
                       count(c.sequence) FILTER (WHERE c.error_class IS NOT NULL)
                  FROM blackbox_views.runs r
                  LEFT JOIN blackbox_views.llm_calls c ON c.run_id = r.run_id
                 WHERE r.session_id = 'chat-1'
                """
            )
        ).one()
    assert detail is not None
    totals = detail.totals
    assert (totals.runs, totals.events, totals.llm_calls, totals.total_tokens) == expected[:4]
    assert totals.cost_usd == expected[4]
    assert isinstance(totals.cost_usd, Decimal)
    assert totals.cost_usd > 0
    assert totals.llm_calls == 6  # 1 + 2 + 2 (one failed) + 1 at globex
    assert totals.tool_calls == 2
    assert totals.errors == 2  # the failed LLM call and the caught tool error
    assert expected[5] == 1
    assert totals.users == ("u-42",)
    assert [r.run_id for r in detail.runs] == [
        runs["first"],
        runs["refund"],
        runs["tools"],
        runs["globex"],
    ]


def test_search_terms_narrow_the_run_list(recorded: Recorded, engine: Engine) -> None:
    runs = recorded.runs
    assert _listed(engine, "tool:lookup_order") == [runs["tools"]]
    assert _listed(engine, "error:KeyError") == [runs["tools"]]
    assert _listed(engine, "error:RateLimitError") == [runs["tools"]]
    assert _listed(engine, "error:ValueError status:failed") == [runs["failed"]]
    assert _listed(engine, "model:fail-429") == [runs["tools"]]
    assert _listed(engine, "code:code-refund") == [runs["refund"]]
    assert _listed(engine, f"run:{runs['refund'][:8]}") == [runs["refund"]]
    assert _listed(engine, "tag:team=sensitive") == [runs["sensitive"]]
    assert _listed(engine, "tag:team=nobody") == []
    assert _listed(engine, "tag:team status:failed") == [runs["failed"]]  # has the tag
    assert _listed(engine, "refund -quiet") == [runs["refund"]]  # the sealed run's is quiet
    hostile = "x' OR '1'='1"
    assert _listed(engine, f'model:"{hostile}" "{hostile}"') == []
    with engine.connect() as conn:  # the hostile value was a value: the table is whole
        assert conn.execute(text("SELECT count(*) FROM blackbox_views.runs")).scalar_one() == 6


def test_full_text_finds_the_redacted_words_only_where_allowed(
    recorded: Recorded, engine: Engine, login: Login
) -> None:
    runs = recorded.runs
    # globex did not opt in: its refund is not found; the sealed run was opened.
    assert _listed(engine, "refund") == [runs["sensitive"], runs["refund"]]
    assert _listed(engine, '"refund order"') == [runs["refund"]]
    assert _listed(engine, "refund session:chat-1") == [runs["refund"]]
    assert _listed(engine, "redacted email") == [runs["refund"]]  # its placeholder is
    for secret in (SECRET, f'"{SECRET}"', "jane", "example.com"):
        assert _listed(engine, secret) == [], secret
    with engine.connect() as conn:
        words = " ".join(
            conn.execute(text("SELECT words::text FROM blackbox_views.message_text")).scalars()
        )
        audited = conn.execute(
            text("SELECT count(*) FROM blackbox.access_audit WHERE purpose = :p"),
            {"p": INDEX_PURPOSE},
        ).scalar_one()
    assert "refund" in words
    assert "jane" not in words
    assert "globex" not in words
    assert audited >= 1  # the sealed run's key was unwrapped on the record

    acme = login("blackbox_reader", tenant="acme")
    attacker = login("blackbox_reader", tenant="globex")
    assert _listed(acme, "refund") == [runs["sensitive"], runs["refund"]]
    assert _listed(attacker, "refund") == []
    assert _listed(attacker, "session:chat-1") == [runs["globex"]]
    with attacker.connect() as conn:
        seen = conn.execute(
            text(
                "SELECT count(*) FROM blackbox_views.message_text "
                "WHERE words @@ to_tsquery('simple', 'refund')"
            )
        ).scalar_one()
        tenants = conn.execute(
            text("SELECT count(*) FROM blackbox_views.text_search_tenants")
        ).scalar_one()
        session = session_txn(conn, "chat-1")
    assert (seen, tenants) == (0, 0)
    assert session is not None
    assert [r.run_id for r in session.runs] == [runs["globex"]]


def test_forget_clears_the_ids_and_the_words(
    recorded: Recorded, settings: Settings, engine: Engine
) -> None:
    runs = recorded.runs
    report = RetentionJob(engine, settings=settings).forget("customer-jane")
    assert [r.run_id for r in report.redacted] == [runs["refund"]]
    with engine.connect() as conn:
        labels = dict(
            (r, (s, u))
            for r, s, u in conn.execute(
                text("SELECT run_id, session_id, user_id FROM blackbox_views.runs")
            )
        )
        indexed = set(
            conn.execute(text("SELECT DISTINCT run_id FROM blackbox_views.message_text")).scalars()
        )
    assert labels[runs["refund"]] == (None, None)
    assert labels[runs["first"]] == ("chat-1", "u-42")
    assert runs["refund"] not in indexed
    assert runs["first"] in indexed
    assert _listed(engine, '"refund order"') == []
    assert runs["refund"] not in _listed(engine, session="chat-1")


def test_the_cli_lists_searches_and_counts_by_session(
    recorded: Recorded, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BLACKBOX_DATABASE_URL", settings.database_url)
    runner = CliRunner()
    found = runner.invoke(main, ["runs", "--json", "--session", "chat-1", "tool:lookup_order"])
    assert found.exit_code == 0, found.output
    assert [json.loads(line)["run_id"] for line in found.output.splitlines()] == [
        recorded.runs["tools"]
    ]
    none = runner.invoke(main, ["runs", "status:failed", "tool:nothing"])
    assert none.exit_code == 1
    bad = runner.invoke(main, ["runs", "colour:red"])
    assert bad.exit_code == 2
    assert "colour: is not a search term" in bad.output
    stats = runner.invoke(main, ["stats", "--by", "session", "--json"])
    assert stats.exit_code == 0, stats.output
    calls = {row["session"]: row["calls"] for row in map(json.loads, stats.output.splitlines())}
    assert calls == {"chat-1": 6, "chat-2": 1, "chat-3": 1}
    tenants = runner.invoke(main, ["tenants", "search"])
    assert tenants.exit_code == 0, tenants.output
    assert "acme" in tenants.output


@pytest.fixture(autouse=True)
def _no_kek_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # The indexer under test is given its keys; one from the environment would hide that.
    monkeypatch.delenv("BLACKBOX_KEK_FILE", raising=False)
    monkeypatch.delenv("BLACKBOX_KEK", raising=False)


def test_a_walk_over_its_budget_gives_way_to_the_bitmaps(engine: Engine) -> None:
    with engine.connect() as conn:
        before = conn.execute(text("SHOW statement_timeout")).scalar_one()
        slow = text("SELECT 'walked' FROM pg_sleep(2)")
        rows = walk_or_bitmaps(conn, slow, text("SELECT 'intersected'"), {})
        assert [tuple(r) for r in rows] == [("intersected",)]
        assert conn.execute(text("SHOW statement_timeout")).scalar_one() == before
        rows = walk_or_bitmaps(conn, text("SELECT 'walked'"), text("SELECT 'no'"), {})
        assert [tuple(r) for r in rows] == [("walked",)]
        assert conn.execute(text("SHOW statement_timeout")).scalar_one() == before
