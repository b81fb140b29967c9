"""Driving an agent's own code in replay mode and reporting what came of it."""

from __future__ import annotations

import asyncio
import inspect
import sys
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import lru_cache
from itertools import chain
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar, Unpack, cast

from agent_blackbox.keystore import DataKeyMissing, KeyDestroyed
from agent_blackbox.outbox import AgentRun, NondeterminismGuard
from agent_blackbox.outbox.contract import in_force, watch_connections
from agent_blackbox.replayer._divergence import (
    Divergence,
    DivergenceKind,
    ReplayDivergence,
    ReplaySetupError,
)
from agent_blackbox.replayer._opening import BlobReader, DigestKeys
from agent_blackbox.replayer._replay import AsyncReplayRun, ReplayRun
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
    EventType,
    KeyUnavailable,
    PayloadPipeline,
    UnknownSchemaVersion,
)

if TYPE_CHECKING:
    from functools import _lru_cache_wrapper

T = TypeVar("T")

_SETUP_ERRORS = (ReplaySetupError, KeyUnavailable, UnknownSchemaVersion, DataKeyMissing)
"""What stops a replay that is not the code's fault: reported as an error, never as a
divergence."""

_ORIGIN_DEPTH = 32
"""Frames kept of where each coroutine was made, while an async entry replays. A
framework may cross the boundary from a task of its own that it starts well below the
agent's line (pydantic-ai sends each model request from an anyio task some 16 frames
down): the origin must reach that line for the call site to name it."""

AgentEntry = Callable[[AgentRun, Any], Any]
"""An agent entry point: ``entry(run, input) -> output``, the same code as in production
(or ``async def entry(run, input)``, which replay drives with an async run)."""


class ReplayOptions(TypedDict, total=False):
    """How :func:`replay_run` and :func:`replay_run_async` replay (keywords, all optional).

    Keys:
        pipeline: opens payloads (the sealing adapter, with its key store, for
            encrypted runs); plain Avro by default.
        blobs: reads bodies stored out of line (``PostgresBlobs`` on the write side).
        agent_id: the agent named in the report.
        digests: the tenants' keyed digests, for runs digested under a key.
        stall_timeout: seconds a concurrent call waits for its turn before the replay
            decides the code left out a child (default 10; see :class:`ReplayRun`).
        reveal_values: an argument mismatch lists the changed values, not only paths.
        nondeterminism: ``"warn"`` (default) or ``"fail"``: what direct reads of the
            clock, ``random``, UUIDs, the OS's randomness and the environment by the
            agent's own modules do to the report.
        agent_modules: modules or packages of the agent's own besides the package of
            the entry's module (their direct reads are reported too).
        allow_network: let connections the agent's code opens through no boundary go
            out (noted in the report) instead of refusing them as an
            ``unrecorded_call`` divergence (the default: replay never goes online).
    """

    pipeline: PayloadPipeline | None
    blobs: BlobReader | None
    agent_id: str | None
    digests: DigestKeys | None
    stall_timeout: float
    reveal_values: bool
    nondeterminism: NondeterminismPolicy
    agent_modules: Iterable[str]
    allow_network: bool


def replay_run(
    events: Iterable[Envelope], entry: AgentEntry, **options: Unpack[ReplayOptions]
) -> ReplayReport:
    """Replay one recorded run through ``entry`` and report PASS or the first divergence
    (``options``: see :class:`ReplayOptions`).

    ``entry`` may be a plain function (it gets a :class:`ReplayRun`) or a coroutine
    function (it gets an :class:`AsyncReplayRun` and runs in an event loop of its own;
    inside a running loop, use :func:`replay_run_async`).

    The agent's exceptions are part of what is replayed: a run recorded as failed passes
    when today's code fails the same way. A problem of the replay's own setup (a missing
    key or blob reader, an event this release cannot read) is the report's ``error``,
    with the exception's message, even when the agent's code caught it.

    Direct reads of the wall clock, ``random``, UUIDs, the OS's randomness and the
    environment by the agent's own modules are the report's ``nondeterminism``, each
    with its call site: warnings, or a failed run with ``nondeterminism="fail"``.

    Raises:
        ValueError: ``nondeterminism`` is neither ``warn`` nor ``fail``.
    """
    work = replay_run_async(events, entry, **options)
    return _in_own_loop(work) if is_async_entry(entry) else _at_once(work)


async def replay_run_async(
    events: Iterable[Envelope], entry: AgentEntry, **options: Unpack[ReplayOptions]
) -> ReplayReport:
    """:func:`replay_run` from async code: a coroutine entry runs in the caller's loop."""
    fails = check_policy(options.get("nondeterminism", "warn")) == "fail"
    agent_id = options.get("agent_id")
    with NondeterminismGuard(modules_of(entry, options.get("agent_modules", ()))) as guard:
        opened = _opened(events, entry, options)
        problem = entry_problem(entry)
        if problem is not None and isinstance(opened, ReplayRun):
            opened = _setup_failed(opened.run_id, agent_id, 0, ReplaySetupError(problem))
        if isinstance(opened, ReplayReport):
            report = opened
        elif is_async_entry(entry):
            report = await _driven_async(opened, entry, agent_id)
        else:
            report = _concluded(opened, agent_id, *_driven(opened, entry))
    return replace(report, nondeterminism=found(guard), nondeterminism_fails=fails)


def entry_problem(entry: Callable[..., Any]) -> str | None:
    """Why ``entry`` cannot be an agent's entry point (called as ``entry(run, input)``),
    or None. A wrong entry point is a setup error, never a divergence."""
    return _per_entry(_entry_problem, entry)


def is_async_entry(entry: Callable[..., Any]) -> bool:
    """Whether ``entry`` is a coroutine function (also behind decorators and partials,
    or as a callable object's ``__call__``)."""
    return _per_entry(_is_async_entry, entry)


_ENTRIES_KEPT = 128
"""Entry points whose checks are remembered."""


def _per_entry(answer: _lru_cache_wrapper[T], entry: Callable[..., Any]) -> T:
    """``answer(entry)``, remembered per entry point: a batch replays run after run with
    the same one, and reading its signature cost more than a short run's events. An
    entry that cannot be a key (a callable object without a hash) is answered afresh."""
    try:
        hash(entry)
    except TypeError:
        return answer.__wrapped__(entry)
    return answer(entry)


@lru_cache(maxsize=_ENTRIES_KEPT)
def _entry_problem(entry: Callable[..., Any]) -> str | None:
    name = getattr(entry, "__qualname__", None) or repr(entry)
    if inspect.isclass(entry):
        return (
            f"the entry {name} is a class; an entry point is a function (or a bound "
            "method) called as entry(run, input)"
        )
    try:
        signature = inspect.signature(entry)
    except (TypeError, ValueError):
        return None  # a builtin that does not say: it is called and answers for itself
    try:
        signature.bind(None, None)
    except TypeError as exc:
        return f"the entry {name}{signature} cannot be called as entry(run, input): {exc}"
    return None


@lru_cache(maxsize=_ENTRIES_KEPT)
def _is_async_entry(entry: Callable[..., Any]) -> bool:
    target = inspect.unwrap(entry)
    method = type(target).__call__  # a function's own is a method-wrapper: not a coroutine
    return inspect.iscoroutinefunction(target) or inspect.iscoroutinefunction(method)


def _opened(
    events: Iterable[Envelope], entry: AgentEntry, options: ReplayOptions
) -> ReplayRun | ReplayReport:
    """The replay run of ``events``, or the report of why none could start."""
    agent_id, blobs = options.get("agent_id"), options.get("blobs")
    stream = iter(events)
    first = next(stream, None)
    if first is None:
        return ReplayReport("unknown", agent_id, 0, error="the run has no events")
    try:
        return ReplayRun(
            chain([first], stream),
            pipeline=options.get("pipeline"),
            blobs=blobs,
            digests=options.get("digests"),
            entry=entry,
            stall_timeout=options.get("stall_timeout", 10.0),
            reveal_values=options.get("reveal_values", False),
            allow_network=options.get("allow_network", False),
        )
    except KeyDestroyed as exc:
        return _limited(chain([first], stream), agent_id, blobs, str(exc))
    except _SETUP_ERRORS as exc:
        return _setup_failed(first.run_id, agent_id, 0, exc)
    except ReplayDivergence as exc:
        return ReplayReport(
            exc.divergence.run_id, agent_id, 0, exc.divergence, divergences=exc.divergences
        )


def _driven(run: ReplayRun, entry: AgentEntry) -> tuple[Any, BaseException | None]:
    """What the agent's code returned, or what it raised."""
    run.drives_here()
    watch_connections()
    try:
        with in_force(run):  # integrations without a run handed to them find it
            output = entry(run, run.input)
    except Exception as exc:
        return None, exc
    if inspect.isawaitable(output):
        _close(output)
        return None, ReplaySetupError(
            f"the entry {getattr(entry, '__qualname__', entry)!r} returned an awaitable but "
            "is not a coroutine function; declare it `async def` so that replay drives it "
            "with an async run"
        )
    return output, None


async def _driven_async(run: ReplayRun, entry: AgentEntry, agent_id: str | None) -> ReplayReport:
    coroutine_entry = cast(Callable[[AsyncReplayRun, Any], Awaitable[Any]], entry)
    run.drives_here()
    # Where each coroutine was made: a boundary's coroutine that a task runs on its own
    # (gather(run.call(...))) has no agent frame on its stack to name as the call site.
    tracking = sys.get_coroutine_origin_tracking_depth()
    sys.set_coroutine_origin_tracking_depth(max(tracking, _ORIGIN_DEPTH))
    watch_connections()
    replay = AsyncReplayRun(run)
    try:
        with in_force(replay):
            output, error = await coroutine_entry(replay, run.input), None
    except Exception as exc:
        output, error = None, exc
    finally:
        sys.set_coroutine_origin_tracking_depth(tracking)
    return _concluded(run, agent_id, output, error)


def _concluded(
    run: ReplayRun, agent_id: str | None, output: Any, error: BaseException | None
) -> ReplayReport:
    """Check how the code ended against the recorded end, and report."""
    try:
        if isinstance(error, (ReplayDivergence, *_SETUP_ERRORS)):
            raise error
        _setup_first(run)
        status = "succeeded" if error is None else "failed"
        run.finish(status=status, output=output, error=error)  # was that how it ended?
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
    LLM call recorded truncated over the blob ceiling) and per call the code made to the
    network through no boundary, let through because the replay allowed it."""
    online = [note for _, note in run.limitations if note.startswith(_WENT_ONLINE)]
    truncated = [(seq, note) for seq, note in run.limitations if not note.startswith(_WENT_ONLINE)]
    if not run.limitations:
        divergence = divergences[0] if divergences else None
        return ReplayReport(
            run.run_id,
            agent_id,
            run.consumed,
            divergence,
            divergences=divergences,
            recorded_status=run.recorded_status,
            recorded_error=run.recorded_error,
        )
    kept: list[Divergence] = list(divergences)
    notes: list[str] = []
    summary: list[str] = []
    limited_levels = {"content"}
    if truncated:
        kept, notes, levels = _past_truncation(truncated, divergences)
        limited_levels |= levels
        count = len(truncated)
        summary.append(
            f"{count} LLM call{'s' if count > 1 else ''} recorded truncated over the blob "
            "ceiling: control flow was checked, the reduced responses and what followed "
            "from their text were not"
        )
    if online:
        count = len(online)
        summary.append(
            f"{count} call{'s' if count > 1 else ''} went online through no boundary "
            "(the network was allowed): what came back was not recorded, nor checked"
        )
        notes += online
    return ReplayReport(
        run.run_id,
        agent_id,
        run.consumed,
        kept[0] if kept else None,
        divergences=tuple(kept),
        limited="; ".join([*summary, *notes]),
        notes=tuple(notes),
        limited_levels=tuple(sorted(limited_levels)),
        recorded_status=run.recorded_status,
        recorded_error=run.recorded_error,
    )


_WENT_ONLINE = "went online: "
"""How :meth:`ReplayRun.unrecorded` notes a call it let through (``allow_network``)."""


def _past_truncation(
    truncated: list[tuple[int, str]], divergences: tuple[Divergence, ...]
) -> tuple[list[Divergence], list[str], set[str]]:
    """The divergences that count (those from the text of a response handed back reduced
    do not), the notes, and the levels so limited."""
    first = truncated[0][0]
    notes = [note for _, note in truncated]
    kept, levels = [], set()
    for divergence in divergences:
        if divergence.kind in _FROM_TEXT and divergence.sequence > first:
            levels.add(divergence.level)
            notes.append(
                f"{divergence.kind} at sequence {divergence.sequence} not counted: it follows "
                f"sequence {first}, whose response was handed back reduced"
            )
        else:
            kept.append(divergence)
    return kept, notes, levels


def _in_own_loop(work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` in a new event loop: here, or in a thread of its own when this
    thread already runs one."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(work)
    with ThreadPoolExecutor(1, thread_name_prefix="blackbox-replay") as pool:
        return pool.submit(asyncio.run, work).result()


def _at_once(work: Coroutine[Any, Any, ReplayReport]) -> ReplayReport:
    """The report of the replay of a plain entry: its coroutine never suspends (nothing in
    it awaits), so it runs to its end here, with no event loop."""
    try:
        work.send(None)
    except StopIteration as done:
        report: ReplayReport = done.value
        return report
    work.close()
    raise RuntimeError("the replay of a plain entry waited for something")


def _close(awaitable: Any) -> None:
    close = getattr(awaitable, "close", None)
    if callable(close):
        close()


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
    ends: list[Envelope] = []
    verified = verify_run(_noting_ends(events, ends), blobs=blobs)
    note = (
        f"limited replay: {why}. Control flow was checked from digests and the hash chain "
        "only; state and content cannot be checked and the agent's code was not driven."
    )
    divergence = None
    if verified.problem is not None:
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
    ended = ends[-1].attributes if ends else {}
    return ReplayReport(
        verified.run_id,
        agent_id,
        verified.events,
        divergence,
        limited=note,
        recorded_status=ended.get("status"),
        recorded_error=ended.get("error"),
    )


def _noting_ends(events: Iterable[Envelope], ends: list[Envelope]) -> Iterator[Envelope]:
    """``events``, noting each ``run.finished`` in ``ends`` (its attributes are plain)."""
    for envelope in events:
        if envelope.event_type == EventType.RUN_FINISHED:
            ends.append(envelope)
        yield envelope
