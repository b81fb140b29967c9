"""A run as a table, event by event, safe to print whatever it holds (``blackbox timeline``)."""

from __future__ import annotations

import json
from collections.abc import Iterable

from rich.table import Table

from agent_blackbox.replayer._bodies import answer_first
from agent_blackbox.replayer._opening import BlobReader
from agent_blackbox.schemas import (
    BlackboxError,
    Envelope,
    EventType,
    PayloadPipeline,
    PlaintextInSealedRun,
    SealedRunGuard,
    permission_refused,
    safe_text,
)

BODY_LIMIT = 160
"""Characters of a body shown per event; a timeline is for reading, not for export."""


def timeline_table(
    run_id: str,
    events: Iterable[Envelope],
    *,
    pipeline: PayloadPipeline | None = None,
    unverified: frozenset[int] = frozenset(),
    blobs: BlobReader | None = None,
) -> Table:
    """The run as a table: sequence, type, time, attributes and, with ``pipeline``, a
    shortened body. Every value from the log passes :func:`agent_blackbox.schemas.safe_text`.

    An event with a plaintext body in a run that has a data key (appended by someone
    other than the run's recorder) is marked refused, and its body is never shown. An
    event whose sequence is in ``unverified`` (the write side does not vouch for it) is
    marked unverified.
    """
    table = Table(title=f"Run {safe_text(run_id)}")
    for column in ("seq", "event", "recorded at", "attributes", *(("body",) if pipeline else ())):
        table.add_column(column, overflow="fold")
    guard = SealedRunGuard()
    for envelope in events:
        refusal = guard.refusal(envelope)
        attributes = ", ".join(f"{k}={v}" for k, v in sorted(envelope.attributes.items()))
        row = [
            str(envelope.sequence),
            safe_text(envelope.event_type)
            + (" (refused)" if refusal else "")
            + (" (unverified)" if envelope.sequence in unverified else ""),
            envelope.recorded_at.isoformat(timespec="milliseconds"),
            safe_text(attributes, limit=BODY_LIMIT),
        ]
        if pipeline is not None:
            row.append(_refused(refusal) if refusal else _body(envelope, pipeline, blobs))
        table.add_row(*row)
    return table


def _refused(refusal: PlaintextInSealedRun) -> str:
    return safe_text(
        f"(refused: plaintext body in a run sealed under data key {refusal.key_id} since "
        f"sequence {refusal.sealed_at}; not written by the run's recorder)"
    )


def _body(envelope: Envelope, pipeline: PayloadPipeline, blobs: BlobReader | None) -> str:
    if envelope.payload is None and blobs is None:
        return safe_text(f"(out of line: {envelope.payload_ref})")
    try:
        data = None
        if envelope.payload_ref is not None and blobs is not None:
            data = blobs.read(envelope.payload_ref)
        body = pipeline.unpack(envelope, data)
    except BlackboxError as exc:  # a body that cannot be opened: said in its place
        if permission_refused(exc) is not None:
            raise  # the login may open no body at all: the command stops and says so
        return safe_text(f"({type(exc).__name__}: {exc})", limit=BODY_LIMIT)
    if envelope.event_type == EventType.LLM_CALL:
        body = answer_first(body)
    return safe_text(json.dumps(body, default=str, ensure_ascii=False), limit=BODY_LIMIT)
