"""Apache Avro's own compatibility check passes between the body versions of every event
type (renamed fields carry their old names as aliases), and nothing on the wire changed:
the fingerprints of every schema are those written before the aliases."""

from __future__ import annotations

import io
from itertools import combinations

import avro.schema
import pytest
from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType
from fastavro import schemaless_reader, schemaless_writer

from agent_blackbox.schemas import default_registry, incompatibilities
from agent_blackbox.schemas._registry import AVSC_DIR

REGISTRY = default_registry()
PAIRS = [
    (name, older, newer)
    for name in (*REGISTRY.event_types(), "envelope")
    for older, newer in combinations(REGISTRY.versions(name), 2)
]


def _apache(name: str, version: int) -> avro.schema.Schema:
    return avro.schema.parse((AVSC_DIR / f"{name}.v{version}.avsc").read_text(encoding="utf-8"))


@pytest.mark.parametrize(("name", "older", "newer"), PAIRS)
def test_apache_avro_finds_every_newer_version_reads_every_older_one(
    name: str, older: int, newer: int
) -> None:
    result = ReaderWriterCompatibilityChecker().get_compatibility(
        _apache(name, newer), _apache(name, older)
    )
    assert result.compatibility == SchemaCompatibilityType.compatible, result.messages
    # The project's own check (which plans reads) agrees.
    reader, writer = REGISTRY.get(name, newer).parsed, REGISTRY.get(name, older).parsed
    assert incompatibilities(reader, writer) == ()


def test_consecutive_versions_of_every_type_with_more_than_one_are_checked() -> None:
    checked = {(name, older, newer) for name, older, newer in PAIRS if newer == older + 1}
    assert ("llm.call", 1, 2) in checked
    assert ("llm.call", 3, 4) in checked
    assert len(checked) == sum(len(REGISTRY.versions(n)) - 1 for n in REGISTRY.event_types())


# Written by the releases before the aliases: single-object encoding carries the
# envelope's, and readers (in any language) find body schemas by type and version.
FINGERPRINTS = {
    ("clock.read", 1): "c0b7187651074192",
    ("effect.intent", 1): "dab3acc5b32f79d8",
    ("effect.receipt", 1): "f8146b3aa453a999",
    ("effect.receipt", 2): "b452a51e2b042784",
    ("envelope", 1): "0474aad37223f5e6",
    ("llm.call", 1): "38276347d27a89fa",
    ("llm.call", 2): "98a26240de8f6ffa",
    ("llm.call", 3): "dd38240d5fc92953",
    ("llm.call", 4): "398a767f4d1da3a9",
    ("random.draw", 1): "4a5cd417ce7d854d",
    ("retrieval", 1): "32627991503168bb",
    ("run.finished", 1): "c36f0afb765a46b6",
    ("run.finished", 2): "bf5c30cd777b2967",
    ("run.redacted", 1): "7e8795e012eab8bc",
    ("run.redacted", 2): "f188696913ef6a31",
    ("run.started", 1): "310693fcf8904fa1",
    ("run.started", 2): "e2c519de43912e39",
    ("state.transition", 1): "3134145cd035eb5e",
    ("tool.call", 1): "20ad2e3d2b18086d",
    ("tool.call", 2): "d2f4efab47e1265f",
}


def test_aliases_change_no_fingerprint() -> None:
    found = {(e.name, e.version): e.fingerprint.hex() for e in REGISTRY}
    assert found == FINGERPRINTS


def test_avro_resolution_alone_reads_a_v1_usage_under_its_new_names() -> None:
    v1 = REGISTRY.get("llm.call", 1).parsed
    body = {
        "provider": "openai",
        "model": "m",
        "request_params_json": "{}",
        "raw_request_json": "{}",
        "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
        "latency_ms": 1.5,
    }
    out = io.BytesIO()
    schemaless_writer(out, v1, body)
    out.seek(0)
    read = schemaless_reader(out, v1, REGISTRY.get("llm.call", 4).parsed)
    assert read["usage"] == {
        "input_tokens": 7,
        "output_tokens": 3,
        "cached_tokens": 0,
        "total_tokens": 10,
    }
