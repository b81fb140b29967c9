"""The run console shows each login what its grants allow, and nothing more.

Attacks, each with the console signed in as the login that tries it:
- a reader of tenant A lists runs, opens B's run page, B's event page, and posts the
  body form of B's event;
- a reader of tenant A posts the body form of A's own event (readers see metadata only);
- a replayer of tenant A opens a body of B's run by posting the form directly;
- a replayer of tenant A opens a body of A's run: allowed, and audited under its name;
- the same with the form that opens a whole run's conversation.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine, text
from starlette.testclient import TestClient

from agent_blackbox.console import LoopbackOnly, create_app
from agent_blackbox.consumers import migrate_views
from agent_blackbox.outbox import AgentRun, Recorder, RunSnapshot
from agent_blackbox.schemas import Settings
from tests.conftest import Login
from tests.integration._backups import events, relay
from tests.integration._views import build_views
from tests.security.conftest import TENANT_A, TENANT_B

pytestmark = pytest.mark.integration

SECRET = "the secret address of tenant b"


def _agent(run: AgentRun, who: Any) -> str:
    return str(run.call("lookup", lambda w: {"address": f"{SECRET} for {w}"}, who))


@pytest.fixture
def runs(settings: Settings, engine: Engine) -> dict[str, str]:
    migrate_views(settings.database_url)
    recorder = Recorder(engine, settings=settings)
    made = {}
    for tenant in (TENANT_A, TENANT_B):
        run, _ = recorder.record(
            _agent, RunSnapshot(code_version="c1", input="ada"), agent_id="a", tenant_id=tenant
        )
        made[tenant] = run.run_id
    relay(engine, settings)
    build_views(settings, engine, expect=events(engine))
    return made


def _console(settings: Settings, login: Engine) -> TestClient:
    app = create_app(settings, login, LoopbackOnly())
    return TestClient(app, client=("127.0.0.1", 1), base_url="http://127.0.0.1:8765")


def _audit(engine: Engine) -> list[tuple[str, str]]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT principal, run_id FROM blackbox.access_audit"))
        return [(str(p), str(r)) for p, r in rows]


def _open(client: TestClient, run_id: str) -> Any:
    return client.post(f"/runs/{run_id}/events/2/body", data={"purpose": "checking a claim"})


def _converse(client: TestClient, run_id: str) -> Any:
    return client.post(f"/runs/{run_id}/conversation", data={"purpose": "checking a claim"})


def test_a_reader_sees_its_tenant_s_runs_and_no_body(
    settings: Settings, engine: Engine, login: Login, runs: dict[str, str]
) -> None:
    client = _console(settings, login("blackbox_reader", tenant=TENANT_A))

    listed = client.get("/runs").text
    assert runs[TENANT_A] in listed
    assert runs[TENANT_B] not in listed
    assert client.get(f"/runs/{runs[TENANT_B]}").status_code == 404
    assert client.get(f"/runs/{runs[TENANT_B]}/events/2").status_code == 404
    foreign = _open(client, runs[TENANT_B])
    assert foreign.status_code == 404
    assert SECRET not in foreign.text
    foreign = _converse(client, runs[TENANT_B])
    assert foreign.status_code == 404
    assert SECRET not in foreign.text

    page = client.get(f"/runs/{runs[TENANT_A]}/events/2").text
    assert 'id="no-bodies"' in page  # said before asking for a purpose
    assert 'id="purpose-form"' not in page
    own = _open(client, runs[TENANT_A])
    assert SECRET not in own.text
    assert 'id="body"' not in own.text
    assert "may not" in own.text or "permission" in own.text
    run_page = client.get(f"/runs/{runs[TENANT_A]}").text
    assert 'id="no-bodies"' in run_page
    assert 'id="conversation-form"' not in run_page
    own = _converse(client, runs[TENANT_A])
    assert SECRET not in own.text
    assert 'id="conversation"' not in own.text
    assert _audit(engine) == []


def test_a_replayer_opens_its_tenant_s_bodies_only_and_each_is_audited(
    settings: Settings, engine: Engine, login: Login, runs: dict[str, str]
) -> None:
    replayer = login("blackbox_replayer", tenant=TENANT_A)
    client = _console(settings, replayer)

    for opening in (_open, _converse):
        foreign = opening(client, runs[TENANT_B])
        assert foreign.status_code == 404
        assert SECRET not in foreign.text
    assert _audit(engine) == []

    assert 'id="purpose-form"' in client.get(f"/runs/{runs[TENANT_A]}/events/2").text
    own = _open(client, runs[TENANT_A])
    assert 'id="body"' in own.text
    assert SECRET in own.text
    assert _audit(engine) == [(replayer.url.username, runs[TENANT_A])]
    assert 'id="conversation-form"' in client.get(f"/runs/{runs[TENANT_A]}").text
    whole = _converse(client, runs[TENANT_A])
    assert 'id="conversation"' in whole.text
    assert SECRET in whole.text
    assert _audit(engine) == [(replayer.url.username, runs[TENANT_A])] * 2
