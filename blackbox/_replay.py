"""``agent_blackbox.replay``: one call that finds a recorded run and replays it.

It composes what ``blackbox replay RUN_ID`` composes (the views' run index, the run's
stretch of the topic, bodies opened for a stated purpose through the configured keys,
out-of-line bodies from the write side) from :class:`~agent_blackbox.schemas.Settings`.
The replayer, the read side and the database driver are imported when it is called, not
with the front door, so an agent that never replays never loads them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, overload

from agent_blackbox.schemas import Envelope

if TYPE_CHECKING:
    from agent_blackbox.replayer import AgentEntry, NondeterminismPolicy, Replaying, ReplayReport
    from agent_blackbox.schemas import Settings

log = logging.getLogger(__name__)

_PURPOSE_EXAMPLE = "for example purpose='incident 4411: refund loop'"


@overload
def replay(
    target: str,
    entry: AgentEntry | str,
    *,
    settings: Settings | None = None,
    purpose: str | None = None,
    nondeterminism: NondeterminismPolicy = "warn",
    agent_modules: Iterable[str] = (),
    reveal_values: bool = False,
    allow_network: bool = False,
) -> ReplayReport: ...


@overload
def replay(
    target: list[str] | tuple[str, ...],
    entry: AgentEntry | str,
    *,
    settings: Settings | None = None,
    purpose: str | None = None,
    nondeterminism: NondeterminismPolicy = "warn",
    agent_modules: Iterable[str] = (),
    reveal_values: bool = False,
    allow_network: bool = False,
) -> list[ReplayReport]: ...


@overload
def replay(
    target: Iterable[Envelope],
    entry: AgentEntry | str,
    *,
    settings: Settings | None = None,
    purpose: str | None = None,
    nondeterminism: NondeterminismPolicy = "warn",
    agent_modules: Iterable[str] = (),
    reveal_values: bool = False,
    allow_network: bool = False,
) -> ReplayReport: ...


def replay(
    target: str | list[str] | tuple[str, ...] | Iterable[Envelope],
    entry: AgentEntry | str,
    *,
    settings: Settings | None = None,
    purpose: str | None = None,
    nondeterminism: NondeterminismPolicy = "warn",
    agent_modules: Iterable[str] = (),
    reveal_values: bool = False,
    allow_network: bool = False,
) -> ReplayReport | list[ReplayReport]:
    """Replay recorded runs through ``entry``, the agent's own code, offline: PASS or the
    first divergence, in a report.

    ``target`` is one run id (a report), a list of run ids (a report each, in order), or
    the envelopes of one run (a report; e.g. a ``MemoryRecorder``'s ``events``, or
    :func:`agent_blackbox.testing.replay` for a recorder holding several runs). Run ids are
    found as ``blackbox replay RUN_ID`` finds them: through the views' run index
    (``blackbox consume`` must have indexed them), read from the topic
    (``BLACKBOX_KAFKA_BOOTSTRAP``), sealed bodies opened with the keys of
    ``BLACKBOX_KEK_FILE`` or ``BLACKBOX_KEK``, each key unwrap audited with ``purpose``.

    A run that cannot be replayed (not in the index, unreadable, a key missing, an entry
    that does not fit) is a report whose ``result`` is ``ERROR`` and whose ``error``
    says why and what to do; the other runs are replayed all the same.

    Args:
        target: a run id, a list of run ids, or the envelopes of one run.
        entry: the entry point, ``entry(run, input)`` (a plain or an ``async`` function),
            or its import path ``"module:function"``; it replays every run given.
        settings: where the database and the topic are (default:
            ``Settings.from_env()``, the ``BLACKBOX_*`` variables).
        purpose: why the recorded bodies are read, written to the access audit (default:
            ``BLACKBOX_PURPOSE``); needed for run ids, not for envelopes.
        nondeterminism: ``"warn"`` or ``"fail"``: what direct reads of the clock,
            randomness or the environment by the agent's code do to the report.
        agent_modules: modules of the agent's own, besides the entry's package, whose
            direct reads are reported too.
        reveal_values: an argument mismatch lists the changed values, not only paths.
        allow_network: let a call that crosses no boundary go out (noted in the report)
            instead of refusing it as an ``unrecorded_call`` divergence.

    Raises:
        AccessDenied: run ids without a usable purpose.
        UnknownAgent: ``entry`` is an import path that cannot be loaded.
        ValueError: a ``BLACKBOX_*`` variable holds a bad value, ``nondeterminism`` is
            neither ``warn`` nor ``fail``, ``target`` is empty, or the envelopes hold
            several runs.
        TypeError: ``target`` is none of the three.
    """
    from agent_blackbox.replayer import Replaying, load_replay_entry

    if nondeterminism not in ("warn", "fail"):
        raise ValueError(f"nondeterminism={nondeterminism!r}: give 'warn' or 'fail'")
    agent = load_replay_entry(entry) if isinstance(entry, str) else entry
    how = Replaying(nondeterminism, tuple(agent_modules), reveal_values, allow_network)
    if isinstance(target, str):
        return _from_topic([target], agent, settings, purpose, how)[0]
    items = list(target)
    if not items:
        raise ValueError("nothing to replay: give a run id, a list of run ids or a run's events")
    ids = [item for item in items if isinstance(item, str)]
    envelopes = [item for item in items if isinstance(item, Envelope)]
    if len(ids) == len(items):
        return _from_topic(ids, agent, settings, purpose, how)
    if len(envelopes) != len(items):
        held = ", ".join(sorted({type(item).__name__ for item in items}))
        raise TypeError(
            "replay takes a run id, a list of run ids, or the envelopes of one run; got "
            f"a {type(target).__name__} of {held}"
        )
    from agent_blackbox.testing import replay as replay_in_memory

    return replay_in_memory(
        envelopes,
        agent,
        nondeterminism=nondeterminism,
        agent_modules=how.agent_modules,
        reveal_values=reveal_values,
        allow_network=allow_network,
    )


def _from_topic(
    run_ids: list[str],
    entry: AgentEntry,
    settings: Settings | None,
    purpose: str | None,
    how: Replaying,
) -> list[ReplayReport]:
    """Each run's report, the run found through the run index and read from the topic.

    Raises:
        AccessDenied: no usable purpose.
    """
    from agent_blackbox.consumers import ViewRunIndex
    from agent_blackbox.keystore import AccessDenied, purpose_problem
    from agent_blackbox.replayer import AgentRegistry, ReplayReport, opening, replay_indexed
    from agent_blackbox.schemas import Settings

    stated = purpose if purpose is not None else os.environ.get("BLACKBOX_PURPOSE")
    if stated is None:
        raise AccessDenied(
            "replaying a recorded run reads its bodies, and every read says why: pass "
            f"purpose= or set BLACKBOX_PURPOSE, {_PURPOSE_EXAMPLE}"
        )
    if (problem := purpose_problem(stated, example=_PURPOSE_EXAMPLE)) is not None:
        raise AccessDenied(problem)
    from agent_blackbox.wiring import COMMAND_POOL

    settings = settings or Settings.from_env()
    # The run index, the blobs and the key unwraps, one run at a time: a command's pool.
    engine = COMMAND_POOL.engine(settings.database_url)
    try:
        reports: list[ReplayReport] = []
        for item in replay_indexed(
            run_ids,
            AgentRegistry(entry),
            opening(lambda: engine, purpose=stated),
            settings=settings,
            engine=engine,
            index=ViewRunIndex.from_settings(engine, settings),
            how=how,
        ):
            if isinstance(item, ReplayReport):
                reports.append(item)
            else:  # a message under the run's key that is not one of its events
                log.warning("passed over a message that is not an event: %s", item.describe())
        return reports
    finally:
        engine.dispose()
