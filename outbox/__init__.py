"""The write side: the Recorder SDK, the transactional outbox and the relay.

An agent process imports only this package (and ``schemas``): it never carries the
read side.
"""

from typing import TYPE_CHECKING

from agent_blackbox.outbox._async import AsyncRecorder, AsyncRun
from agent_blackbox.outbox._core import RunSnapshot
from agent_blackbox.outbox._effects import (
    EffectOutcome,
    EffectPolicy,
    EffectReceipt,
    EffectRefused,
    LiveEffects,
    LiveTools,
    RecordedTools,
    RefuseEffects,
    SandboxEffects,
    ToolNotRecorded,
    ToolPolicy,
)
from agent_blackbox.outbox._errors import (
    ConcurrentRunWriter,
    DatabaseUnavailable,
    EffectRejected,
    PayloadTooLarge,
    RecordedError,
    RunNotActive,
)
from agent_blackbox.outbox._kafka import BrokerUnavailable, ensure_topic, producer_config
from agent_blackbox.outbox._lifecycle import append_redaction_txn
from agent_blackbox.outbox._llm import completion_view
from agent_blackbox.outbox._memory import MemoryRecorder
from agent_blackbox.outbox._metrics import RelayMetrics
from agent_blackbox.outbox._migrate import migrate_write_side
from agent_blackbox.outbox._protocol import AgentRun
from agent_blackbox.outbox._recorder import Recorder, Run
from agent_blackbox.outbox._recovery import PendingEffect
from agent_blackbox.outbox._redaction import (
    DEFAULT_DETECTORS,
    DETECTORS,
    Redacted,
    RedactionConfigError,
    Redactor,
    placeholder,
)
from agent_blackbox.outbox._relay import EVENT_ID_HEADER, Relay, RelayOptions
from agent_blackbox.outbox._replay import (
    BlobReader,
    CallSite,
    DigestKeys,
    Divergence,
    DivergenceKind,
    ReplayDivergence,
    ReplayRun,
)
from agent_blackbox.outbox._tables import (
    NOTIFY_CHANNEL,
    SCHEMA,
    access_audit,
    blobs,
    data_keys,
    deletion_ledger,
    effects,
    outbox,
    relay_leases,
    relay_members,
    runs,
)
from agent_blackbox.outbox._writer import shard_of

if TYPE_CHECKING:
    from agent_blackbox.outbox._openai import (
        AsyncAgentRun,
        AsyncRecordedStream,
        CapturedAsyncOpenAI,
        CapturedOpenAI,
        RecordedStream,
        capture_openai,
    )

# The OpenAI capture needs the optional ``openai`` extra, so it is imported on first use
# rather than with the package: an agent without the SDK still imports ``outbox``.
_OPENAI_NAMES = frozenset(
    {
        "AsyncAgentRun",
        "AsyncRecordedStream",
        "CapturedAsyncOpenAI",
        "CapturedOpenAI",
        "RecordedStream",
        "capture_openai",
    }
)


def __getattr__(name: str) -> object:
    if name not in _OPENAI_NAMES:
        raise AttributeError(f"module agent_blackbox.outbox has no attribute {name!r}")
    try:
        from agent_blackbox.outbox import _openai
    except ModuleNotFoundError as exc:
        if exc.name != "openai":
            raise
        raise ImportError(
            f"agent_blackbox.outbox.{name} needs the openai SDK: "
            "pip install 'agent-blackbox[openai]'"
        ) from exc
    return getattr(_openai, name)


__all__ = [
    "DEFAULT_DETECTORS",
    "DETECTORS",
    "EVENT_ID_HEADER",
    "NOTIFY_CHANNEL",
    "SCHEMA",
    "AgentRun",
    "AsyncAgentRun",
    "AsyncRecordedStream",
    "AsyncRecorder",
    "AsyncRun",
    "BlobReader",
    "BrokerUnavailable",
    "CallSite",
    "CapturedAsyncOpenAI",
    "CapturedOpenAI",
    "ConcurrentRunWriter",
    "DatabaseUnavailable",
    "DigestKeys",
    "Divergence",
    "DivergenceKind",
    "EffectOutcome",
    "EffectPolicy",
    "EffectReceipt",
    "EffectRefused",
    "EffectRejected",
    "LiveEffects",
    "LiveTools",
    "MemoryRecorder",
    "PayloadTooLarge",
    "PendingEffect",
    "RecordedError",
    "RecordedStream",
    "RecordedTools",
    "Recorder",
    "Redacted",
    "RedactionConfigError",
    "Redactor",
    "RefuseEffects",
    "Relay",
    "RelayMetrics",
    "RelayOptions",
    "ReplayDivergence",
    "ReplayRun",
    "Run",
    "RunNotActive",
    "RunSnapshot",
    "SandboxEffects",
    "ToolNotRecorded",
    "ToolPolicy",
    "access_audit",
    "append_redaction_txn",
    "blobs",
    "capture_openai",
    "completion_view",
    "data_keys",
    "deletion_ledger",
    "effects",
    "ensure_topic",
    "migrate_write_side",
    "outbox",
    "placeholder",
    "producer_config",
    "relay_leases",
    "relay_members",
    "runs",
    "shard_of",
]
