"""Call sites: where in the agent's code a diverging boundary was crossed.

The site is the innermost frame of the agent's own code: not the project's (but its
examples'), the event loop's, threads', the CLI framework's, the standard library's or
an installed library's. When a library (a framework, an SDK) crossed the boundary on the
agent's behalf, the site also names the library's function the agent called.
"""

from __future__ import annotations

import asyncio
import inspect
import sys
from dataclasses import dataclass, replace
from types import FrameType
from typing import Any

from agent_blackbox.outbox.contract import (
    Hole,
    agent_file,
    installed_file,
    loop_step,
    stdlib_file,
    tool_definition,
)

# Frames of these modules are never the agent's: the call site is the innermost other one.
_NOT_AGENT = (
    "agent_blackbox.",
    "asyncio",
    "concurrent.",
    "threading",
    "contextlib",
    "functools",
    "click.",
    "runpy",
)
_EXAMPLES = "agent_blackbox.examples."
_DRIVER = "agent_blackbox.replayer._driver"
"""The module that calls the agent's entry: no frame of the agent's is below it."""


@dataclass(frozen=True, slots=True)
class CallSite:
    """Where in the agent's code the diverging boundary was crossed."""

    function: str
    file: str
    line: int
    library: CallSite | None = None
    """The innermost frame of an installed library (a framework, an SDK) between the
    agent's frame and the boundary, when a library crossed it on the agent's behalf."""

    def __str__(self) -> str:
        return f"{self.function} ({self.file}:{self.line})"


def call_site() -> CallSite | None:
    """The innermost frame of the agent's code on the stack: the one that crossed the
    boundary, with the library frame it called (the framework's function that crossed
    the boundary on the agent's behalf, several frames down). Nothing below the driver
    that called the entry (whoever called the replay) is ever it.

    When a task runs the boundary's coroutine itself (``gather(run.call(...), ...)``), no
    agent frame is on its stack: then it is the place that made the coroutine, as the
    coroutine's origin says (the driver turns origin tracking on while an async entry
    replays). When a framework ran the agent's tool on a thread of its own, it is the
    tool's definition. Without an agent frame at all, the library frame is the site.
    """
    library = None
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        module = str(frame.f_globals.get("__name__", ""))
        if module == _DRIVER:
            break
        code = frame.f_code
        if _agent_frame(module, code.co_filename):
            return CallSite(code.co_name, code.co_filename, frame.f_lineno, library)
        if _library_frame(module, code.co_filename):  # the outermost: what the agent called
            library = CallSite(code.co_name, code.co_filename, frame.f_lineno)
        frame = frame.f_back
    origin = _origin()
    if origin is None and (tool := tool_definition()) is not None:
        # A framework's thread ran the agent's tool (LangGraph's tool node): the nearest
        # the agent's code comes is the tool's own definition.
        return CallSite(tool.function, tool.file, tool.line, library)
    if origin is None or origin.library is not None or library is None:
        return origin or library
    return replace(origin, library=library)


def _agent_frame(module: str, filename: str) -> bool:
    """Whether a frame of ``module`` is the agent's: not the project's (but its
    examples'), the event loop's, threads' or the CLI framework's, nor one of a file
    of the standard library or an installed library."""
    if module.startswith(_EXAMPLES):
        return True
    if module.startswith(_NOT_AGENT):
        return False
    return not stdlib_file(filename) and not installed_file(filename)


def _library_frame(module: str, filename: str) -> bool:
    """Whether a frame of ``module`` is an installed library's (not the project's)."""
    return not module.startswith(_NOT_AGENT) and installed_file(filename)


def raised_at(error: BaseException | None) -> CallSite | None:
    """The innermost frame of the agent's code that ``error`` passed through, with the
    innermost library frame it passed through after it (or the library frame alone,
    when no frame was the agent's)."""
    found, library = None, None
    traceback = error.__traceback__ if error is not None else None
    while traceback is not None:
        code = traceback.tb_frame.f_code
        module = str(traceback.tb_frame.f_globals.get("__name__", ""))
        here = CallSite(code.co_name, code.co_filename, traceback.tb_lineno)
        if _agent_frame(module, code.co_filename):
            found, library = here, None
        elif library is None and _library_frame(module, code.co_filename):
            library = here  # the first after the agent's frame: what the agent called
        traceback = traceback.tb_next
    if found is None:
        return library
    return replace(found, library=library)


def _origin() -> CallSite | None:
    """Where the running task's coroutine was made, in the agent's code (with the
    library frame it called), else in a library's."""
    if asyncio.events._get_running_loop() is None:
        return None
    task = asyncio.current_task()
    origin = getattr(task.get_coro(), "cr_origin", None) if task is not None else None
    library = None
    driver = getattr(sys.modules.get(_DRIVER), "__file__", None)
    for filename, line, function in origin or ():
        if filename == driver or loop_step(filename, function):
            break  # made in another task's step, or by the replay itself: not the agent
        if agent_file(filename):
            return CallSite(function, filename, line, library)
        if installed_file(filename):  # the outermost: what the agent's line called
            library = CallSite(function, filename, line)
    return library


def entry_site(entry: Any) -> CallSite | None:
    """Where the agent's entry point is defined: the call site of what is found after it
    returned (its output, events it left)."""
    target = inspect.unwrap(entry) if entry is not None else None
    code = getattr(target, "__code__", None) or getattr(type(target).__call__, "__code__", None)
    if code is None:
        return None
    return CallSite(code.co_name, code.co_filename, code.co_firstlineno)


def site_of(hole: Hole) -> CallSite | None:
    """The call site of a connection the code opened through no boundary."""
    site, library = hole.site, hole.library
    through = None if library is None else CallSite(library.function, library.file, library.line)
    return None if site is None else CallSite(site.function, site.file, site.line, through)
