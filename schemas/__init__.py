"""The contract both sides share: envelope, Avro schemas and codecs, canonical JSON,
schema migrators and compatibility checks.

This package is a leaf: it imports no other part of agent_blackbox.
"""

from agent_blackbox.schemas._canonical import (
    DIGEST_PREFIX,
    HMAC_PREFIX,
    Digester,
    JsonValue,
    KeyedDigest,
    canonical_json,
    canonical_text,
    digest,
    digest_bytes,
)
from agent_blackbox.schemas._checkpoint import (
    Checkpoint,
    CheckpointSigner,
    CheckpointVerifier,
    ForgedCheckpoint,
    SigningKeyError,
    key_fingerprint,
)
from agent_blackbox.schemas._codec import (
    CONFLUENT_MAGIC,
    SINGLE_OBJECT_MAGIC,
    BodyCodec,
    EnvelopeCodec,
    SchemaIdResolver,
)
from agent_blackbox.schemas._compat import (
    CompatibilityProblem,
    CompatibilityReport,
    Incompatibility,
    can_read,
    check_registry,
    incompatibilities,
)
from agent_blackbox.schemas._deletion import (
    DELETION_PURPOSE,
    REDACTED_SIGNED_VERSION,
    deletion_statement,
)
from agent_blackbox.schemas._display import safe_console, safe_text
from agent_blackbox.schemas._envelope import GENESIS_CHAIN_HASH, Envelope, next_chain_hash
from agent_blackbox.schemas._errors import (
    BlackboxError,
    BodyEncodingError,
    KeyUnavailable,
    MigrationFailed,
    NotSerialisable,
    PermissionRefused,
    UndecodableMessage,
    UnknownSchemaVersion,
    permission_refused,
)
from agent_blackbox.schemas._keyfile import (
    OTHERS_WRITE_FORBIDDEN,
    OWNER_ONLY_FORBIDDEN,
    read_checked_file,
)
from agent_blackbox.schemas._llm_call import (
    LLM_CALL_VERSION,
    llm_call_v1_to_v2,
    llm_tool_call,
    llm_usage,
)
from agent_blackbox.schemas._llm_reply import (
    LlmReply,
    choice_view,
    completion_view,
    llm_reply,
    tool_call_views,
)
from agent_blackbox.schemas._migrations import (
    BodyReader,
    Migrator,
    MigratorRegistry,
    Step,
    default_migrators,
)
from agent_blackbox.schemas._payload import (
    PLAIN_ENCODING,
    DataKey,
    PayloadContext,
    PayloadPipeline,
    PlaintextSealer,
    Sealed,
    Sealer,
)
from agent_blackbox.schemas._registry import ENVELOPE, SchemaEntry, SchemaRegistry, default_registry
from agent_blackbox.schemas._sealed_runs import (
    PLAINTEXT_IN_SEALED_RUN,
    PlaintextInSealedRun,
    SealedRunGuard,
    is_plaintext,
    is_sealed,
    refusing_plaintext,
)
from agent_blackbox.schemas._settings import DEFAULT_DATABASE_URL, DEFAULT_KAFKA_BOOTSTRAP, Settings
from agent_blackbox.schemas.event_types import EventType

__all__ = [
    "CONFLUENT_MAGIC",
    "DEFAULT_DATABASE_URL",
    "DEFAULT_KAFKA_BOOTSTRAP",
    "DELETION_PURPOSE",
    "DIGEST_PREFIX",
    "ENVELOPE",
    "GENESIS_CHAIN_HASH",
    "HMAC_PREFIX",
    "LLM_CALL_VERSION",
    "OTHERS_WRITE_FORBIDDEN",
    "OWNER_ONLY_FORBIDDEN",
    "PLAINTEXT_IN_SEALED_RUN",
    "PLAIN_ENCODING",
    "REDACTED_SIGNED_VERSION",
    "SINGLE_OBJECT_MAGIC",
    "BlackboxError",
    "BodyCodec",
    "BodyEncodingError",
    "BodyReader",
    "Checkpoint",
    "CheckpointSigner",
    "CheckpointVerifier",
    "CompatibilityProblem",
    "CompatibilityReport",
    "DataKey",
    "Digester",
    "Envelope",
    "EnvelopeCodec",
    "EventType",
    "ForgedCheckpoint",
    "Incompatibility",
    "JsonValue",
    "KeyUnavailable",
    "KeyedDigest",
    "LlmReply",
    "MigrationFailed",
    "Migrator",
    "MigratorRegistry",
    "NotSerialisable",
    "PayloadContext",
    "PayloadPipeline",
    "PermissionRefused",
    "PlaintextInSealedRun",
    "PlaintextSealer",
    "SchemaEntry",
    "SchemaIdResolver",
    "SchemaRegistry",
    "Sealed",
    "SealedRunGuard",
    "Sealer",
    "Settings",
    "SigningKeyError",
    "Step",
    "UndecodableMessage",
    "UnknownSchemaVersion",
    "can_read",
    "canonical_json",
    "canonical_text",
    "check_registry",
    "choice_view",
    "completion_view",
    "default_migrators",
    "default_registry",
    "deletion_statement",
    "digest",
    "digest_bytes",
    "incompatibilities",
    "is_plaintext",
    "is_sealed",
    "key_fingerprint",
    "llm_call_v1_to_v2",
    "llm_reply",
    "llm_tool_call",
    "llm_usage",
    "next_chain_hash",
    "permission_refused",
    "read_checked_file",
    "refusing_plaintext",
    "safe_console",
    "safe_text",
    "tool_call_views",
]
