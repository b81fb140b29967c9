"""Key pair KEKs: the public half wraps, only the private half unwraps; files and settings."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent_blackbox.cli.main import main
from agent_blackbox.keystore import (
    KeyProviderError,
    LocalKeyProvider,
    PublicKeyProvider,
    UnknownKeyVersion,
    UnsafeKeyFile,
    WrapOnly,
    WrongKey,
    provider_from_env,
    wrapping_aad,
)
from agent_blackbox.schemas import Settings

AAD = wrapping_aad("run-1", "dk-1")
KEY = os.urandom(32)


def _pair(tmp_path: Path, *args: str) -> tuple[Path, Path]:
    private = tmp_path / "kek.json"
    result = CliRunner().invoke(main, ["keys", "init", str(private), "--pair", *args])
    assert result.exit_code == 0, result.output
    return private, tmp_path / "kek.pub.json"


def test_the_public_half_wraps_and_only_the_private_half_unwraps(tmp_path: Path) -> None:
    private, public = _pair(tmp_path)
    agent = PublicKeyProvider.from_file(public)
    replayer = LocalKeyProvider.from_file(private)
    wrapped = agent.wrap(KEY, aad=AAD)
    assert wrapped.kek_version == "v1"
    assert KEY not in wrapped.blob
    assert replayer.unwrap(wrapped, aad=AAD) == KEY
    with pytest.raises(WrapOnly, match="public half only"):
        agent.unwrap(wrapped, aad=AAD)
    with pytest.raises(WrongKey):  # bound to its run and key id
        replayer.unwrap(wrapped, aad=wrapping_aad("run-2", "dk-1"))
    with pytest.raises(WrongKey):  # another key pair of the same version name
        LocalKeyProvider({}, pairs={"v1": os.urandom(32)}).unwrap(wrapped, aad=AAD)
    # Each wrap is fresh (ephemeral key, nonce): two wraps of one key differ.
    assert agent.wrap(KEY, aad=AAD).blob != wrapped.blob


def test_the_public_file_holds_no_private_material_and_is_readable(tmp_path: Path) -> None:
    private, public = _pair(tmp_path)
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert stat.S_IMODE(public.stat().st_mode) == 0o644
    secret = json.loads(private.read_text())["keys"]["v1"]["x25519"]
    assert secret not in public.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kek.json", "kek.pub.json"]


def test_a_public_file_others_can_change_or_a_key_file_given_as_one_is_refused(
    tmp_path: Path,
) -> None:
    private, public = _pair(tmp_path)
    public.chmod(0o666)
    with pytest.raises(UnsafeKeyFile, match="chmod 644"):
        PublicKeyProvider.from_file(public)
    with pytest.raises(KeyProviderError, match="not a key file"):
        PublicKeyProvider.from_file(private)  # the private file is never the agents' file
    link = tmp_path / "link.pub.json"
    public.chmod(0o644)
    link.symlink_to(public)
    with pytest.raises(UnsafeKeyFile, match="symbolic link"):
        PublicKeyProvider.from_file(link)


def test_a_symmetric_deployment_adds_a_key_pair_version_and_keeps_its_old_keys(
    tmp_path: Path,
) -> None:
    path = tmp_path / "kek.json"
    assert CliRunner().invoke(main, ["keys", "init", str(path)]).exit_code == 0
    old = LocalKeyProvider.from_file(path)
    legacy = old.wrap(KEY, aad=AAD)
    refused = CliRunner().invoke(main, ["keys", "init", str(path), "--pair"])
    assert refused.exit_code != 0
    assert "--add" in refused.output
    _pair(tmp_path, "--add", "--version", "v2")
    both = LocalKeyProvider.from_file(path)
    assert both.versions == ("v1", "v2")
    assert both.current_version == "v2"
    assert both.unwrap(legacy, aad=AAD) == KEY  # v1 still opens
    agent = PublicKeyProvider.from_file(tmp_path / "kek.pub.json")
    assert agent.versions == ("v2",)
    with pytest.raises(UnknownKeyVersion, match="BLACKBOX_KEK_PUBLIC_FILE"):
        agent.wrap(KEY, aad=AAD, version="v1")
    assert both.unwrap(agent.wrap(KEY, aad=AAD), aad=AAD) == KEY


def test_the_environment_picks_the_provider_and_refuses_both_kinds(tmp_path: Path) -> None:
    private, public = _pair(tmp_path)
    agent = provider_from_env({"BLACKBOX_KEK_PUBLIC_FILE": str(public)})
    assert isinstance(agent, PublicKeyProvider)
    replayer = provider_from_env({"BLACKBOX_KEK_FILE": str(private)})
    assert isinstance(replayer, LocalKeyProvider)
    assert provider_from_env({}) is None
    with pytest.raises(KeyProviderError, match="unset one"):
        provider_from_env(
            {"BLACKBOX_KEK_PUBLIC_FILE": str(public), "BLACKBOX_KEK_FILE": str(private)}
        )


def test_every_run_of_an_encrypting_recorder_is_keyed_unless_its_class_opts_out() -> None:
    default = Settings()
    assert default.digest_keyed("internal", encrypted=True)
    assert not default.digest_keyed("internal", encrypted=False)  # bodies are plain anyway
    assert default.digest_keyed("sensitive", encrypted=False)  # refused without keys
    opted = Settings(plain_digest_classes="public, internal")
    assert not opted.digest_keyed("internal", encrypted=True)
    assert opted.digest_keyed("customer", encrypted=True)
    everything = Settings(plain_digest_classes="*")
    assert not everything.digest_keyed("customer", encrypted=True)
    assert everything.digest_keyed("sensitive", encrypted=True)  # never opted out
    from_env = Settings.from_env({"BLACKBOX_PLAIN_DIGEST_CLASSES": "public"})
    assert not from_env.digest_keyed("public", encrypted=True)
