"""Replaying runs found through the run index, each read from its stretch of the topic:
the wiring ``blackbox replay RUN_ID`` and :func:`agent_blackbox.replay` share."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from functools import partial

from sqlalchemy import Engine

from agent_blackbox.outbox.storage import PostgresBlobs
from agent_blackbox.replayer._access import Opening
from agent_blackbox.replayer._batch import BatchReplayer, OpenedRun, Replaying
from agent_blackbox.replayer._history import SkippedMessage
from agent_blackbox.replayer._index import RunIndex
from agent_blackbox.replayer._registry import AgentRegistry
from agent_blackbox.replayer._report import ReplayReport
from agent_blackbox.replayer._sources import KafkaRunSource
from agent_blackbox.schemas import Settings


def replay_indexed(
    run_ids: Iterable[str],
    registry: AgentRegistry,
    reading: Opening,
    *,
    settings: Settings,
    engine: Engine,
    index: RunIndex,
    how: Replaying | None = None,
) -> Iterator[ReplayReport | SkippedMessage]:
    """Replay each of ``run_ids``, located through ``index`` and read from its stretch of
    one partition; yields each run's report, then the messages under its key that were
    passed over (not events: anyone who can produce to the topic can write one).

    A run that cannot be replayed (not indexed, unreadable, no key) is a report whose
    ``error`` says why and what to do; the next run is replayed all the same.

    Args:
        run_ids: the runs, replayed in this order.
        registry: which code replays which agent (a run of an agent without an entry
            point is an error, not skipped).
        reading: the payload pipeline and digest keys (see ``_access.opening``).
        settings: where the topic is (``BLACKBOX_KAFKA_BOOTSTRAP``).
        engine: the write side's database, for bodies stored out of line.
        index: where each run is in the topic (the read side's run index).
        how: the replay's options (the defaults of :class:`Replaying` when None).
    """
    replayer = BatchReplayer(
        registry, reading, PostgresBlobs(engine), skip_unknown=False, how=how or Replaying()
    )
    for run_id in run_ids:
        sources: list[KafkaRunSource] = []
        yield replayer.replay(run_id, partial(_located, settings, index, run_id, sources))
        for source in sources:
            yield from source.skipped


def _located(
    settings: Settings, index: RunIndex, run_id: str, opened: list[KafkaRunSource]
) -> OpenedRun:
    """The run's events, read from its stretch of one partition (the source is kept in
    ``opened``, to list the messages it passed over once the run is replayed)."""
    source = KafkaRunSource(settings, index, run_id)
    opened.append(source)
    return source, source.agent_id
