"""Recording runs of the example agent for the integration tests."""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from agent_blackbox.examples.ticket_agent import KeywordModel, Notifier, TicketAgent, sample_tickets
from agent_blackbox.outbox import Recorder


@dataclass(frozen=True)
class RecordedRun:
    run_id: str
    events: int
    code_version: str


def record_ticket_runs(
    recorder: Recorder, ticket_ids: Iterable[str], *, workers: int = 4
) -> list[RecordedRun]:
    """Record one run of the ticket agent per ticket id; returns what was recorded."""
    ids = list(ticket_ids)
    agent = TicketAgent(sample_tickets(len(ids) + 1_000), KeywordModel(), Notifier())

    def one(ticket_id: str) -> RecordedRun:
        snapshot = agent.snapshot(ticket_id)
        run, _ = recorder.record(
            agent.run, snapshot, agent_id="ticket-agent", subject_ids=("customer-1",)
        )
        return RecordedRun(run.run_id, run.last_sequence, snapshot.code_version)

    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(one, ids))


def ticket_ids(count: int) -> list[str]:
    return [f"T-{i:05d}" for i in range(count)]
