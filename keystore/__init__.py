"""Keys: envelope encryption of recorded bodies, the data-key store, key providers.

Each run is sealed under its own data key (AES-256-GCM); data keys are stored wrapped by
a versioned key-encryption key from a :class:`KeyProvider`. Agents are given only the
public half of a key pair KEK (:class:`PublicKeyProvider`): they wrap new data keys and
unwrap none; a replayer holding the private half (:class:`LocalKeyProvider`) unwraps them
only through the audited database functions; destroying a run's keys makes its bodies
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
    WrapOnly,
    WrongKey,
)
from agent_blackbox.keystore._postgres import (
    PURPOSE_MAX_CHARS,
    AuditedKeys,
    DataKeyStore,
    bodies_openable_txn,
    destroy_key_ids_txn,
    destroy_keys_txn,
    forget_destroyed_keys_txn,
    has_keys_txn,
    key_owners_txn,
    purpose_problem,
    request_access,
    tenant_aad,
    wrapping_aad,
)
from agent_blackbox.keystore._provider import (
    KeyProvider,
    LocalKeyProvider,
    PublicKeyProvider,
    WrappedKey,
    provider_from_env,
)
from agent_blackbox.keystore._sealer import (
    LEGACY_SEALED_ENCODING,
    SEALED_ENCODING,
    AesGcmSealer,
    OpeningKeys,
)
from agent_blackbox.keystore._snapshot import (
    data_key_rows_txn,
    key_states_txn,
    record_access_txn,
    restore_data_keys_txn,
    restore_tenant_keys_txn,
    tenant_key_rows_txn,
)

__all__ = [
    "LEGACY_SEALED_ENCODING",
    "PURPOSE_MAX_CHARS",
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
    "PublicKeyProvider",
    "UnknownKeyVersion",
    "UnsafeKeyFile",
    "WrapOnly",
    "WrappedKey",
    "WrongKey",
    "bodies_openable_txn",
    "data_key_rows_txn",
    "destroy_key_ids_txn",
    "destroy_keys_txn",
    "forget_destroyed_keys_txn",
    "has_keys_txn",
    "key_owners_txn",
    "key_states_txn",
    "provider_from_env",
    "purpose_problem",
    "record_access_txn",
    "request_access",
    "restore_data_keys_txn",
    "restore_tenant_keys_txn",
    "tenant_aad",
    "tenant_key_rows_txn",
    "wrapping_aad",
]
