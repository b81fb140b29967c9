"""The composition root of the ``blackbox`` command: what the commands of one invocation
are built from, made once and handed down."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import click
from sqlalchemy import Connection, Engine
from sqlalchemy.exc import OperationalError

from agent_blackbox.cli._workers import could_not_run, database_unreachable
from agent_blackbox.replayer import ReadSide
from agent_blackbox.schemas import Settings, safe_console
from agent_blackbox.wiring import COMMAND_POOL, Pool

if TYPE_CHECKING:
    from agent_blackbox.consumers import ViewReplayResults, ViewRunIndex


@dataclass(frozen=True, slots=True)
class Wiring:
    """The settings of one ``blackbox`` invocation, read from the environment once, and
    how the replayer's commands reach the read side.

    The root group puts one in the click context; each command takes it with
    :func:`wired`, and hands the settings, and the engines :meth:`engine` makes, down to
    the parts as arguments.
    """

    settings: Settings
    read_side: ReadSide

    @classmethod
    def from_env(cls, read_side: ReadSide | None = None) -> Wiring:
        """The settings from the ``BLACKBOX_*`` variables, and the views' read side
        unless ``read_side`` is given.

        Raises:
            ValueError: a variable holds a value its setting cannot take (named).
        """
        settings = Settings.from_env()
        return cls(settings, read_side or views_read_side(settings))

    def engine(self, pool: Pool = COMMAND_POOL) -> Engine:
        """An engine on the settings' database with ``pool`` (the pool policy's size
        for the kind of process; a command's by default)."""
        return pool.engine(self.settings.database_url)

    @contextmanager
    def connection(self, *, begin: bool = False) -> Iterator[Connection]:
        """A connection for a command that reads (or, with ``begin``, writes in one
        transaction that commits when the block ends) and is done: its engine is
        disposed of afterwards. A database that cannot be reached is a setup error: said
        on stderr, exit 2 (never a traceback, never a finding's exit 1)."""
        engine = self.engine()
        try:
            with engine.begin() if begin else engine.connect() as conn:
                yield conn
        except OperationalError as exc:
            could_not_run(safe_console(stderr=True), database_unreachable(exc))
        finally:
            engine.dispose()


def views_read_side(settings: Settings) -> ReadSide:
    """The read side of the views: their run index and replay results. Picklable, so
    that the worker processes of ``replay --all`` and ``verify --all`` get it whole."""
    return ReadSide(
        run_index=partial(_view_run_index, settings), replay_results=_view_replay_results
    )


# The views are loaded when a command reaches for them, not by every command's wiring.


def _view_run_index(settings: Settings, engine: Engine) -> ViewRunIndex:
    """The views' run index (see :meth:`ViewRunIndex.from_settings`)."""
    from agent_blackbox.consumers import ViewRunIndex

    return ViewRunIndex.from_settings(engine, settings)


def _view_replay_results(engine: Engine) -> ViewReplayResults:
    """Where the views keep replay results."""
    from agent_blackbox.consumers import ViewReplayResults

    return ViewReplayResults(engine)


_MADE = "agent_blackbox.wiring"


def wired(ctx: click.Context | None = None) -> Wiring:
    """The wiring of the running command (``ctx``, by default the current one): the one
    its ``blackbox`` invocation made. A command invoked on its own (a test, a script)
    gets one made from the environment the first time it asks, with the
    :class:`ReadSide` it was given as its context object, if any.

    Raises:
        ValueError: a ``BLACKBOX_*`` variable holds a bad value (only when made here).
    """
    ctx = ctx or click.get_current_context()
    found = ctx.find_object(Wiring)
    if found is not None:
        return found
    made = ctx.meta.get(_MADE)
    if not isinstance(made, Wiring):
        made = ctx.meta[_MADE] = Wiring.from_env(ctx.find_object(ReadSide))
    return made
