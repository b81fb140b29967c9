"""Where in the agent's own code something happened: the innermost frame on the stack
that is neither the project's, the standard library's nor an installed library's.

An agent built on a framework crosses boundaries from deep inside it (the OpenAI Agents
SDK sends a request from its model module, LangChain from its chat model): the line that
helps is the agent's own, and the framework's innermost frame comes second.
"""

from __future__ import annotations

import site
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

__all__ = ["Site", "agent_site", "is_agent_file"]

_OWN_PREFIX = "agent_blackbox."
_EXAMPLES_PREFIX = "agent_blackbox.examples"


@dataclass(frozen=True, slots=True)
class Site:
    """A place in the code: function, file and line."""

    function: str
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.function} ({self.file}:{self.line})"


def _library_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    found = {paths["stdlib"], paths["platstdlib"], paths["purelib"], paths["platlib"]}
    found.update(site.getsitepackages())
    if site.ENABLE_USER_SITE and site.USER_SITE:
        found.add(site.USER_SITE)
    return tuple(sorted(str(Path(p)) for p in found if p))


_LIBRARY_DIRS = _library_dirs()
_INSTALLED_MARKS = ("/site-packages/", "/dist-packages/")


def is_agent_file(filename: str) -> bool:
    """Whether ``filename`` holds the agent's own code: not the standard library's, not an
    installed distribution's (site-packages), not the interpreter's frozen modules."""
    if filename.startswith("<"):  # <frozen ...>, <string>: not a file of the agent's
        return False
    if any(mark in filename for mark in _INSTALLED_MARKS):
        return False
    return not filename.startswith(_LIBRARY_DIRS)


def _own_module(module: str) -> bool:
    return module.startswith(_OWN_PREFIX) and not module.startswith(_EXAMPLES_PREFIX)


def agent_site(frame: FrameType | None = None) -> tuple[Site | None, Site | None]:
    """The innermost frame of the agent's code from ``frame`` outwards (the caller's
    caller when None), and the innermost library frame below it (None when the agent
    crossed directly). The project's own frames (but its examples') are neither."""
    frame = frame if frame is not None else sys._getframe(2)
    library: Site | None = None
    while frame is not None:
        module = str(frame.f_globals.get("__name__", ""))
        if not _own_module(module):
            code = frame.f_code
            here = Site(code.co_name, code.co_filename, frame.f_lineno)
            if module.startswith(_EXAMPLES_PREFIX) or is_agent_file(code.co_filename):
                return here, library
            if library is None:
                library = here
        frame = frame.f_back
    return None, library
