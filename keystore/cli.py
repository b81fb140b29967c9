"""``blackbox keys``: create key-encryption and signing keys, rotate data-key wrapping."""

from __future__ import annotations

import os
from pathlib import Path

import click
from sqlalchemy import create_engine

from agent_blackbox.keystore._errors import KeyProviderError
from agent_blackbox.keystore._keyfile import write_key_file
from agent_blackbox.keystore._postgres import DataKeyStore
from agent_blackbox.keystore._provider import LocalKeyProvider
from agent_blackbox.schemas import BlackboxError, CheckpointSigner, Settings, safe_console


@click.group("keys")
def keys_group() -> None:
    """Key-encryption keys (BLACKBOX_KEK_FILE) and the checkpoint signing key."""


@keys_group.command("init")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--version", "version", default="v1", show_default=True, help="KEK version name.")
@click.option(
    "--add", is_flag=True, help="Add a new current version to the existing key file PATH."
)
def keys_init(path: Path, version: str, add: bool) -> None:
    """Write a key file with a fresh AES-256 KEK (owner-only permissions)."""
    if os.path.lexists(path) and not add:
        raise click.ClickException(f"{path} exists; pass --add to add version {version} to it")
    try:
        LocalKeyProvider.write_file(path, version=version, add_to=path if add else None)
    except (KeyProviderError, OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    safe_console().print(
        f"KEK version {version} written to {path}; set BLACKBOX_KEK_FILE={path} for agents, "
        "the relay-side jobs and the replayer, and keep a copy somewhere safe"
    )


@keys_group.command("signing")
@click.argument("path", type=click.Path(path_type=Path))
def keys_signing(path: Path) -> None:
    """Write a fresh Ed25519 checkpoint signing key (PEM) and its public key beside it."""
    public = path.with_suffix(".pub.pem")
    for target in (path, public):
        if os.path.lexists(target):
            raise click.ClickException(f"{target} exists; choose another path")
    signer = CheckpointSigner.generate()
    try:
        write_key_file(path, signer.private_key_pem())
        # The public key is for every verifier to read, but is never written through a
        # link planted at its path: O_EXCL|O_NOFOLLOW creates it or fails.
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        with os.fdopen(os.open(public, flags, 0o644), "wb") as out:
            out.write(signer.public_key_pem())
    except OSError as exc:
        raise click.ClickException(f"cannot write {public}: {exc.strerror}") from exc
    except KeyProviderError as exc:
        raise click.ClickException(str(exc)) from exc
    safe_console().print(
        f"signing key {signer.key_id}: {path} (for `blackbox sign` only; agents never get "
        f"it), public key {public} (for `blackbox verify`: BLACKBOX_SIGNING_PUBLIC_KEYS)"
    )


@keys_group.command("rotate")
def keys_rotate() -> None:
    """Re-wrap every data key under the current KEK version of BLACKBOX_KEK_FILE."""
    provider = LocalKeyProvider.from_env()
    if provider is None:
        raise click.ClickException("set BLACKBOX_KEK_FILE (holding the old and the new version)")
    engine = create_engine(Settings.from_env().database_url)
    try:
        with safe_console(stderr=True).status(f"re-wrapping under {provider.current_version}"):
            count = DataKeyStore(provider).rotate(engine)
    except BlackboxError as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        engine.dispose()
    safe_console().print(f"{count} keys re-wrapped under KEK version {provider.current_version}")
