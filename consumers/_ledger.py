"""The deletion ledger in the topic, and its authenticated re-application after a restore.

Every destruction of data keys is announced by a ``run.redacted`` note in the run's own
log; the topic outlives any database backup, so after a restore :func:`reapply_ledger`
destroys again what an old backup brought back. Anyone with produce access can write
to the topic, so a note is acted on only when all of these hold:

1. it is authentic: the database's own deletion ledger already records the destruction
   of its keys for its run, or it carries the retention job's signature (body v2,
   :func:`agent_blackbox.schemas.deletion_statement`) under a known public key;
2. its chain verifies: it is the correctly chained next event of its run, followed from
   the run's first event in the topic, or from the chain head ``blackbox.runs`` holds;
3. each key it names belongs to its run (``blackbox.data_keys.run_id``) and tenant.

Any other note is reported with the reason and changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial

from sqlalchemy import Connection, Engine

from agent_blackbox.broker import EpochFence, GrantedEpochs, read_ranges, watermarks
from agent_blackbox.keystore import destroy_key_ids_txn, key_owners_txn
from agent_blackbox.outbox.lifecycle import (
    RunHead,
    check_may_shred_txn,
    lease_epochs,
    ledger_key_ids_txn,
    run_head_txn,
    scrub_run_txn,
    write_ledger_txn,
)
from agent_blackbox.schemas import (
    GENESIS_CHAIN_HASH,
    BlackboxError,
    CheckpointVerifier,
    Envelope,
    EnvelopeCodec,
    EventType,
    PayloadPipeline,
    Settings,
    deletion_statement,
)


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """A destruction as a ``run.redacted`` note in the topic records it."""

    run_id: str
    key_ids: tuple[str, ...]
    reason: str
    subject_id: str | None
    envelope: Envelope | None = None
    """The note itself (its tenant, sequence and chain hash); None only for an entry
    built by hand, which then has to match the database's ledger and chain head."""
    chained_in_topic: bool = False
    """The run's chain, followed in the topic from its first event, reaches this note."""
    retention_class: str | None = None
    signer_key_id: str | None = None
    signature: bytes | None = field(default=None, repr=False)
    unreadable: str | None = None
    """Why the note's body could not be read (it is then never applied)."""

    def statement(self) -> dict[str, object] | None:
        """What the retention job signed for this note; None without an envelope."""
        if self.envelope is None:
            return None
        return deletion_statement(
            run_id=self.run_id,
            tenant_id=self.envelope.tenant_id,
            sequence=self.envelope.sequence,
            key_ids=self.key_ids,
            reason=self.reason,
            subject_id=self.subject_id,
            retention_class=self.retention_class,
        )


@dataclass(frozen=True, slots=True)
class IgnoredEntry:
    """A note re-application refused, and why."""

    entry: LedgerEntry
    why: str


@dataclass(frozen=True, slots=True)
class LedgerReport:
    """What :func:`reapply_ledger` did."""

    destroyed: tuple[tuple[str, str], ...] = ()
    """The (run, key) pairs a restore had brought back, destroyed again now."""
    applied: int = 0
    """Notes found authentic and sound (whether or not a key was left to destroy)."""
    ignored: tuple[IgnoredEntry, ...] = ()
    """Notes not acted on: not authentic, not chained, or naming another run's key."""


@dataclass(frozen=True, slots=True)
class DatabaseFacts:
    """What the database says about one note's run and keys."""

    ledger_key_ids: frozenset[str]
    key_owners: dict[str, tuple[str, str]]
    head: RunHead | None


def reapply_ledger(
    engine: Engine,
    entries: Iterable[LedgerEntry],
    *,
    verifier: CheckpointVerifier | None = None,
) -> LedgerReport:
    """Destroy again the data keys of every authentic, chained note whose keys belong to
    its run, and scrub the run's clear values as the shredding did (see the module's
    docstring); report the others with the reason. One transaction for all. Entries
    come from the topic (:func:`ledger_entries`).

    Args:
        engine: a connection as the schema owner (it destroys keys, writes the ledger).
        entries: the notes to consider.
        verifier: the retention job's public keys; without it only notes the database's
            ledger already records can be applied.
    """
    destroyed: list[tuple[str, str]] = []
    ignored: list[IgnoredEntry] = []
    applied = 0
    with engine.begin() as conn:
        check_may_shred_txn(conn, work="reapplying the deletion ledger")
        for entry in entries:
            why = entry_problem(entry, database_facts(conn, entry), verifier)
            if why is not None:
                ignored.append(IgnoredEntry(entry, why))
                continue
            applied += 1
            reason = f"reapplied {entry.reason}"
            again = destroy_key_ids_txn(conn, entry.key_ids, run_id=entry.run_id, reason=reason)
            # The whole of the shredding comes back, not only the keys' destruction: what
            # the run row and its effects held in clear is scrubbed as forget scrubs it.
            scrub_run_txn(conn, entry.run_id)
            if again:
                write_ledger_txn(
                    conn,
                    action="reapply",
                    run_id=entry.run_id,
                    key_ids=again,
                    subject_id=entry.subject_id,
                    reason=entry.reason,
                )
                destroyed += [(entry.run_id, key_id) for key_id in again]
    return LedgerReport(tuple(destroyed), applied, tuple(ignored))


def database_facts(conn: Connection, entry: LedgerEntry) -> DatabaseFacts:
    """The ledger rows, key owners and chain head the database holds for ``entry``."""
    return DatabaseFacts(
        ledger_key_ids_txn(conn, entry.run_id),
        key_owners_txn(conn, entry.key_ids),
        run_head_txn(conn, entry.run_id),
    )


def entry_problem(
    entry: LedgerEntry, facts: DatabaseFacts, verifier: CheckpointVerifier | None
) -> str | None:
    """Why ``entry`` must not be applied; None when it may (authentic, chained, and
    naming only keys of its own run)."""
    if entry.unreadable is not None:
        return f"its body cannot be read: {entry.unreadable}"
    if not entry.key_ids:
        return "it names no data key"
    return (
        authenticity_problem(entry, facts, verifier)
        or _chain_problem(entry, facts.head)
        or _ownership_problem(entry, facts)
    )


def authenticity_problem(
    entry: LedgerEntry, facts: DatabaseFacts, verifier: CheckpointVerifier | None
) -> str | None:
    """Why ``entry`` is not known to be the retention job's: neither the database's
    ledger (``facts.ledger_key_ids``) records its keys destroyed, nor does a signature
    under ``verifier`` vouch for it; None when one of them does."""
    if facts.ledger_key_ids.issuperset(entry.key_ids):
        return None  # the database itself records this destruction
    statement = entry.statement()
    if entry.signature is None or entry.signer_key_id is None or statement is None:
        return (
            "it is not in the database's deletion ledger and carries no signature of the "
            "retention job"
        )
    if verifier is None:
        return (
            f"it is signed by key {entry.signer_key_id!r} but no public key was given to "
            "check it (set BLACKBOX_SIGNING_PUBLIC_KEYS)"
        )
    problem = verifier.statement_problem(
        statement, signer_key_id=entry.signer_key_id, signature=entry.signature
    )
    return None if problem is None else f"its signature is not the retention job's: {problem}"


def _chain_problem(entry: LedgerEntry, head: RunHead | None) -> str | None:
    envelope = entry.envelope
    if envelope is None:
        return "it has no envelope whose chain could be checked"
    if entry.chained_in_topic:
        return None
    if head is not None:
        if head.last_sequence == envelope.sequence - 1 and envelope.chain_hash == (
            envelope.expected_chain_hash(head.chain_head)
        ):
            return None
        if head.last_sequence == envelope.sequence and envelope.chain_hash == head.chain_head:
            return None
    return (
        f"its chain does not verify: sequence {envelope.sequence} does not follow the run's "
        "events in the topic, nor the chain head the database holds"
    )


def _ownership_problem(entry: LedgerEntry, facts: DatabaseFacts) -> str | None:
    tenant = entry.envelope.tenant_id if entry.envelope is not None else None
    if facts.head is not None and tenant is not None and facts.head.tenant_id != tenant:
        return f"it names tenant {tenant!r} but the run belongs to tenant {facts.head.tenant_id!r}"
    for key_id in entry.key_ids:
        owner = facts.key_owners.get(key_id)
        if owner is None:
            continue  # unknown here: nothing to destroy
        run_id, key_tenant = owner
        if run_id != entry.run_id:
            return f"key {key_id!r} belongs to another run ({run_id!r}), not to this one"
        if tenant is not None and key_tenant != tenant:
            return f"key {key_id!r} belongs to tenant {key_tenant!r}, not {tenant!r}"
    return None


@dataclass
class _Follow:
    """How far a run's chain verifies in the topic, from its first event."""

    last_sequence: int = 0
    chain_head: str = GENESIS_CHAIN_HASH
    broken: bool = False

    def advance(self, envelope: Envelope) -> bool:
        """Take the next event; True when it is the correctly chained next one."""
        if self.broken or envelope.sequence <= self.last_sequence:
            return False  # past a break, or a repeat of an event already followed
        expected = envelope.expected_chain_hash(self.chain_head)
        if envelope.sequence != self.last_sequence + 1 or envelope.chain_hash != expected:
            self.broken = True
            return False
        self.last_sequence, self.chain_head = envelope.sequence, envelope.chain_hash
        return True


def entries_of(envelopes: Iterable[Envelope], pipeline: PayloadPipeline) -> Iterator[LedgerEntry]:
    """The ``run.redacted`` notes among ``envelopes`` (in topic order), each marked with
    whether its run's chain, followed from the first event, reaches it."""
    follows: dict[str, _Follow] = {}
    for envelope in envelopes:
        chained = follows.setdefault(envelope.run_id, _Follow()).advance(envelope)
        if envelope.event_type == EventType.RUN_REDACTED:
            yield note_entry(envelope, pipeline, chained_in_topic=chained)


def note_entry(
    envelope: Envelope, pipeline: PayloadPipeline, *, chained_in_topic: bool = False
) -> LedgerEntry:
    """The ledger entry a ``run.redacted`` note states (marked unreadable when its body
    cannot be read)."""
    try:
        body = pipeline.unpack(envelope)
    except BlackboxError as exc:
        return LedgerEntry(envelope.run_id, (), "", None, envelope, unreadable=str(exc))
    signature = body.get("signature")
    return LedgerEntry(
        run_id=envelope.run_id,
        key_ids=tuple(body["key_ids"]),
        reason=str(body["reason"]),
        subject_id=body["subject_id"],
        envelope=envelope,
        chained_in_topic=chained_in_topic,
        retention_class=body.get("retention_class"),
        signer_key_id=body.get("signer_key_id"),
        signature=bytes(signature) if signature is not None else None,
    )


def ledger_entries(
    settings: Settings, *, engine: Engine | None = None, timeout_s: float = 30.0
) -> Iterator[LedgerEntry]:
    """Every ``run.redacted`` in the event topic, read from the start of each partition
    to its end as of now. The topic is the copy of the ledger a database restore cannot
    roll back; :func:`reapply_ledger` decides which notes to trust.

    ``engine``: the write side's database, asked which lease epochs it granted, so that
    a message stamped with an epoch no relay held cannot fence the real notes out.

    Raises:
        BlackboxError: the broker cannot be reached or the topic does not exist.
    """
    granted = None if engine is None else GrantedEpochs(partial(lease_epochs, engine))
    yield from entries_of(_topic_envelopes(settings, timeout_s, granted), PayloadPipeline())


def _topic_envelopes(
    settings: Settings, timeout_s: float, granted: GrantedEpochs | None
) -> Iterator[Envelope]:
    codec = EnvelopeCodec()
    fence = EpochFence(granted)  # a stale relay's late copy is not read (broker._fencing)
    ends = watermarks(settings, settings.topic, timeout_s=timeout_s)
    for message in read_ranges(settings, settings.topic, ends, timeout_s=timeout_s):
        headers = message.headers()
        if isinstance(headers, dict):  # the client hands a list; typed as either
            headers = list(headers.items())
        value = message.value()
        if not value or not fence.admit(message.partition() or 0, headers):
            continue
        try:
            yield codec.decode(value)
        except BlackboxError:
            continue  # the views consumer sends these to the dead-letter topic
