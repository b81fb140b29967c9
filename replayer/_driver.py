"""Driving an agent's own code in replay mode and reporting what came of it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import chain
from typing import Any

from agent_blackbox.keystore import DataKeyMissing, KeyDestroyed
from agent_blackbox.outbox import AgentRun
from agent_blackbox.replayer._replay import (
    BlobReader,
    DigestKeys,
    Divergence,
    DivergenceKind,
    ReplayDivergence,
    ReplayRun,
    ReplaySetupError,
)
from agent_blackbox.replayer._report import ReplayReport
from agent_blackbox.replayer._verify import verify_run
from agent_blackbox.schemas import (
    Envelope,
    KeyUnavailable,
    PayloadPipeline,
    UnknownSchemaVersion,
)

_SETUP_ERRORS = (ReplaySetupError, KeyUnavailable, UnknownSchemaVersion, DataKeyMissing)
"""What stops a replay that is not the code's fault: reported as an error, never as a
divergence."""

AgentEntry = Callable[[AgentRun, Any], Any]
"""An agent entry point: ``entry(run, input) -> output``, the same code as in production."""


def replay_run(
    events: Iterable[Envelope],
    entry: AgentEntry,
    *,
    pipeline: PayloadPipeline | None = None,
    blobs: BlobReader | None = None,
    agent_id: str | None = None,
    digests: DigestKeys | None = None,
) -> ReplayReport:
    """Replay one recorded run through ``entry`` and report PASS or the first divergence.

    The agent's exceptions are part of what is replayed: a run recorded as failed passes
    when today's code fails the same way. A problem of the replay's own setup (a missing
    key or blob reader, an event this release cannot read) is the report's ``error``,
    with the exception's message, even when the agent's code caught it.
    """
    stream = iter(events)
    first = next(stream, None)
    if first is None:
        return ReplayReport("unknown", agent_id, 0, error="the run has no events")
    try:
        run = ReplayRun(chain([first], stream), pipeline=pipeline, blobs=blobs, digests=digests)
    except KeyDestroyed as exc:
        return _limited(chain([first], stream), agent_id, blobs, str(exc))
    except _SETUP_ERRORS as exc:
        return _setup_failed(first.run_id, agent_id, 0, exc)
    except ReplayDivergence as exc:
        return ReplayReport(
            exc.divergence.run_id, agent_id, 0, exc.divergence, divergences=exc.divergences
        )
    try:
        try:
            output = entry(run, run.input)
        except (ReplayDivergence, *_SETUP_ERRORS):
            raise
        except Exception as exc:  # the agent failed; was that what was recorded?
            _setup_first(run)
            run.finish(error=exc)
        else:
            _setup_first(run)
            run.finish(output=output)
    except _SETUP_ERRORS as exc:
        return _setup_failed(run.run_id, agent_id, run.consumed, run.setup_error or exc)
    except ReplayDivergence as exc:
        if run.setup_error is not None:
            return _setup_failed(run.run_id, agent_id, run.consumed, run.setup_error)
        return _reported(run, agent_id, exc.divergences)
    return _reported(run, agent_id, ())


# What code derives from a reply's text: after a reply handed back reduced, these may
# differ because of the cut alone, so they are not counted as divergences.
_FROM_TEXT = (DivergenceKind.STATE_MISMATCH, DivergenceKind.OUTPUT_MISMATCH)


def _reported(
    run: ReplayRun, agent_id: str | None, divergences: tuple[Divergence, ...]
) -> ReplayReport:
    """The report of a replay that ran, with a note per event checked only in part (an
    LLM call recorded truncated over the blob ceiling)."""
    if not run.limitations:
        divergence = divergences[0] if divergences else None
        return ReplayReport(run.run_id, agent_id, run.consumed, divergence, divergences=divergences)
    first = run.limitations[0][0]
    notes = [note for _, note in run.limitations]
    kept, limited_levels = [], {"content"}
    for found in divergences:
        if found.kind in _FROM_TEXT and found.sequence > first:
            limited_levels.add(found.level)
            notes.append(
                f"{found.kind} at sequence {found.sequence} not counted: it follows sequence "
                f"{first}, whose response was handed back reduced"
            )
        else:
            kept.append(found)
    count = len(run.limitations)
    limited = (
        f"{count} LLM call{'s' if count > 1 else ''} recorded truncated over the blob "
        "ceiling: control flow was checked, the reduced responses and what followed from "
        "their text were not; " + "; ".join(notes)
    )
    return ReplayReport(
        run.run_id,
        agent_id,
        run.consumed,
        kept[0] if kept else None,
        divergences=tuple(kept),
        limited=limited,
        notes=tuple(notes),
        limited_levels=tuple(sorted(limited_levels)),
    )


def _setup_first(run: ReplayRun) -> None:
    """Raise the setup error the agent's code caught and went past, if any."""
    if run.setup_error is not None:
        raise run.setup_error


def _setup_failed(
    run_id: str, agent_id: str | None, consumed: int, exc: BaseException
) -> ReplayReport:
    return ReplayReport(run_id, agent_id, consumed, error=f"{type(exc).__name__}: {exc}")


def _limited(
    events: Iterable[Envelope], agent_id: str | None, blobs: BlobReader | None, why: str
) -> ReplayReport:
    """The replay of a run whose bodies were destroyed: its code cannot be driven (its
    input is gone with them), so the recorded control flow is checked from what is
    left, the sequences, event types, digests and hash chain."""
    verified = verify_run(events, blobs=blobs)
    note = (
        f"limited replay: {why}. Control flow was checked from digests and the hash chain "
        "only; state and content cannot be checked and the agent's code was not driven."
    )
    divergence = None
    if not verified.ok and verified.problem is not None:
        kind = (
            DivergenceKind.SEQUENCE_GAP
            if verified.problem == "sequence_gap"
            else DivergenceKind.BROKEN_CHAIN
        )
        divergence = Divergence(
            kind=kind,
            run_id=verified.run_id,
            sequence=verified.sequence or 0,
            expected_type=None,
            actual_type=None,
            detail=verified.detail,
        )
    return ReplayReport(verified.run_id, agent_id, verified.events, divergence, limited=note)
