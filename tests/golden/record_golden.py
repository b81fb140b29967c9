"""Records the golden histories of the ticket agent (run once per schema version).

    BLACKBOX_DATABASE_URL=... python -m tests.golden.record_golden tests/golden/ticket-agent.v1.avro

The archive it writes is committed and must replay forever: later releases read it
through Avro resolution and the migrators, never by rewriting it.

``ticket-agent.v2.avro`` holds the same kind of runs (five tickets and one failing run)
as written by the last release that wrote ``llm.call`` v2 bodies (commit 318301e),
recorded with the memory recorder.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

from sqlalchemy import create_engine, text

from agent_blackbox.examples.ticket_agent import (
    KeywordModel,
    Notifier,
    TicketAgent,
    TicketStore,
    sample_tickets,
)
from agent_blackbox.outbox import Recorder
from agent_blackbox.outbox.storage import migrate_write_side
from agent_blackbox.replayer import write_archive
from agent_blackbox.schemas import EnvelopeCodec, Settings


def main(target: Path) -> None:
    settings = Settings.from_env()
    migrate_write_side(settings.database_url)
    engine = create_engine(settings.database_url)
    recorder = Recorder(engine, settings=settings)
    tickets = sample_tickets(5)
    agent = TicketAgent(tickets, KeywordModel(), Notifier())
    run_ids = []
    for ticket_id in tickets.tickets:
        run, _ = recorder.record(agent.run, agent.snapshot(ticket_id), agent_id="ticket-agent")
        run_ids.append(run.run_id)
    # A run that failed: the ticket does not exist, the tool raised, the run failed.
    missing = TicketAgent(TicketStore(), KeywordModel(), Notifier())
    failing_id = str(uuid.uuid4())
    try:
        recorder.record(
            missing.run, missing.snapshot("T-404"), agent_id="ticket-agent", run_id=failing_id
        )
    except KeyError:
        run_ids.append(failing_id)
    codec = EnvelopeCodec()
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT envelope FROM blackbox.outbox WHERE run_id = ANY(:ids) "
                "ORDER BY array_position(:ids, run_id), sequence"
            ),
            {"ids": run_ids},
        ).scalars()
        count = write_archive(target, (codec.decode(bytes(row)) for row in rows))
    print(f"wrote {count} events of {len(run_ids)} runs to {target}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
