"""Record mode's two drivers of the boundary generators (``_steps.py``): sync and async.

Each answers a boundary's steps by doing them: a :class:`~agent_blackbox.outbox._steps.Call`
calls the agent's function (awaiting what it returns, in async code), builds the crossing
of what came of it and appends it, then sends the value back into the boundary or throws
in the exception; a :class:`~agent_blackbox.outbox._steps.Cross` builds
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
    failed: BaseException | None = None
    while True:
        try:
            step = boundary.send(reply) if failed is None else boundary.throw(failed)
        except StopIteration as returned:
            return returned.value  # type: ignore[no-any-return]
        if isinstance(step, Call):
            ask, build, _, perform, arguments, place = step
            place = _placed(place, core)
            done = _call(perform, arguments)
            crossing = build(core.contract, ask, *done).placed(place)
            append(crossing, None)
            reply, failed = done.value, _raised(crossing, done)
        elif isinstance(step, Cross):
            crossing = _crossed(step, core)
            reply, failed = (append(crossing, step.connection), crossing.output), None
        elif isinstance(step, Begin):
            reply, failed = core.placement.begin(), None
        elif isinstance(step, Settle):
            crossing = step.outcome(*step.done).placed(step.place)
            append(crossing, None)
            reply, failed = step.done.value, _raised(crossing, step.done)
        else:
            assert isinstance(step, End)
            ending = _ending(step, core)
            reply, failed = append(ending, step.connection), ending.raises
            core.finished = True


async def drive_async(
    boundary: Steps[T],
    core: RunCore,
    append: AsyncAppend,
    settling: Collection[asyncio.Task[Any]] = (),
) -> T:
    """Record the boundary ``boundary`` in async code: agent functions may be plain or
    ``async``. ``settling``: crossings appended by tasks of their own (a sync tool called
    on the loop), begun before this one: it waits for them before it appends."""
    reply: Any = None
    failed: BaseException | None = None
    while True:
        try:
            step = boundary.send(reply) if failed is None else boundary.throw(failed)
        except StopIteration as returned:
            return returned.value  # type: ignore[no-any-return]
        if isinstance(step, Call):
            ask, build, _, perform, arguments, place = step
            place = _placed(place, core)
            done = await _call_async(perform, arguments)
            crossing = build(core.contract, ask, *done).placed(place)
            await _after(settling)
            await append(crossing, None)
            reply, failed = done.value, _raised(crossing, done)
        elif isinstance(step, Cross):
            crossing = _crossed(step, core)
            await _after(settling)
            reply, failed = (await append(crossing, step.connection), crossing.output), None
        elif isinstance(step, Begin):
            reply, failed = core.placement.begin(), None
        elif isinstance(step, Settle):  # (in a settling task: those go in their order)
            crossing = step.outcome(*step.done).placed(step.place)
            await append(crossing, None)
            reply, failed = step.done.value, _raised(crossing, step.done)
        else:
            assert isinstance(step, End)
            await _after(settling)
            ending = _ending(step, core)
            reply, failed = await append(ending, step.connection), ending.raises
            core.finished = True


async def _after(settling: Collection[asyncio.Task[Any]]) -> None:
    """Wait for the crossings tasks of their own are appending (a sync tool called on the
    loop settles in a task): they began before the one about to be appended, and a
    branch's events must be in the order it began them, which replay follows. (Without
    this, a crossing that appends without yielding to the loop, as into memory, went
    first, and the replay of the run diverged.) The settling tasks append in the order
    they were made: each takes the run's lock in turn."""
    if settling:
        await asyncio.wait(list(settling))


def _placed(place: Place | None, core: RunCore) -> Place:
    """``place``, or, for a crossing the driver places, the place it begins at now."""
    return place if place is not None else core.placement.begin()


def _crossed(step: Cross, core: RunCore) -> Crossing:
    """The crossing of a step that calls nothing."""
    place = _placed(step.place, core)
    return step.build(core.contract, step.ask, None, None, 0.0).placed(place)


def _ending(step: End, core: RunCore) -> Crossing:
    """``run.finished``, at the place the end begins (raising, once appended, the refusal
    of an output that could not be recorded)."""
    return core.finish(step.status, step.output, step.error).placed(core.placement.begin())


def _raised(crossing: Crossing, done: Done) -> BaseException | None:
    """What the boundary raises once its crossing is appended: what the call raised, or
    the refusal to record a result that cannot be recorded (recorded as its error)."""
    return crossing.raises if crossing.raises is not None else done.error


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
