"""Calls that leave the process from inside a run without crossing a boundary: holes.

A flight recorder with holes is worse than none: a call nobody recorded cannot be
replayed, and a replay that quietly goes online proves nothing. So every socket
connection opened from a context where a run is in force (see ``_context``), other than
from inside a boundary's own work, is a hole:

- in record mode it is reported on the run (``unrecorded_calls`` on ``run.finished``,
  the first one named), warned about once per call site, and in ``fail`` mode refused
  (:class:`UnrecordedCall` raised where the connection was opened) and the run ends
  ``failed``;
- in replay it is refused and the replay reports an ``unrecorded_call`` divergence naming
  host, port and the agent's call site, unless the replay allows the network.

Connections are seen through the interpreter's audit hooks (``socket.connect``): every
connection made by Python code, whatever library makes it; a request sent over a
connection an HTTP client keeps open opens none, so the pools of ``httpx2`` and ``httpx``
are watched too (``_pools``). Not seen: connections of a thread that does not carry the
run's context (a plain ``threading.Thread``; asyncio tasks, ``asyncio.to_thread`` and
frameworks' executors do carry it), and connections made by native code (libpq,
librdkafka, gRPC's core), which is how the project's own database and broker connections
stay out of it.
"""

from __future__ import annotations

import socket
import sys
import threading
import warnings
from dataclasses import dataclass
from typing import Any

from agent_blackbox.outbox._context import current_run, in_crossing
from agent_blackbox.outbox._sandbox import NondeterminismMode, watch_mode
from agent_blackbox.outbox._sites import Site, agent_site
from agent_blackbox.schemas import BlackboxError

__all__ = [
    "MODE_VARIABLE",
    "Hole",
    "NetworkMode",
    "UnrecordedCall",
    "UnrecordedCallWarning",
    "network_mode",
    "watch_connections",
]

NetworkMode = NondeterminismMode
"""What a recording run does about a hole: nothing, report it (attribute and warning),
or refuse it and fail the run."""
MODE_VARIABLE = "BLACKBOX_RECORD_NETWORK"


@dataclass(frozen=True, slots=True)
class Hole:
    """One call that left (or tried to leave) the process without crossing a boundary."""

    host: str
    port: int | None
    what: str = "connection"
    """``connection``, or the HTTP request (``GET /v1/models``) a recording client saw."""
    site: Site | None = None
    """The agent's own line that led to it."""
    library: Site | None = None
    """The innermost library frame below that line, when a library made the call."""

    def describe(self) -> str:
        """One line: what, where to, and from where in the agent's code."""
        where = self.host if self.port is None else f"{self.host}:{self.port}"
        at = f" at {self.site}" if self.site else ""
        through = f" (through {self.library})" if self.library else ""
        return f"{self.what} to {where}{at}{through}"


class UnrecordedCall(BlackboxError, ConnectionRefusedError):
    """A call was about to leave the process inside a run without crossing a boundary,
    and was refused: in replay (which never goes online), or while recording in ``fail``
    mode. A connection error, so that HTTP clients treat it as one."""

    def __init__(self, hole: Hole, advice: str) -> None:
        self.hole = hole
        super().__init__(f"unrecorded call: {hole.describe()}; {advice}")


class UnrecordedCallWarning(UserWarning):
    """A call left the process inside a recording run without crossing a boundary."""


def network_mode(value: str | None) -> NetworkMode:
    """The mode ``value`` names, or ``BLACKBOX_RECORD_NETWORK``'s when None (``warn``
    when that is unset).

    Raises:
        ValueError: not ``off``, ``warn`` or ``fail``.
    """
    return watch_mode(value, variable=MODE_VARIABLE, default="warn", option="network")


# The audit hook ------------------------------------------------------------------------

_INSTALLED = threading.Lock()
_installed = False
_resolved = threading.local()
"""The last host name this thread looked up, with its port: names the address a
connection goes to (the hook sees the address, not the name)."""


def watch_connections() -> None:
    """Install the audit hook that sees connections (once per process; it cannot be
    removed, and costs a string comparison per audited event outside runs), and watch the
    connection pools of the HTTP libraries imported so far (``_pools``: a request over a
    pooled connection opens none)."""
    global _installed
    with _INSTALLED:
        if not _installed:
            sys.addaudithook(_audit)
            _installed = True
    # Imported here: the pools' watch reports its holes with this module's classes.
    from agent_blackbox.outbox._pools import watch_pools

    watch_pools()


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "socket.connect":
        try:
            _connecting(args[0], args[1])
        except UnrecordedCall:
            raise  # the refusal is the point
        except Exception:  # noqa: S110 - a fault of the watch must not break the agent's I/O
            pass
    elif event == "socket.getaddrinfo":
        _resolved.last = (args[0], args[1])


def _connecting(sock: Any, address: Any) -> None:
    if getattr(sock, "family", None) not in (socket.AF_INET, socket.AF_INET6):
        return
    run = current_run()
    if run is None or in_crossing():
        return
    unrecorded = getattr(run, "unrecorded", None)
    if unrecorded is None:
        return
    host, port = str(address[0]), int(address[1])
    last = getattr(_resolved, "last", None)
    if last is not None and _same_port(last[1], port) and isinstance(last[0], str | bytes):
        name = last[0].decode() if isinstance(last[0], bytes) else last[0]
        host = f"{name} ({host})" if name != host else host
    agent, library = agent_site(sys._getframe(2))
    unrecorded(Hole(host, port, "connection", agent, library))


def _same_port(looked_up: Any, port: int) -> bool:
    try:
        return int(looked_up) == port
    except (TypeError, ValueError):
        return False


def note_hole(holes: list[Hole], hole: Hole, *, mode: NetworkMode, seen: set[Site | None]) -> None:
    """What a recording run does about ``hole`` in ``mode``: keeps it in ``holes``, warns
    once per call site (``seen``), and in ``fail`` mode refuses it.

    Raises:
        UnrecordedCall: in ``fail`` mode.
    """
    if mode == "off":
        return
    holes.append(hole)
    advice = (
        "record it through the run (an instrumented SDK client, agent_blackbox.tool, "
        "run.call) so that replay can answer it"
    )
    if mode == "fail":
        raise UnrecordedCall(hole, advice + f"; refused because {MODE_VARIABLE}=fail")
    if hole.site not in seen:
        seen.add(hole.site)
        site = hole.site
        message = f"unrecorded call: {hole.describe()}; {advice}"
        if site is None:
            warnings.warn(message, UnrecordedCallWarning, stacklevel=2)
        else:
            warnings.warn_explicit(message, UnrecordedCallWarning, site.file, site.line)
