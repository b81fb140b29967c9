"""The front door's names the documentation uses before they exist.

The pages are written with the names a user will type (``bb.Recorder``, ``bb.replay``,
``agent_blackbox.testing``...). Until the front door lands, a page that reaches one of
them is an expected failure whose reason names it (never a skip), and the same page is run
a second time with the stand-ins below filling in only the missing names, so that the rest
of the page is still checked. Once a name exists, neither applies to it: the page runs as
written. Delete this module when :data:`PENDING` is empty.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
import types
from collections.abc import Callable, Iterable
from typing import Any

PENDING = (
    "agent_blackbox.Recorder",
    "agent_blackbox.AsyncRecorder",
    "agent_blackbox.RunSnapshot",
    "agent_blackbox.RunOptions",
    "agent_blackbox.replay",
    "agent_blackbox.testing",
)


def missing() -> list[str]:
    """The names of :data:`PENDING` that do not exist yet."""
    return [name for name in PENDING if not _exists(name)]


def _exists(name: str) -> bool:
    module, _, attribute = name.rpartition(".")
    try:
        return hasattr(importlib.import_module(module), attribute) or bool(
            importlib.util.find_spec(name)
        )
    except ImportError:
        return False


def missing_name_in(text: str) -> str | None:
    """The missing pending name a failure's text is about, or None."""
    for name in missing():
        short = name.rpartition(".")[2]
        if name in text or re.search(rf"agent_blackbox\W.*\b{short}\b", text):
            return name
    return None


def install() -> None:
    """Fill in the missing names with stand-ins made of today's parts."""
    import agent_blackbox as bb
    from agent_blackbox import outbox

    gaps = set(missing())
    for name in ("Recorder", "AsyncRecorder", "RunSnapshot", "RunOptions"):
        if f"agent_blackbox.{name}" in gaps:
            setattr(bb, name, getattr(outbox, name))
    if "agent_blackbox.replay" in gaps:
        bb.replay = _replay  # type: ignore[attr-defined]
    if "agent_blackbox.testing" in gaps:
        testing = types.ModuleType("agent_blackbox.testing")
        testing.MemoryRecorder = outbox.MemoryRecorder  # type: ignore[attr-defined]
        testing.AsyncMemoryRecorder = outbox.AsyncMemoryRecorder  # type: ignore[attr-defined]
        sys.modules["agent_blackbox.testing"] = testing
        bb.testing = testing  # type: ignore[attr-defined]


def _replay(source: str | Iterable[Any], entry: Callable[..., Any], **options: Any) -> Any:
    """``bb.replay`` as the pages use it: a run id (found through the settings) or a
    run's envelopes."""
    from agent_blackbox.replayer import replay_run

    if not isinstance(source, str):
        return replay_run(list(source), entry, **options)
    from sqlalchemy import create_engine

    from agent_blackbox.consumers import ViewRunIndex
    from agent_blackbox.outbox import PostgresBlobs
    from agent_blackbox.replayer import KafkaRunSource
    from agent_blackbox.schemas import Settings

    settings = Settings.from_env()
    engine = create_engine(settings.database_url)
    try:
        run = KafkaRunSource(settings, ViewRunIndex(engine), source)
        return replay_run(run, entry, blobs=PostgresBlobs(engine), **options)
    finally:
        engine.dispose()
