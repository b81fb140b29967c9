"""Tamper evidence: prove a stored run is the run that was recorded.

:func:`verify_run` walks a run's envelopes once, in order, holding only the previous
event's sequence and chain hash, so a run of any length verifies in constant memory.
It checks that sequences are contiguous from 1, that every chain hash is the one the
chain computes (so a changed byte anywhere in an envelope or its inline payload is
found at its own sequence), that out-of-line bodies hash to their ``payload_ref``,
and, given a signed :class:`~agent_blackbox.schemas.Checkpoint`, that a known signer signed exactly
this log's head (or, for a mid-run checkpoint, a prefix of it). Given what the write
side's database and the events index know of the run, it also finds a log that is
shorter than they say (``truncated``), one the database never committed, and a run the
database does not know. A sound log that no genuine checkpoint covers to its last event
is ``unverified``: sound as far as the chain can tell, but not vouched for. It needs no
data key, never opens a payload, and never puts payload content in its report.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

from agent_blackbox.replayer._opening import BlobReader
from agent_blackbox.replayer._verify_report import (
    CheckpointStatus,
    DatabaseCheck,
    Problem,
    RecordedHead,
    VerifyReport,
)
from agent_blackbox.schemas import (
    GENESIS_CHAIN_HASH,
    BlackboxError,
    Checkpoint,
    CheckpointVerifier,
    Envelope,
    EventType,
    ForgedCheckpoint,
    PermissionRefused,
    digest_bytes,
    is_plaintext,
    safe_text,
)

__all__ = [
    "CheckpointStatus",
    "DatabaseCheck",
    "Problem",
    "RecordedHead",
    "VerifyReport",
    "verify_run",
]


def verify_run(
    events: Iterable[Envelope],
    *,
    run_id: str | None = None,
    blobs: BlobReader | None = None,
    checkpoint: Checkpoint | None = None,
    verifier: CheckpointVerifier | None = None,
    require_checkpoint: bool = False,
    require_finished: bool = False,
    database: DatabaseCheck | Callable[[], DatabaseCheck] | None = None,
    indexed_events: int | None = None,
) -> VerifyReport:
    """Verify one run's stored envelopes, streamed in sequence order.

    1. The checkpoint's signature, when one is given (this needs no log).
    2. Every event in order: it is of the run, its sequence is the previous one's
       plus 1 (from 1), its chain hash is the one the chain computes, it has a body,
       and (with ``blobs``) its out-of-line body hashes to its ``payload_ref``.
       Against a genuine checkpoint: the first event's run and tenant are the
       checkpoint's, event ``last_sequence`` carries the signed head, and only
       ``run.redacted`` events (appended when keys are destroyed) follow it.
       The walk stops at the first problem.
       A plaintext body after a sealed one is a problem (``run.redacted`` excepted).
    3. At the end: there were events, the log reaches the signed sequence, the
       checkpoint is genuine, a checkpoint was given if required, and a
       ``run.finished`` was seen if required. A run without ``run.finished`` (still
       running, or its process died) is otherwise not a failure: ``finished`` says so.
    4. Against ``database`` and ``indexed_events``: the database knows the run, holds
       no fewer events than the log and the same chain hash where their ends meet, and
       neither knows events the log lacks (``truncated``).
    5. A sound log is ``unverified`` from the first sequence no genuine checkpoint
       covers: after a final checkpoint only ``run.redacted`` may follow, after a
       mid-run one anything may, unvouched.

    Args:
        events: the run's envelopes in sequence order; read once.
        run_id: the run expected; defaults to the first event's.
        blobs: reads out-of-line bodies; without it they are counted in
            ``unchecked_blobs``. Its errors are reported as ``payload_mismatch``.
        checkpoint: the run's signed checkpoint, if there is one.
        verifier: the signers' public keys; required with ``checkpoint``.
        require_checkpoint: report ``checkpoint_missing`` when none is given.
        require_finished: report ``unfinished`` when no ``run.finished`` was seen.
        database: what ``blackbox.runs`` said of the run around the read, if asked;
            a callable is called once, after the log was read (so it can read the
            database's head after the walk).
        indexed_events: how many events the events index holds for the run, if asked.

    Raises:
        ValueError: a checkpoint was given without a verifier.
    """
    if checkpoint is not None and verifier is None:
        raise ValueError("verifying a checkpoint needs verifier= with the signers' public keys")
    walk = _Walk(run_id, blobs)
    signed = None if checkpoint is None or verifier is None else _Signed(checkpoint, verifier)
    for envelope in events:
        found = walk.step(envelope)
        if found is None and signed is not None:
            found = signed.see(envelope, walk.run_id)
        if found is not None:
            return walk.report(*found, signed=signed, checkpoint=checkpoint)
    return _finish(
        walk,
        signed,
        checkpoint=checkpoint,
        require_checkpoint=require_checkpoint,
        require_finished=require_finished,
        known=_Known(database, indexed_events),
    )


_Found = tuple[Problem, int | None, str]


def _finish(
    walk: _Walk,
    signed: _Signed | None,
    *,
    checkpoint: Checkpoint | None,
    require_checkpoint: bool,
    require_finished: bool,
    known: _Known,
) -> VerifyReport:
    """Steps 3 to 5 of :func:`verify_run`, on a log found sound event by event."""
    found: _Found | None = None
    if walk.events == 0:
        found = (Problem.NO_EVENTS, None, "the stream holds no event of the run")
        if signed is not None:
            signed.see_nothing()
    elif signed is not None:
        found = signed.finish(walk.last_sequence)
    elif require_checkpoint:
        found = (Problem.CHECKPOINT_MISSING, None, "no signed checkpoint was given")
    if found is None and require_finished and not walk.finished:
        found = (
            Problem.UNFINISHED,
            None,
            f"no run.finished event; the log ends at sequence {walk.last_sequence}",
        )
    covered = 0 if signed is None else signed.covered(walk.last_sequence)
    if found is None and walk.events:
        found = known.check(walk, vouched=covered == walk.last_sequence and signed_final(signed))
    if found is not None:
        return walk.report(*found, signed=signed, checkpoint=checkpoint)
    report = walk.report(None, None, "", signed=signed, checkpoint=checkpoint)
    unverified = known.unverified_from(walk, covered)
    if unverified is None:
        return report
    return replace(
        report, unverified_from=unverified, detail=known.unverified_detail(walk, covered)
    )


def signed_final(signed: _Signed | None) -> bool:
    """Whether a genuine checkpoint signed the run's end (not a mid-run head)."""
    return signed is not None and signed.status == CheckpointStatus.VALID and signed.final


class _Known:
    """Step 4 and 5: what the database and the events index know of the run."""

    __slots__ = ("_database", "_indexed", "_lookup")

    def __init__(
        self, database: DatabaseCheck | Callable[[], DatabaseCheck] | None, indexed: int | None
    ) -> None:
        self._lookup = database
        self._database: DatabaseCheck | None = None
        self._indexed = indexed

    def _db(self) -> DatabaseCheck | None:
        if self._database is None and self._lookup is not None:
            lookup = self._lookup
            self._database = lookup if isinstance(lookup, DatabaseCheck) else lookup()
        return self._database

    def check(self, walk: _Walk, *, vouched: bool) -> _Found | None:
        """A problem the log has against them, or None."""
        last = walk.last_sequence
        if self._indexed is not None and self._indexed > last:
            return _truncated(last, f"the events index knows {self._indexed} events")
        db = self._db()
        if db is None:
            return None
        if db.before is None and db.after is None:
            if vouched:  # signed when the database knew it; retention deleted it since
                return None
            return (
                Problem.NOT_IN_DATABASE,
                None,
                f"blackbox.runs has no run {_show(walk.run_id)} and no final checkpoint "
                "vouches for it: it was never recorded through the write side",
            )
        return self._against_database(walk, db)

    def _against_database(self, walk: _Walk, db: DatabaseCheck) -> _Found | None:
        last = walk.last_sequence
        after = db.after or db.before
        assert after is not None
        if last > after.last_sequence:
            return (
                Problem.AHEAD_OF_DATABASE,
                after.last_sequence + 1,
                f"the log holds {last} events, blackbox.runs committed "
                f"{after.last_sequence}: events past it were never recorded",
            )
        for head in (db.before, db.after):
            if head is not None and head.last_sequence == last and head.chain_head != walk.chain:
                return (
                    Problem.HEAD_MISMATCH,
                    last,
                    f"at sequence {last} the log's chain hash is {walk.chain}, "
                    f"blackbox.runs has {_show(head.chain_head)}",
                )
        if self._missing(walk, db):
            assert db.before is not None
            return _truncated(last, f"blackbox.runs committed {db.before.last_sequence} events")
        return None

    @staticmethod
    def _missing(walk: _Walk, db: DatabaseCheck) -> bool:
        """Whether events the database committed before the log was read are not in it
        and none of them still waits in the outbox. When the outbox cannot be read (the
        reader role may not), an ended run's events are taken as published."""
        before = db.before
        if before is None or before.last_sequence <= walk.last_sequence:
            return False
        return db.pending_before == 0 or (db.pending_before is None and before.ended)

    def unverified_from(self, walk: _Walk, covered: int) -> int | None:
        """The first sequence not vouched for, or None when every event is."""
        if covered < walk.last_sequence or self._unpublished(walk):
            return covered + 1
        return None

    def unverified_detail(self, walk: _Walk, covered: int) -> str:
        waiting = ""
        if self._unpublished(walk):
            waiting = (
                "; blackbox.runs counts events past the log's end that the relay has not "
                "published yet"
            )
        if covered == 0:
            return f"no checkpoint covers the run's events{waiting}"
        return f"a checkpoint covers events 1 to {covered}, not the rest{waiting}"

    def _unpublished(self, walk: _Walk) -> bool:
        db = self._db()
        before = None if db is None else db.before
        return before is not None and before.last_sequence > walk.last_sequence


def _truncated(last: int, who: str) -> _Found:
    return (
        Problem.TRUNCATED,
        last + 1,
        f"{who}, the log holds {last}: events from {last + 1} on were removed or never published",
    )


class _Walk:
    """The log's side of the check: the previous event's sequence and chain hash."""

    __slots__ = (
        "_blobs",
        "_chain",
        "_sealed",
        "events",
        "finished",
        "last_sequence",
        "run_id",
        "unchecked_blobs",
    )

    def __init__(self, run_id: str | None, blobs: BlobReader | None) -> None:
        self.run_id = run_id
        self._blobs = blobs
        self._chain = GENESIS_CHAIN_HASH
        self._sealed = False
        self.events = 0
        self.last_sequence = 0
        self.finished = False
        self.unchecked_blobs = 0

    def step(self, envelope: Envelope) -> _Found | None:
        """Check the next envelope; on success it becomes the previous one."""
        self.events += 1
        if self.run_id is None:
            self.run_id = envelope.run_id
        at = self.last_sequence + 1
        found = (
            self._run(envelope, at)
            or self._sequence(envelope, at)
            or self._chained(envelope, at)
            or self._body(envelope, at)
            or self._sealing(envelope, at)
        )
        if found is None:
            self.last_sequence = at
            self._chain = envelope.chain_hash
            self._sealed = self._sealed or envelope.key_id is not None
            self.finished = self.finished or envelope.event_type == EventType.RUN_FINISHED
        return found

    def _run(self, envelope: Envelope, at: int) -> _Found | None:
        if envelope.run_id == self.run_id:
            return None
        return (
            Problem.WRONG_RUN,
            at,
            f"the envelope read where sequence {at} belongs is of run "
            f"{_show(envelope.run_id)}, not {_show(self.run_id)}",
        )

    def _sequence(self, envelope: Envelope, at: int) -> _Found | None:
        if type(envelope.sequence) is int and envelope.sequence == at:
            return None
        after = f"after sequence {at - 1}" if at > 1 else "first"
        return (
            Problem.SEQUENCE_GAP,
            at,
            f"expected sequence {at} {after}, read sequence {_show(envelope.sequence)}: "
            "an event is missing, repeated or out of order",
        )

    def _chained(self, envelope: Envelope, at: int) -> _Found | None:
        try:
            expected = envelope.expected_chain_hash(self._chain)
        except (BlackboxError, TypeError, ValueError, AttributeError) as exc:
            return (
                Problem.BROKEN_CHAIN,
                at,
                f"event {at} cannot be hashed ({_show(exc)}): a field was changed",
            )
        if envelope.chain_hash == expected:
            return None
        return (
            Problem.BROKEN_CHAIN,
            at,
            f"event {at} ({_show(envelope.event_type)}) carries chain hash "
            f"{_show(envelope.chain_hash)}, the chain computes {expected}: the event or "
            "its payload was changed after it was written",
        )

    @property
    def chain(self) -> str:
        """The chain hash of the last event found sound."""
        return self._chain

    def _sealing(self, envelope: Envelope, at: int) -> _Found | None:
        # run.redacted is appended plain once the keys are gone, by design.
        if (
            not self._sealed
            or envelope.key_id is not None
            or not is_plaintext(envelope)
            or envelope.event_type == EventType.RUN_REDACTED
        ):
            return None
        return (
            Problem.PLAINTEXT_IN_SEALED_RUN,
            at,
            f"event {at} ({_show(envelope.event_type)}) carries a plaintext body in a run "
            "whose earlier events were sealed with a data key: refused unread",
        )

    def _body(self, envelope: Envelope, at: int) -> _Found | None:
        ref = envelope.payload_ref
        if ref is None:
            if envelope.payload is None:
                return (
                    Problem.MISSING_PAYLOAD,
                    at,
                    f"event {at} has no payload and no payload_ref",
                )
            return None
        if self._blobs is None:
            self.unchecked_blobs += 1
            return None
        try:
            actual = digest_bytes(self._blobs.read(ref))
        except PermissionRefused:  # the login's limits, not the log's fault: unchecked
            self.unchecked_blobs += 1
            return None
        except Exception as exc:  # any reader's failure is a finding, never a crash
            return (
                Problem.PAYLOAD_MISMATCH,
                at,
                f"event {at}: blob {_show(ref)} cannot be read ({_show(exc)})",
            )
        if actual == ref:
            return None
        return (
            Problem.PAYLOAD_MISMATCH,
            at,
            f"event {at}: blob {_show(ref)} holds bytes hashing to {actual}: it was changed",
        )

    def report(
        self,
        problem: Problem | None,
        sequence: int | None,
        detail: str,
        *,
        signed: _Signed | None,
        checkpoint: Checkpoint | None,
    ) -> VerifyReport:
        run_id = self.run_id
        if run_id is None:
            run_id = "" if checkpoint is None else checkpoint.run_id
        return VerifyReport(
            run_id=run_id,
            events=self.events,
            problem=problem,
            sequence=sequence,
            detail=detail,
            checkpoint=CheckpointStatus.MISSING if signed is None else signed.status,
            finished=self.finished,
            last_sequence=self.last_sequence,
            chain_head=None if self.last_sequence == 0 else self._chain,
            unchecked_blobs=self.unchecked_blobs,
        )


class _Signed:
    """The checkpoint's side of the check, fed every event found sound."""

    __slots__ = ("_checkpoint", "_forged", "status")

    def __init__(self, checkpoint: Checkpoint, verifier: CheckpointVerifier) -> None:
        self._checkpoint = checkpoint
        self._forged: str | None = None
        self.status = CheckpointStatus.NOT_CHECKED
        try:
            verifier.verify(checkpoint)
        except ForgedCheckpoint as exc:
            self._forged = safe_text(exc.reason, limit=300)
            self.status = CheckpointStatus.FORGED

    def see(self, envelope: Envelope, run_id: str | None) -> _Found | None:
        """Compare a sound event with what was signed; a forged checkpoint signed
        nothing, so it is compared with nothing."""
        if self._forged is not None:
            return None
        signed = self._checkpoint
        at = envelope.sequence
        if at == 1 and (signed.run_id != run_id or signed.tenant_id != envelope.tenant_id):
            return self._mismatch(
                at,
                f"the checkpoint signed run {_show(signed.run_id)} of tenant "
                f"{_show(signed.tenant_id)}, the log is run {_show(run_id)} of tenant "
                f"{_show(envelope.tenant_id)}",
            )
        if at == signed.last_sequence:
            if envelope.chain_hash != signed.chain_head:
                return self._mismatch(
                    at,
                    f"the checkpoint signed head {_show(signed.chain_head)} at sequence "
                    f"{at}, the log has {envelope.chain_hash}: the log was rewritten",
                )
            self.status = CheckpointStatus.VALID
        elif (
            at > signed.last_sequence
            and signed.final
            and envelope.event_type != EventType.RUN_REDACTED
        ):
            return self._mismatch(
                at,
                f"event {at} ({_show(envelope.event_type)}) follows the signed head at "
                f"sequence {signed.last_sequence}; only run.redacted may",
            )
        return None

    @property
    def final(self) -> bool:
        """Whether the checkpoint signed the run's end."""
        return self._checkpoint.final

    def covered(self, last_sequence: int) -> int:
        """How many of the log's ``last_sequence`` sound events the checkpoint vouches
        for: after a final head, the ``run.redacted`` notes that follow it too."""
        if self.status != CheckpointStatus.VALID:
            return 0
        return last_sequence if self.final else min(last_sequence, self._checkpoint.last_sequence)

    def see_nothing(self) -> None:
        """An empty log: a genuine checkpoint says it should not be."""
        if self._forged is None:
            self.status = CheckpointStatus.MISMATCH

    def finish(self, last_sequence: int) -> _Found | None:
        """After the last event: the log reached the signed head, and the signature."""
        if self._forged is not None:
            return (Problem.FORGED_CHECKPOINT, None, self._forged)
        signed = self._checkpoint
        if last_sequence < signed.last_sequence:
            return self._mismatch(
                last_sequence + 1,
                f"the log ends at sequence {last_sequence}, the checkpoint signed "
                f"{signed.last_sequence} events: events were removed from the end",
            )
        return None

    def _mismatch(self, at: int, detail: str) -> _Found:
        self.status = CheckpointStatus.MISMATCH
        return (Problem.CHECKPOINT_MISMATCH, at, detail)


def _show(value: object) -> str:
    """A value from the log (any field may have been tampered with) as safe, short text."""
    return safe_text(value, limit=80)
