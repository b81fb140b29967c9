"""Driving an agent's own code in replay mode and reporting what came of it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from outbox import AgentRun, BlobReader, ReplayDivergence, ReplayRun
from replayer._report import ReplayReport
from schemas import Envelope, PayloadPipeline

AgentEntry = Callable[[AgentRun, Any], Any]
"""An agent entry point: ``entry(run, input) -> output``, the same code as in production."""


def replay_run(
    events: Iterable[Envelope],
    entry: AgentEntry,
    *,
    pipeline: PayloadPipeline | None = None,
    blobs: BlobReader | None = None,
    agent_id: str | None = None,
) -> ReplayReport:
    """Replay one recorded run through ``entry`` and report PASS or the first divergence.

    The agent's exceptions are part of what is replayed: a run recorded as failed passes
    when today's code fails the same way.
    """
    try:
        run = ReplayRun(events, pipeline=pipeline, blobs=blobs)
    except ReplayDivergence as exc:
        return ReplayReport(
            exc.divergence.run_id, agent_id, 0, exc.divergence, divergences=exc.divergences
        )
    try:
        try:
            output = entry(run, run.input)
        except ReplayDivergence:
            raise
        except Exception as exc:  # the agent failed; was that what was recorded?
            run.finish(error=exc)
        else:
            run.finish(output=output)
    except ReplayDivergence as exc:
        return ReplayReport(
            run.run_id, agent_id, run.consumed, exc.divergence, divergences=exc.divergences
        )
    return ReplayReport(run.run_id, agent_id, run.consumed)
