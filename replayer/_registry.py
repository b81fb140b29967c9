"""Which code replays which agent: entry points by agent name or import path."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agent_blackbox.replayer._driver import AgentEntry, entry_problem
from agent_blackbox.schemas import BlackboxError


class UnknownAgent(BlackboxError):
    """An agent's entry point cannot be used: malformed, not importable, not callable."""


class MissingEntryPoint(UnknownAgent):
    """No entry point is configured for an agent (``--agent`` nor ``BLACKBOX_AGENTS``).

    A batch replay skips that agent's runs and goes on; a single replay stops.
    """


def load_entry(path: str) -> AgentEntry:
    """Import ``module:function``.

    Raises:
        UnknownAgent: the path is malformed, the module cannot be imported (whatever it
            raised while importing is named, with its message), or the function is
            missing or not callable.
    """
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise UnknownAgent(
            f"{path!r} is not an entry point: give module:function, for example "
            "agent_blackbox.examples.ticket_agent:replay_entry"
        )
    if module_name.endswith(".py") or "/" in module_name or "\\" in module_name:
        file = Path(module_name)
        raise UnknownAgent(
            f"{module_name!r} in {path!r} is a file, and an entry point names a module: "
            f"give {file.stem}:{attribute} from the folder {str(file.parent)!r} (or with that "
            "folder on PYTHONPATH)"
        )
    try:
        module = _imported(module_name)
    except (Exception, SystemExit) as exc:  # the agent's module ran its own code
        raise UnknownAgent(
            f"cannot import {module_name!r} for entry point {path!r}: {type(exc).__name__}: {exc}"
        ) from exc
    entry = getattr(module, attribute, None)
    if entry is None:
        raise UnknownAgent(
            f"module {module_name!r} has no {attribute!r}; check the function name in {path!r}"
        )
    if not callable(entry):
        raise UnknownAgent(
            f"{path!r} is not a function (it is of type {type(entry).__name__}); an entry "
            "point is called as entry(run, input)"
        )
    return entry  # type: ignore[no-any-return]


def _imported(module_name: str) -> Any:
    """``module_name`` imported; when it is not found and the working directory is not on
    the import path, looked for there too, as ``python -m`` would (the ``blackbox``
    script puts its own folder on the path instead, so an agent's module beside the
    command was not found). Searched after everything installed, so nothing installed
    is shadowed by a file of the same name here."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        here = os.getcwd()
        top = module_name.partition(".")[0]
        if exc.name != top or here in sys.path or "" in sys.path:
            raise
        sys.path.append(here)
        return importlib.import_module(module_name)


def load_replay_entry(path: str) -> AgentEntry:
    """:func:`load_entry` of an agent's entry point, checked to be callable as
    ``entry(run, input)``.

    Raises:
        UnknownAgent: as :func:`load_entry`, or the function takes other arguments.
    """
    entry = load_entry(path)
    problem = entry_problem(entry)
    if problem is not None:
        raise UnknownAgent(f"{path!r}: {problem}")
    return entry


class AgentRegistry:
    """Agent name → entry point, from code or from ``BLACKBOX_AGENTS``.

    ``BLACKBOX_AGENTS`` holds comma-separated ``agent-name=module:function`` pairs.
    A default entry (``--agent`` on the command line) serves every agent not named.
    """

    def __init__(self, default: AgentEntry | None = None) -> None:
        self._entries: dict[str, AgentEntry] = {}
        self._paths: dict[str, str] = {}
        self._broken: dict[str, UnknownAgent] = {}
        self.default = default

    @classmethod
    def from_env(
        cls, default: AgentEntry | None = None, environ: Mapping[str, str] | None = None
    ) -> AgentRegistry:
        """A registry of the entry points ``BLACKBOX_AGENTS`` names (imported when first
        needed), with ``default`` for every other agent.

        Raises:
            UnknownAgent: a ``BLACKBOX_AGENTS`` entry is not ``name=module:function``.
        """
        registry = cls(default)
        spec = (os.environ if environ is None else environ).get("BLACKBOX_AGENTS", "")
        for pair in filter(None, (p.strip() for p in spec.split(","))):
            name, _, path = pair.partition("=")
            if not name.strip() or not path.strip():
                raise UnknownAgent(f"BLACKBOX_AGENTS entry {pair!r} is not name=module:function")
            registry._paths[name.strip()] = path.strip()
        return registry

    def register(self, agent_id: str, entry: AgentEntry) -> None:
        self._entries[agent_id] = entry

    def resolve(self, agent_id: str | None) -> AgentEntry:
        """The entry point of ``agent_id``.

        Raises:
            MissingEntryPoint: none is registered and no default was given.
            UnknownAgent: the configured entry point cannot be imported (the failure
                is kept, so later runs of that agent fail at once with the same message).
        """
        if agent_id is not None:
            if agent_id in self._entries:
                return self._entries[agent_id]
            if agent_id in self._broken:
                raise self._broken[agent_id]
            if agent_id in self._paths:
                try:
                    self._entries[agent_id] = load_replay_entry(self._paths[agent_id])
                except UnknownAgent as exc:
                    self._broken[agent_id] = exc
                    raise
                return self._entries[agent_id]
        if self.default is not None:
            return self.default
        raise MissingEntryPoint(
            f"no entry point for agent {agent_id!r}: pass --agent module:function or set "
            "BLACKBOX_AGENTS=name=module:function"
        )
