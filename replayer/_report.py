"""What a replay found: PASS, or the first divergence, level by level."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from outbox import Divergence

LEVEL_NAMES = ("control_flow", "state", "content")


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """The result of replaying one run."""

    run_id: str
    agent_id: str | None
    events: int
    """Recorded events consumed before the replay ended."""
    divergence: Divergence | None = None
    error: str | None = None
    """A replay that could not run at all (an unknown agent, an unreadable source)."""

    @property
    def passed(self) -> bool:
        return self.divergence is None and self.error is None

    @property
    def levels(self) -> dict[str, str]:
        """``pass``, ``fail`` or ``unchecked`` for control flow, state and content.

        Replay stops at the first divergence, so the levels it did not reach are
        unchecked rather than passed.
        """
        if self.passed:
            return dict.fromkeys(LEVEL_NAMES, "pass")
        if self.divergence is None:
            return dict.fromkeys(LEVEL_NAMES, "unchecked")
        return {
            name: "fail" if name == self.divergence.level else "unchecked" for name in LEVEL_NAMES
        }

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form, for ``--json``."""
        return {
            "run_id": self.run_id,
            "agent_id": self.agent_id,
            "result": "PASS" if self.passed else ("ERROR" if self.error else "DIVERGED"),
            "events": self.events,
            "levels": self.levels,
            "divergence": None if self.divergence is None else self.divergence.to_dict(),
            "error": self.error,
        }
