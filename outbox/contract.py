"""The record/replay boundary contract: everything both modes share.

Record mode (the Recorder's runs) and replay mode (the replayer's runs) are two drivers
of one boundary model:

- what a crossing asks (:class:`Ask`, built by :class:`Contract`): everything the agent's
  own code decides at a boundary, the input of each crossing (a tool's arguments, an LLM
  request, an effect's key and arguments, a transition) and the outputs that are the
  code's rather than the world's (the state a transition sets, how a run ends), scrubbed
  with the run's redaction rules, then digested with the run's digest. Replay compares
  those digests with the recorded ones, so there is one builder per boundary kind, and
  both modes call it;
- the steps each boundary is a generator of (:class:`Call`, :class:`Cross`,
  :class:`Begin`, :class:`End`): record mode answers them by calling and appending,
  replay mode from the log, rebuilding what came of each call (:class:`Done`) as the
  crossing's reader says (:class:`Restore` is what a replay gives it);
- the boundary surface runs of both modes inherit, once per flavour
  (:class:`Boundaries`, :class:`AsyncBoundaries`).

What the world answers (a tool's result, a model's response, a clock reading) is the
recorder's business alone; replay reads it back with :func:`recorded`.
"""

from agent_blackbox.outbox._asks import Ask, Contract, Ending, default_idempotency_key
from agent_blackbox.outbox._boundaries import error_info, recorded, recorded_input
from agent_blackbox.outbox._context import (
    crossing,
    current_run,
    enter_crossing,
    in_force,
    leave_crossing,
)
from agent_blackbox.outbox._crossings import Done, Read, Restore
from agent_blackbox.outbox._effects import EffectPolicy, ToolPolicy
from agent_blackbox.outbox._network import Hole, UnrecordedCall, watch_connections
from agent_blackbox.outbox._placement import (
    BRANCH,
    STARTED,
    Place,
    Placement,
    branch_of,
    started_of,
)
from agent_blackbox.outbox._request_memo import Expected
from agent_blackbox.outbox._scrub import FIRED_ATTRIBUTE, RULES_ATTRIBUTE, Scrub
from agent_blackbox.outbox._sites import (
    agent_file,
    installed_file,
    loop_step,
    stdlib_file,
    tool_definition,
)
from agent_blackbox.outbox._steps import Begin, Call, Cross, Draws, End, Settle, Step, Steps
from agent_blackbox.outbox._surface import AsyncBoundaries, Boundaries

__all__ = [
    "BRANCH",
    "FIRED_ATTRIBUTE",
    "RULES_ATTRIBUTE",
    "STARTED",
    "Ask",
    "AsyncBoundaries",
    "Begin",
    "Boundaries",
    "Call",
    "Contract",
    "Cross",
    "Done",
    "Draws",
    "EffectPolicy",
    "End",
    "Ending",
    "Expected",
    "Hole",
    "Place",
    "Placement",
    "Read",
    "Restore",
    "Scrub",
    "Settle",
    "Step",
    "Steps",
    "ToolPolicy",
    "UnrecordedCall",
    "agent_file",
    "branch_of",
    "crossing",
    "current_run",
    "default_idempotency_key",
    "enter_crossing",
    "error_info",
    "in_force",
    "installed_file",
    "leave_crossing",
    "loop_step",
    "recorded",
    "recorded_input",
    "started_of",
    "stdlib_file",
    "tool_definition",
    "watch_connections",
]
