"""A run id is a label: it cannot carry markup or a path into a record or a console link.

Attacks:
- a tenant-A writer login (an agent host) records runs under ids with markup
  (``b"><script>``), a path (``../../etc/passwd``), a URL's own syntax, white space, an
  escape sequence, a look-alike letter, a leading ``-``, 129 characters, nothing: each is
  refused with an error that names the id and the rule, by the sync and the async
  recorder, and nothing reaches ``blackbox.runs`` or the outbox;
- runs already in the log under such ids (recorded before the rule, as an old archive
  or a forged topic message would bring them), a session id chosen as a path
  (``../runs/<victim>``, which session ids may hold) and a fork whose parent id is one:
  every link of the run list, the session page and the fork's run page stays on the page
  it names (``/`` of an id is encoded too), and no markup is written raw.
"""

from __future__ import annotations

import asyncio
import posixpath
from html.parser import HTMLParser
from typing import Any
from urllib.parse import quote, unquote, urljoin, urlsplit

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DataError
from sqlalchemy.ext.asyncio import create_async_engine
from starlette.testclient import TestClient

from agent_blackbox.console import LoopbackOnly, create_app
from agent_blackbox.consumers import migrate_views
from agent_blackbox.outbox import AgentRun, AsyncRecorder, Recorder, RunSnapshot
from agent_blackbox.schemas import RUN_ID_RULE, InvalidRunId, Settings
from tests._run_ids import unchecked_run_ids
from tests.conftest import Login
from tests.integration._backups import events, relay
from tests.integration._views import build_views
from tests.security.conftest import TENANT_A

pytestmark = pytest.mark.integration

BASE = "http://127.0.0.1:8765"
REFUSED = (
    'b"><script>alert(1)</script>',
    "../../etc/passwd",
    "..",
    "runs/other",
    "a?b=1#c",
    "100%",
    "with space",
    "tab\there",
    "\x1b[2Jclear",
    "\u0430dmin",  # Cyrillic a: looks like "admin"
    "-rf",
    "x" * 129,
    "",
)


def _agent(run: AgentRun, who: Any) -> str:
    return str(run.call("lookup", lambda w: f"found {w}", who))


def _counts(engine: Engine) -> tuple[int, int]:
    with engine.connect() as conn:
        runs = conn.execute(text("SELECT count(*) FROM blackbox.runs")).scalar_one()
        outbox = conn.execute(text("SELECT count(*) FROM blackbox.outbox")).scalar_one()
    return int(runs), int(outbox)


def test_a_writer_cannot_record_a_run_under_a_hostile_id(
    settings: Settings, engine: Engine, login: Login
) -> None:
    writer = login("blackbox_writer", tenant=TENANT_A)
    recorder = Recorder(writer, settings=settings)
    snapshot = RunSnapshot(code_version="ids.1", input="ada")
    for hostile in REFUSED:
        with pytest.raises(InvalidRunId) as refused:
            recorder.record(_agent, snapshot, agent_id="a", tenant_id=TENANT_A, run_id=hostile)
        assert repr(hostile)[:40] in str(refused.value)  # names the id, escaped
        assert RUN_ID_RULE in str(refused.value)
        with pytest.raises(InvalidRunId):
            recorder.start_run(snapshot, agent_id="a", tenant_id=TENANT_A, run_id=hostile)
    assert _counts(engine) == (0, 0)

    async def in_async() -> None:
        async_writer = create_async_engine(writer.url)
        try:
            async_recorder = AsyncRecorder(async_writer, settings=settings)
            for hostile in REFUSED:
                with pytest.raises(InvalidRunId):
                    await async_recorder.start_run(
                        snapshot, agent_id="a", tenant_id=TENANT_A, run_id=hostile
                    )
        finally:
            await async_writer.dispose()

    asyncio.run(in_async())
    assert _counts(engine) == (0, 0)

    allowed = "order-17:retry.2_" + "x" * 111  # the whole alphabet, 128 characters
    run, _ = recorder.record(_agent, snapshot, agent_id="a", tenant_id=TENANT_A, run_id=allowed)
    assert run.run_id == allowed
    assert _counts(engine)[0] == 1


_START = text(
    "SELECT blackbox.start_run(:run_id, :tenant, 'a', ARRAY[]::text[], 'genesis', NULL, "
    "'ids.1', 'standard', 'standard', :credential)"
)


def test_a_writer_going_around_the_recorder_is_held_to_the_rule_too(
    engine: Engine, login: Login
) -> None:
    writer = login("blackbox_writer", tenant=TENANT_A)
    for hostile in REFUSED:
        with writer.begin() as conn, pytest.raises(DataError, match="run id rule"):
            conn.execute(_START, {"run_id": hostile, "tenant": TENANT_A, "credential": b"k" * 32})
    assert _counts(engine) == (0, 0)
    # The schema's owner still may: a restore brings back runs recorded before the rule.
    with engine.begin() as conn:
        conn.execute(_START, {"run_id": "../legacy", "tenant": TENANT_A, "credential": b"k" * 32})
    assert _counts(engine)[0] == 1


class _Links(HTMLParser):
    """Every link target of a page (``href`` and form ``action``), unescaped."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found += [v for k, v in attrs if k in ("href", "action") and v is not None]


def _links(page: str) -> list[str]:
    parser = _Links()
    parser.feed(page)
    return parser.found


def _check_links(page: str, at: str) -> list[str]:
    """The page's links, each checked to stay on the path it names: resolving it (as a
    browser does) removes no ``.`` or ``..`` segment, and no id adds a segment."""
    links = _links(page)
    for link in links:
        path = urlsplit(urljoin(BASE + at, link)).path
        written = urlsplit(link).path
        if written.startswith("/"):
            assert path == written, f"{link!r} leads to {path!r}"
        assert posixpath.normpath(path) == path.rstrip("/") or path == "/", link
        assert not {".", ".."} & set(path.split("/")), link
    return links


def test_every_console_link_quotes_the_ids_it_carries(
    settings: Settings, engine: Engine, login: Login
) -> None:
    migrate_views(settings.database_url)
    recorder = Recorder(engine, settings=settings)
    snapshot = RunSnapshot(code_version="ids.1", input="ada")
    victim, _ = recorder.record(_agent, snapshot, agent_id="a", tenant_id=TENANT_A)
    climbing = f"../runs/{victim.run_id}"
    markup = 'b"><script>alert(1)</script>'
    with unchecked_run_ids():  # as runs recorded before the rule were
        for hostile in (climbing, markup):
            recorder.record(
                _agent,
                snapshot,
                agent_id="a",
                tenant_id=TENANT_A,
                run_id=hostile,
                session_id="s-1",
            )
    in_session, _ = recorder.record(
        _agent, snapshot, agent_id="a", tenant_id=TENANT_A, session_id=climbing
    )
    fork, _ = recorder.record(
        _agent,
        RunSnapshot(code_version="ids.2", input="ada", parent_run_id=climbing),
        agent_id="a",
        tenant_id=TENANT_A,
    )
    relay(engine, settings)
    build_views(settings, engine, expect=events(engine))
    reader = login("blackbox_reader", tenant=TENANT_A)
    app = create_app(settings, reader, LoopbackOnly())
    client = TestClient(app, client=("127.0.0.1", 1), base_url=BASE)

    listed = client.get("/runs")
    assert listed.status_code == 200
    links = _check_links(listed.text, "/runs")
    for hostile in (climbing, markup):
        assert f"/runs/{quote(hostile, safe='')}" in links
    assert f"/sessions/{quote(climbing, safe='')}" in links
    assert "<script>" not in listed.text
    leading_to_victim = [link for link in links if unquote(link) == f"/runs/{victim.run_id}"]
    assert leading_to_victim == [f"/runs/{victim.run_id}"]  # its own link, once

    climbing_session = client.get(f"/sessions/{quote(climbing, safe='')}")  # its own link
    assert climbing_session.status_code == 200
    shown = _links(climbing_session.text)  # that session's page, not the victim's
    assert f"/runs/{in_session.run_id}" in shown
    assert f"/runs/{victim.run_id}" not in shown

    session = client.get("/sessions/s-1")
    assert session.status_code == 200
    links = _check_links(session.text, "/sessions/s-1")
    assert f"/runs/{quote(climbing, safe='')}" in links
    assert "<script>" not in session.text

    page = client.get(f"/runs/{fork.run_id}")
    assert page.status_code == 200
    links = _check_links(page.text, f"/runs/{fork.run_id}")
    assert f"/runs/{quote(climbing, safe='')}" in links  # "Forked from", quoted whole
    for hostile in (climbing, markup):  # and a hostile id names no page of its own
        assert client.get(f"/runs/{quote(hostile, safe='')}").status_code == 404
