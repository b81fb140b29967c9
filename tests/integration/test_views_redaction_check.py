"""Views kept in a database without the write side: a ``run.redacted`` note is confirmed
by the retention job's signature when public keys are configured, and applied as it
comes (said once in the log) when they are not."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, make_url, text

from agent_blackbox.consumers import apply_batch, migrate_views, runs_view
from agent_blackbox.consumers._batch import Delivered
from agent_blackbox.consumers._redacted_views import RedactionCheck
from agent_blackbox.schemas import (
    GENESIS_CHAIN_HASH,
    BodyCodec,
    CheckpointSigner,
    CheckpointVerifier,
    Envelope,
    EventType,
    deletion_statement,
)
from tests.conftest import Services

pytestmark = pytest.mark.integration

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SIGNER = CheckpointSigner.generate(key_id="retention-1")
VERIFIER = CheckpointVerifier({SIGNER.key_id: SIGNER.public_key})


@pytest.fixture
def views_only(services: Services) -> Iterator[Engine]:
    """A database holding the views and nothing of the write side."""
    name = f"bbv_{uuid.uuid4().hex[:12]}"
    admin = create_engine(services.database_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
    url = make_url(services.database_url).set(database=name).render_as_string(False)
    engine = create_engine(url)
    try:
        migrate_views(url)
        yield engine
    finally:
        engine.dispose()
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()


def _event(run_id: str, sequence: int, event_type: str, **kw: Any) -> Envelope:
    values: dict[str, Any] = {
        "event_id": str(uuid.uuid4()),
        "run_id": run_id,
        "sequence": sequence,
        "event_type": event_type,
        "body_version": 1,
        "recorded_at": T0 + timedelta(seconds=sequence),
        "tenant_id": "tenant-1",
        "agent_id": "agent-1",
        "input_digest": f"in-{sequence}",
        "output_digest": f"out-{sequence}",
        "chain_hash": f"chain-{sequence}",
        "payload": b"\x00plain",
        **kw,
    }
    return Envelope(**values)


def _note(run_id: str, sequence: int, *, signer: CheckpointSigner | None) -> Envelope:
    statement = deletion_statement(
        run_id=run_id,
        tenant_id="tenant-1",
        sequence=sequence,
        key_ids=["key-1"],
        reason="forget",
        subject_id="customer-1",
        retention_class=None,
    )
    body: dict[str, Any] = {
        "reason": "forget",
        "retention_class": None,
        "subject_id": "customer-1",
        "key_ids": ["key-1"],
        "signer_key_id": None if signer is None else signer.key_id,
        "signature": None if signer is None else signer.sign_statement(statement),
    }
    return _event(
        run_id,
        sequence,
        EventType.RUN_REDACTED,
        body_version=2,
        payload=BodyCodec().encode("run.redacted", 2, body),
    )


def _chained(events: list[Envelope]) -> list[Envelope]:
    previous = GENESIS_CHAIN_HASH
    chained = []
    for event in events:
        event = replace(event, chain_hash=event.expected_chain_hash(previous))
        previous = event.chain_hash
        chained.append(event)
    return chained


def _run(engine: Engine, check: RedactionCheck, *, signer: CheckpointSigner | None) -> str:
    run_id = f"run-{uuid.uuid4().hex}"
    events = [
        _event(run_id, 1, EventType.RUN_STARTED),
        _event(run_id, 2, EventType.RUN_FINISHED, attributes={"status": "succeeded"}),
        _note(run_id, 3, signer=signer),
    ]
    events = _chained(events)  # as its recorder wrote them: an event off the chain is unverified
    records = [Delivered(e, "events", 0, e.sequence) for e in events]
    with engine.begin() as conn:
        apply_batch(conn, records, redactions=check)
    return run_id


def _state(engine: Engine, run_id: str) -> tuple[bool, set[str], list[str]]:
    with engine.connect() as conn:
        limited = (
            conn.execute(runs_view.select().where(runs_view.c.run_id == run_id))
            .one()
            .limited_replay
        )
        digests = conn.execute(
            text("SELECT input_digest FROM blackbox_views.events WHERE run_id = :r"),
            {"r": run_id},
        ).scalars()
        kinds = conn.execute(
            text("SELECT kind FROM blackbox_views.integrity_violations WHERE run_id = :r"),
            {"r": run_id},
        ).scalars()
        return bool(limited), set(digests), list(kinds)


def test_a_signed_note_is_confirmed_and_an_unsigned_one_is_not(views_only: Engine) -> None:
    check = RedactionCheck(VERIFIER)
    signed = _run(views_only, check, signer=SIGNER)
    assert _state(views_only, signed) == (True, {"shredded"}, [])

    unsigned = _run(views_only, check, signer=None)
    assert _state(views_only, unsigned) == (
        False,
        {"in-1", "in-2", "in-3"},
        ["unconfirmed_redaction"],
    )

    stranger = CheckpointSigner.generate(key_id=SIGNER.key_id)  # same id, another key
    forged = _run(views_only, check, signer=stranger)
    assert _state(views_only, forged)[2] == ["unconfirmed_redaction"]


def test_without_public_keys_notes_apply_as_before_and_the_log_says_so(
    views_only: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    check = RedactionCheck()
    with caplog.at_level(logging.WARNING, logger="agent_blackbox.consumers._redacted_views"):
        first = _run(views_only, check, signer=None)
        second = _run(views_only, check, signer=None)
    assert _state(views_only, first)[:2] == (True, {"shredded"})
    assert _state(views_only, second)[:2] == (True, {"shredded"})
    warnings = [r for r in caplog.records if "unconfirmed" in r.getMessage()]
    assert len(warnings) == 1
    assert "BLACKBOX_SIGNING_PUBLIC_KEYS" in warnings[0].getMessage()
