"""The data-key store in Postgres (``blackbox.data_keys``), and audited unwrapping.

Writers insert wrapped keys and never read them back; they get their tenant's digest key
through ``blackbox.tenant_digest_key`` only. A replayer obtains a wrapped key only
through an access request committed first (``blackbox.request_key_access``, which
writes the audit row no rollback can take back) and then
``blackbox.unwrap_data_key(run, key, request)``; retention destroys keys for good.
"""

from __future__ import annotations

import os
import unicodedata
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Engine, TextClause, text
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from agent_blackbox.keystore._errors import (
    AccessDenied,
    DataKeyMissing,
    KeyDestroyed,
    KeystoreError,
    UnknownKeyVersion,
    WrapOnly,
)
from agent_blackbox.keystore._provider import (
    KEY_BYTES,
    KeyProvider,
    WrappedKey,
    provider_from_env,
)
from agent_blackbox.schemas import DataKey, KeyedDigest

# Through the write side's function: it stores a key only for a run whose writer
# credential the caller holds (the recorder adds ``credential`` to these parameters).
_INSERT = text(
    "SELECT blackbox.store_data_key(:run_id, :credential, :key_id, :tenant_id, "
    ":kek_version, :wrapped)"
)

_REQUEST = text("SELECT blackbox.request_key_access(:purpose, :run_id, :tenant_id)")
_UNWRAP = text(
    "SELECT key_id, kek_version, wrapped, destroyed_at "
    "FROM blackbox.unwrap_data_key(:run_id, :key_id, :request)"
)

_DESTROY = text(
    """
    UPDATE blackbox.data_keys
       SET wrapped = NULL, destroyed_at = now(), destroyed_reason = :reason
     WHERE run_id = ANY(:run_ids) AND wrapped IS NOT NULL
    RETURNING run_id, key_id
    """
)

_DESTROY_IDS = text(
    """
    UPDATE blackbox.data_keys
       SET wrapped = NULL, destroyed_at = now(), destroyed_reason = :reason
     WHERE key_id = ANY(:key_ids) AND run_id = :run_id AND wrapped IS NOT NULL
    RETURNING key_id
    """
)
_KEY_OWNERS = text(
    "SELECT key_id, run_id, tenant_id FROM blackbox.data_keys WHERE key_id = ANY(:key_ids)"
)

_LIVE_KEYS = text(
    """
    SELECT key_id, run_id, kek_version, wrapped FROM blackbox.data_keys
     WHERE wrapped IS NOT NULL AND kek_version <> :version AND key_id > :after
     ORDER BY key_id LIMIT :limit
    """
)

_REWRAP = text(
    "UPDATE blackbox.data_keys SET kek_version = :kek_version, wrapped = :wrapped "
    "WHERE key_id = :key_id AND wrapped IS NOT NULL"
)


_TENANT_DIGEST_KEY = text(
    "SELECT secret, kek_version, wrapped "
    "FROM blackbox.tenant_digest_key(:t, :secret, :kek_version, :wrapped)"
)
_UNWRAP_TENANT = text("SELECT kek_version, wrapped FROM blackbox.unwrap_tenant_key(:t, :request)")


_OLD_TENANT_KEYS = text(
    """
    SELECT t.tenant_id, t.kek_version, t.wrapped, d.tenant_id IS NOT NULL
      FROM blackbox.tenant_keys t
      LEFT JOIN blackbox.tenant_digest_keys d ON d.tenant_id = t.tenant_id
     WHERE t.kek_version <> :version OR d.tenant_id IS NULL
       FOR UPDATE OF t
    """
)
_STORE_DIGEST_SECRET = text(
    "INSERT INTO blackbox.tenant_digest_keys (tenant_id, secret) VALUES (:t, :secret) "
    "ON CONFLICT (tenant_id) DO NOTHING"
)
_REWRAP_TENANT = text(
    "UPDATE blackbox.tenant_keys SET kek_version = :kek_version, wrapped = :wrapped "
    "WHERE tenant_id = :t"
)


def tenant_aad(tenant_id: str) -> bytes:
    """What a wrapped tenant digest key is bound to."""
    return f"agent-blackbox digest key\x00{tenant_id}".encode()


def wrapping_aad(run_id: str, key_id: str) -> bytes:
    """What a wrapped data key is bound to: it unwraps for its own run and id only."""
    return f"agent-blackbox data key\x00{run_id}\x00{key_id}".encode()


class DataKeyStore:
    """Creates, rotates and destroys the data keys of runs.

    Args:
        provider: the key-encryption keys new data keys are wrapped under.
    """

    def __init__(self, provider: KeyProvider) -> None:
        self.provider = provider

    def new_key(
        self, run_id: str, tenant_id: str
    ) -> tuple[DataKey, tuple[TextClause, dict[str, Any]]]:
        """A fresh data key for ``run_id`` and the statement that stores it wrapped, to run
        in the transaction that creates the run (or resumes it)."""
        key = DataKey(key_id=f"dk-{uuid.uuid4().hex}", secret=os.urandom(KEY_BYTES))
        wrapped = self.provider.wrap(key.secret, aad=wrapping_aad(run_id, key.key_id))
        params = {
            "key_id": key.key_id,
            "run_id": run_id,
            "tenant_id": tenant_id,
            "kek_version": wrapped.kek_version,
            "wrapped": wrapped.blob,
        }
        return key, (_INSERT, params)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DataKeyStore | None:
        """The store of the key provider the environment configures (see
        :func:`provider_from_env`: ``BLACKBOX_KEK_PUBLIC_FILE`` on agent hosts); None
        when none is (runs are recorded plain)."""
        provider = provider_from_env(environ)
        return None if provider is None else cls(provider)

    def tenant_digest_txn(self, conn: Connection, tenant_id: str) -> KeyedDigest:
        """The keyed digest of ``tenant_id``'s runs, through the audited
        ``blackbox.tenant_digest_key`` (the session user must be granted the tenant).

        The first writer of a tenant makes its key: a fresh one is offered, with its copy
        wrapped under the current KEK for the replayer; concurrent writers agree (the
        first insert wins, everyone gets it back).

        Raises:
            AccessDenied: the session user is not granted ``tenant_id``.
            WrapOnly: the tenant's key predates the raw copy agents read and this host
                cannot unwrap the wrapped one (run ``blackbox keys rotate`` once).
        """
        secret = os.urandom(KEY_BYTES)
        wrapped = self.provider.wrap(secret, aad=tenant_aad(tenant_id))
        params = {"t": tenant_id, "secret": secret, "kek_version": wrapped.kek_version}
        try:
            row = conn.execute(_TENANT_DIGEST_KEY, {**params, "wrapped": wrapped.blob}).one()
        except DBAPIError as exc:
            raise _refusal(exc, f"tenant {tenant_id} digest key") from exc
        if row[0] is not None:
            return KeyedDigest(bytes(row[0]))
        try:  # made before revision 0005: only the wrapped copy exists
            stored = WrappedKey(str(row[1]), bytes(row[2]))
            return KeyedDigest(self.provider.unwrap(stored, aad=tenant_aad(tenant_id)))
        except (WrapOnly, UnknownKeyVersion) as exc:
            raise WrapOnly(
                f"tenant {tenant_id}'s digest key was made by an earlier release and is "
                f"stored only wrapped, which this host cannot open ({exc}): run `blackbox "
                "keys rotate` once with the replayer's BLACKBOX_KEK_FILE to store the copy "
                "agents read"
            ) from exc

    def destroy_txn(
        self, conn: Connection, run_ids: Sequence[str], *, reason: str
    ) -> list[tuple[str, str]]:
        """:func:`destroy_keys_txn` (kept here so the store has its whole life cycle)."""
        return destroy_keys_txn(conn, run_ids, reason=reason)

    def rotate(self, engine: Engine, *, batch: int = 500) -> int:
        """Re-wrap every live data key (and tenant digest key) not yet under the current
        KEK version, and store the raw copy agents read of digest keys that lack one;
        events are not touched. Needs the owner role (it reads wrapped keys directly)
        and a provider that unwraps (the private halves). Returns how many keys were
        re-wrapped or completed."""
        version, after, done = self.provider.current_version, "", 0
        while True:
            with engine.begin() as conn:
                rows = conn.execute(
                    _LIVE_KEYS, {"version": version, "after": after, "limit": batch}
                ).all()
                for key_id, run_id, kek_version, blob in rows:
                    aad = wrapping_aad(str(run_id), str(key_id))
                    secret = self.provider.unwrap(
                        WrappedKey(str(kek_version), bytes(blob)), aad=aad
                    )
                    rewrapped = self.provider.wrap(secret, aad=aad, version=version)
                    conn.execute(
                        _REWRAP,
                        {"key_id": key_id, "kek_version": version, "wrapped": rewrapped.blob},
                    )
            if not rows:
                return done + self._rotate_tenant_keys(engine, version)
            done += len(rows)
            after = str(rows[-1][0])

    def _rotate_tenant_keys(self, engine: Engine, version: str) -> int:
        with engine.begin() as conn:
            rows = conn.execute(_OLD_TENANT_KEYS, {"version": version}).all()
            for tenant_id, kek_version, blob, has_secret in rows:
                aad = tenant_aad(str(tenant_id))
                secret = self.provider.unwrap(WrappedKey(str(kek_version), bytes(blob)), aad=aad)
                if not has_secret:  # the copy wrap-only agents read (a key made before 0005)
                    conn.execute(_STORE_DIGEST_SECRET, {"t": tenant_id, "secret": secret})
                if kek_version != version:
                    rewrapped = self.provider.wrap(secret, aad=aad, version=version)
                    conn.execute(
                        _REWRAP_TENANT,
                        {"t": tenant_id, "kek_version": version, "wrapped": rewrapped.blob},
                    )
        return len(rows)


def destroy_keys_txn(
    conn: Connection, run_ids: Sequence[str], *, reason: str
) -> list[tuple[str, str]]:
    """Crypto-shred every live data key of ``run_ids`` in the caller's transaction;
    returns the (run, key) pairs destroyed. Needs no key-encryption key."""
    rows = conn.execute(_DESTROY, {"run_ids": list(run_ids), "reason": reason}).all()
    return [(str(run_id), str(key_id)) for run_id, key_id in rows]


def destroy_key_ids_txn(
    conn: Connection, key_ids: Sequence[str], *, run_id: str, reason: str
) -> list[str]:
    """Crypto-shred those of ``key_ids`` that belong to ``run_id`` and are still live (a
    restored backup brought them back); returns those destroyed. A key of another run
    is never touched, whatever a ledger entry names."""
    params = {"key_ids": list(key_ids), "run_id": run_id, "reason": reason}
    return [str(key_id) for key_id in conn.execute(_DESTROY_IDS, params).scalars()]


def key_owners_txn(conn: Connection, key_ids: Sequence[str]) -> dict[str, tuple[str, str]]:
    """The run and tenant each of ``key_ids`` belongs to (``data_keys.run_id``), for those
    the database knows."""
    rows = conn.execute(_KEY_OWNERS, {"key_ids": list(key_ids)})
    return {str(key_id): (str(run_id), str(tenant)) for key_id, run_id, tenant in rows}


_HAS_KEYS = text("SELECT EXISTS (SELECT 1 FROM blackbox.data_keys WHERE run_id = :run_id)")
_FORGET_DESTROYED = text(
    "DELETE FROM blackbox.data_keys WHERE run_id = ANY(:run_ids) AND wrapped IS NULL"
)


def has_keys_txn(conn: Connection, run_id: str) -> bool:
    """Whether ``run_id`` was ever encrypted (it has data keys, live or destroyed)."""
    return bool(conn.execute(_HAS_KEYS, {"run_id": run_id}).scalar_one())


def forget_destroyed_keys_txn(conn: Connection, run_ids: Sequence[str]) -> None:
    """Delete the rows of destroyed keys of ``run_ids``, whose metadata is deleted (the
    deletion ledger keeps what was destroyed)."""
    conn.execute(_FORGET_DESTROYED, {"run_ids": list(run_ids)})


class AuditedKeys:
    """Opening keys for a replayer: each data key is unwrapped once, through the audited
    database functions, for the purpose given.

    Reading a run's (or a tenant's) keys takes two steps: an access request, committed
    in a transaction of its own (so the audit keeps it whatever happens next), then the
    unwraps, each naming that request. One request covers every key of its run.

    Args:
        engine: a connection as the replayer role (or any role granted the functions),
            granted the tenants whose runs it reads.
        provider: the key-encryption keys (the private halves).
        purpose: why the bodies are read (recorded in the access audit).
    """

    def __init__(self, engine: Engine, provider: KeyProvider, *, purpose: str) -> None:
        self.check_purpose(purpose)
        self._engine = engine
        self._provider = provider
        self.purpose = purpose
        self._cache: dict[str, bytes] = {}
        self._tenants: dict[str, KeyedDigest] = {}
        self._requests: dict[tuple[str | None, str | None], int] = {}

    @staticmethod
    def check_purpose(purpose: str) -> None:
        """Refuse a purpose the audit cannot show as it is (see :func:`purpose_problem`):
        a line break in it would forge a line of the server's log.

        Raises:
            AccessDenied: ``purpose`` is empty, too short or long, or holds control
                characters.
        """
        if (problem := purpose_problem(purpose)) is not None:
            raise AccessDenied(problem)

    def opening_key(self, run_id: str, key_id: str) -> bytes:
        cached = self._cache.get(key_id)
        if cached is not None:
            return cached
        where = f"run {run_id} key {key_id}"
        request = self._request(where, run_id=run_id)
        row = self._call(_UNWRAP, {"run_id": run_id, "key_id": key_id, "request": request}, where)
        if row is None:
            raise DataKeyMissing(f"{where}: no such data key in the key store")
        _, kek_version, blob, destroyed_at = row
        if blob is None:
            raise KeyDestroyed(
                f"{where}: the data key was destroyed at {destroyed_at} (crypto-shredded by "
                "retention or a deletion request); its bodies cannot be read any more"
            )
        try:
            secret = self._provider.unwrap(
                WrappedKey(str(kek_version), bytes(blob)), aad=wrapping_aad(run_id, key_id)
            )
        except KeystoreError as exc:  # the same kind of error, saying which run and key
            raise type(exc)(f"{where}: {exc}") from exc
        self._cache[key_id] = secret
        return secret

    def tenant_digest(self, tenant_id: str) -> KeyedDigest:
        """The keyed digest of ``tenant_id``, its key unwrapped through the audited function.

        Raises:
            DataKeyMissing: the tenant has no digest key.
        """
        cached = self._tenants.get(tenant_id)
        if cached is not None:
            return cached
        where = f"tenant {tenant_id} digest key"
        request = self._request(where, tenant_id=tenant_id)
        row = self._call(_UNWRAP_TENANT, {"t": tenant_id, "request": request}, where)
        if row is None:
            raise DataKeyMissing(f"{where}: no such key in the key store")
        try:
            secret = self._provider.unwrap(
                WrappedKey(str(row[0]), bytes(row[1])), aad=tenant_aad(tenant_id)
            )
        except KeystoreError as exc:
            raise type(exc)(f"{where}: {exc}") from exc
        self._tenants[tenant_id] = digest = KeyedDigest(secret)
        return digest

    def _request(
        self, where: str, *, run_id: str | None = None, tenant_id: str | None = None
    ) -> int:
        """The committed access request for ``run_id`` or ``tenant_id`` (made once)."""
        scope = (run_id, tenant_id)
        request = self._requests.get(scope)
        if request is None:
            params = {"purpose": self.purpose, "run_id": run_id, "tenant_id": tenant_id}
            row = self._call(_REQUEST, params, where)  # committed when _call returns
            self._requests[scope] = request = int(row[0])
        return request

    def request_access(self, run_id: str) -> int:
        """Record (once) the request to read ``run_id``'s bodies for this purpose; the
        audit row's id. Done before a body is shown even when the run has no data key,
        so every reading of recorded content leaves its row."""
        return self._request(f"run {run_id}", run_id=run_id)

    def _call(self, statement: TextClause, params: dict[str, Any], where: str) -> Any:
        return _call(self._engine, statement, params, where)


_OPENABLE = text(
    "SELECT CASE WHEN to_regprocedure('blackbox.request_key_access(text, text, text)') IS NULL "
    "THEN false "
    "ELSE has_function_privilege('blackbox.request_key_access(text, text, text)', 'EXECUTE') END"
)


def bodies_openable_txn(conn: Connection) -> bool:
    """Whether the connected login may ask for access to recorded bodies at all (the
    replayer role may; a reader may not): to say so before asking it for a purpose."""
    try:
        with conn.begin_nested():
            return bool(conn.execute(_OPENABLE).scalar())
    except SQLAlchemyError:
        return False


def request_access(engine: Engine, *, purpose: str, run_id: str) -> int:
    """Write the access audit's request row for reading ``run_id``'s bodies (a run with
    no data key too); its id. What :meth:`AuditedKeys.request_access` does, for a
    reader that holds no key-encryption key.

    Raises:
        AccessDenied: the purpose is unusable, or the role may not read the run's tenant.
    """
    AuditedKeys.check_purpose(purpose)
    params = {"purpose": purpose, "run_id": run_id, "tenant_id": None}
    return int(_call(engine, _REQUEST, params, f"run {run_id}")[0])


def _call(engine: Engine, statement: TextClause, params: dict[str, Any], where: str) -> Any:
    """One statement in a transaction of its own (committed when this returns)."""
    try:
        with engine.begin() as conn:
            return conn.execute(statement, params).first()
    except DBAPIError as exc:
        raise _refusal(exc, where) from exc
    except SQLAlchemyError as exc:
        raise KeystoreError(f"{where}: the key store failed: {exc}") from exc


def _refusal(exc: DBAPIError, where: str) -> KeystoreError:
    """What the key store's refusal ``exc`` means, as the error a caller can act on."""
    code = getattr(exc.orig, "sqlstate", None)
    detail = str(exc.orig).strip().splitlines()[0] if exc.orig is not None else str(exc)
    if code == "42501":
        return AccessDenied(
            f"{where}: this database role may not read it ({detail}); connect as a role "
            "granted blackbox_replayer (blackbox_writer to record) and granted the tenant"
        )
    if code in ("22023", "55000"):
        return AccessDenied(f"{where}: {detail}")
    return KeystoreError(f"{where}: the key store failed: {detail}")


PURPOSE_MIN_CHARS = 3
PURPOSE_MAX_CHARS = 500
_PURPOSE_EXAMPLE = "for example --purpose 'incident 4411: refund loop'"


def purpose_problem(purpose: str, *, example: str = _PURPOSE_EXAMPLE) -> str | None:
    """What is wrong with ``purpose`` as the reason written to the access audit, or None.

    A purpose is one line of plain text of 3 to 500 characters: the audit shows it to
    people, so control characters (line breaks, escape sequences, bidirectional
    overrides) are refused rather than stored.
    """
    stripped = purpose.strip()
    if not stripped:
        return f"the purpose is empty; say why the recorded bodies are read, {example}"
    if len(stripped) < PURPOSE_MIN_CHARS:
        return (
            f"the purpose {stripped!r} is too short ({len(stripped)} characters, at least "
            f"{PURPOSE_MIN_CHARS}); say why the recorded bodies are read, {example}"
        )
    if len(purpose) > PURPOSE_MAX_CHARS:
        return (
            f"the purpose is too long ({len(purpose)} characters, at most "
            f"{PURPOSE_MAX_CHARS}); give a short reason and a ticket number"
        )
    for position, char in enumerate(purpose, start=1):
        if unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp"):
            return (
                f"the purpose contains a control character (U+{ord(char):04X} at character "
                f"{position}); write it as one line of plain text"
            )
    return None
