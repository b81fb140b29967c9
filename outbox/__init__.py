"""The write side an agent imports: the Recorder SDK, the record/replay boundary contract,
redaction, and the write side's tables and migrations.

The public names are listed in ``__init__.pyi``; each is loaded from its module on first
use, so ``import agent_blackbox.outbox`` costs next to nothing and an agent carries only
what it touches. Nothing here loads a Kafka client, alembic (until a migration runs),
prometheus-client or rich: the relay (:mod:`agent_blackbox.outbox.relay`) and the LLM SDK
captures (:mod:`agent_blackbox.outbox.integrations`) are subpackages of their own.
"""

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


def __getattr__(name: str) -> object:
    moved = _MOVED.get(name)
    if moved is not None:
        # ImportError, not AttributeError: ``from ... import`` shows this message only then.
        raise ImportError(
            f"agent_blackbox.outbox.{name} is not part of the agent's package: import it "
            f"from {moved}"
        )
    return _lazy_getattr(name)
