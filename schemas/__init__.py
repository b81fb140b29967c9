"""The contract both sides share: envelope, Avro schemas and codecs, canonical JSON.

This package is a leaf: it imports none of ``outbox``, ``consumers`` or ``replayer``.
"""

from schemas._canonical import (
    DIGEST_PREFIX,
    JsonValue,
    canonical_json,
    canonical_text,
    digest,
    digest_bytes,
)
from schemas._codec import (
    CONFLUENT_MAGIC,
    SINGLE_OBJECT_MAGIC,
    BodyCodec,
    EnvelopeCodec,
    SchemaIdResolver,
)
from schemas._envelope import GENESIS_CHAIN_HASH, Envelope, next_chain_hash
from schemas._errors import (
    BlackboxError,
    BodyEncodingError,
    NotSerialisable,
    UndecodableMessage,
    UnknownSchemaVersion,
)
from schemas._payload import (
    PLAIN_ENCODING,
    PayloadContext,
    PayloadPipeline,
    PlaintextSealer,
    Sealed,
    Sealer,
)
from schemas._registry import ENVELOPE, SchemaEntry, SchemaRegistry, default_registry
from schemas._settings import DEFAULT_DATABASE_URL, DEFAULT_KAFKA_BOOTSTRAP, Settings
from schemas.event_types import EventType

__all__ = [
    "CONFLUENT_MAGIC",
    "DEFAULT_DATABASE_URL",
    "DEFAULT_KAFKA_BOOTSTRAP",
    "DIGEST_PREFIX",
    "ENVELOPE",
    "GENESIS_CHAIN_HASH",
    "PLAIN_ENCODING",
    "SINGLE_OBJECT_MAGIC",
    "BlackboxError",
    "BodyCodec",
    "BodyEncodingError",
    "Envelope",
    "EnvelopeCodec",
    "EventType",
    "JsonValue",
    "NotSerialisable",
    "PayloadContext",
    "PayloadPipeline",
    "PlaintextSealer",
    "SchemaEntry",
    "SchemaIdResolver",
    "SchemaRegistry",
    "Sealed",
    "Sealer",
    "Settings",
    "UndecodableMessage",
    "UnknownSchemaVersion",
    "canonical_json",
    "canonical_text",
    "default_registry",
    "digest",
    "digest_bytes",
    "next_chain_hash",
]
