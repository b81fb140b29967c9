"""Every command run as the wrong role stops at once with exit 2 and one line naming what
the database refused and the role the README's table gives the command: no traceback,
no retry, nothing changed."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine

from agent_blackbox.cli import main
from agent_blackbox.keystore import DataKeyStore, LocalKeyProvider
from agent_blackbox.outbox import Recorder, RunSnapshot
from agent_blackbox.outbox.relay import Relay
from agent_blackbox.replayer import write_archive
from agent_blackbox.schemas import CheckpointSigner, Settings
from tests.conftest import Login
from tests.integration._kafka import read_topic
from tests.security._keys import table

pytestmark = pytest.mark.integration

_OWNER = "the owner of both schemas"
_STATE = (
    "SELECT r.run_id, r.status, r.last_sequence, r.subject_ids, r.tenant_id, "
    "(SELECT count(*) FROM blackbox.outbox o WHERE o.run_id = r.run_id), "
    "(SELECT count(*) FROM blackbox.deletion_ledger d WHERE d.run_id = r.run_id), "
    "(SELECT count(*) FROM blackbox.tenant_grants) "
    "FROM blackbox.runs r"
)

# (login role, command, the role the message must name)
CASES = [
    ("blackbox_relay", ["ledger", "reapply"], _OWNER),
    ("blackbox_writer", ["forget", "--subject", "subject-w"], _OWNER),
    ("blackbox_writer", ["retention", "run"], _OWNER),
    ("blackbox_writer", ["tenants", "grant", "blackbox_reader", "tenant-x"], _OWNER),
    ("blackbox_writer", ["relay", "--until-idle", "30"], "blackbox_relay login"),
    ("blackbox_writer", ["consume", "--until-idle", "30"], "the owner of blackbox_views"),
    ("blackbox_writer", ["sign", "--until-idle", "30"], "the owner of blackbox_views"),
    ("blackbox_writer", ["verify", "--all"], "blackbox_reader login"),
    ("blackbox_relay", ["verify", "--all"], "blackbox_reader login"),
    ("blackbox_relay", ["replay", "--all", "--purpose", "incident 42 triage"], "blackbox_replayer"),
    ("blackbox_relay", ["timeline", "RUN"], "blackbox_replayer"),
    ("blackbox_writer", ["keys", "rotate"], _OWNER),
]


@pytest.fixture
def kek(tmp_path: Path) -> Path:
    path = tmp_path / "kek.json"
    made = CliRunner().invoke(main, ["keys", "init", str(path)])
    assert made.exit_code == 0, made.output
    return path


@pytest.fixture
def recorded(engine: Engine, settings: Settings, kek: Path) -> str:
    """A finished sealed run of subject-w, and one of subject-gone that the owner forgot
    (so the topic holds a run.redacted note), all published."""
    recorder = Recorder(
        engine, settings=settings, keys=DataKeyStore(LocalKeyProvider.from_file(kek))
    )
    runs = []
    for subject in ("subject-w", "subject-gone"):
        run = recorder.start_run(
            RunSnapshot(code_version="wrong-role"), agent_id="wrong-role", subject_ids=(subject,)
        )
        run.now()
        run.finish(output={"ok": True})
        runs.append(run.run_id)
    env = {"BLACKBOX_DATABASE_URL": settings.database_url, "BLACKBOX_TOPIC": settings.topic}
    forgot = CliRunner(env=env).invoke(main, ["forget", "--subject", "subject-gone"])
    assert forgot.exit_code == 0, forgot.output
    relay = Relay(engine, settings=settings)
    try:
        relay.drain(timeout=60)
    finally:
        relay.close()
    return runs[0]


@pytest.mark.parametrize(
    ("role", "command", "named"), CASES, ids=[f"{r} {' '.join(c[:2])}" for r, c, _ in CASES]
)
def test_a_command_run_as_the_wrong_role_names_the_role_and_exits_2(
    engine: Engine,
    settings: Settings,
    login: Login,
    tmp_path: Path,
    kek: Path,
    recorded: str,
    role: str,
    command: list[str],
    named: str,
) -> None:
    wrong = login(role, tenant="*")
    key = tmp_path / "signing.pem"
    key.touch(mode=0o600)
    key.write_bytes(CheckpointSigner.generate().private_key_pem())
    env = {
        "BLACKBOX_DATABASE_URL": wrong.url.render_as_string(hide_password=False),
        "BLACKBOX_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "BLACKBOX_TOPIC": settings.topic,
        "BLACKBOX_CONSUMER_GROUP": settings.consumer_group,
        "BLACKBOX_SIGNING_KEY_FILE": str(key),
        "BLACKBOX_KEK_FILE": str(kek),
        "BLACKBOX_AGENTS": "wrong-role=tests.integration._agents:ticket_agent",
        "COLUMNS": "400",
    }
    before = table(engine, _STATE)
    args = [recorded if word == "RUN" else word for word in command]
    started = time.monotonic()
    result = CliRunner(env=env).invoke(main, args)
    elapsed = time.monotonic() - started
    output = result.output.replace("\n", " ")
    assert result.exit_code == 2, output
    assert not isinstance(result.exception, Exception) or isinstance(
        result.exception, SystemExit
    ), output
    assert "Traceback" not in output
    assert "the database refused `blackbox " in output, output
    assert "permission denied" in output or "not granted" in output or "refus" in output
    assert f"login {wrong.url.username!r}" in output
    assert named in output, output
    assert elapsed < 10, f"{args} took {elapsed:.1f} s: a permission error was retried"
    assert table(engine, _STATE) == before


def test_a_timeline_with_bodies_as_a_login_that_may_open_none_stops_and_says_so(
    engine: Engine, settings: Settings, login: Login, tmp_path: Path, kek: Path, recorded: str
) -> None:
    """A reader may see a sealed run's timeline, not its bodies: asked for them, the
    command stops at the first (exit 2, naming the role to use), as export does, rather
    than print the refusal in every row and exit 0."""
    archive = tmp_path / "run.avro"
    published = read_topic(settings.kafka_bootstrap, settings.topic, expect=3)
    write_archive(archive, [e for _, _, e in published if e.run_id == recorded])
    reader = login("blackbox_reader", tenant="*")
    env = {
        "BLACKBOX_DATABASE_URL": reader.url.render_as_string(hide_password=False),
        "BLACKBOX_KEK_FILE": str(kek),
        "COLUMNS": "400",
    }
    args = ["timeline", recorded, "--archive", str(archive)]
    plain = CliRunner(env=env).invoke(main, args)
    assert plain.exit_code == 0, plain.output  # the metadata is the reader's to see
    bodies = CliRunner(env=env).invoke(main, [*args, "--bodies", "--purpose", "a role test"])
    output = bodies.output.replace("\n", " ")
    assert bodies.exit_code == 2, output
    assert "AccessDenied" not in output
    assert "the database refused `blackbox " in output, output
    assert "blackbox_replayer" in output, output
