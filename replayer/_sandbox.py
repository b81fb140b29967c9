"""Unrecorded nondeterminism in replay: which modules are the agent's, and what the
report says about their direct reads of the clock, randomness and the environment.

The interception itself is the write side's guard
(:class:`~agent_blackbox.outbox.NondeterminismGuard`), which a recorder can also run
while recording; here it is entered once per replayed run.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from agent_blackbox.outbox import NondeterminismGuard, NondeterministicRead, agent_package
from agent_blackbox.replayer._sites import CallSite

NondeterminismPolicy = Literal["warn", "fail"]
"""What a replay makes of unrecorded nondeterminism: a warning in the report (the run
still passes) or a failure of the run."""
POLICIES: tuple[NondeterminismPolicy, ...] = ("warn", "fail")
KIND = "unrecorded_nondeterminism"


@dataclass(frozen=True, slots=True)
class Nondeterminism:
    """A direct read of the clock, randomness or the environment by the agent's code:
    a value replay cannot give back, so the code may behave otherwise than recorded."""

    call_site: CallSite
    what: str
    """What was read: ``time.time``, ``random.random``, ``os.environ``, ..."""
    count: int = 1
    """How often that call site read it during the replay."""

    @property
    def kind(self) -> str:
        return KIND

    def describe(self) -> str:
        """One line for people."""
        times = f" ({self.count} times)" if self.count > 1 else ""
        return (
            f"{KIND}: {self.what} read directly at {self.call_site}{times}; let it cross "
            "the run (run.now(), run.random(), run.uuid(), an input or a tool call)"
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form."""
        site = self.call_site
        return {
            "kind": KIND,
            "what": self.what,
            "count": self.count,
            "call_site": {"function": site.function, "file": site.file, "line": site.line},
        }

    @classmethod
    def of(cls, read: NondeterministicRead) -> Nondeterminism:
        return cls(CallSite(read.function, read.file, read.line), read.what, read.count)


def modules_of(entry: Callable[..., Any], named: Iterable[str] = ()) -> tuple[str, ...]:
    """The agent's own modules: the package of ``entry``'s module (the module alone
    when it is top-level or directly inside ``agent_blackbox``), and ``named``.

    Raises:
        ValueError: a named module is empty.
    """
    found = set()
    for name in named:
        if not name.strip():
            raise ValueError("an agent module name is empty; name a module like my_agent.tools")
        found.add(name.strip())
    module = _module_of(entry)
    if module is not None:
        found.add(agent_package(module))
    return tuple(sorted(found))


def check_policy(policy: str) -> NondeterminismPolicy:
    """``policy`` when it is ``warn`` or ``fail``.

    Raises:
        ValueError: another value.
    """
    if policy not in POLICIES:
        raise ValueError(f"nondeterminism={policy!r}: use 'warn' or 'fail'")
    return policy


def found(guard: NondeterminismGuard) -> tuple[Nondeterminism, ...]:
    """What ``guard`` saw, as report entries."""
    return tuple(Nondeterminism.of(read) for read in guard.reads)


def _module_of(entry: Callable[..., Any]) -> str | None:
    while isinstance(entry, functools.partial):
        entry = entry.func
    module = getattr(entry, "__module__", None)
    return module if isinstance(module, str) else None
