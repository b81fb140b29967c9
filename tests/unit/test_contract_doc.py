"""docs/reference/other-languages.md says what the code does: its worked examples,
names, bytes and tables are taken from the page and checked against the code."""

from __future__ import annotations

import re
from pathlib import Path

from agent_blackbox.broker import LEASE_HEADER
from agent_blackbox.broker._partitioning import murmur2, partition_of
from agent_blackbox.consumers._dead_letters import (
    DLQ_OFFSET,
    DLQ_PARTITION,
    DLQ_REASON,
    DLQ_TOPIC,
)
from agent_blackbox.keystore._sealer import LEGACY_SEALED_ENCODING, SEALED_ENCODING
from agent_blackbox.outbox.relay import EVENT_ID_HEADER
from agent_blackbox.replayer import read_archive
from agent_blackbox.schemas import (
    C14N_ATTRIBUTE,
    GENESIS_CHAIN_HASH,
    RFC8785,
    EnvelopeCodec,
    Settings,
    default_registry,
    digest,
    rfc8785_json,
)
from agent_blackbox.schemas._payload import _AAD_LABEL

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "reference" / "other-languages.md").read_text(encoding="utf-8")
GOLDEN = ROOT / "tests" / "golden"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", PAGE, flags=re.DOTALL)


def test_the_chain_example_is_the_golden_historys_first_event() -> None:
    first = next(iter(read_archive(GOLDEN / "contract.rfc8785.avro")))
    material = first.chain_material().decode()
    assert material + "\n" in _blocks("json")
    assert f"```text\n{first.chain_hash}\n```" in PAGE
    assert first.expected_chain_hash(GENESIS_CHAIN_HASH) == first.chain_hash


def test_the_digest_example_is_what_each_form_digests() -> None:
    written = next(b for b in _blocks("json") if '"provider":"openai"' in b).strip()
    request = {
        "model": "gpt-test",
        "messages": [{"role": "user", "content": "hi"}],
        "top_p": 1e-05,
        "temperature": 1.0,
        "seed": 9007199254740993,
    }
    value = {"provider": "openai", "model": "gpt-test", "request": request}
    assert rfc8785_json(value).decode() == written
    assert f"rfc8785: {RFC8785.digest(value)}" in PAGE
    assert f"v1:      {digest(value)}" in PAGE
    assert '"seed":9007199254740993,"temperature":1.0,"top_p":1e-05}}' in PAGE


def test_names_headers_and_encodings_are_the_codes() -> None:
    for name in (EVENT_ID_HEADER, LEASE_HEADER, DLQ_REASON, DLQ_TOPIC, DLQ_PARTITION, DLQ_OFFSET):
        assert f"`{name}`" in PAGE
    assert f"`{C14N_ATTRIBUTE}`" in PAGE
    assert f"`{Settings().topic}`" in PAGE
    assert f"{Settings().partitions} partitions" in PAGE
    for encoding in ("avro+zstd-d1", "avro+zstd", "avro+deflate", LEGACY_SEALED_ENCODING):
        assert f"`{encoding}`" in PAGE
    assert SEALED_ENCODING == "avro+aes256gcm+aad2"
    assert f'"{_AAD_LABEL}"' in PAGE


def test_the_framing_bytes_are_the_envelope_codecs() -> None:
    first = next(iter(read_archive(GOLDEN / "contract.rfc8785.avro")))
    head = EnvelopeCodec().encode(first)[:10]
    assert f"{head[:2].hex(' ')}                      magic" in PAGE
    assert f"\n{head[2:].hex(' ')}    CRC-64-AVRO" in PAGE


def test_the_partition_formula_is_the_relays() -> None:
    for key in (b"run-1", b"00000000-0000-4000-8000-00000000c001", "é".encode()):
        assert partition_of(key, 12) == (murmur2(key) & 0x7FFFFFFF) % 12
    assert "`(murmur2(key) & 0x7fffffff) % partitions`" in PAGE


def test_the_version_table_lists_every_schema_file() -> None:
    registry = default_registry()
    rows = dict(re.findall(r"^\| `([a-z_.]+)` \| ([0-9, ]+) \|$", PAGE, flags=re.MULTILINE))
    assert rows == {
        name: ", ".join(map(str, registry.versions(name))) for name in registry.event_types()
    }


def test_the_digest_table_covers_every_event_type() -> None:
    section = PAGE.split("## Digests", 1)[1].split("###", 1)[0]
    listed = set(re.findall(r"^\| `([a-z_.]+)` \|", section, flags=re.MULTILINE))
    assert listed == set(default_registry().event_types())


def test_the_jvm_figures_are_the_golden_histories() -> None:
    histories = [list(read_archive(path)) for path in sorted(GOLDEN.glob("*.avro"))]
    runs = sum(len({e.run_id for e in events}) for events in histories)
    count = sum(len(events) for events in histories)
    sealed = sum(1 for events in histories for e in events if e.key_id is not None)
    assert f"({runs} runs, {count} events)" in PAGE
    assert f"sealed ({count - sealed}; the {sealed} sealed" in PAGE
