"""What an agent's own tests need: recorders that keep runs in memory, replay of what they
recorded, and pytest fixtures.

:class:`MemoryRecorder` and :class:`AsyncMemoryRecorder` record exactly the envelopes
:class:`~agent_blackbox.Recorder` and :class:`~agent_blackbox.AsyncRecorder` write to
Postgres (the same digests, chain and bodies), into a list, with no database. A test
records a run of its agent with fakes for the model and the tools, then checks the run
replays::

    from agent_blackbox import RunSnapshot
    from agent_blackbox.testing import MemoryRecorder, replay

    recorder = MemoryRecorder()
    run, answer = recorder.record(agent, RunSnapshot("my-agent/1", {"q": "hi"}), agent_id="a")
    report = replay(recorder, agent)
    assert report.passed, report.divergence

The fixtures (:mod:`agent_blackbox.testing.fixtures`) give each test a fresh recorder:
add ``pytest_plugins = ["agent_blackbox.testing.fixtures"]`` to the suite's top
``conftest.py``.

Importing this module loads the recorder, not the replayer: :func:`replay` loads it when
first called.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Unpack

from agent_blackbox.outbox import AsyncMemoryRecorder, MemoryRecorder
from agent_blackbox.schemas import Envelope

if TYPE_CHECKING:
    from agent_blackbox.replayer import AgentEntry, ReplayOptions, ReplayReport

__all__ = ["AsyncMemoryRecorder", "MemoryRecorder", "replay"]


def replay(
    recorded: MemoryRecorder | AsyncMemoryRecorder | Iterable[Envelope],
    entry: AgentEntry,
    *,
    run_id: str | None = None,
    **options: Unpack[ReplayOptions],
) -> ReplayReport:
    """Replay a run recorded in memory through ``entry``, offline: PASS or the first
    divergence, in a report.

    Args:
        recorded: a memory recorder (its events, and its bodies stored out of line), or
            recorded envelopes (an archive's, a list kept by a ``sink``).
        entry: the entry point, ``entry(run, input)``, a plain or an ``async`` function
            (inside a running event loop, an ``async`` entry replays in a thread of its
            own).
        run_id: which run, when ``recorded`` holds several.
        options: as :func:`agent_blackbox.replayer.replay_run` takes them
            (``nondeterminism``, ``reveal_values``, ``allow_network``, ``pipeline``, ...).

    Raises:
        ValueError: ``recorded`` holds no run, or several and ``run_id`` names none of
            them.
    """
    from agent_blackbox.replayer import replay_run

    if isinstance(recorded, MemoryRecorder | AsyncMemoryRecorder):
        options.setdefault("blobs", recorded)
        events = recorded.events
    else:
        events = list(recorded)
    runs = list(dict.fromkeys(envelope.run_id for envelope in events))
    chosen = run_id if run_id is not None else _only(runs)
    if chosen not in runs:
        raise ValueError(
            f"run {chosen} was not recorded here; the runs recorded are {_listed(runs)}"
        )
    return replay_run([e for e in events if e.run_id == chosen], entry, **options)


def _only(runs: list[str]) -> str:
    """The one run recorded.

    Raises:
        ValueError: none was, or several were.
    """
    if not runs:
        raise ValueError("nothing was recorded: record a run first (recorder.record(...))")
    if len(runs) > 1:
        raise ValueError(
            f"{len(runs)} runs were recorded ({_listed(runs)}): say which with run_id= "
            "(the run_id of the run recorder.record(...) gave back)"
        )
    return runs[0]


def _listed(runs: list[str], most: int = 5) -> str:
    shown = ", ".join(runs[:most])
    return shown + (f" and {len(runs) - most} more" if len(runs) > most else "") or "none"
