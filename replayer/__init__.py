"""Offline replay: re-drive an agent's own code from a recorded run, report PASS or the
first divergence. Reads runs from Kafka (located through a :class:`RunIndex`, which the
read side implements), from Avro archives, or from envelopes in memory; nothing external
is ever called. Replay mode itself (:class:`ReplayRun`) lives here, beside its reports.
"""

from agent_blackbox.replayer._driver import AgentEntry, replay_run
from agent_blackbox.replayer._index import ReadSide, RunIndex, RunLocation
from agent_blackbox.replayer._registry import AgentRegistry, UnknownAgent, load_entry
from agent_blackbox.replayer._replay import (
    BlobReader,
    CallSite,
    DigestKeys,
    Divergence,
    DivergenceKind,
    ReplayDivergence,
    ReplayRun,
)
from agent_blackbox.replayer._report import LEVEL_NAMES, ReplayReport
from agent_blackbox.replayer._sandbox import Nondeterminism, NondeterminismPolicy
from agent_blackbox.replayer._sources import (
    KafkaRunSource,
    SourceError,
    read_archive,
    write_archive,
)
from agent_blackbox.replayer._verify import CheckpointStatus, Problem, VerifyReport, verify_run

__all__ = [
    "LEVEL_NAMES",
    "AgentEntry",
    "AgentRegistry",
    "BlobReader",
    "CallSite",
    "CheckpointStatus",
    "DigestKeys",
    "Divergence",
    "DivergenceKind",
    "KafkaRunSource",
    "Nondeterminism",
    "NondeterminismPolicy",
    "Problem",
    "ReadSide",
    "ReplayDivergence",
    "ReplayReport",
    "ReplayRun",
    "RunIndex",
    "RunLocation",
    "SourceError",
    "UnknownAgent",
    "VerifyReport",
    "load_entry",
    "read_archive",
    "replay_run",
    "verify_run",
    "write_archive",
]
