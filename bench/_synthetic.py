"""Many runs of valid envelopes, fast: one run recorded for real, then cloned.

Recording 100,000 events through the Recorder takes over a minute on a small machine,
and the relay and view benches are not about the Recorder. So one run is recorded with
the Recorder (a mix of tool, LLM, clock, random and state events, as an agent writes
them), read back from the outbox, and cloned: each clone gets its own run id, fresh
event ids and a hash chain recomputed over its own envelopes, and is encoded with the
same :class:`~agent_blackbox.schemas.EnvelopeCodec`. Payloads are plain Avro and not bound to a run,
so the template's bodies stay valid in every clone.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import Engine, text

from agent_blackbox.broker import LeaseStamp, new_producer, producer_config
from agent_blackbox.outbox import AgentRun, Recorder, RunSnapshot
from agent_blackbox.outbox.relay import EVENT_ID_HEADER
from agent_blackbox.outbox.storage import shard_of
from agent_blackbox.schemas import GENESIS_CHAIN_HASH, Envelope, EnvelopeCodec, Settings
from bench._common import drop_runs

TEMPLATE_EVENTS = 50
"""Events per run, ``run.started`` and ``run.finished`` included."""


@dataclass(frozen=True, slots=True)
class Row:
    """One outbox row: what the recorder inserts and the relay publishes."""

    shard: int
    run_id: str
    sequence: int
    event_id: str
    envelope: bytes


def record_template(engine: Engine, settings: Settings) -> list[Envelope]:
    """Record one run with the Recorder and return its envelopes, then drop it."""
    recorder = Recorder(engine, settings=settings)
    snapshot = RunSnapshot(code_version="bench", input={"task": "summarise the inbox"})
    run, _ = recorder.record(bench_agent, snapshot, agent_id="bench")
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT envelope FROM blackbox.outbox WHERE run_id = :id ORDER BY sequence"),
            {"id": run.run_id},
        ).all()
    drop_runs(engine, [run.run_id])
    codec = EnvelopeCodec()
    return [codec.decode(row[0]) for row in rows]


def bench_agent(run: AgentRun, input: Any) -> Any:
    """The template's agent: a loop over the kinds of boundary until the run holds
    :data:`TEMPLATE_EVENTS` events with its end (also the clones' replay entry point)."""
    del input
    for step in range(TEMPLATE_EVENTS - 2):  # one event each, between start and finish
        _agent_step(run, step)
    return {"summary": "done"}


def _agent_step(run: AgentRun, step: int) -> None:
    """One boundary of a plausible agent loop, cycling through the kinds."""
    kind = step % 5
    if kind == 0:
        run.llm(
            _chat,
            {"model": "bench-model", "messages": [{"role": "user", "content": "hi"}]},
            provider="bench",
        )
    elif kind == 1:
        run.call("search", _search, "quarterly report", limit=5)
    elif kind == 2:
        run.now()
    elif kind == 3:
        run.random()
    else:
        run.transition(f"step-{step}", state={"step": step, "notes": ["a", "b"]})


def _chat(request: Mapping[str, Any]) -> Mapping[str, Any]:
    return {
        "id": "chatcmpl-bench",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello."},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
    }


def _search(query: str, *, limit: int) -> list[dict[str, str]]:
    return [{"title": f"{query} #{i}", "url": f"https://example.test/{i}"} for i in range(limit)]


def clone(template: Sequence[Envelope], run_id: str) -> list[Envelope]:
    """``template`` as the run ``run_id``: fresh event ids, its own hash chain."""
    head = GENESIS_CHAIN_HASH
    clones: list[Envelope] = []
    for envelope in template:
        moved = replace(envelope, run_id=run_id, event_id=str(uuid.uuid4()), chain_hash="")
        chained = replace(moved, chain_hash=moved.expected_chain_hash(head))
        head = chained.chain_hash
        clones.append(chained)
    return clones


def rows(template: Sequence[Envelope], *, events: int, shards: int) -> Iterator[Row]:
    """``events`` outbox rows of cloned runs, interleaved as concurrent writers leave them."""
    codec = EnvelopeCodec()
    runs = -(-events // len(template))
    clones = [clone(template, str(uuid.uuid4())) for _ in range(runs)]
    emitted = 0
    for position in range(len(template)):
        for envelopes in clones:
            if emitted == events:
                return
            envelope = envelopes[position]
            yield Row(
                shard=shard_of(envelope.run_id, shards),
                run_id=envelope.run_id,
                sequence=envelope.sequence,
                event_id=envelope.event_id,
                envelope=codec.encode(envelope),
            )
            emitted += 1


def register(engine: Engine, rows: Sequence[Row]) -> None:
    """Give the write side a runs row for each run of ``rows`` (tenant, agent, head and
    chain head of its last row), as its recorder would have left it: the consumers
    mark events of runs the write side does not hold as unverified, and a bench of
    them must measure the path recorded runs take. :func:`bench._common.drop_runs`
    deletes them again."""
    last: dict[str, Row] = {}
    for row in rows:
        seen = last.get(row.run_id)
        if seen is None or row.sequence > seen.sequence:
            last[row.run_id] = row
    codec = EnvelopeCodec()
    heads = [codec.decode(row.envelope) for row in last.values()]
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO blackbox.runs (run_id, tenant_id, agent_id, last_sequence, "
                "chain_head) VALUES (:run_id, :tenant_id, :agent_id, :sequence, :chain_hash) "
                "ON CONFLICT (run_id) DO UPDATE SET last_sequence = excluded.last_sequence, "
                "chain_head = excluded.chain_head"
            ),
            [
                {
                    "run_id": e.run_id,
                    "tenant_id": e.tenant_id,
                    "agent_id": e.agent_id,
                    "sequence": e.sequence,
                    "chain_hash": e.chain_hash,
                }
                for e in heads
            ],
        )


def produce(settings: Settings, topic: str, rows: Sequence[Row], *, stamped: bool = False) -> None:
    """Send ``rows`` to ``topic`` as the relay does (key, value, header, its producer
    config) with a bare producer, and return once every one is acknowledged.

    ``stamped`` adds the relay's lease stamp header too (epoch 1, prebuilt per shard as
    the relay's are), so that the messages are the relay's byte for byte: for comparing
    the two, not for a topic that a relay also publishes to (a reader's fence would
    drop these after a relay's newer epochs).

    Raises:
        RuntimeError: deliveries were still outstanding after two minutes.
    """
    producer = new_producer(settings, producer_config(settings))
    shards = range(settings.outbox_shards) if stamped else range(0)
    stamps = {shard: LeaseStamp(shard, 1).header() for shard in shards}
    for row in rows:
        headers = [(EVENT_ID_HEADER, row.event_id.encode("ascii"))]
        if stamps:
            headers.append(stamps[row.shard])
        while True:
            try:
                producer.produce(
                    topic, key=row.run_id.encode("utf-8"), value=row.envelope, headers=headers
                )
                break
            except BufferError:
                producer.poll(0.05)  # the local queue is full; let deliveries drain
        producer.poll(0)
    if left := producer.flush(120):
        raise RuntimeError(f"{left} messages to {topic} were not delivered within 120s")
