"""How the replayer opens recorded bodies: with a stated purpose, through audited keys."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Engine

from keystore import AesGcmSealer, AuditedKeys, DataKeyStore, LocalKeyProvider
from schemas import PayloadPipeline


def opening_pipeline(engine: Callable[[], Engine], *, purpose: str) -> PayloadPipeline:
    """The payload pipeline a replay, fork or re-execution reads bodies with.

    With key-encryption keys configured (``BLACKBOX_KEK_FILE`` or ``BLACKBOX_KEK``),
    sealed bodies open through data keys unwrapped by the audited database function,
    each unwrap recorded with ``purpose``; without, only plain bodies open.

    Args:
        engine: the database connection to unwrap keys through, made when first needed.
        purpose: why the bodies are read; required even for plain runs, so every read
            of recorded content has a stated reason.

    Raises:
        AccessDenied: ``purpose`` is empty.
        KeyProviderError: the configured keys cannot be read.
    """
    provider = LocalKeyProvider.from_env()
    if provider is None:
        AuditedKeys.check_purpose(purpose)
        return PayloadPipeline()
    return PayloadPipeline(sealer=AesGcmSealer(AuditedKeys(engine(), provider, purpose=purpose)))


def recording_keys() -> DataKeyStore | None:
    """The data-key store new runs (forks) are encrypted with, when keys are configured."""
    provider = LocalKeyProvider.from_env()
    return None if provider is None else DataKeyStore(provider)
