"""The write side an agent records with: the Recorder SDK, the record/replay boundary
contract, redaction, the values a boundary records.

An agent usually imports :mod:`agent_blackbox` instead, whose few names come from here.
The write side's tables, ``*_txn`` functions and migrations are
:mod:`agent_blackbox.outbox.storage`, for the pipeline and integrators.

The public names are listed in ``__init__.pyi``; each is loaded from its module on first
use, so ``import agent_blackbox.outbox`` costs next to nothing and an agent carries only
what it touches. Nothing here loads a Kafka client, alembic (until a migration runs),
prometheus-client or rich: the relay (:mod:`agent_blackbox.outbox.relay`) and the LLM SDK
captures (:mod:`agent_blackbox.outbox.integrations`) are subpackages of their own.
"""

import importlib
import warnings

import lazy_loader

_lazy_getattr, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)

# Names this package exported before the relay, the Kafka layer, the OpenAI capture and
# replay mode moved to parts of their own: importing one says where it is now.
_MOVED = {
    "Relay": "agent_blackbox.outbox.relay",
    "RelayOptions": "agent_blackbox.outbox.relay",
    "RelayMetrics": "agent_blackbox.outbox.relay",
    "EVENT_ID_HEADER": "agent_blackbox.outbox.relay",
    "ensure_topic": "agent_blackbox.broker (as ensure_topics)",
    "producer_config": "agent_blackbox.broker",
    "BrokerUnavailable": "agent_blackbox.broker (as KafkaUnavailable)",
    "capture_openai": "agent_blackbox.outbox.integrations.openai",
    "CapturedOpenAI": "agent_blackbox.outbox.integrations.openai",
    "CapturedAsyncOpenAI": "agent_blackbox.outbox.integrations.openai",
    "RecordedStream": "agent_blackbox.outbox.integrations.openai",
    "AsyncRecordedStream": "agent_blackbox.outbox.integrations.openai",
    "ReplayRun": "agent_blackbox.replayer",
    "ReplayDivergence": "agent_blackbox.replayer",
    "Divergence": "agent_blackbox.replayer",
    "DivergenceKind": "agent_blackbox.replayer",
    "CallSite": "agent_blackbox.replayer",
    "BlobReader": "agent_blackbox.replayer",
    "DigestKeys": "agent_blackbox.replayer",
    "RecordedTools": "agent_blackbox.replayer",
    "ToolNotRecorded": "agent_blackbox.replayer",
    "append_redaction_txn": "agent_blackbox.outbox.lifecycle",
}

_STORAGE = "agent_blackbox.outbox.storage"
# Names this package exported until the storage names left the agent's import: they still
# work, for one release, with a DeprecationWarning naming where they are now. Each maps to
# (module, name there, what to do instead).
_DEPRECATED = {
    **{
        name: (_STORAGE, name, f"import it from {_STORAGE}")
        for name in (
            "EVERY_TENANT",
            "NOTIFY_CHANNEL",
            "SCHEMA",
            "PostgresBlobs",
            "RunHead",
            "access_audit",
            "blobs",
            "data_keys",
            "deletion_ledger",
            "effects",
            "grant_tenant_txn",
            "migrate_write_side",
            "outbox",
            "outbox_backlog_txn",
            "pending_events_txn",
            "relay_leases",
            "relay_members",
            "revoke_tenant_txn",
            "run_heads_txn",
            "runs",
            "shard_of",
            "tenant_grants",
            "tenant_grants_txn",
        )
    },
    "SyncRecorder": (
        "agent_blackbox.outbox._recorder",
        "RunLogRecorder",
        "construct agent_blackbox.Recorder (Postgres) or agent_blackbox.testing.MemoryRecorder,"
        " and annotate with `Recorder | MemoryRecorder` where either will do",
    ),
    "AsyncRecorderBase": (
        "agent_blackbox.outbox._async",
        "AsyncRunLogRecorder",
        "construct agent_blackbox.AsyncRecorder (Postgres) or "
        "agent_blackbox.testing.AsyncMemoryRecorder, and annotate with "
        "`AsyncRecorder | AsyncMemoryRecorder` where either will do",
    ),
}


def __getattr__(name: str) -> object:
    deprecated = _DEPRECATED.get(name)
    if deprecated is not None:
        module, attribute, instead = deprecated
        warnings.warn(
            f"agent_blackbox.outbox.{name} is deprecated and goes in the next release: {instead}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(module), attribute)
    moved = _MOVED.get(name)
    if moved is not None:
        # ImportError, not AttributeError: ``from ... import`` shows this message only then.
        raise ImportError(
            f"agent_blackbox.outbox.{name} is not part of the agent's package: import it "
            f"from {moved}"
        )
    return _lazy_getattr(name)
