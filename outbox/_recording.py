"""Record mode's two drivers of the boundary generators (``_steps.py``): sync and async.

Each answers a boundary's steps by doing them: a :class:`~agent_blackbox.outbox._steps.Call`
calls the agent's function (awaiting what it returns, in async code), builds the crossing
of what came of it and appends it; a :class:`~agent_blackbox.outbox._steps.Cross` builds
and appends a crossing that calls nothing; the run's placement gives each crossing its
place as it begins. The two loops differ only in ``await``; replay mode answers the same
steps from the log (the replayer's ``ReplayRun``).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Collection
from typing import TYPE_CHECKING, Any, TypeVar

from agent_blackbox.outbox._boundaries import Crossing
from agent_blackbox.outbox._context import enter_crossing, leave_crossing
from agent_blackbox.outbox._crossings import Done
from agent_blackbox.outbox._placement import Place
from agent_blackbox.outbox._steps import Begin, Call, Cross, End, Settle, Steps
from agent_blackbox.schemas import Envelope

if TYPE_CHECKING:
    from agent_blackbox.outbox._core import RunCore

T = TypeVar("T")

Append = Callable[[Crossing, Any], Envelope]
"""Appends a crossing to the run's event log (in the caller's transaction, when given a
connection) and gives back its envelope."""

AsyncAppend = Callable[[Crossing, Any], Awaitable[Envelope]]


def drive(boundary: Steps[T], core: RunCore, append: Append) -> T:
    """Record the boundary ``boundary`` in sync code."""
    reply: Any = None
    while True:
        try:
            step = boundary.send(reply)
        except StopIteration as returned:
            return returned.value  # type: ignore[no-any-return]
        if isinstance(step, Call):
            place = _placed(step.place, core)
            done = _call(step.perform, step.arguments)
            crossing = step.build(core.contract, step.ask, *done).placed(place)
            append(crossing, None)
            reply = _raised_on(crossing, done)
        elif isinstance(step, Cross):
            crossing = _crossed(step, core)
            reply = append(crossing, step.connection), crossing.output
        elif isinstance(step, Begin):
            reply = core.placement.begin()
        elif isinstance(step, Settle):
            crossing = step.outcome(*step.done).placed(step.place)
            append(crossing, None)
            reply = _raised_on(crossing, step.done)
        else:
            reply = append(_ending(step, core), step.connection)
            core.finished = True


async def drive_async(
    boundary: Steps[T],
    core: RunCore,
    append: AsyncAppend,
    settling: Collection[asyncio.Task[Any]] = (),
) -> T:
    """Record the boundary ``boundary`` in async code: agent functions may be plain or
    ``async``. ``settling``: crossings appended by tasks of their own (a sync tool called
    on the loop), which come before the end of the run: it waits for them."""
    reply: Any = None
    while True:
        try:
            step = boundary.send(reply)
        except StopIteration as returned:
            return returned.value  # type: ignore[no-any-return]
        if isinstance(step, Call):
            place = _placed(step.place, core)
            done = await _call_async(step.perform, step.arguments)
            crossing = step.build(core.contract, step.ask, *done).placed(place)
            await append(crossing, None)
            reply = _raised_on(crossing, done)
        elif isinstance(step, Cross):
            crossing = _crossed(step, core)
            reply = await append(crossing, step.connection), crossing.output
        elif isinstance(step, Begin):
            reply = core.placement.begin()
        elif isinstance(step, Settle):
            crossing = step.outcome(*step.done).placed(step.place)
            await append(crossing, None)
            reply = _raised_on(crossing, step.done)
        else:
            if settling:
                await asyncio.wait(list(settling))
            reply = await append(_ending(step, core), step.connection)
            core.finished = True


def _placed(place: Place | None, core: RunCore) -> Place:
    """``place``, or, for a crossing the driver places, the place it begins at now."""
    return place if place is not None else core.placement.begin()


def _crossed(step: Cross, core: RunCore) -> Crossing:
    """The crossing of a step that calls nothing."""
    place = _placed(step.place, core)
    return step.build(core.contract, step.ask, None, None, 0.0).placed(place)


def _ending(step: End, core: RunCore) -> Crossing:
    """``run.finished``, at the place the end begins."""
    return core.finish(step.status, step.output, step.error).placed(core.placement.begin())


def _raised_on(crossing: Crossing, done: Done) -> Done:
    """``done``, once its crossing is appended; a result that could not be recorded was
    recorded as an error, which the agent gets now."""
    if crossing.raises is not None:
        raise crossing.raises
    return done


def _call(perform: Callable[..., Any], arguments: tuple[Any, ...]) -> Done:
    started = time.perf_counter()
    inside = enter_crossing()  # what the function does belongs to this crossing
    try:
        value = perform(*arguments)
    except Exception as exc:
        return Done(None, exc, _since(started))
    finally:
        leave_crossing(inside)
    return Done(value, None, _since(started))


async def _call_async(perform: Callable[..., Any], arguments: tuple[Any, ...]) -> Done:
    started = time.perf_counter()
    inside = enter_crossing()
    try:
        value = perform(*arguments)
        if inspect.isawaitable(value):
            value = await value
    except Exception as exc:
        return Done(None, exc, _since(started))
    finally:
        leave_crossing(inside)
    return Done(value, None, _since(started))


def _since(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0
