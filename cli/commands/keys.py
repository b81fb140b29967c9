"""``blackbox keys``: create key-encryption and signing keys, rotate data-key wrapping."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NoReturn

import click

from agent_blackbox.cli._wiring import wired
from agent_blackbox.keystore import DataKeyStore, KeyProviderError, LocalKeyProvider
from agent_blackbox.keystore._keyfile import write_key_file
from agent_blackbox.schemas import (
    BlackboxError,
    CheckpointSigner,
    permission_refused,
    safe_console,
    safe_text,
)


def could_not_run(message: object) -> NoReturn:
    """Say on standard error why the command could not run, and exit 2."""
    safe_console(stderr=True).print(f"[red]error:[/] {safe_text(str(message))}", soft_wrap=True)
    sys.exit(2)


@click.group("keys")
def keys_group() -> None:
    """Key-encryption keys (BLACKBOX_KEK_FILE) and the checkpoint signing key."""


@keys_group.command("init")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--version", "version", default="v1", show_default=True, help="KEK version name.")
@click.option(
    "--add", is_flag=True, help="Add a new current version to the existing key file PATH."
)
@click.option(
    "--pair",
    is_flag=True,
    help="Make the version an X25519 key pair: PATH keeps the private half (replayer), "
    "PATH with .pub.json the public half (agents: wrap only).",
)
def keys_init(path: Path, version: str, add: bool, pair: bool) -> None:
    """Write a key file with a fresh KEK (owner-only permissions): a symmetric AES-256
    key, or with --pair a key pair whose public half agents get."""
    if os.path.lexists(path) and not add:
        could_not_run(f"{path} exists; pass --add to add version {version} to it")
    public = public_path(path)
    if pair and not add and os.path.lexists(public):
        could_not_run(f"{public} exists; move it away or pass --add")
    try:
        LocalKeyProvider.write_file(path, version=version, add_to=path if add else None, pair=pair)
        if pair:
            LocalKeyProvider.from_file(path).write_public_file(public)
    except (KeyProviderError, OSError, ValueError) as exc:
        could_not_run(exc)
    console = safe_console()
    if pair:
        console.print(
            f"KEK version {version} (key pair) written: private half {path} for the replayer "
            f"and `blackbox keys rotate` (BLACKBOX_KEK_FILE={path}); public half {public} for "
            f"agent hosts (BLACKBOX_KEK_PUBLIC_FILE={public}: with it they can wrap new data "
            "keys but unwrap none). Keep a copy of the private file somewhere safe"
        )
    else:
        console.print(
            f"KEK version {version} (symmetric) written to {path}: set "
            f"BLACKBOX_KEK_FILE={path} for the replayer and `blackbox keys rotate` only, and "
            "keep a copy somewhere safe. Agent hosts should not get this file (whoever holds "
            "it can unwrap every data key): add a key pair for them with `blackbox keys init "
            f"--pair --add --version {_next_version(version)} {path}`, run `blackbox keys "
            "rotate`, and give agents "
            "its public half (BLACKBOX_KEK_PUBLIC_FILE)"
        )


def _next_version(version: str) -> str:
    """A version name to suggest beside ``version`` (``v1`` → ``v2``)."""
    number = version.removeprefix("v")
    return f"v{int(number) + 1}" if number.isdigit() else f"{version}-pair"


def public_path(path: Path) -> Path:
    """Where ``keys init --pair`` writes the public half of the key file ``path``."""
    return path.with_name(path.name.removesuffix(".json") + ".pub.json")


@keys_group.command("signing")
@click.argument("path", type=click.Path(path_type=Path))
def keys_signing(path: Path) -> None:
    """Write a fresh Ed25519 checkpoint signing key (PEM) and its public key beside it."""
    public = path.with_suffix(".pub.pem")
    for target in (path, public):
        if os.path.lexists(target):
            could_not_run(f"{target} exists; choose another path")
    signer = CheckpointSigner.generate()
    try:
        write_key_file(path, signer.private_key_pem())
        # The public key is for every verifier to read, but is never written through a
        # link planted at its path: O_EXCL|O_NOFOLLOW creates it or fails.
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        with os.fdopen(os.open(public, flags, 0o644), "wb") as out:
            out.write(signer.public_key_pem())
    except OSError as exc:
        could_not_run(f"cannot write {public}: {exc.strerror}")
    except KeyProviderError as exc:
        could_not_run(exc)
    safe_console().print(
        f"signing key {signer.key_id}: {path} (for `blackbox sign` only; agents never get "
        f"it), public key {public} (for `blackbox verify`: BLACKBOX_SIGNING_PUBLIC_KEYS)"
    )


@keys_group.command("rotate")
def keys_rotate() -> None:
    """Re-wrap every data key under the current KEK version of BLACKBOX_KEK_FILE (and
    store the copy wrap-only agents read of digest keys made by earlier releases)."""
    try:
        provider = LocalKeyProvider.from_env()
    except BlackboxError as exc:
        if permission_refused(exc) is not None:
            raise  # the top-level command names the role to run as
        could_not_run(exc)
    if provider is None:
        could_not_run("set BLACKBOX_KEK_FILE (holding the old and the new version)")
    engine = wired().engine()
    try:
        with safe_console(stderr=True).status(f"re-wrapping under {provider.current_version}"):
            count = DataKeyStore(provider).rotate(engine)
    except BlackboxError as exc:
        if permission_refused(exc) is not None:
            raise  # the top-level command names the role to run as
        could_not_run(exc)
    finally:
        engine.dispose()
    safe_console().print(f"{count} keys re-wrapped under KEK version {provider.current_version}")
