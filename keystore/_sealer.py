"""Envelope encryption of payloads: AES-256-GCM under the run's data key.

A sealed payload is ``nonce (12 bytes) ‖ ciphertext ‖ tag (16 bytes)``; the additional
authenticated data binds it to its run, sequence, event id, event type, body version,
tenant and data key id (:meth:`PayloadContext.aad`), so a sealed body moved to another
event, event type, tenant or key id does not open. The envelope's ``payload_encoding``
says which additional data was used: :data:`SEALED_ENCODING` for this binding,
:data:`LEGACY_SEALED_ENCODING` for payloads sealed by earlier releases (run, sequence and
event id only), which still open. Payloads recorded without encryption still open.
"""

from __future__ import annotations

import os
from typing import Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from agent_blackbox.keystore._errors import CiphertextCorrupt, KeystoreError
from agent_blackbox.schemas import PLAIN_ENCODING, PayloadContext, Sealed

SEALED_ENCODING = "avro+aes256gcm+aad2"
"""Sealed under AES-256-GCM with the full additional data; every new payload."""
LEGACY_SEALED_ENCODING = "avro+aes256gcm"
"""Sealed by earlier releases, with run, sequence and event id as additional data."""
_OPENED = frozenset({SEALED_ENCODING, LEGACY_SEALED_ENCODING})
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
        if not context.event_type or context.body_version < 1:
            raise KeystoreError(
                f"run {context.run_id} sequence {context.sequence}: the payload context "
                "names no event type and body version; seal through PayloadPipeline.pack"
            )
        nonce = os.urandom(_NONCE)
        data = nonce + AESGCM(key.secret).encrypt(nonce, plaintext, context.aad(key.key_id))
        return Sealed(data=data, key_id=key.key_id, encoding=SEALED_ENCODING)

    def open(self, sealed: Sealed, context: PayloadContext) -> bytes:
        if sealed.encoding == PLAIN_ENCODING and sealed.key_id is None:
            return sealed.data  # recorded before encryption was turned on
        where = f"run {context.run_id} sequence {context.sequence} (key {sealed.key_id})"
        if sealed.encoding not in _OPENED or sealed.key_id is None:
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
        if sealed.encoding == SEALED_ENCODING:
            aad = context.aad(sealed.key_id)
        else:
            aad = context.legacy_aad()
        try:
            return AESGCM(secret).decrypt(sealed.data[:_NONCE], sealed.data[_NONCE:], aad)
        except InvalidTag:
            raise CiphertextCorrupt(
                f"{where}: the sealed payload does not authenticate; it was truncated, "
                "altered, or belongs to another event, event type, tenant or key"
            ) from None
