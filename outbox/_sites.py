"""Where in the agent's own code something happened: the innermost frame on the stack
that is neither the project's, the standard library's nor an installed library's.

An agent built on a framework crosses boundaries from deep inside it (the OpenAI Agents
SDK sends a request from its model module, LangChain from its chat model): the line that
helps is the agent's own, and the framework's innermost frame comes second. Recorded
holes and replay divergences name their call sites by the same rules, kept here.
"""

from __future__ import annotations

import asyncio.events
import os
import site
import sys
import sysconfig
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

__all__ = [
    "Site",
    "agent_file",
    "agent_site",
    "crossing_tool",
    "installed_file",
    "loop_step",
    "stdlib_file",
    "tool_definition",
]

# As the interpreter names the files it imported (code objects keep those names).
PROJECT_DIR = str(Path(__file__).parents[1])
"""The project's own package (its examples are the agent's code, the rest is not)."""
EXAMPLES_DIR = str(Path(PROJECT_DIR) / "examples")
_STDLIB_DIRS = tuple(
    os.path.join(folder, "")
    for folder in {sysconfig.get_paths()[n] for n in ("stdlib", "platstdlib")}
)
_INSTALLED_DIRS = tuple(
    os.path.join(folder, "")
    for folder in sorted(
        {sysconfig.get_paths()[name] for name in ("purelib", "platlib")}
        | set(site.getsitepackages())
    )
)
"""Where installed distributions live: this interpreter's site-packages (a virtual
environment's, the user's, the system's)."""
_INSTALLED_PARTS = tuple(f"{os.sep}{name}{os.sep}" for name in ("site-packages", "dist-packages"))
"""The folders any installation puts distributions in (another environment's too)."""


@dataclass(frozen=True, slots=True)
class Site:
    """A place in the code: function, file and line."""

    function: str
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.function} ({self.file}:{self.line})"


def stdlib_file(filename: str) -> bool:
    """Whether a source file is the standard library's (or the interpreter's own)."""
    return filename.startswith(_STDLIB_DIRS) or filename.startswith("<")


def installed_file(filename: str) -> bool:
    """Whether a source file belongs to an installed distribution (not the project)."""
    if filename.startswith(PROJECT_DIR):
        return False
    return filename.startswith(_INSTALLED_DIRS) or any(p in filename for p in _INSTALLED_PARTS)


def agent_file(filename: str) -> bool:
    """Whether a source file is the agent's: not the project's (but its examples'), not
    the standard library's, not an installed library's. An agent in the current
    directory or anywhere else on ``sys.path`` is the agent's."""
    if filename.startswith(EXAMPLES_DIR):
        return True
    if filename.startswith(PROJECT_DIR) or stdlib_file(filename):
        return False
    return not installed_file(filename)


def loop_step(filename: str, function: str) -> bool:
    """Whether a frame is the event loop running one step of a task (``Handle._run``):
    the frames outside it are whoever runs the loop (a script's ``asyncio.run`` line),
    not the code of the task, so no site is looked for past it."""
    return function == "_run" and filename == _LOOP_STEP_FILE


_LOOP_STEP_FILE = str(Path(asyncio.events.__file__))


def agent_site(frame: FrameType | None = None) -> tuple[Site | None, Site | None]:
    """The innermost frame of the agent's code from ``frame`` outwards (the caller's
    caller when None), and the installed library's frame it called (None when the agent
    crossed directly): the framework function the agent's line called, not the HTTP
    library's frame deep below it. A task's frames end at the event loop's step (see
    :func:`loop_step`): a framework's own task holds no frame of the agent's."""
    frame = frame if frame is not None else sys._getframe(2)
    library: Site | None = None
    while frame is not None:
        code = frame.f_code
        if loop_step(code.co_filename, code.co_name):
            break
        if agent_file(code.co_filename):
            return Site(code.co_name, code.co_filename, frame.f_lineno), library
        if installed_file(code.co_filename):  # the outermost: the one the agent called
            library = Site(code.co_name, code.co_filename, frame.f_lineno)
        frame = frame.f_back
    return None, library


_TOOL: ContextVar[Callable[..., Any] | None] = ContextVar("blackbox_crossing_tool", default=None)


class crossing_tool:  # noqa: N801 - used as a ``with`` block, as a function would be
    """While the agent's tool ``function`` crosses its boundary: where it is defined, the
    site to name when no frame of the agent's is on the stack (a framework ran the tool
    on a thread of its own, as LangGraph's tool node does).

    Entered for every recorded tool call: it keeps the function, and the site is made
    only when a divergence asks for it (:func:`tool_definition`)."""

    __slots__ = ("_function", "_token")

    def __init__(self, function: Callable[..., Any]) -> None:
        self._function = function

    def __enter__(self) -> None:
        self._token = _TOOL.set(self._function)

    def __exit__(self, *_: object) -> None:
        _TOOL.reset(self._token)


def tool_definition() -> Site | None:
    """Where the tool crossing now is defined, when one of the agent's is (see
    :class:`crossing_tool`)."""
    function = _TOOL.get()
    code = None if function is None else getattr(function, "__code__", None)
    if function is None or code is None or not agent_file(code.co_filename):
        return None
    return Site(function.__name__, code.co_filename, code.co_firstlineno)
