"""The run in force: which run a crossing reached from anywhere in the agent's code
belongs to.

A run is in force inside its ``with`` block (``with recorder.start_run(...) as run:``)
and while the recorder drives its entry (``recorder.record(entry, ...)``), in that task or
thread and in every asyncio task created from it (tasks copy the context); the replayer
puts its replay run in force while it drives the entry. A run started without either is
in force nowhere: integrations then need it handed to them. Integrations that have no run
handed to them (a recording HTTP transport, the :func:`~agent_blackbox.outbox.tool`
decorator, a process-wide SDK client) find it here, so one client serves concurrent runs
and each records only its own calls: this is how OpenTelemetry finds the current span.

While a boundary does its own work (a tool's function runs, a model answers, the
recorder writes), the context is *inside a crossing*: what happens there belongs to that
crossing. An LLM call a tool makes is part of the tool's result and is not recorded a
second time (replay never calls the tool, so it would never ask for it), and a connection
it opens is not a hole.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from typing import Any

__all__ = [
    "crossing",
    "current_run",
    "enter_crossing",
    "in_crossing",
    "in_force",
    "leave_crossing",
    "live_runs",
    "put_in_force",
    "take_out",
]

_RUN: ContextVar[Any] = ContextVar("blackbox_run", default=None)
_CROSSING: ContextVar[bool] = ContextVar("blackbox_crossing", default=False)
_PUT: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
"""The runs in force in this process, each with how many contexts put it in force and
have not taken it out yet (see :func:`live_runs`)."""
_COUNTING = threading.Lock()


def current_run() -> Any | None:
    """The run in force in the calling context, or None outside any run (or once it
    finished): a record-mode :class:`~agent_blackbox.outbox.Run` or
    :class:`~agent_blackbox.outbox.AsyncRun`, or a replay run while the replayer drives
    the agent."""
    run = _RUN.get()
    if run is None or _finished(run):
        return None
    return run


def _finished(run: Any) -> bool:
    core = getattr(run, "core", None)
    return bool(getattr(core, "finished", False))


def live_runs() -> list[Any]:
    """The runs in force somewhere in this process and not finished: where a crossing
    found no run in its own context, whether one was meant (a thread that did not carry
    the run's context over)."""
    return [run for run, count in list(_PUT.items()) if count > 0 and not _finished(run)]


def _counted(run: Any, step: int) -> None:
    with _COUNTING:
        _PUT[run] = _PUT.get(run, 0) + step


def put_in_force(run: Any) -> Token[Any]:
    """Make ``run`` the run in force in the calling context; :func:`take_out` with the
    token it gives ends that."""
    _counted(run, 1)
    return _RUN.set(run)


def take_out(run: Any, token: Token[Any] | None) -> None:
    """End ``run``'s being in force, where it still is: the run that was in force before
    it is again. From another context than the one that put it in force (a run finished
    by another thread), nothing changes there: a finished run is never in force."""
    if token is None or _RUN.get() is not run:
        return
    _counted(run, -1)
    try:
        _RUN.reset(token)
    except ValueError:  # the token belongs to another context
        _RUN.set(None)


@contextmanager
def in_force(run: Any) -> Iterator[None]:
    """``run`` is the run in force inside the block."""
    _counted(run, 1)
    token = _RUN.set(run)
    try:
        yield
    finally:
        _RUN.reset(token)
        _counted(run, -1)


def in_crossing() -> bool:
    """Whether the calling context is inside a boundary's own work."""
    return _CROSSING.get()


@contextmanager
def crossing() -> Iterator[None]:
    """The block is a boundary's own work (see the module's docstring)."""
    token = _CROSSING.set(True)
    try:
        yield
    finally:
        _CROSSING.reset(token)


def enter_crossing() -> Token[bool]:
    """:func:`crossing` for the recorder's hot path (no generator): a boundary's own work
    starts; :func:`leave_crossing` with the token ends it."""
    return _CROSSING.set(True)


def leave_crossing(token: Token[bool]) -> None:
    """The work :func:`enter_crossing` started is over."""
    _CROSSING.reset(token)
