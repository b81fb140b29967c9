"""Finding 11: an unwrap's audit row vanished with ROLLBACK while the wrapped key had
already been returned, and a newline in the purpose forged a server log line.

Now a key is handed out only against an access request whose audit row an earlier
transaction committed, and the database refuses a purpose with control characters.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from agent_blackbox.keystore import AccessDenied, AuditedKeys, DataKeyStore, LocalKeyProvider
from agent_blackbox.outbox import Recorder, RunSnapshot
from agent_blackbox.schemas import Settings
from tests.conftest import Login
from tests.security._keys import key_pair_files, table
from tests.security.conftest import TENANT_A, TENANT_B

pytestmark = pytest.mark.integration

AUDIT = (
    "SELECT principal, purpose, run_id, key_id, outcome FROM blackbox.access_audit "
    "WHERE principal <> current_user"  # the recording owner's digest key fetch aside
)
REQUEST = text("SELECT blackbox.request_key_access(:purpose, :run)")
UNWRAP = text("SELECT kek_version, wrapped FROM blackbox.unwrap_data_key(:run, :key, :request)")


def _run(engine: Engine, settings: Settings, tmp_path: Path, tenant: str) -> tuple[str, str, Path]:
    private, public = _pair(tmp_path, tenant)
    keys = DataKeyStore.from_env({"BLACKBOX_KEK_PUBLIC_FILE": str(public)})
    run = Recorder(engine, settings=settings, keys=keys).start_run(
        RunSnapshot(code_version="keys.11"), agent_id="keys-11", tenant_id=tenant
    )
    with engine.connect() as conn:
        key_id = conn.execute(
            text("SELECT key_id FROM blackbox.data_keys WHERE run_id = :r"), {"r": run.run_id}
        ).scalar_one()
    return run.run_id, str(key_id), private


def _pair(tmp_path: Path, tenant: str) -> tuple[Path, Path]:
    folder = tmp_path / tenant
    folder.mkdir()
    return key_pair_files(folder)


def _sqlstate(exc: pytest.ExceptionInfo[DBAPIError]) -> str | None:
    return getattr(exc.value.orig, "sqlstate", None)


def test_an_unwrap_rolled_back_leaves_its_committed_audit_row(
    engine: Engine, settings: Settings, login: Login, tmp_path: Path
) -> None:
    run_id, key_id, private = _run(engine, settings, tmp_path, TENANT_A)
    replayer = login("blackbox_replayer", tenant=TENANT_A)
    user = replayer.url.username
    # Request and unwrap in one transaction, then roll back: refused, so nothing is
    # handed out that the rollback could hide.
    with replayer.connect() as conn, conn.begin() as transaction:
        request = conn.execute(REQUEST, {"purpose": "incident 7", "run": run_id}).scalar()
        with pytest.raises(DBAPIError, match="not committed") as refused:
            conn.execute(UNWRAP, {"run": run_id, "key": key_id, "request": request})
        transaction.rollback()
    assert _sqlstate(refused) == "55000"
    assert table(engine, AUDIT) == []
    # The two steps: the request commits; the unwrap returns the key and is rolled back.
    with replayer.begin() as conn:
        request = conn.execute(REQUEST, {"purpose": "incident 7", "run": run_id}).scalar()
    with replayer.connect() as conn:
        transaction = conn.begin()
        version, wrapped = conn.execute(
            UNWRAP, {"run": run_id, "key": key_id, "request": request}
        ).one()
        transaction.rollback()
    assert version == "v1"
    assert wrapped  # the key left the database...
    # ... and the audit still says who took it, why, and for which run.
    assert table(engine, AUDIT) == [(user, "incident 7", run_id, None, "requested")]
    # Another principal cannot spend that request.
    other = login("blackbox_replayer", tenant=TENANT_A)
    with other.begin() as conn, pytest.raises(DBAPIError, match="no access request"):
        conn.execute(UNWRAP, {"run": run_id, "key": key_id, "request": request})
    # The library takes the two steps itself; every key it opens has a committed request.
    keys = AuditedKeys(replayer, LocalKeyProvider.from_file(private), purpose="incident 8")
    assert len(keys.opening_key(run_id, key_id)) == 32
    assert (user, "incident 8", run_id, None, "requested") in table(engine, AUDIT)


@pytest.mark.parametrize(
    "purpose",
    [
        "incident 7\nLOG:  blackbox unwrap: principal=auditor purpose=routine",
        "incident 7\r",
        "incident \x1b[2J7",
        "incident 7 \u202egnp.exe",
        "inci\u200bdent 7",
        "incident\u20287",
        "x" * 501,
        "ab",
        "   ",
    ],
    ids=[
        "newline",
        "carriage return",
        "escape",
        "bidi",
        "zero width",
        "line sep",
        "long",
        "short",
        "blank",
    ],
)
def test_a_purpose_the_audit_cannot_show_as_it_is_is_refused(
    engine: Engine, settings: Settings, login: Login, tmp_path: Path, purpose: str
) -> None:
    run_id, _, private = _run(engine, settings, tmp_path, TENANT_A)
    replayer = login("blackbox_replayer", tenant=TENANT_A)
    with replayer.begin() as conn, pytest.raises(DBAPIError) as refused:
        conn.execute(REQUEST, {"purpose": purpose, "run": run_id})
    assert _sqlstate(refused) == "22023"
    with pytest.raises(AccessDenied, match="purpose"):
        AuditedKeys(replayer, LocalKeyProvider.from_file(private), purpose=purpose)
    assert table(engine, AUDIT) == []


def test_a_request_for_another_tenants_run_is_refused_and_leaves_nothing(
    engine: Engine, settings: Settings, login: Login, tmp_path: Path
) -> None:
    run_id, _, _ = _run(engine, settings, tmp_path, TENANT_B)
    replayer = login("blackbox_replayer", tenant=TENANT_A)
    with replayer.begin() as conn, pytest.raises(DBAPIError, match="not granted") as refused:
        conn.execute(REQUEST, {"purpose": "curious", "run": run_id})
    assert _sqlstate(refused) == "42501"
    assert table(engine, AUDIT) == []
