"""Driving an agent's own code in replay mode and reporting what came of it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from itertools import chain
from typing import Any

from agent_blackbox.keystore import DataKeyMissing, KeyDestroyed
from agent_blackbox.outbox import AgentRun, NondeterminismGuard
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
from agent_blackbox.replayer._sandbox import (
    NondeterminismPolicy,
    check_policy,
    found,
    modules_of,
)
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
    nondeterminism: NondeterminismPolicy = "warn",
    agent_modules: Iterable[str] = (),
) -> ReplayReport:
    """Replay one recorded run through ``entry`` and report PASS or the first divergence
    (see :func:`_replay`).

    Direct reads of the wall clock, ``random``, UUIDs, the OS's randomness and the
    environment by the agent's own modules (the package of ``entry``'s module, and the
    modules or packages named in ``agent_modules``) are the report's
    ``nondeterminism``, each with its call site: warnings with
    ``nondeterminism="warn"``, a failed run with ``"fail"``.

    Raises:
        ValueError: ``nondeterminism`` is neither ``warn`` nor ``fail``.
    """
    fails = check_policy(nondeterminism) == "fail"
    with NondeterminismGuard(modules_of(entry, agent_modules)) as guard:
        report = _replay(
            events, entry, pipeline=pipeline, blobs=blobs, agent_id=agent_id, digests=digests
        )
    return replace(report, nondeterminism=found(guard), nondeterminism_fails=fails)


def _replay(
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
        return ReplayReport(
            run.run_id, agent_id, run.consumed, exc.divergence, divergences=exc.divergences
        )
    return ReplayReport(run.run_id, agent_id, run.consumed)


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
