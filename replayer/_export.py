"""Recorded runs as JSON lines: each event's envelope, its body only when asked.

Bodies open only through the payload pipeline given (the replayer's audited keys), and a
plaintext body in a run that has a data key is refused
(:class:`~agent_blackbox.schemas.SealedRunGuard`), as every reader refuses it.
:func:`json_line` writes a value as one line that stays one line for every reader of
JSON lines and prints as written on a terminal, whatever the recorded text holds.
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from itertools import groupby
from typing import Any

from agent_blackbox.keystore import KeyDestroyed
from agent_blackbox.replayer._opening import BlobReader
from agent_blackbox.schemas import (
    BlackboxError,
    Envelope,
    KeyUnavailable,
    PayloadPipeline,
    SealedRunGuard,
    digest_bytes,
    hidden_characters,
    is_sealed,
    permission_refused,
)

_PROBLEMS_KEPT = 5
"""Problems a tally keeps word for word; the rest are counted."""


class ExportError(BlackboxError):
    """An export cannot go on: what it needs to open the bodies is missing."""


@dataclass(slots=True)
class ExportTally:
    """What an export wrote and what it left out, for its summary."""

    runs: int = 0
    events: int = 0
    llm_calls: int = 0
    examples: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    """LLM calls not made into an example, by reason (``truncated``, ``failed``, ...)."""
    unreadable: int = 0
    """Bodies that could not be opened (a missing key or blob, a damaged body, ...)."""
    forgotten: int = 0
    """Bodies whose data key was destroyed on purpose (retention, a deletion request)."""
    refused: int = 0
    """Plaintext bodies in runs that have a data key: not written by the run's recorder."""
    problems: list[str] = field(default_factory=list)
    """The first few reasons a body was not exported, word for word."""

    def problem(self, reason: str) -> None:
        if len(self.problems) < _PROBLEMS_KEPT:
            self.problems.append(reason)


# Envelopes and bodies ----------------------------------------------------------------


def _metadata(envelope: Envelope) -> dict[str, Any]:
    """Everything of an envelope but its payload (which enters by its digest)."""
    payload = envelope.payload
    return {
        "run_id": envelope.run_id,
        "sequence": envelope.sequence,
        "event_id": envelope.event_id,
        "event_type": envelope.event_type,
        "body_version": envelope.body_version,
        "recorded_at": timestamp(envelope.recorded_at),
        "tenant_id": envelope.tenant_id,
        "agent_id": envelope.agent_id,
        "subject_ids": list(envelope.subject_ids),
        "trace_id": envelope.trace_id,
        "span_id": envelope.span_id,
        "parent_span_id": envelope.parent_span_id,
        "input_digest": envelope.input_digest,
        "output_digest": envelope.output_digest,
        "chain_hash": envelope.chain_hash,
        "payload_digest": None if payload is None else digest_bytes(payload),
        "payload_ref": envelope.payload_ref,
        "payload_encoding": envelope.payload_encoding,
        "key_id": envelope.key_id,
        "classification": envelope.classification,
        "retention_class": envelope.retention_class,
        "attributes": dict(sorted(envelope.attributes.items())),
    }


def timestamp(at: datetime) -> str:
    """A recorded time as exported: ISO 8601 with microseconds and its UTC offset."""
    return at.isoformat(timespec="microseconds")


class BodyOpener:
    """Opens the bodies of one run after another, in sequence order.

    A key that could not be had (destroyed, missing, refused) is asked for once per
    export: every other body sealed under it is unreadable for the same reason, and each
    ask would be one more row in the access audit.
    """

    def __init__(
        self, pipeline: PayloadPipeline, blobs: BlobReader | None, tally: ExportTally
    ) -> None:
        self._pipeline, self._blobs, self._tally = pipeline, blobs, tally
        self._guard = SealedRunGuard()
        self._run: str | None = None
        self._lost_keys: dict[str, tuple[str, bool]] = {}
        """Data keys that could not be had: why, and whether destroyed on purpose."""

    def refused(self, envelope: Envelope) -> str | None:
        """Why the body of ``envelope`` must not be read (a plaintext body in a run that
        has a data key), or None. Every event of a run passes here, in sequence order,
        opened or not: the guard learns that a run is sealed from its sealed events."""
        if envelope.run_id != self._run:
            self._run, self._guard = envelope.run_id, SealedRunGuard()
        refusal = self._guard.refusal(envelope)
        if refusal is None:
            return None
        self._tally.refused += 1
        return self._note(
            f"refused: run {envelope.run_id} sequence {envelope.sequence} carries a "
            f"plaintext body, but the run is sealed under data key {refusal.key_id} since "
            f"sequence {refusal.sealed_at}: not written by the run's recorder"
        )

    def open(self, envelope: Envelope) -> tuple[dict[str, Any] | None, str | None]:
        """The body of ``envelope``, or None and why it is not exported.

        Raises:
            ExportError: the body is sealed and the pipeline has no key to open it.
            BlackboxError: the database refused (a permission error; the caller names
                the role to run as).
        """
        refusal = self.refused(envelope)
        if refusal is not None:
            return None, refusal
        return self.read(envelope)

    def read(self, envelope: Envelope) -> tuple[dict[str, Any] | None, str | None]:
        """:meth:`open` for an event :meth:`refused` let through."""
        if is_sealed(envelope) and not self._pipeline.seals:
            raise ExportError(
                f"the bodies of run {envelope.run_id} are sealed and no key-encryption key "
                "is configured: set BLACKBOX_KEK_FILE (or BLACKBOX_KEK) to the replayer's "
                "key file, or export without --bodies"
            )
        lost = self._lost_keys.get(envelope.key_id or "")
        if lost is not None:
            self._count_unopened(destroyed=lost[1])
            return None, lost[0]
        try:
            return self._unpacked(envelope), None
        except BlackboxError as exc:
            if permission_refused(exc) is not None:
                raise
            why = f"{type(exc).__name__}: {exc}"
            destroyed = isinstance(exc, KeyDestroyed)
            if isinstance(exc, KeyUnavailable) and envelope.key_id is not None:
                self._lost_keys[envelope.key_id] = (why, destroyed)
            self._count_unopened(destroyed=destroyed)
            return None, self._note(why)

    def _count_unopened(self, *, destroyed: bool) -> None:
        if destroyed:
            self._tally.forgotten += 1  # destroyed on purpose: no finding
        else:
            self._tally.unreadable += 1

    def _unpacked(self, envelope: Envelope) -> dict[str, Any]:
        if envelope.payload is None and envelope.payload_ref is not None:
            if self._blobs is None:
                raise ExportError(
                    f"run {envelope.run_id} sequence {envelope.sequence}: the body is "
                    f"stored out of line ({envelope.payload_ref}) and no blob store was given"
                )
            return self._pipeline.unpack(envelope, self._blobs.read(envelope.payload_ref))
        return self._pipeline.unpack(envelope)

    def _note(self, reason: str) -> str:
        self._tally.problem(reason)
        return reason


def event_records(
    events: Iterable[Envelope],
    *,
    pipeline: PayloadPipeline | None = None,
    blobs: BlobReader | None = None,
    tally: ExportTally | None = None,
) -> Iterator[dict[str, Any]]:
    """One record per event: the envelope's metadata (ids, type, time, ownership,
    trace context, digests, chain hash, payload digest, key id, attributes), never its
    payload; with ``pipeline``, also ``body``, the body as recorded at its newest
    version (None, with ``body_unavailable`` saying why, when it cannot be opened).

    Args:
        events: one run's events in sequence order, or several runs one after another.
        pipeline: opens the bodies (with the audited keys of
            :func:`~agent_blackbox.replayer._access.opening`); None: metadata only.
        blobs: reads bodies stored out of line.
        tally: counts what was written and what was not.

    Raises:
        ExportError: a body is sealed and ``pipeline`` has no keys.
    """
    tally = tally if tally is not None else ExportTally()
    bodies = None if pipeline is None else BodyOpener(pipeline, blobs, tally)
    for _run_id, run in groupby(events, key=lambda e: e.run_id):
        tally.runs += 1
        for envelope in run:
            tally.events += 1
            record = _metadata(envelope)
            if bodies is not None:
                body, why = bodies.open(envelope)
                record["body"] = body
                if why is not None:
                    record["body_unavailable"] = why
            yield record


# JSON lines --------------------------------------------------------------------------


def json_line(value: Any) -> str:
    """``value`` as one line of JSON (without the line break), UTF-8 text kept as it is.

    Whatever the recorded text holds, the line stays one line and prints as written:
    besides the control characters JSON escapes anyway, every character a reader could
    take for a line break (U+0085, U+2028, U+2029), every other control or invisible
    format character (C1 controls, bidi overrides, zero-width characters) and any lone
    surrogate is written as a ``\\u`` escape, which reads back as the same text. A
    number that is not finite (which canonical JSON never records) is written as null;
    bytes as base64 text.
    """
    try:
        text = _dumps(value)
    except ValueError:  # NaN or an infinity somewhere
        text = _dumps(_finite(value))
    if text.isascii():
        return text.replace("\x7f", "\\u007f")
    return hidden_characters().sub(_escape, text)


def _dumps(value: Any) -> str:
    return json.dumps(
        value, ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=_plain
    )


def _plain(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, datetime):
        return timestamp(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000  # a JSON escape of a character past the BMP is a surrogate pair
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
