"""What a replay found: PASS, or the first divergence, level by level."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent_blackbox.replayer._divergence import Divergence
from agent_blackbox.replayer._kept import KeptValues
from agent_blackbox.replayer._sandbox import Nondeterminism

LEVEL_NAMES = ("control_flow", "state", "content")


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """The result of replaying one run."""

    run_id: str
    agent_id: str | None
    events: int
    """Recorded events consumed before the replay ended."""
    divergence: Divergence | None = None
    """The first divergence found."""
    error: str | None = None
    """Why replay could not run, as ``ExceptionName: message``: a setup or access problem
    (an agent that does not import, an unreadable source, a missing key), never a
    divergence of the code."""
    divergences: tuple[Divergence, ...] = ()
    """The first divergence of each level found, in sequence order."""
    limited: str | None = None
    """Why not everything could be checked: the run's bodies were destroyed (only control
    flow was checked), or some bodies were recorded truncated (see :attr:`notes`)."""
    notes: tuple[str, ...] = ()
    """One line per event checked only in part (an LLM call recorded truncated over the
    blob ceiling: its reduced response was handed back, its output digest unchecked),
    and per state or output difference not counted because it followed one."""
    limited_levels: tuple[str, ...] = ()
    """The levels :attr:`notes` say were checked only in part: ``limited`` where they
    would otherwise ``pass``."""
    skipped: str | None = None
    """Why a batch replay left the run out (no entry point for its agent)."""
    nondeterminism: tuple[Nondeterminism, ...] = ()
    """Direct reads of the clock, randomness or the environment by the agent's code
    (``unrecorded_nondeterminism``), each call site once."""
    nondeterminism_fails: bool = False
    """Whether those reads fail the run (``fail``) or are warnings (``warn``)."""
    duration_ms: float | None = None
    """How long opening and replaying the run took (a batch replay measures it)."""
    recorded_status: str | None = None
    """How the recorded run ended (its ``run.finished`` status: ``succeeded``,
    ``failed``, ...); None when the replay stopped before reading its end. A replay
    that reproduces a failed run passes: the code did what was recorded."""
    recorded_error: str | None = None
    """The type of the error a failed recorded run ended with."""
    kept: KeptValues | None = None
    """The values behind :attr:`divergence`, as a replay result keeps them for a stated
    purpose (a batch replay seals them when the run is sealed)."""

    def __post_init__(self) -> None:
        if self.divergence is not None and not self.divergences:
            object.__setattr__(self, "divergences", (self.divergence,))

    @property
    def passed(self) -> bool:
        """Every level that could be checked matched (``PASS`` or ``LIMITED``), and no
        unrecorded read fails the run."""
        failing = self.nondeterminism_fails and bool(self.nondeterminism)
        return (
            self.divergence is None and self.error is None and self.skipped is None and not failing
        )

    @property
    def recorded_failed(self) -> bool:
        """Whether the recorded run had failed (a pass reproduced the failure)."""
        return self.recorded_status == "failed"

    def recorded_ending(self) -> str | None:
        """How the recorded run ended, in words (``failed (KeyError)``), or None."""
        if self.recorded_status is None:
            return None
        error = f" ({self.recorded_error})" if self.recorded_error else ""
        return f"{self.recorded_status}{error}"

    @property
    def levels(self) -> dict[str, str]:
        """``pass``, ``fail`` or ``unchecked`` for control flow, state and content.

        Replay goes on past state and content divergences but stops at a control-flow
        one; a level without a divergence of its own then counts as unchecked, since
        the rest of the run was never compared.
        """
        if self.error is not None or self.skipped is not None:
            return dict.fromkeys(LEVEL_NAMES, "unchecked")
        if self.limited is not None and not self.notes:
            flow = "fail" if self.divergences else "pass"
            return {"control_flow": flow, "state": "unavailable", "content": "unavailable"}
        failed = {d.level for d in self.divergences}
        completed = "control_flow" not in failed
        levels = {
            name: "fail" if name in failed else ("pass" if completed else "unchecked")
            for name in LEVEL_NAMES
        }
        for name in self.limited_levels:
            if levels[name] == "pass":
                levels[name] = "limited"
        return levels

    @property
    def result(self) -> str:
        """``PASS``, ``LIMITED`` (passed what could be checked), ``DIVERGED``,
        ``NONDETERMINISTIC`` (no divergence, but unrecorded reads that fail the run),
        ``ERROR`` (replay could not run: a setup or access problem) or ``SKIPPED``."""
        if self.error:
            return "ERROR"
        if self.skipped:
            return "SKIPPED"
        if self.divergence is not None:
            return "DIVERGED"
        if not self.passed:
            return "NONDETERMINISTIC"
        return "LIMITED" if self.limited else "PASS"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form, for ``--json``."""
        return {
            "run_id": self.run_id,
            "agent_id": self.agent_id,
            "result": self.result,
            "limited": self.limited,
            "notes": list(self.notes),
            "events": self.events,
            "levels": self.levels,
            "divergence": None if self.divergence is None else self.divergence.to_dict(),
            "divergences": [d.to_dict() for d in self.divergences],
            "error": self.error,
            "skipped": self.skipped,
            "nondeterminism": [n.to_dict() for n in self.nondeterminism],
            "nondeterminism_policy": "fail" if self.nondeterminism_fails else "warn",
            "recorded_status": self.recorded_status,
            "recorded_error": self.recorded_error,
        }
