"""Wrapping data keys under the public half of a key pair (X25519, HKDF-SHA256, AES-256-GCM).

Whoever holds the public half can wrap a data key; only the holder of the private half
can unwrap it. Each wrap makes a fresh ephemeral X25519 key pair, agrees a shared secret
with the recipient's public key, derives a one-time AES-256 key from it with HKDF-SHA256
(salted with both public keys, its info naming the KEK version) and seals the data key
under it, with the caller's additional data. The stored blob is
``ephemeral public key (32) ‖ nonce (12) ‖ ciphertext ‖ tag (16)``.
"""

from __future__ import annotations

import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.hashes import SHA256
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

POINT_BYTES = 32
_NONCE = 12
_TAG = 16
_INFO = b"agent-blackbox kek x25519 hkdf-sha256 aes-256-gcm\x00"


def public_half(private: bytes) -> bytes:
    """The raw public key of the raw X25519 private key ``private``."""
    return X25519PrivateKey.from_private_bytes(private).public_key().public_bytes_raw()


def new_private() -> bytes:
    """A fresh raw X25519 private key."""
    return X25519PrivateKey.generate().private_bytes_raw()


def _wrapping_key(shared: bytes, ephemeral: bytes, recipient: bytes, version: str) -> AESGCM:
    derived = HKDF(
        algorithm=SHA256(),
        length=32,
        salt=ephemeral + recipient,
        info=_INFO + version.encode("utf-8"),
    ).derive(shared)
    return AESGCM(derived)


def seal_to(public: bytes, version: str, key: bytes, aad: bytes) -> bytes:
    """``key`` wrapped so that only the private half of ``public`` unwraps it."""
    ephemeral = X25519PrivateKey.generate()
    ephemeral_public = ephemeral.public_key().public_bytes_raw()
    shared = ephemeral.exchange(X25519PublicKey.from_public_bytes(public))
    nonce = os.urandom(_NONCE)
    sealed = _wrapping_key(shared, ephemeral_public, public, version).encrypt(nonce, key, aad)
    return ephemeral_public + nonce + sealed


def open_with(private: bytes, version: str, blob: bytes, aad: bytes) -> bytes | None:
    """The key in ``blob`` (from :func:`seal_to`), or None when ``private`` does not open
    it (another key pair, another version, altered, or other additional data)."""
    if len(blob) < POINT_BYTES + _NONCE + _TAG:
        return None
    recipient = X25519PrivateKey.from_private_bytes(private)
    ephemeral_public = blob[:POINT_BYTES]
    try:
        shared = recipient.exchange(X25519PublicKey.from_public_bytes(ephemeral_public))
    except ValueError:  # a low-order point: not something seal_to ever writes
        return None
    public = recipient.public_key().public_bytes_raw()
    nonce, sealed = blob[POINT_BYTES : POINT_BYTES + _NONCE], blob[POINT_BYTES + _NONCE :]
    try:
        return _wrapping_key(shared, ephemeral_public, public, version).decrypt(nonce, sealed, aad)
    except InvalidTag:
        return None
