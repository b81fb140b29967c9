"""Key files: a planted symlink or a stale temporary file can neither redirect nor widen
the write, and a key file others can read is refused."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent_blackbox.cli.main import main
from agent_blackbox.keystore import KeyProviderError, LocalKeyProvider, UnsafeKeyFile


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_keys_init_writes_an_owner_only_file_that_loads(tmp_path: Path) -> None:
    path = tmp_path / "kek.json"
    result = CliRunner().invoke(main, ["keys", "init", str(path)])
    assert result.exit_code == 0, result.output
    assert _mode(path) == 0o600
    assert LocalKeyProvider.from_file(path).versions == ("v1",)
    assert [p.name for p in tmp_path.iterdir()] == ["kek.json"]  # no temporary file left


def test_keys_init_does_not_follow_a_planted_symlink(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious", encoding="utf-8")
    path = tmp_path / "kek.json"
    path.symlink_to(victim)
    result = CliRunner().invoke(main, ["keys", "init", str(path)])
    assert result.exit_code != 0
    assert "exists" in result.output
    assert victim.read_text(encoding="utf-8") == "precious"
    with pytest.raises(UnsafeKeyFile, match="symbolic link"):
        LocalKeyProvider.write_file(path, version="v1")
    assert victim.read_text(encoding="utf-8") == "precious"


def test_a_dangling_planted_symlink_is_not_written_through(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.json"
    path = tmp_path / "kek.json"
    path.symlink_to(target)
    result = CliRunner().invoke(main, ["keys", "init", str(path)])
    assert result.exit_code != 0
    assert not target.exists()


@pytest.mark.parametrize("stale", ["kek.tmp", "world-readable"])
def test_a_stale_temporary_file_neither_redirects_nor_widens_the_write(
    tmp_path: Path, stale: str
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious", encoding="utf-8")
    victim.chmod(0o644)
    path = tmp_path / "kek.json"
    temporary = path.with_suffix(".tmp")
    if stale == "kek.tmp":  # a symlink where the old code put its temporary file
        temporary.symlink_to(victim)
    else:  # a world-readable file left where the old code put its temporary file
        temporary.write_text("{}", encoding="utf-8")
        temporary.chmod(0o644)
    result = CliRunner().invoke(main, ["keys", "init", str(path)])
    assert result.exit_code == 0, result.output
    assert not path.is_symlink()
    assert _mode(path) == 0o600
    assert victim.read_text(encoding="utf-8") == "precious"
    assert _mode(victim) & 0o077  # not narrowed to 0600 either: the victim was not touched
    assert LocalKeyProvider.from_file(path).current_version == "v1"


def test_adding_a_version_keeps_the_file_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "kek.json"
    LocalKeyProvider.write_file(path, version="v1")
    LocalKeyProvider.write_file(path, version="v2", add_to=path)
    assert _mode(path) == 0o600
    assert json.loads(path.read_text(encoding="utf-8"))["current"] == "v2"


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_key_file_others_can_read_is_refused_naming_the_file_and_the_fix(
    tmp_path: Path, mode: int
) -> None:
    path = tmp_path / "kek.json"
    LocalKeyProvider.write_file(path, version="v1")
    path.chmod(mode)
    with pytest.raises(UnsafeKeyFile) as caught:
        LocalKeyProvider.from_file(path)
    assert str(path) in str(caught.value)
    assert f"chmod 600 {path}" in str(caught.value)
    with pytest.raises(UnsafeKeyFile):
        LocalKeyProvider.from_env({"BLACKBOX_KEK_FILE": str(path)})
    with pytest.raises(UnsafeKeyFile):  # nor is a version added to it
        LocalKeyProvider.write_file(path, version="v2", add_to=path)
    assert _mode(path) == mode


def test_a_symlinked_key_file_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real.json"
    LocalKeyProvider.write_file(real, version="v1")
    link = tmp_path / "kek.json"
    link.symlink_to(real)
    with pytest.raises(UnsafeKeyFile, match=f"{link} is a symbolic link"):
        LocalKeyProvider.from_file(link)


def test_a_key_path_that_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "kek.fifo"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(UnsafeKeyFile, match="not a regular file"):
        LocalKeyProvider.from_file(fifo)  # does not hang on the FIFO
    with pytest.raises(UnsafeKeyFile, match="not a regular file"):
        LocalKeyProvider.from_file(tmp_path)


def test_a_missing_key_file_says_so(tmp_path: Path) -> None:
    missing = tmp_path / "absent.json"
    with pytest.raises(KeyProviderError, match=f"cannot read the key file {missing}"):
        LocalKeyProvider.from_file(missing)


def test_keys_signing_writes_an_owner_only_private_key(tmp_path: Path) -> None:
    path = tmp_path / "signing.pem"
    result = CliRunner().invoke(main, ["keys", "signing", str(path)])
    assert result.exit_code == 0, result.output
    assert _mode(path) == 0o600
    assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert (tmp_path / "signing.pub.pem").read_bytes().startswith(b"-----BEGIN PUBLIC KEY")


def test_keys_signing_does_not_write_through_a_planted_public_key_symlink(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious", encoding="utf-8")
    (tmp_path / "signing.pub.pem").symlink_to(victim)
    result = CliRunner().invoke(main, ["keys", "signing", str(tmp_path / "signing.pem")])
    assert result.exit_code != 0
    assert "signing.pub.pem exists" in result.output
    assert victim.read_text(encoding="utf-8") == "precious"
    assert not (tmp_path / "signing.pem").exists()  # nothing half-written


def test_keys_init_tells_who_gets_which_file(tmp_path: Path) -> None:
    symmetric = CliRunner().invoke(main, ["keys", "init", str(tmp_path / "kek.json")])
    assert symmetric.exit_code == 0, symmetric.output
    said = " ".join(symmetric.output.split())
    assert "for agents" not in said
    assert "Agent hosts should not get this file" in said
    assert "--pair --add --version v2" in said
    assert "BLACKBOX_KEK_PUBLIC_FILE" in said
    pair = CliRunner().invoke(main, ["keys", "init", "--pair", str(tmp_path / "pair.json")])
    assert pair.exit_code == 0, pair.output
    said = " ".join(pair.output.split())
    assert "wrap and unwrap nothing" not in said
    assert "can wrap new data keys but unwrap none" in said
