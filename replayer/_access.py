"""How the replayer opens recorded bodies: with a stated purpose, through audited keys."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Engine

from agent_blackbox.keystore import (
    AccessDenied,
    AesGcmSealer,
    AuditedKeys,
    DataKeyStore,
    LocalKeyProvider,
    OpeningKeys,
    purpose_problem,
)
from agent_blackbox.replayer._opening import DigestKeys
from agent_blackbox.schemas import PayloadPipeline


@dataclass(frozen=True, slots=True)
class Opening:
    """How recorded runs are read: the payload pipeline, and the tenants' digest keys."""

    pipeline: PayloadPipeline
    digests: DigestKeys | None = None
    keys: OpeningKeys | None = None
    """The audited data keys the pipeline opens sealed bodies with (None: no keys)."""


def opening(engine: Callable[[], Engine], *, purpose: str) -> Opening:
    """The payload pipeline (and digest keys) a replay, fork or re-execution reads with.

    With key-encryption keys configured (``BLACKBOX_KEK_FILE`` or ``BLACKBOX_KEK``),
    sealed bodies open through data keys unwrapped by the audited database function,
    each unwrap recorded with ``purpose``; without, only plain bodies open.

    Args:
        engine: the database connection to unwrap keys through, made when first needed.
        purpose: why the bodies are read; required even for plain runs, so every read
            of recorded content has a stated reason.

    Raises:
        AccessDenied: ``purpose`` is not a usable reason (see :func:`purpose_problem`).
        KeyProviderError: the configured keys cannot be read.
    """
    if (problem := purpose_problem(purpose)) is not None:
        raise AccessDenied(problem)
    provider = LocalKeyProvider.from_env()
    if provider is None:
        return Opening(PayloadPipeline())
    keys = AuditedKeys(engine(), provider, purpose=purpose)
    return Opening(PayloadPipeline(sealer=AesGcmSealer(keys)), keys, keys)


def recording_keys() -> DataKeyStore | None:
    """The data-key store new runs (forks) are encrypted with, when keys are configured."""
    provider = LocalKeyProvider.from_env()
    return None if provider is None else DataKeyStore(provider)
