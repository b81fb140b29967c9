"""Key-encryption keys: the port, and the local adapter (a key file or an environment variable).

A data key never rests in the clear: it is stored wrapped (AES-256-GCM) under a
key-encryption key (KEK) that has a version. The provider holds the KEKs; a cloud KMS
adapter implements the same three members.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from agent_blackbox.keystore._errors import KeyProviderError, UnknownKeyVersion, WrongKey
from agent_blackbox.keystore._keyfile import read_key_file, write_key_file

KEY_BYTES = 32
NONCE_BYTES = 12
_VERSION = re.compile(r"^[A-Za-z0-9._-]{1,32}$")


@dataclass(frozen=True, slots=True)
class WrappedKey:
    """A data key as stored: wrapped under the KEK of ``kek_version``."""

    kek_version: str
    blob: bytes = field(repr=False)


class KeyProvider(Protocol):
    """Holds the key-encryption keys; wraps and unwraps data keys."""

    @property
    def current_version(self) -> str:
        """The KEK version new data keys are wrapped under."""
        ...

    def wrap(self, key: bytes, *, aad: bytes, version: str | None = None) -> WrappedKey:
        """``key`` wrapped under the KEK ``version`` (the current one when None)."""
        ...

    def unwrap(self, wrapped: WrappedKey, *, aad: bytes) -> bytes:
        """The data key in ``wrapped``.

        Raises:
            UnknownKeyVersion: this provider does not hold ``wrapped.kek_version``.
            WrongKey: the KEK of that version does not open it.
        """
        ...


class LocalKeyProvider:
    """KEKs held in this process: from a JSON key file or the ``BLACKBOX_KEK`` variable.

    Args:
        keys: KEK version → 32 key bytes.
        current: the version new data keys are wrapped under (the last given if None).
    """

    def __init__(self, keys: Mapping[str, bytes], *, current: str | None = None) -> None:
        if not keys:
            raise KeyProviderError(
                "no key-encryption key given; set BLACKBOX_KEK or BLACKBOX_KEK_FILE"
            )
        for version, key in keys.items():
            if not _VERSION.match(version):
                raise KeyProviderError(f"KEK version {version!r} must match {_VERSION.pattern}")
            if len(key) != KEY_BYTES:
                raise KeyProviderError(
                    f"KEK {version} has {len(key)} bytes; AES-256 needs {KEY_BYTES}"
                )
        self._keys = {version: AESGCM(key) for version, key in keys.items()}
        self._current = current or list(keys)[-1]
        if self._current not in self._keys:
            raise KeyProviderError(
                f"current KEK version {self._current} is not among the keys given"
            )

    @property
    def current_version(self) -> str:
        return self._current

    @property
    def versions(self) -> tuple[str, ...]:
        """Every KEK version held."""
        return tuple(self._keys)

    def wrap(self, key: bytes, *, aad: bytes, version: str | None = None) -> WrappedKey:
        chosen = version or self._current
        nonce = os.urandom(NONCE_BYTES)
        return WrappedKey(chosen, nonce + self._kek(chosen).encrypt(nonce, key, aad))

    def unwrap(self, wrapped: WrappedKey, *, aad: bytes) -> bytes:
        kek = self._kek(wrapped.kek_version)
        try:
            return kek.decrypt(wrapped.blob[:NONCE_BYTES], wrapped.blob[NONCE_BYTES:], aad)
        except InvalidTag:
            raise WrongKey(
                f"the data key does not unwrap under KEK version {wrapped.kek_version}: the "
                "key-encryption key is not the one it was wrapped with, or the stored key "
                "was altered"
            ) from None

    def _kek(self, version: str) -> AESGCM:
        try:
            return self._keys[version]
        except KeyError:
            held = ", ".join(self._keys)
            raise UnknownKeyVersion(
                f"KEK version {version} is not held by this key provider (it holds {held}); "
                "add that version to BLACKBOX_KEK or BLACKBOX_KEK_FILE"
            ) from None

    # Sources -----------------------------------------------------------------------

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> LocalKeyProvider | None:
        """The provider ``BLACKBOX_KEK_FILE`` or ``BLACKBOX_KEK`` configures; None when
        neither is set (encryption off).

        ``BLACKBOX_KEK`` is ``version:base64key[,version:base64key...]``; the last one
        is current.
        """
        env = os.environ if environ is None else environ
        if path := env.get("BLACKBOX_KEK_FILE"):
            return cls.from_file(Path(path))
        if raw := env.get("BLACKBOX_KEK"):
            keys: dict[str, bytes] = {}
            for item in raw.split(","):
                version, sep, encoded = item.strip().partition(":")
                if not sep:
                    raise KeyProviderError("BLACKBOX_KEK items must look like version:base64key")
                keys[version] = _decode(encoded, f"BLACKBOX_KEK version {version}")
            return cls(keys)
        return None

    @classmethod
    def from_file(cls, path: Path) -> LocalKeyProvider:
        """Read a key file: ``{"current": "v2", "keys": {"v1": "<base64>", "v2": ...}}``.

        Raises:
            UnsafeKeyFile: the file is a symbolic link, not a regular file, or readable
                by its group or others (``chmod 600`` it).
            KeyProviderError: the file cannot be read or is not a key file.
        """
        raw = read_key_file(path)
        try:
            document = json.loads(raw.decode("utf-8"))
            keys = {
                str(v): _decode(str(k), f"{path} version {v}") for v, k in document["keys"].items()
            }
            current = document.get("current")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise KeyProviderError(
                f'{path} is not a key file: expected {{"current": ..., "keys": {{version: '
                f"base64}}}} ({exc})"
            ) from exc
        return cls(keys, current=None if current is None else str(current))

    @staticmethod
    def write_file(path: Path, *, version: str = "v1", add_to: Path | None = None) -> str:
        """Write a key file with a fresh KEK ``version`` (added to the keys of ``add_to``
        and made current), readable by its owner only; returns the version."""
        keys: dict[str, str] = {}
        if add_to is not None:
            keys = _encoded_keys(add_to)
        if version in keys:
            raise KeyProviderError(f"{add_to} already holds KEK version {version}")
        keys[version] = base64.b64encode(AESGCM.generate_key(bit_length=256)).decode("ascii")
        document = json.dumps({"current": version, "keys": keys}, indent=2)
        write_key_file(path, document.encode("utf-8"))
        return version


def _encoded_keys(path: Path) -> dict[str, str]:
    """The version → base64 key map of the key file ``path``, unchanged."""
    try:
        return {str(v): str(k) for v, k in json.loads(read_key_file(path))["keys"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise KeyProviderError(f"{path} is not a key file ({exc}); fix or move it") from exc


def _decode(encoded: str, what: str) -> bytes:
    try:
        return base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise KeyProviderError(f"{what} is not base64") from exc
