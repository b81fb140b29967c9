"""Retention and deletion: crypto-shredding, the deletion ledger, and its re-application.

Bodies are deleted by destroying the run's data keys: every copy of a sealed body (the
topic, a copy of the topic, a backup of the outbox or the blobs) becomes unreadable at
once. In the same transaction the values the write side keeps in clear (``runs.state``,
effects' idempotency keys and external ids) are scrubbed. Each destruction is written
to the deletion ledger and announced by a ``run.redacted`` event in the run's own log,
signed by the job when it has the signer's key; after a restore,
:func:`agent_blackbox.consumers.reapply_ledger` destroys again whatever an old backup
brought back.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine

from agent_blackbox.consumers._redacted_views import forget_run_labels_txn
from agent_blackbox.consumers._views import delete_run_views_txn
from agent_blackbox.keystore import (
    destroy_keys_txn,
    forget_destroyed_keys_txn,
    has_keys_txn,
)
from agent_blackbox.outbox.lifecycle import (
    append_redaction_txn,
    check_may_shred_txn,
    delete_run_metadata_txn,
    lock_run_txn,
    mark_abandoned_txn,
    retention_classes_txn,
    runs_due_for_deletion_txn,
    runs_due_for_shredding_txn,
    runs_of_subject_txn,
    scrub_run_txn,
    write_ledger_txn,
)
from agent_blackbox.schemas import (
    BlackboxError,
    CheckpointSigner,
    Settings,
)

DEFAULT_CLASSES = {
    "standard": {"bodies_days": 30, "metadata_days": 400},
    "sensitive": {"bodies_days": 7, "metadata_days": 400},
}


class RunStillRunning(BlackboxError):
    """A run cannot be shredded yet: it is still recording."""


class RetentionConfigError(BlackboxError):
    """The retention classes are missing or malformed (``BLACKBOX_RETENTION_FILE``)."""


@dataclass(frozen=True, slots=True)
class RetentionClass:
    """How long the bodies and the metadata of a run of this class are kept."""

    name: str
    bodies: timedelta
    metadata: timedelta


FALLBACK_CLASS = "standard"
"""The class whose periods apply to a run naming a class the policy does not define."""


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """The retention classes by name (a run names its class when it starts)."""

    classes: Mapping[str, RetentionClass]

    def for_unknown(self, name: str) -> RetentionClass:
        """The periods a run of the undefined class ``name`` is held to: the
        ``standard`` class's, or (a policy without one) the shortest of each period.

        An agent chooses its run's class, so a made-up name must not keep its runs
        for ever; it gets no longer than the defined classes give."""
        fallback = self.classes.get(FALLBACK_CLASS)
        if fallback is not None:
            return RetentionClass(name, fallback.bodies, fallback.metadata)
        return RetentionClass(
            name,
            min(c.bodies for c in self.classes.values()),
            min(c.metadata for c in self.classes.values()),
        )

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> RetentionPolicy:
        """``{class: {"bodies_days": N, "metadata_days": M}}``; metadata outlives bodies."""
        classes = {}
        for name, spec in raw.items():
            bodies, metadata = _days(name, spec, "bodies_days"), _days(name, spec, "metadata_days")
            if not 0 < bodies <= metadata:
                raise RetentionConfigError(
                    f"retention class {name!r}: need 0 < bodies_days ({bodies}) <= "
                    f"metadata_days ({metadata})"
                )
            classes[name] = RetentionClass(name, timedelta(days=bodies), timedelta(days=metadata))
        if not classes:
            raise RetentionConfigError(
                "the retention policy defines no class; define at least "
                f"{FALLBACK_CLASS!r} (bodies_days, metadata_days)"
            )
        return cls(classes)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RetentionPolicy:
        """The classes of the JSON file ``BLACKBOX_RETENTION_FILE``, or the defaults
        (standard: bodies 30 days, metadata 400; sensitive: bodies 7 days)."""
        path = (os.environ if environ is None else environ).get("BLACKBOX_RETENTION_FILE")
        if not path:
            return cls.from_mapping(DEFAULT_CLASSES)
        try:
            return cls.from_mapping(json.loads(Path(path).read_text(encoding="utf-8")))
        except OSError as exc:
            raise RetentionConfigError(f"cannot read {path}: {exc.strerror}") from exc
        except ValueError as exc:
            raise RetentionConfigError(f"{path} is not JSON: {exc}") from exc


@dataclass(frozen=True, slots=True)
class Redaction:
    """One run whose bodies were destroyed, or could not be."""

    run_id: str
    reason: str
    key_ids: tuple[str, ...]
    subject_id: str | None = None
    encrypted: bool = True
    """False: the run was recorded without encryption; its bodies stay wherever they
    were copied until that copy's own retention removes them."""


@dataclass(frozen=True, slots=True)
class RetentionReport:
    """What one retention pass (or one deletion request) did."""

    redacted: tuple[Redaction, ...] = ()
    metadata_deleted: tuple[str, ...] = ()
    unknown_classes: tuple[str, ...] = field(default=())
    """Retention classes runs name that the policy does not define: their runs were held
    to the ``standard`` class's periods (:meth:`RetentionPolicy.for_unknown`)."""
    still_running: tuple[str, ...] = ()
    """Runs a deletion request could not shred yet: they are still recording, and their
    writer holds the key. Forget again once they end (or are marked abandoned)."""
    abandoned: tuple[str, ...] = ()
    """Runs marked ``abandoned`` by this pass: running, with no event for longer than
    the job's ``abandon_after``."""
    linked: int = 0
    """Runs a deletion request found linked to its subject (shredded now, before, or
    still recording)."""


_KNOWN_KEYS = frozenset({"bodies_days", "metadata_days"})


def _days(name: str, spec: Any, key: str) -> int:
    """``spec[key]``, a whole number of days (not a string, a bool or a fraction).

    Raises:
        RetentionConfigError: it is missing or not such a number, or ``spec`` is not an
            object with only the two keys.
    """
    if not isinstance(spec, Mapping):
        raise RetentionConfigError(
            f"retention class {name!r} must be an object with bodies_days and metadata_days"
        )
    if unknown := sorted(set(spec) - _KNOWN_KEYS):
        raise RetentionConfigError(
            f"retention class {name!r}: unknown key {', '.join(map(repr, unknown))}; a class "
            "has bodies_days and metadata_days"
        )
    value = spec.get(key)
    if type(value) is not int:
        found = "missing" if value is None else f"{value!r}, a {type(value).__name__}"
        raise RetentionConfigError(
            f"retention class {name!r}: {key} must be a whole number of days ({found})"
        )
    return value


def shred_run_txn(
    conn: Connection,
    run_id: str,
    *,
    reason: str,
    subject_id: str | None = None,
    settings: Settings,
    signer: CheckpointSigner | None = None,
) -> Redaction | None:
    """Destroy the data keys of ``run_id``, scrub the run's clear values (state, effect
    keys and ids), write the ledger and append ``run.redacted`` (signed by ``signer``
    when given), in the caller's transaction. None when the run has no live key left
    (already done).

    A run still recording is refused (:class:`RunStillRunning`): its writer holds the key
    in memory.
    """
    status = lock_run_txn(conn, run_id)
    if status is None:
        return None
    if status == "running":
        raise RunStillRunning(f"run {run_id} is still running; redact it after it finishes")
    destroyed = [key_id for _, key_id in destroy_keys_txn(conn, [run_id], reason=reason)]
    if not destroyed:
        if has_keys_txn(conn, run_id):
            return None  # shredded before
        scrub_run_txn(conn, run_id)
        _ledger(conn, "unencrypted", run_id, [], subject_id, reason)
        return Redaction(run_id, reason, (), subject_id, encrypted=False)
    scrub_run_txn(conn, run_id)
    _ledger(conn, "shred_keys", run_id, destroyed, subject_id, reason)
    append_redaction_txn(
        conn,
        run_id,
        reason=reason,
        key_ids=destroyed,
        subject_id=subject_id,
        settings=settings,
        sign=None if signer is None else partial(_sign, signer),
    )
    return Redaction(run_id, reason, tuple(destroyed), subject_id)


def _sign(signer: CheckpointSigner, statement: Mapping[str, Any]) -> tuple[str, bytes]:
    return signer.key_id, signer.sign_statement(statement)


def abandon_after_from_env(environ: Mapping[str, str] | None = None) -> timedelta:
    """``BLACKBOX_ABANDON_AFTER_HOURS`` (default 24).

    Raises:
        RetentionConfigError: not a positive number.
    """
    raw = (os.environ if environ is None else environ).get("BLACKBOX_ABANDON_AFTER_HOURS")
    if not raw:
        return timedelta(hours=24)
    try:
        hours = float(raw)
    except ValueError:
        hours = 0.0
    if not 0 < hours < 1e6:  # refuses NaN and infinity too
        raise RetentionConfigError(
            f"BLACKBOX_ABANDON_AFTER_HOURS={raw!r}: give a positive number of hours"
        )
    return timedelta(hours=hours)


def _ledger(
    conn: Connection,
    action: str,
    run_id: str,
    key_ids: list[str],
    subject_id: str | None,
    reason: str,
) -> None:
    write_ledger_txn(
        conn,
        action=action,
        run_id=run_id,
        key_ids=key_ids,
        subject_id=subject_id,
        reason=reason,
    )


class RetentionJob:
    """Applies the retention policy and deletion requests to one database.

    Args:
        engine: a connection as the schema owner (it destroys keys and deletes rows).
        policy: the retention classes.
        settings: the outbox's shard count, for the ``run.redacted`` notes it appends.
        clock: the current time (tests move it).
        abandon_after: how long a run may go without an event before a pass marks it
            ``abandoned`` (``BLACKBOX_ABANDON_AFTER_HOURS``, default 24): crashed runs
            then fall under retention instead of staying ``running`` for ever.
        signer: the signer's key, to sign each ``run.redacted`` note so that a
            re-application after a restore can trust it (without it, only notes the
            database's own ledger records are re-applied).
    """

    def __init__(
        self,
        engine: Engine,
        *,
        policy: RetentionPolicy | None = None,
        settings: Settings,
        clock: Callable[[], datetime] | None = None,
        batch: int = 200,
        abandon_after: timedelta | None = None,
        signer: CheckpointSigner | None = None,
    ) -> None:
        self._engine = engine
        self._signer = signer
        self.abandon_after = abandon_after or abandon_after_from_env()
        self.policy = policy or RetentionPolicy.from_env()
        self._settings = settings
        self._clock = clock or (lambda: datetime.now(UTC))
        self._batch = batch

    def run_once(self) -> RetentionReport:
        """Shred every run whose bodies expired, then delete expired metadata. Runs of
        a class the policy does not define are held to the ``standard`` class's periods
        and their classes reported (``unknown_classes``)."""
        now = self._clock()
        with self._engine.begin() as conn:
            abandoned = mark_abandoned_txn(conn, before=now - self.abandon_after, limit=10_000)
        with self._engine.connect() as conn:
            named = retention_classes_txn(conn)
        unknown = tuple(sorted(c for c in named if c not in self.policy.classes))
        redacted: list[Redaction] = []
        deleted: list[str] = []
        classes = [*self.policy.classes.values(), *map(self.policy.for_unknown, unknown)]
        for retention in classes:
            redacted += self._expire_bodies(retention, now - retention.bodies)
            deleted += self._expire_metadata(retention, now - retention.metadata)
        return RetentionReport(tuple(redacted), tuple(deleted), unknown, abandoned=tuple(abandoned))

    def forget(self, subject_id: str) -> RetentionReport:
        """Shred every run linked to ``subject_id`` (a deletion request), and clear what
        the views hold of each that names a person (session and user ids, the words of
        the full-text index). Runs still recording cannot be shredded yet: they are
        reported (``still_running``) and the request goes on with the others."""
        with self._engine.connect() as conn:
            check_may_shred_txn(conn, work="forgetting a data subject")
            run_ids = runs_of_subject_txn(conn, subject_id)
        redacted, running = [], []
        for run_id in run_ids:
            try:
                with self._engine.begin() as conn:
                    done = shred_run_txn(
                        conn,
                        run_id,
                        reason="forget",
                        subject_id=subject_id,
                        settings=self._settings,
                        signer=self._signer,
                    )
                    # At once, not when the views consumer reads the run's note: a run
                    # recorded unencrypted gets none, and its labels must go all the same.
                    forget_run_labels_txn(conn, [run_id])
            except RunStillRunning:
                running.append(run_id)
                continue
            if done is not None:
                redacted.append(done)
        return RetentionReport(tuple(redacted), still_running=tuple(running), linked=len(run_ids))

    def _expire_bodies(self, retention: RetentionClass, before: datetime) -> list[Redaction]:
        done: list[Redaction] = []
        while True:
            with self._engine.connect() as conn:
                run_ids = runs_due_for_shredding_txn(
                    conn, retention.name, before=before, limit=self._batch
                )
            for run_id in run_ids:
                with self._engine.begin() as conn:
                    redaction = shred_run_txn(
                        conn,
                        run_id,
                        reason="retention",
                        settings=self._settings,
                        signer=self._signer,
                    )
                if redaction is not None:
                    done.append(redaction)
            if len(run_ids) < self._batch:
                return done

    def _expire_metadata(self, retention: RetentionClass, before: datetime) -> list[str]:
        deleted: list[str] = []
        while True:
            with self._engine.begin() as conn:
                run_ids = runs_due_for_deletion_txn(
                    conn, retention.name, before=before, limit=self._batch
                )
                for run_id in run_ids:
                    _ledger(conn, "delete_metadata", run_id, [], None, "retention")
                delete_run_metadata_txn(conn, run_ids)
                forget_destroyed_keys_txn(conn, run_ids)
                delete_run_views_txn(conn, run_ids)
            deleted += run_ids
            if len(run_ids) < self._batch:
                return deleted
