"""What a run left in the outbox, read as the owner (before the relay publishes it)."""

from __future__ import annotations

from sqlalchemy import Engine, text

from agent_blackbox.schemas import Envelope, EnvelopeCodec

_ROWS = text("SELECT envelope FROM blackbox.outbox WHERE run_id = :r ORDER BY sequence")


def outbox_rows(engine: Engine, run_id: str) -> list[bytes]:
    """The encoded envelopes of ``run_id`` still in the outbox, in sequence order."""
    with engine.connect() as conn:
        return [bytes(row) for row in conn.execute(_ROWS, {"r": run_id}).scalars()]


def outbox_envelopes(engine: Engine, run_id: str) -> list[Envelope]:
    """The envelopes of ``run_id`` still in the outbox, in sequence order."""
    codec = EnvelopeCodec()
    return [codec.decode(row) for row in outbox_rows(engine, run_id)]
