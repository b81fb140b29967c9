"""Offline replay: re-drive an agent's own code from a recorded run, report PASS or the
first divergence. Reads runs from Kafka (one located through a :class:`RunIndex`, which
the read side implements, or a whole history in one pass: :class:`HistoryScan`), from
Avro archives, or from envelopes in memory; nothing external is ever called. Replay mode
itself (:class:`ReplayRun`) lives here, beside its reports. Recorded runs are exported as
JSON lines (:func:`event_records`, :func:`json_line`) or as a chat dataset for
fine-tuning and evaluation (:func:`chat_examples`).
"""

from agent_blackbox.replayer._access import Opening, opening
from agent_blackbox.replayer._batch import Replaying
from agent_blackbox.replayer._bodies import OpenedBody, open_body, readable_body
from agent_blackbox.replayer._chat import chat_examples
from agent_blackbox.replayer._driver import (
    AgentEntry,
    ReplayOptions,
    is_async_entry,
    replay_run,
    replay_run_async,
)
from agent_blackbox.replayer._export import ExportError, ExportTally, event_records, json_line
from agent_blackbox.replayer._fork import (
    ForkError,
    ForkResult,
    RecordedTools,
    ToolMode,
    ToolNotRecorded,
    fork_replay_entry,
    fork_run,
)
from agent_blackbox.replayer._fork_diff import ForkDiff, fork_diff
from agent_blackbox.replayer._history import (
    AssembledRun,
    Handled,
    HistoryScan,
    PartitionFailed,
    RunHandler,
    RunWork,
    SkippedMessage,
)
from agent_blackbox.replayer._index import ReadSide, ReplayResults, RunIndex, RunLocation
from agent_blackbox.replayer._indexed import replay_indexed
from agent_blackbox.replayer._reexecute import (
    CallDiff,
    Endpoint,
    ReexecuteSetupError,
    RequestMapper,
    anthropic_sender,
    check_routes,
    endpoints_for,
    openai_sender,
    reexecute,
)
from agent_blackbox.replayer._registry import (
    AgentRegistry,
    MissingEntryPoint,
    UnknownAgent,
    load_entry,
    load_replay_entry,
)
from agent_blackbox.replayer._replay import (
    AsyncReplayRun,
    BlobReader,
    CallSite,
    Change,
    DigestKeys,
    Divergence,
    DivergenceKind,
    ReplayDivergence,
    ReplayRun,
    ReplaySetupError,
)
from agent_blackbox.replayer._report import LEVEL_NAMES, ReplayReport
from agent_blackbox.replayer._sandbox import Nondeterminism, NondeterminismPolicy
from agent_blackbox.replayer._sources import (
    KafkaRunSource,
    SourceError,
    read_archive,
    write_archive,
)
from agent_blackbox.replayer._verify import (
    CheckpointStatus,
    DatabaseCheck,
    Problem,
    RecordedHead,
    VerifyReport,
    verify_run,
)

__all__ = [
    "LEVEL_NAMES",
    "AgentEntry",
    "AgentRegistry",
    "AssembledRun",
    "AsyncReplayRun",
    "BlobReader",
    "CallDiff",
    "CallSite",
    "Change",
    "CheckpointStatus",
    "DatabaseCheck",
    "DigestKeys",
    "Divergence",
    "DivergenceKind",
    "Endpoint",
    "ExportError",
    "ExportTally",
    "ForkDiff",
    "ForkError",
    "ForkResult",
    "Handled",
    "HistoryScan",
    "KafkaRunSource",
    "MissingEntryPoint",
    "Nondeterminism",
    "NondeterminismPolicy",
    "OpenedBody",
    "Opening",
    "PartitionFailed",
    "Problem",
    "ReadSide",
    "RecordedHead",
    "RecordedTools",
    "ReexecuteSetupError",
    "ReplayDivergence",
    "ReplayOptions",
    "ReplayReport",
    "ReplayResults",
    "ReplayRun",
    "ReplaySetupError",
    "Replaying",
    "RequestMapper",
    "RunHandler",
    "RunIndex",
    "RunLocation",
    "RunWork",
    "SkippedMessage",
    "SourceError",
    "ToolMode",
    "ToolNotRecorded",
    "UnknownAgent",
    "VerifyReport",
    "anthropic_sender",
    "chat_examples",
    "check_routes",
    "endpoints_for",
    "event_records",
    "fork_diff",
    "fork_replay_entry",
    "fork_run",
    "is_async_entry",
    "json_line",
    "load_entry",
    "load_replay_entry",
    "open_body",
    "openai_sender",
    "opening",
    "read_archive",
    "readable_body",
    "reexecute",
    "replay_indexed",
    "replay_run",
    "replay_run_async",
    "verify_run",
    "write_archive",
]
