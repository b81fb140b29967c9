"""Finding 12: ``keys init`` left the KEK world-readable when a stale temporary file
existed and followed a planted symlink; ``from_file`` loaded a 0644 key silently.

Driven through the CLI an operator uses; the key files' own code is in
``keystore/_keyfile.py``.
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine

from agent_blackbox.cli.main import main
from agent_blackbox.keystore import DataKeyStore, LocalKeyProvider, UnsafeKeyFile
from agent_blackbox.outbox import Recorder, RunSnapshot
from agent_blackbox.schemas import Settings
from tests.security._keys import table

pytestmark = pytest.mark.integration


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def _init(path: Path, *more: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["keys", "init", str(path), *more])
    return result.exit_code, result.output


@pytest.mark.parametrize("pair", [False, True], ids=["symmetric", "key pair"])
@pytest.mark.parametrize("stale", ["symlink to a victim", "world-readable file"])
def test_keys_init_with_a_stale_temporary_file_writes_an_owner_only_key(
    tmp_path: Path, stale: str, pair: bool
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious", encoding="utf-8")
    victim.chmod(0o644)
    path = tmp_path / "kek.json"
    leftover = path.with_suffix(".tmp")  # where the old code put its temporary file
    if stale == "symlink to a victim":
        leftover.symlink_to(victim)
    else:
        leftover.write_text("{}", encoding="utf-8")
        leftover.chmod(0o644)
    code, output = _init(path, *(["--pair"] if pair else []))
    assert code == 0, output
    assert not path.is_symlink()
    assert _mode(path) == 0o600
    assert LocalKeyProvider.from_file(path).current_version == "v1"
    assert victim.read_text(encoding="utf-8") == "precious"
    assert _mode(victim) == 0o644  # neither written nor narrowed through the link


@pytest.mark.parametrize("dangling", [False, True], ids=["to a file", "dangling"])
def test_keys_init_refuses_a_planted_symlink(tmp_path: Path, dangling: bool) -> None:
    victim = tmp_path / "victim"
    if not dangling:
        victim.write_text("precious", encoding="utf-8")
    path = tmp_path / "kek.json"
    path.symlink_to(victim)
    for more in ([], ["--pair"], ["--add"]):
        code, output = _init(path, *more)
        assert code == 2, output  # could not run
        if dangling:
            assert not victim.exists()
        else:
            assert victim.read_text(encoding="utf-8") == "precious"
    # The public half of a key pair is not written through a planted link either.
    real = tmp_path / "real.json"
    public_victim = tmp_path / "public-victim"
    (tmp_path / "real.pub.json").symlink_to(public_victim)
    code, output = _init(real, "--pair")
    assert code == 2
    assert "exists" in output
    assert not real.exists()
    assert not public_victim.exists()


def test_a_key_file_others_can_read_is_refused_and_nothing_is_done(
    engine: Engine, settings: Settings, tmp_path: Path
) -> None:
    path = tmp_path / "kek.json"
    assert _init(path)[0] == 0
    recorder = Recorder(
        engine, settings=settings, keys=DataKeyStore(LocalKeyProvider.from_file(path))
    )
    recorder.start_run(RunSnapshot(code_version="keys.12"), agent_id="keys-12")
    before = table(engine, "SELECT key_id, kek_version, wrapped FROM blackbox.data_keys")
    path.chmod(0o644)
    code, output = _init(path, "--add", "--version", "v2")
    assert code == 2
    assert "chmod 600" in output
    env = {"BLACKBOX_KEK_FILE": str(path), "BLACKBOX_DATABASE_URL": settings.database_url}
    rotated = CliRunner(env=env).invoke(main, ["keys", "rotate"])
    assert rotated.exit_code == 2
    assert "readable or writable by others" in rotated.output
    assert "chmod 600" in rotated.output
    assert table(engine, "SELECT key_id, kek_version, wrapped FROM blackbox.data_keys") == before
    with pytest.raises(UnsafeKeyFile, match="chmod 600"):
        LocalKeyProvider.from_file(path)


def test_a_signing_key_file_others_can_read_is_refused_by_sign_and_forget(
    engine: Engine, settings: Settings, tmp_path: Path
) -> None:
    key = tmp_path / "signing.pem"
    made = CliRunner().invoke(main, ["keys", "signing", str(key)])
    assert made.exit_code == 0, made.output
    assert _mode(key) == 0o600
    kek = tmp_path / "kek.json"
    assert _init(kek)[0] == 0
    recorder = Recorder(
        engine, settings=settings, keys=DataKeyStore(LocalKeyProvider.from_file(kek))
    )
    subject = "subject-12"
    recorder.start_run(
        RunSnapshot(code_version="keys.12"), agent_id="keys-12", subject_ids=(subject,)
    ).finish(output={"ok": True})
    keys_before = table(engine, "SELECT key_id, wrapped FROM blackbox.data_keys")
    ledger_before = table(engine, "SELECT * FROM blackbox.deletion_ledger")
    key.chmod(0o644)  # what a careless copy leaves: anyone on the host could sign
    env = {
        "BLACKBOX_SIGNING_KEY_FILE": str(key),
        "BLACKBOX_DATABASE_URL": settings.database_url,
        "BLACKBOX_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "BLACKBOX_TOPIC": settings.topic,
    }
    for command in (["sign", "--until-idle", "1"], ["forget", "--subject", subject]):
        result = CliRunner(env=env).invoke(main, command)
        assert result.exit_code == 2, (command, result.output)
        assert "readable or writable by others (mode 0644)" in result.output
        assert f"chmod 600 {key}" in result.output.replace("\n", "")
    assert table(engine, "SELECT key_id, wrapped FROM blackbox.data_keys") == keys_before
    assert table(engine, "SELECT * FROM blackbox.deletion_ledger") == ledger_before
    link = tmp_path / "link.pem"
    link.symlink_to(key)
    key.chmod(0o600)
    refused = CliRunner(env={**env, "BLACKBOX_SIGNING_KEY_FILE": str(link)}).invoke(
        main, ["forget", "--subject", subject]
    )
    assert refused.exit_code == 2, refused.output
    assert "symbolic link" in refused.output
    assert table(engine, "SELECT key_id, wrapped FROM blackbox.data_keys") == keys_before
