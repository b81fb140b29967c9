"""Tools that record themselves: :func:`tool` makes a function a ``tool.call`` boundary
wherever it is called from, so tools handed to a framework (an OpenAI Agents SDK
``function_tool``, a LangChain ``@tool``, a pydantic-ai tool) are recorded without
wrapping each call.

Inside a run (the run in force, see :func:`~agent_blackbox.outbox.current_run`) a call
is recorded in record mode and answered from the log in replay (the function is not
called); outside any run, and inside another boundary's own work, it is a plain call.

What is recorded of the arguments: each by its parameter's name, however the caller
passed it (so a framework that passes them by keyword in one release and by position in
the next records the same input), leaving out ``self``/``cls``, the framework's context
objects (an argument whose class is named ``...Context``, ``...ContextWrapper`` or
``ToolRuntime``: not data, and not recordable) and the parameters named in ``exclude``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
import warnings
from collections.abc import Callable, Collection
from typing import Any, TypeVar, cast, overload

from agent_blackbox.outbox._context import current_run, in_crossing, live_runs
from agent_blackbox.outbox._errors import RunNotActive
from agent_blackbox.outbox._network import UnrecordedCallWarning
from agent_blackbox.outbox._sites import crossing_tool

__all__ = ["tool"]

F = TypeVar("F", bound=Callable[..., Any])

_CONTEXT_SUFFIXES = ("Context", "ContextWrapper")
_CONTEXT_NAMES = frozenset({"ToolRuntime"})


@overload
def tool(fn: F, /) -> F: ...


@overload
def tool(*, name: str | None = None, exclude: Collection[str] = ()) -> Callable[[F], F]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    exclude: Collection[str] = (),
) -> Any:
    """Record ``fn`` (sync or async) as a ``tool.call`` whenever it runs inside a run.

    Use it bare (``@tool``) or with options (``@tool(name="search")``), under or over a
    framework's own decorator's input: the wrapper keeps the function's name,
    signature, annotations and docstring, which frameworks read to describe the tool.

    Args:
        fn: the tool function.
        name: the tool's name in the log (default: the function's ``__name__``).
        exclude: parameters left out of the recorded arguments (besides ``self``,
            ``cls`` and framework context objects).

    Raises (when called inside a run):
        NotSerialisable: an argument or the result cannot be recorded.
    """

    def decorate(function: F) -> F:
        recorded = _Arguments(function, exclude)
        tool_name = name or function.__name__
        if inspect.iscoroutinefunction(function):
            return cast(F, _async_tool(function, tool_name, recorded))
        return cast(F, _sync_tool(function, tool_name, recorded))

    return decorate if fn is None else decorate(fn)


class _Arguments:
    """How a call's arguments become the recorded ones (by parameter name)."""

    def __init__(self, function: Callable[..., Any], exclude: Collection[str]) -> None:
        self._signature = inspect.signature(function)
        params = list(self._signature.parameters)
        self._left_out = set(exclude)
        if params and params[0] in ("self", "cls"):
            self._left_out.add(params[0])

    def of(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        bound = self._signature.bind(*args, **kwargs)
        return {
            key: value
            for key, value in bound.arguments.items()
            if key not in self._left_out and not _is_context(value)
        }


def _is_context(value: Any) -> bool:
    name = type(value).__name__
    return name in _CONTEXT_NAMES or name.endswith(_CONTEXT_SUFFIXES)


def _run_here(name: str) -> Any | None:
    """The run a tool call belongs to, or None for a plain call."""
    if in_crossing():
        return None
    run = current_run()
    if run is None:
        _outside_runs(name)
    return run


_WARNED: set[str] = set()


def _outside_runs(name: str) -> None:
    """A tool called where no run is in force while runs are live in this process: most
    likely a thread that did not carry the run's context over (a ``ThreadPoolExecutor``'s).
    A recording run goes on without the call, said once per tool; a replay refuses it,
    which would otherwise run the tool for real.

    Raises:
        RunNotActive: a replay is live.
    """
    live = live_runs()
    if not live:
        return
    advice = (
        "a thread that does not carry the run's context (a ThreadPoolExecutor's): submit the "
        "work as pool.submit(contextvars.copy_context().run, tool, ...), or call run.call there"
    )
    if any(getattr(run, "replaying", False) for run in live):
        raise RunNotActive(
            f"tool {name!r} was called where no run is in force while a run is replayed, and "
            f"replay does not run tools for real: {advice}"
        )
    if name not in _WARNED:
        _WARNED.add(name)
        warnings.warn(
            f"tool {name!r} was called where no run is in force while a run records; it is "
            f"not recorded: {advice}",
            UnrecordedCallWarning,
            stacklevel=4,
        )


def _on_its_loop(run: Any) -> bool:
    loop = getattr(run, "loop", None)
    return loop is not None and asyncio.events._get_running_loop() is loop


def _since(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0


def _sync_tool(function: Callable[..., Any], name: str, arguments: _Arguments) -> Any:
    @functools.wraps(function)
    def recorded_tool(*args: Any, **kwargs: Any) -> Any:
        run = _run_here(name)
        if run is None:
            return function(*args, **kwargs)
        recorded = arguments.of(args, kwargs)

        def call(**_: Any) -> Any:
            return function(*args, **kwargs)

        with crossing_tool(function):
            if not inspect.iscoroutinefunction(run.call):
                return run.call(name, call, **recorded)
            if getattr(run, "replaying", False):  # an async replay run: its sync twin answers
                return run.replay.call(name, call, **recorded)
            return _through_loop(run, name, recorded, call)

    return recorded_tool


def _through_loop(run: Any, name: str, recorded: dict[str, Any], call: Callable[..., Any]) -> Any:
    """A sync tool of an async run: the function runs here, its event is appended on the
    run's loop (waited for from another thread; scheduled first, from the loop's own)."""
    opened = run.open_tool(name, (), recorded)
    started = time.perf_counter()
    try:
        result = call()
    except Exception as exc:
        _settle_on_loop(run, opened.close(error=exc, latency_ms=_since(started)), exc)
        raise
    _settle_on_loop(run, opened.close(result, latency_ms=_since(started)), None)
    return result


def _settle_on_loop(run: Any, closing: Any, error: Exception | None) -> None:
    """Append a closed tool call on the run's loop; ``error`` (the tool's own, raised on
    by the caller) is not a failure of the recording."""
    if _on_its_loop(run):
        # Scheduled before anything the agent awaits next, so it is appended first; a
        # failure is raised at the run's next boundary.
        task = run.loop.create_task(closing)
        task.add_done_callback(functools.partial(_keep_failure, run, error))
        run.settling.add(task)  # the run's finish waits for it (the agent may await nothing)
        task.add_done_callback(run.settling.discard)
        return
    try:
        asyncio.run_coroutine_threadsafe(closing, run.loop).result()
    except Exception as exc:
        if exc is not error:
            raise


def _keep_failure(run: Any, error: Exception | None, task: asyncio.Task[Any]) -> None:
    failure = None if task.cancelled() else task.exception()
    if failure is not None and failure is not error and run.core.unreported is None:
        run.core.unreported = failure


def _async_tool(function: Callable[..., Any], name: str, arguments: _Arguments) -> Any:
    @functools.wraps(function)
    async def recorded_tool(*args: Any, **kwargs: Any) -> Any:
        run = _run_here(name)
        if run is None:
            return await function(*args, **kwargs)
        recorded = arguments.of(args, kwargs)

        async def call(**_: Any) -> Any:
            return await function(*args, **kwargs)

        with crossing_tool(function):
            if inspect.iscoroutinefunction(run.call):
                return await run.call(name, call, **recorded)
            if getattr(run, "replaying", False):
                return run.call(name, call, **recorded)  # answered from the log: nothing awaited
            return await _awaited_in_sync_run(run, name, recorded, call)

    return recorded_tool


async def _awaited_in_sync_run(
    run: Any, name: str, recorded: dict[str, Any], call: Callable[..., Any]
) -> Any:
    """An async tool of a sync run: awaited here, recorded once done (the run's tool
    policy decides, as for any tool call: a fork may answer from its parent's log)."""
    opened = run.open_tool(name, (), recorded)
    started = time.perf_counter()
    try:
        answer = run._recorder.tools.call(name, (), recorded, call)
        result = await answer if inspect.isawaitable(answer) else answer
    except Exception as exc:
        opened.close(error=exc, latency_ms=_since(started))
        raise
    return opened.close(result, latency_ms=_since(started))
