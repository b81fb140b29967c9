"""Events about a run after it ended, appended by jobs rather than by the agent.

``run.redacted`` says the run's data keys were destroyed. It goes through the outbox
like every event, continues the run's hash chain (so the note itself is tamper-evident)
and reaches every consumer of the run's partition after the run's own events.
"""

from __future__ import annotations

from sqlalchemy import Connection

from agent_blackbox.outbox import _boundaries as b
from agent_blackbox.outbox._core import new_factory, utc_now
from agent_blackbox.outbox._errors import RunNotActive
from agent_blackbox.outbox._postgres import append_txn, load_run_txn
from agent_blackbox.outbox._writer import new_event_id
from agent_blackbox.schemas import Envelope, Settings


def append_redaction_txn(
    conn: Connection,
    run_id: str,
    *,
    reason: str,
    key_ids: list[str],
    subject_id: str | None = None,
    settings: Settings | None = None,
) -> Envelope:
    """Append ``run.redacted`` to ``run_id`` in the caller's transaction; never commits.

    The caller holds the run row locked (``SELECT ... FOR UPDATE``) so no writer moves
    the run meanwhile.

    Raises:
        RunNotActive: the run does not exist, or it moved on under this transaction.
    """
    settings = settings or Settings.from_env()
    stored = load_run_txn(conn, run_id, shards=settings.outbox_shards)
    crossing = b.run_redacted(
        reason=reason,
        key_ids=key_ids,
        subject_id=subject_id,
        retention_class=stored.identity.retention_class if reason == "retention" else None,
    )
    factory = new_factory(settings, None, utc_now)  # plain: no key is left to seal with
    event = factory.prepare(stored.identity, stored.cursor, crossing, event_id=new_event_id())
    if not append_txn(conn, stored.identity, event):
        raise RunNotActive(f"run {run_id} moved on while its redaction was appended")
    return event.envelope
