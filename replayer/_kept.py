"""The values behind a replay's first divergence, kept for a stated purpose.

A replay result row says what diverged in words anyone who may see the run may read; the
values (each changed path's recorded and asked value, and the input the code asked with,
scrubbed by the run's redaction rules already) are kept beside it for whoever opens them
for a purpose, as a body is opened. In a sealed run they are sealed under the run's own
data key (bound to the run, the divergence's sequence and the tenant), so destroying the
run's keys shreds them with its bodies; in a run recorded unencrypted they are kept as
they are, readable by replayer logins only and cleared by ``forget``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import Engine

from agent_blackbox.keystore import (
    SEALED_ENCODING,
    AesGcmSealer,
    AuditedKeys,
    KeystoreError,
    LocalKeyProvider,
    OpeningKeys,
    request_access,
)
from agent_blackbox.replayer._divergence import Divergence
from agent_blackbox.schemas import (
    BlackboxError,
    DataKey,
    Envelope,
    PayloadContext,
    Sealed,
    canonical_json,
)

_EVENT = "replay.divergence"
"""What the values are sealed as (the additional data binds it: never a body's)."""
MAX_KEPT = 256 * 1024
"""The most bytes of values a result keeps (the database refuses more): past it, only
the changed paths are kept."""


@dataclass(frozen=True, slots=True)
class KeptValues:
    """A divergence's values as a replay result keeps them: sealed under ``key_id``, or
    plain when the run has no data key."""

    data: bytes
    key_id: str | None


def kept_values(
    divergence: Divergence, run: Envelope | None, keys: OpeningKeys | None
) -> KeptValues | None:
    """The values of ``divergence`` to keep with its result; None when it has none, or
    when the run is sealed and this replay holds no key to seal them with.

    Args:
        divergence: the replay's first divergence.
        run: an event of the run (its tenant and data key id).
        keys: the replay's audited keys (the run's data key is cached there already).
    """
    values = divergence.values()
    if values is None or run is None:
        return None
    plain = canonical_json(values)
    if len(plain) > MAX_KEPT:
        plain = canonical_json({"changes": [{"path": c.path} for c in divergence.changes]})
    if run.key_id is None:
        return KeptValues(plain, None)
    if keys is None:
        return None
    secret = keys.opening_key(divergence.run_id, run.key_id)
    context = _context(divergence.run_id, divergence.sequence, run.tenant_id)
    sealed = AesGcmSealer().seal(plain, replace(context, data_key=DataKey(run.key_id, secret)))
    return KeptValues(sealed.data, run.key_id)


def open_kept_values(
    engine: Engine,
    kept: KeptValues,
    *,
    run_id: str,
    sequence: int,
    tenant_id: str,
    purpose: str,
) -> dict[str, Any]:
    """The values a replay result kept, opened for ``purpose``: an access audit row is
    written first (by the unwrap of the run's data key when sealed).

    Raises:
        AccessDenied: the purpose is unusable, or the login may not read the run.
        KeystoreError: the values are sealed and this process holds no key-encryption
            key, or the run's keys were destroyed.
    """
    if kept.key_id is None:
        request_access(engine, purpose=purpose, run_id=run_id)
        return _loaded(kept.data)
    provider = LocalKeyProvider.from_env()
    if provider is None:
        raise KeystoreError(
            f"the replay values of run {run_id} are sealed and this process has no "
            "key-encryption key; set BLACKBOX_KEK_FILE as the replayer does"
        )
    keys = AuditedKeys(engine, provider, purpose=purpose)
    sealed = Sealed(data=kept.data, key_id=kept.key_id, encoding=SEALED_ENCODING)
    return _loaded(AesGcmSealer(keys).open(sealed, _context(run_id, sequence, tenant_id)))


def _context(run_id: str, sequence: int, tenant_id: str) -> PayloadContext:
    return PayloadContext(
        run_id=run_id,
        sequence=sequence,
        event_id=_EVENT,
        tenant_id=tenant_id,
        event_type=_EVENT,
        body_version=1,
    )


def _loaded(data: bytes) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError as exc:
        raise BlackboxError(f"the kept replay values do not read as JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise BlackboxError("the kept replay values are not an object")
    return value
