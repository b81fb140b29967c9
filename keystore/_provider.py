"""Key-encryption keys: the port, and the local adapters (key files, an environment variable).

A data key never rests in the clear: it is stored wrapped under a key-encryption key
(KEK) that has a version. A version is one of two kinds:

- symmetric (AES-256-GCM): whoever wraps can also unwrap; what earlier releases made;
- a key pair (X25519 + HKDF-SHA256 + AES-256-GCM, see ``_x25519.py``): the public half
  wraps, only the private half unwraps.

:class:`LocalKeyProvider` holds whole KEKs (symmetric keys and private halves): the
replayer, rotation and retention's restores. :class:`PublicKeyProvider` holds public
halves only: what agent hosts are given, so that an agent host, or anyone who takes its
configuration, can wrap new data keys and unwrap none. A cloud KMS adapter implements the
same three members of :class:`KeyProvider`.
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
from typing import Any, Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from agent_blackbox.keystore import _x25519 as x25519
from agent_blackbox.keystore._errors import (
    KeyProviderError,
    UnknownKeyVersion,
    WrapOnly,
    WrongKey,
)
from agent_blackbox.keystore._keyfile import (
    read_key_file,
    read_public_file,
    write_key_file,
    write_public_file,
)

KEY_BYTES = 32
NONCE_BYTES = 12
_VERSION = re.compile(r"^[A-Za-z0-9._-]{1,32}$")
_PAIR = "x25519"
"""The member naming a key pair version in key files: ``{"x25519": "<base64>"}``."""


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
            WrapOnly: this provider holds only the public half of that version.
        """
        ...


class _Kek(Protocol):
    def wrap(self, key: bytes, aad: bytes, version: str) -> bytes: ...

    def unwrap(self, blob: bytes, aad: bytes, version: str) -> bytes | None: ...


class _Symmetric:
    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)

    def wrap(self, key: bytes, aad: bytes, version: str) -> bytes:
        nonce = os.urandom(NONCE_BYTES)
        return nonce + self._aead.encrypt(nonce, key, aad)

    def unwrap(self, blob: bytes, aad: bytes, version: str) -> bytes | None:
        try:
            return self._aead.decrypt(blob[:NONCE_BYTES], blob[NONCE_BYTES:], aad)
        except InvalidTag:
            return None


class _Pair:
    """A key pair version; ``private`` is None where only the public half is held."""

    def __init__(self, public: bytes, private: bytes | None) -> None:
        self.public = public
        self._private = private

    def wrap(self, key: bytes, aad: bytes, version: str) -> bytes:
        return x25519.seal_to(self.public, version, key, aad)

    def unwrap(self, blob: bytes, aad: bytes, version: str) -> bytes | None:
        if self._private is None:
            raise WrapOnly(
                f"KEK version {version} is held here as its public half only: this host "
                "wraps new data keys and unwraps none (agents are wrap-only by design); "
                "unwrap on the replayer, whose BLACKBOX_KEK_FILE holds the private half"
            )
        return x25519.open_with(self._private, version, blob, aad)


class _Keyring:
    """Versions of KEKs of either kind, one of them current."""

    def __init__(self, keks: dict[str, _Kek], current: str | None, source: str) -> None:
        if not keks:
            raise KeyProviderError(f"no key-encryption key given; set {source}")
        for version in keks:
            if not _VERSION.match(version):
                raise KeyProviderError(f"KEK version {version!r} must match {_VERSION.pattern}")
        self._keks = keks
        self._current = current or list(keks)[-1]
        self._source = source
        if self._current not in keks:
            raise KeyProviderError(
                f"current KEK version {self._current} is not among the keys given"
            )

    @property
    def current_version(self) -> str:
        return self._current

    @property
    def versions(self) -> tuple[str, ...]:
        """Every KEK version held."""
        return tuple(self._keks)

    def wrap(self, key: bytes, *, aad: bytes, version: str | None = None) -> WrappedKey:
        chosen = version or self._current
        return WrappedKey(chosen, self._kek(chosen).wrap(key, aad, chosen))

    def unwrap(self, wrapped: WrappedKey, *, aad: bytes) -> bytes:
        version = wrapped.kek_version
        secret = self._kek(version).unwrap(wrapped.blob, aad, version)
        if secret is None:
            raise WrongKey(
                f"the data key does not unwrap under KEK version {version}: the "
                "key-encryption key is not the one it was wrapped with, or the stored key "
                "was altered"
            )
        return secret

    def _kek(self, version: str) -> _Kek:
        try:
            return self._keks[version]
        except KeyError:
            held = ", ".join(self._keks)
            raise UnknownKeyVersion(
                f"KEK version {version} is not held by this key provider (it holds {held}); "
                f"add that version to {self._source}"
            ) from None


class LocalKeyProvider(_Keyring):
    """Whole KEKs held in this process: from a key file or the ``BLACKBOX_KEK`` variable.

    Args:
        keys: symmetric KEK version → 32 key bytes.
        pairs: key pair KEK version → 32 bytes of its X25519 private key.
        current: the version new data keys are wrapped under (the last given if None).
    """

    def __init__(
        self,
        keys: Mapping[str, bytes],
        *,
        current: str | None = None,
        pairs: Mapping[str, bytes] | None = None,
    ) -> None:
        keks: dict[str, _Kek] = {}
        for version, key in keys.items():
            if len(key) != KEY_BYTES:
                raise KeyProviderError(
                    f"KEK {version} has {len(key)} bytes; AES-256 needs {KEY_BYTES}"
                )
            keks[version] = _Symmetric(key)
        for version, private in (pairs or {}).items():
            if version in keks:
                raise KeyProviderError(f"KEK version {version} is given twice")
            if len(private) != x25519.POINT_BYTES:
                raise KeyProviderError(f"KEK {version}: an X25519 private key has 32 bytes")
            keks[version] = _Pair(x25519.public_half(private), private)
        super().__init__(keks, current, "BLACKBOX_KEK or BLACKBOX_KEK_FILE")

    def public_keys(self) -> dict[str, bytes]:
        """The public half of every key pair version (what agents are given)."""
        return {v: kek.public for v, kek in self._keks.items() if isinstance(kek, _Pair)}

    # Sources -----------------------------------------------------------------------

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> LocalKeyProvider | None:
        """The provider ``BLACKBOX_KEK_FILE`` or ``BLACKBOX_KEK`` configures; None when
        neither is set (encryption off).

        ``BLACKBOX_KEK`` is ``version:base64key[,version:base64key...]`` (symmetric
        versions only); the last one is current.
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
        """Read a key file: ``{"current": "v2", "keys": {"v1": "<base64>", "v2":
        {"x25519": "<base64 private key>"}}}`` (a string is a symmetric version).

        Raises:
            UnsafeKeyFile: the file is a symbolic link, not a regular file, or readable
                by its group or others (``chmod 600`` it).
            KeyProviderError: the file cannot be read or is not a key file.
        """
        document = _document(read_key_file(path), path, "keys")
        keys: dict[str, bytes] = {}
        pairs: dict[str, bytes] = {}
        for version, value in document["keys"].items():
            if isinstance(value, dict):
                pairs[str(version)] = _decode(value.get(_PAIR), f"{path} version {version}")
            else:
                keys[str(version)] = _decode(value, f"{path} version {version}")
        current = document.get("current")
        return cls(keys, pairs=pairs, current=None if current is None else str(current))

    @staticmethod
    def write_file(
        path: Path, *, version: str = "v1", add_to: Path | None = None, pair: bool = False
    ) -> str:
        """Write a key file with a fresh KEK ``version`` (added to the keys of ``add_to``
        and made current), readable by its owner only; returns the version.

        With ``pair``, the new version is an X25519 key pair (write its public half for
        agents with :meth:`write_public_file`); else a symmetric AES-256 key.
        """
        keys: dict[str, Any] = {}
        if add_to is not None:
            keys = _document(read_key_file(add_to), add_to, "keys")["keys"]
        if version in keys:
            raise KeyProviderError(f"{add_to} already holds KEK version {version}")
        if not _VERSION.match(version):
            raise KeyProviderError(f"KEK version {version!r} must match {_VERSION.pattern}")
        if pair:
            keys[version] = {_PAIR: _encode(x25519.new_private())}
        else:
            keys[version] = _encode(AESGCM.generate_key(bit_length=256))
        document = json.dumps({"current": version, "keys": keys}, indent=2)
        write_key_file(path, document.encode("utf-8"))
        return version

    def write_public_file(self, path: Path) -> tuple[str, ...]:
        """Write the public halves of this provider's key pair versions to ``path`` (mode
        0644), the current version current; returns the versions written.

        Raises:
            KeyProviderError: the current version is not a key pair (agents given only
                public halves could not wrap under it).
        """
        public = self.public_keys()
        if self.current_version not in public:
            raise KeyProviderError(
                f"the current KEK version {self.current_version} is symmetric, not a key "
                "pair; add a key pair version first (`blackbox keys init --pair --add`)"
            )
        document = {
            "current": self.current_version,
            "public": {v: {_PAIR: _encode(key)} for v, key in public.items()},
        }
        write_public_file(path, json.dumps(document, indent=2).encode("utf-8"))
        return tuple(public)


class PublicKeyProvider(_Keyring):
    """The public halves of key pair KEKs: wraps new data keys, unwraps none.

    What an agent host is given (``BLACKBOX_KEK_PUBLIC_FILE``): a copy of its disk or
    its configuration opens no recorded body and no data key in any backup.

    Args:
        public: KEK version → 32 bytes of the X25519 public key.
        current: the version new data keys are wrapped under (the last given if None).
    """

    def __init__(self, public: Mapping[str, bytes], *, current: str | None = None) -> None:
        keks: dict[str, _Kek] = {}
        for version, key in public.items():
            if len(key) != x25519.POINT_BYTES:
                raise KeyProviderError(f"KEK {version}: an X25519 public key has 32 bytes")
            keks[version] = _Pair(key, None)
        super().__init__(keks, current, "BLACKBOX_KEK_PUBLIC_FILE")

    @classmethod
    def from_file(cls, path: Path) -> PublicKeyProvider:
        """Read a public key file (``blackbox keys init --pair`` writes one):
        ``{"current": "v2", "public": {"v2": {"x25519": "<base64>"}}}``.

        Raises:
            UnsafeKeyFile: the file is a symbolic link, not a regular file, or writable
                by its group or others.
            KeyProviderError: the file cannot be read or is not a public key file.
        """
        document = _document(read_public_file(path), path, "public")
        public: dict[str, bytes] = {}
        for version, value in document["public"].items():
            if not isinstance(value, dict):
                raise KeyProviderError(
                    f"{path} version {version} is not a public key; give agents the file "
                    "`blackbox keys init --pair` wrote beside the key file, never the key file"
                )
            public[str(version)] = _decode(value.get(_PAIR), f"{path} version {version}")
        current = document.get("current")
        return cls(public, current=None if current is None else str(current))


def provider_from_env(environ: Mapping[str, str] | None = None) -> KeyProvider | None:
    """The key provider the environment configures, None when none is (encryption off).

    ``BLACKBOX_KEK_PUBLIC_FILE`` (agent hosts): a :class:`PublicKeyProvider`, wrap-only.
    ``BLACKBOX_KEK_FILE`` or ``BLACKBOX_KEK`` (the replayer, rotation; agents of
    deployments still on symmetric KEKs): a :class:`LocalKeyProvider`.

    Raises:
        KeyProviderError: both kinds are set (a host is either wrap-only or not), or
            the keys cannot be read.
    """
    env = os.environ if environ is None else environ
    public = env.get("BLACKBOX_KEK_PUBLIC_FILE")
    if public and (env.get("BLACKBOX_KEK_FILE") or env.get("BLACKBOX_KEK")):
        raise KeyProviderError(
            "BLACKBOX_KEK_PUBLIC_FILE and BLACKBOX_KEK_FILE/BLACKBOX_KEK are both set: an "
            "agent host gets the public file only, the replayer the key file only; unset one"
        )
    if public:
        return PublicKeyProvider.from_file(Path(public))
    return LocalKeyProvider.from_env(env)


def _document(raw: bytes, path: Path, member: str) -> dict[str, Any]:
    try:
        document = json.loads(raw.decode("utf-8"))
        if not isinstance(document, dict) or not isinstance(document[member], dict):
            raise TypeError(f"{member!r} is not an object")
    except (ValueError, KeyError, TypeError) as exc:
        raise KeyProviderError(
            f'{path} is not a key file: expected {{"current": ..., "{member}": {{version: '
            f"...}}}} ({exc}); fix or move it"
        ) from exc
    return document


def _encode(key: bytes) -> str:
    return base64.b64encode(key).decode("ascii")


def _decode(encoded: object, what: str) -> bytes:
    if not isinstance(encoded, str):
        raise KeyProviderError(f"{what} is not a base64 key")
    try:
        return base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise KeyProviderError(f"{what} is not base64") from exc
