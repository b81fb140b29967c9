"""Keys: envelope encryption of recorded bodies, the data-key store, key providers.

Each run is sealed under its own data key (AES-256-GCM); data keys are stored wrapped by
a versioned key-encryption key from a :class:`KeyProvider`; a replayer unwraps them only
through the audited database function; destroying a run's keys makes its bodies
unreadable everywhere they were copied (crypto-shredding).
"""

from agent_blackbox.keystore._errors import (
    AccessDenied,
    CiphertextCorrupt,
    DataKeyMissing,
    KeyDestroyed,
    KeyProviderError,
    KeystoreError,
    UnknownKeyVersion,
    UnsafeKeyFile,
    WrongKey,
)
from agent_blackbox.keystore._postgres import (
    AuditedKeys,
    DataKeyStore,
    destroy_key_ids_txn,
    destroy_keys_txn,
    forget_destroyed_keys_txn,
    has_keys_txn,
    key_owners_txn,
    purpose_problem,
    wrapping_aad,
)
from agent_blackbox.keystore._provider import KeyProvider, LocalKeyProvider, WrappedKey
from agent_blackbox.keystore._sealer import (
    LEGACY_SEALED_ENCODING,
    SEALED_ENCODING,
    AesGcmSealer,
    OpeningKeys,
)

__all__ = [
    "LEGACY_SEALED_ENCODING",
    "SEALED_ENCODING",
    "AccessDenied",
    "AesGcmSealer",
    "AuditedKeys",
    "CiphertextCorrupt",
    "DataKeyMissing",
    "DataKeyStore",
    "KeyDestroyed",
    "KeyProvider",
    "KeyProviderError",
    "KeystoreError",
    "LocalKeyProvider",
    "OpeningKeys",
    "UnknownKeyVersion",
    "UnsafeKeyFile",
    "WrappedKey",
    "WrongKey",
    "destroy_key_ids_txn",
    "destroy_keys_txn",
    "forget_destroyed_keys_txn",
    "has_keys_txn",
    "key_owners_txn",
    "purpose_problem",
    "wrapping_aad",
]
