"""Envelope encryption of payloads: AES-256-GCM under the run's data key.

A sealed payload is ``nonce (12 bytes) ‖ ciphertext ‖ tag (16 bytes)``; the additional
authenticated data binds it to its run, sequence and event id, so a sealed body moved to
another event does not open. Payloads recorded without encryption still open.
"""

from __future__ import annotations

import os
from typing import Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from agent_blackbox.keystore._errors import CiphertextCorrupt, KeystoreError
from agent_blackbox.schemas import PLAIN_ENCODING, PayloadContext, Sealed

SEALED_ENCODING = "avro+aes256gcm"
_NONCE = 12
_TAG = 16


class OpeningKeys(Protocol):
    """Finds the data key that sealed a payload (unwrapping it, audited)."""

    def opening_key(self, run_id: str, key_id: str) -> bytes:
        """The data key ``key_id`` of ``run_id``.

        Raises:
            DataKeyMissing, WrongKey, UnknownKeyVersion, AccessDenied.
        """
        ...


class AesGcmSealer:
    """The :class:`~agent_blackbox.schemas.Sealer` of encrypted runs.

    Args:
        keys: where opening finds data keys; recorders, which only seal, need none.
    """

    def __init__(self, keys: OpeningKeys | None = None) -> None:
        self._keys = keys

    def seal(self, plaintext: bytes, context: PayloadContext) -> Sealed:
        key = context.data_key
        if key is None:
            raise KeystoreError(
                f"run {context.run_id} has no data key; start it with a recorder given a "
                "key store, or record it without encryption"
            )
        nonce = os.urandom(_NONCE)
        data = nonce + AESGCM(key.secret).encrypt(nonce, plaintext, context.aad())
        return Sealed(data=data, key_id=key.key_id, encoding=SEALED_ENCODING)

    def open(self, sealed: Sealed, context: PayloadContext) -> bytes:
        if sealed.encoding == PLAIN_ENCODING and sealed.key_id is None:
            return sealed.data  # recorded before encryption was turned on
        where = f"run {context.run_id} sequence {context.sequence} (key {sealed.key_id})"
        if sealed.encoding != SEALED_ENCODING or sealed.key_id is None:
            raise CiphertextCorrupt(
                f"{where}: payload encoding {sealed.encoding!r} is not one this release opens"
            )
        if len(sealed.data) < _NONCE + _TAG:
            raise CiphertextCorrupt(
                f"{where}: the sealed payload is truncated ({len(sealed.data)} bytes)"
            )
        if self._keys is None:
            raise KeystoreError(f"{where}: the payload is sealed and no key store was given")
        secret = self._keys.opening_key(context.run_id, sealed.key_id)
        try:
            return AESGCM(secret).decrypt(sealed.data[:_NONCE], sealed.data[_NONCE:], context.aad())
        except InvalidTag:
            raise CiphertextCorrupt(
                f"{where}: the sealed payload does not authenticate; it was truncated, "
                "altered, or belongs to another event"
            ) from None
