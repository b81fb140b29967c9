"""Where a crossing stands among the concurrent work of its run.

A run's events are appended in completion order: that is their sequence. When the agent
runs boundaries concurrently (asyncio tasks, ``gather``/``TaskGroup``, threads), the order
they *started* in is another order, and replay needs both: it matches each call the code
makes to the recorded event that started in the same place, and hands the results back in
the recorded completion order. So every crossing takes a start number when its boundary
begins (``run.started`` is start 1; in code that runs one boundary at a time the start
number of every event equals its sequence, and nothing more is written) and the branch
of work it ran in: the asyncio task or thread, numbered in the order each first crossed a
boundary of the run (0 is the first after ``run.started``), with the branch it was spawned
from. Within one branch, boundaries run one at a time, so its events in sequence order
are the order the branch's code asked for them: replay matches each call to the next
recorded event of the same branch. Envelopes carry them as attributes, only where they
say something:

- ``started``: the start number, when it differs from the sequence;
- ``branch`` and ``parent_branch``: for every branch but the run's own.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import weakref
from contextvars import ContextVar
from typing import Any, NamedTuple

STARTED = "started"
BRANCH = "branch"
PARENT_BRANCH = "parent_branch"


class Place(NamedTuple):
    """A crossing's start number, its branch and the branch that spawned that one."""

    started: int
    branch: int = 0
    parent: int = 0


# The branch of the current context, per run: an asyncio task inherits its creator's
# context, so a child's first crossing finds the branch that spawned it here.
_CURRENT: ContextVar[tuple[int, int] | None] = ContextVar("blackbox_branch", default=None)


def _executor() -> Any:
    """What runs the current code: its asyncio task, or its thread."""
    loop = asyncio.events._get_running_loop()
    if loop is not None:
        task = asyncio.current_task(loop)
        if task is not None:
            return task
    return threading.current_thread()


class Placement:
    """Hands out start numbers and branches for one run; safe to use from threads."""

    def __init__(self, first: int = 1) -> None:
        self._starts = itertools.count(first)
        # Weakly held: a long run's finished tasks (and threads) are not kept alive.
        self._branches: weakref.WeakKeyDictionary[Any, tuple[int, int]] = (
            weakref.WeakKeyDictionary()
        )
        self._count = 0
        self._lock = threading.Lock()
        self._token = id(self)

    def opening(self) -> Place:
        """The place of ``run.started``: start 1, in no branch yet (branch 0 is the task
        or thread that drives the agent's entry, or else the first to cross a boundary
        after it, in record and replay alike)."""
        return Place(next(self._starts))

    def root(self) -> None:
        """Make the current task or thread branch 0, unless a branch crossed already: the
        recorder calls this where it drives the agent's entry, and the replayer where it
        drives it again (a pool started before any crossing must not make a pool thread
        the run's own branch)."""
        with self._lock:
            if self._count:
                return
            self._branches[_executor()] = (0, 0)
            self._count = 1
        _CURRENT.set((self._token, 0))

    def begin(self) -> Place:
        """The place of a boundary the current task or thread begins now."""
        started = next(self._starts)  # atomic: the count is advanced under the GIL
        executor = _executor()
        branch = self._branches.get(executor)
        if branch is None:
            branch = self._new_branch(executor)
        return Place(started, *branch)

    def _new_branch(self, executor: Any) -> tuple[int, int]:
        inherited = _CURRENT.get()
        parent = inherited[1] if inherited is not None and inherited[0] == self._token else 0
        with self._lock:
            branch = (self._count, parent)
            self._branches[executor] = branch
            self._count += 1
        _CURRENT.set((self._token, branch[0]))
        return branch


def placed_attributes(
    attributes: dict[str, str], place: Place | None, sequence: int
) -> dict[str, str]:
    """``attributes`` with what ``place`` says beyond the sequence (the same dict when
    nothing)."""
    if place is None or (place.started == sequence and place.branch == 0):
        return attributes
    extra = dict(attributes)
    if place.started != sequence:
        extra[STARTED] = str(place.started)
    if place.branch:
        extra[BRANCH] = str(place.branch)
        extra[PARENT_BRANCH] = str(place.parent)
    return extra


def started_of(attributes: dict[str, str], sequence: int) -> int:
    """The start number of a recorded event (its sequence unless it says otherwise; an
    unreadable value counts as the sequence, and the hash chain will not hold)."""
    raw = attributes.get(STARTED)
    if raw is None:
        return sequence
    try:
        return int(raw)
    except ValueError:
        return sequence


def branch_of(attributes: dict[str, str]) -> int:
    """The branch a recorded event ran in (0 unless it says otherwise)."""
    raw = attributes.get(BRANCH)
    if raw is None:
        return 0
    try:
        return int(raw)
    except ValueError:
        return 0
