"""Which code replays which agent: entry points by agent name or import path."""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping

from agent_blackbox.replayer._driver import AgentEntry
from agent_blackbox.schemas import BlackboxError


class UnknownAgent(BlackboxError):
    """No entry point is known for an agent."""


def load_entry(path: str) -> AgentEntry:
    """Import ``module:function``.

    Raises:
        UnknownAgent: the path is malformed, or the module or function is missing.
    """
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise UnknownAgent(f"{path!r} is not an import path of the form module:function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UnknownAgent(
            f"cannot import {module_name!r} for agent entry {path!r}: {exc}"
        ) from exc
    entry = getattr(module, attribute, None)
    if not callable(entry):
        raise UnknownAgent(f"{module_name} has no callable {attribute!r}")
    return entry  # type: ignore[no-any-return]


class AgentRegistry:
    """Agent name → entry point, from code or from ``BLACKBOX_AGENTS``.

    ``BLACKBOX_AGENTS`` holds comma-separated ``agent-name=module:function`` pairs.
    A default entry (``--agent`` on the command line) serves every agent not named.
    """

    def __init__(self, default: AgentEntry | None = None) -> None:
        self._entries: dict[str, AgentEntry] = {}
        self._paths: dict[str, str] = {}
        self.default = default

    @classmethod
    def from_env(
        cls, default: AgentEntry | None = None, environ: Mapping[str, str] | None = None
    ) -> AgentRegistry:
        registry = cls(default)
        spec = (os.environ if environ is None else environ).get("BLACKBOX_AGENTS", "")
        for pair in filter(None, (p.strip() for p in spec.split(","))):
            name, _, path = pair.partition("=")
            if not path:
                raise UnknownAgent(f"BLACKBOX_AGENTS entry {pair!r} is not name=module:function")
            registry._paths[name.strip()] = path.strip()
        return registry

    def register(self, agent_id: str, entry: AgentEntry) -> None:
        self._entries[agent_id] = entry

    def resolve(self, agent_id: str | None) -> AgentEntry:
        """The entry point of ``agent_id``.

        Raises:
            UnknownAgent: none is registered and no default was given.
        """
        if agent_id is not None:
            if agent_id in self._entries:
                return self._entries[agent_id]
            if agent_id in self._paths:
                self._entries[agent_id] = load_entry(self._paths[agent_id])
                return self._entries[agent_id]
        if self.default is not None:
            return self.default
        raise UnknownAgent(
            f"no entry point for agent {agent_id!r}: pass --agent module:function or set "
            "BLACKBOX_AGENTS=name=module:function"
        )
