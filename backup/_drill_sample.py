"""The drill's replay sample: runs of the restored copy replayed by ``blackbox replay``.

The sample is a random draw (``replay --all --random``), so that a drill repeated over
time looks at runs across the history, the newest and the sealed ones among them, not
only the oldest. It is drawn from the agents that have an entry point
(``BLACKBOX_AGENTS``, or the drill's ``--agent``), shared out among them in turn; the
runs of the other agents are counted as skipped (a figure of the report), never a
failure: a copy holds every agent's runs, and a drill runs where only some agents'
code is installed.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

AGENTS_ENV = "BLACKBOX_AGENTS"


@dataclass(frozen=True, slots=True)
class EntryPoints:
    """Which agents a replay can drive: those named, or every one when a default entry
    point (``--agent module:function``) was given."""

    named: frozenset[str]
    default: bool
    options: tuple[str, ...]
    """The ``--agent`` options to hand the replay command."""

    @classmethod
    def of(cls, agents: Sequence[str], environ: Mapping[str, str] | None = None) -> EntryPoints:
        """The entry points of ``agents`` (``--agent`` values: ``module:function`` for
        every agent, ``name=module:function`` for one) and of ``BLACKBOX_AGENTS``."""
        spec = (os.environ if environ is None else environ).get(AGENTS_ENV, "")
        pairs = [p.strip() for p in spec.split(",") if p.strip()]
        named = {p.partition("=")[0].strip() for p in pairs if "=" in p}
        default = False
        for agent in agents:
            name, sep, _path = agent.partition("=")
            if sep and ":" not in name:
                named.add(name.strip())
            else:
                default = True
        options = tuple(o for agent in agents for o in ("--agent", agent))
        return cls(frozenset(named), default, options)

    @property
    def empty(self) -> bool:
        return not self.named and not self.default

    def serve(self, agent_id: str) -> bool:
        """Whether a run of ``agent_id`` can be replayed."""
        return self.default or agent_id in self.named


@dataclass(frozen=True, slots=True)
class SamplePlan:
    """How many runs to replay of each agent (``None``: any agent, one replay), and the
    runs skipped for want of an entry point."""

    quotas: dict[str | None, int]
    skipped_runs: int
    skipped_agents: tuple[str, ...]

    def describe_skipped(self) -> str:
        """``N runs of K agents without an entry point skipped (names)``, or ``""``."""
        if not self.skipped_runs:
            return ""
        agents = len(self.skipped_agents)
        shown = ", ".join(self.skipped_agents[:5]) + (", ..." if agents > 5 else "")
        return (
            f"{self.skipped_runs} runs of {agents} agent{'s' if agents != 1 else ''} "
            f"without an entry point skipped ({shown})"
        )


def plan_sample(agents_of_runs: Mapping[str, str], entries: EntryPoints, sample: int) -> SamplePlan:
    """Share ``sample`` runs out among the agents ``entries`` serve, one run to each
    agent in turn while it has runs left; ``agents_of_runs``: run → agent."""
    runs = Counter(agents_of_runs.values())
    unserved = sorted(a for a in runs if not entries.serve(a))
    skipped = sum(runs[a] for a in unserved)
    if entries.default:
        return SamplePlan({None: sample}, skipped, tuple(unserved))
    left = {a: n for a, n in sorted(runs.items()) if entries.serve(a)}
    quotas: dict[str | None, int] = {}
    while sample > 0 and any(left.values()):
        for agent in [a for a, n in left.items() if n]:
            if sample == 0:
                break
            quotas[agent] = quotas.get(agent, 0) + 1
            left[agent] -= 1
            sample -= 1
    return SamplePlan(quotas, skipped, tuple(unserved))


def replay_arguments(
    plan: SamplePlan, entries: EntryPoints, purpose: str
) -> list[tuple[str | None, list[str]]]:
    """The ``blackbox replay`` arguments of each replay the plan asks for."""
    done: list[tuple[str | None, list[str]]] = []
    for agent, quota in plan.quotas.items():
        args = ["replay", "--all", "--random", "--limit", str(quota), "--json"]
        args += ["--purpose", purpose]
        if agent is not None:
            args += ["--agent-id", agent]
        done.append((agent, [*args, *entries.options]))
    return done
