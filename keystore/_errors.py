"""What can go wrong with keys, one class per condition a caller can act on."""

from __future__ import annotations

from agent_blackbox.schemas import BlackboxError, KeyUnavailable, UndecodableMessage


class KeystoreError(BlackboxError):
    """A key could not be created, found, unwrapped or used."""


class KeyProviderError(KeystoreError, KeyUnavailable):
    """The key-encryption keys are missing or malformed (``BLACKBOX_KEK[_FILE]``)."""


class UnsafeKeyFile(KeyProviderError):
    """A key file is a symbolic link, not a regular file, or readable by others."""


class UnknownKeyVersion(KeystoreError, KeyUnavailable):
    """A data key is wrapped under a key-encryption key version this provider lacks."""


class WrongKey(KeystoreError, KeyUnavailable):
    """A data key does not unwrap under the key-encryption key of its version."""


class DataKeyMissing(KeystoreError, KeyUnavailable):
    """No data key of that id exists for the run, or it was destroyed (crypto-shredded)."""


class CiphertextCorrupt(KeystoreError, UndecodableMessage):
    """A sealed payload does not authenticate: truncated, altered, or moved to another event."""


class AccessDenied(KeystoreError, KeyUnavailable):
    """The database refused: the role may not do this, or no purpose was given."""


class KeyDestroyed(DataKeyMissing):
    """The data key was destroyed on purpose (retention or a deletion request)."""


class WrapOnly(KeystoreError, KeyUnavailable):
    """This host holds only the public half of a key-encryption key: it wraps new data
    keys and unwraps none (what agents are given)."""
