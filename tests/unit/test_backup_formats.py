"""The backup's file formats: signed manifests, event segments, snapshot tables, and the
manifest chain a restore walks (a folder store under tmp_path; no service)."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import uuid
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from agent_blackbox.backup import BackupCorrupt, ChainProblem, FolderStore, check_key, load_chain
from agent_blackbox.backup._chain import manifest_numbers
from agent_blackbox.backup._manifest import (
    GENESIS_MANIFEST,
    LostRange,
    Manifest,
    RunRange,
    SegmentEntry,
    SnapshotEntry,
    TableEntry,
    manifest_key,
)
from agent_blackbox.backup._segment import (
    NO_EVENTS_DIGEST,
    Message,
    RunSpan,
    SegmentBuilder,
    decode_segment,
    encode_segment,
    roll_digest,
)
from agent_blackbox.backup._snapshot import (
    TABLES,
    TABLES_BY_NAME,
    blob_key,
    decode_table,
    encode_table,
)
from agent_blackbox.schemas import (
    CheckpointSigner,
    CheckpointVerifier,
    Envelope,
    EnvelopeCodec,
    canonical_json,
)

SIGNER = CheckpointSigner.generate(key_id="backup-test")
VERIFIER = CheckpointVerifier({SIGNER.key_id: SIGNER.public_key})
CODEC = EnvelopeCodec()
CREATED = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
TOPIC = "blackbox.events"


def _sha(label: str) -> str:
    return hashlib.sha256(label.encode()).hexdigest()


def _manifest(
    number: int = 1, *, previous: str = GENESIS_MANIFEST, created_at: datetime = CREATED
) -> Manifest:
    """A signed manifest with a bit of everything: two runs, an undecodable message,
    two partitions, two tables, two KEK versions and a lost range."""
    first = 100 * number
    segment = SegmentEntry(
        key=f"segments/0/{first:020d}.avro",
        sha256=_sha(f"segment {number}"),
        size=2048,
        partition=0,
        first_offset=first,
        last_offset=first + 9,
        count=10,
        first_timestamp_ms=1_772_366_400_000 + first,
        last_timestamp_ms=1_772_366_400_000 + first + 9,
        event_digest=_sha(f"events {number}"),
        undecodable=1,
        runs=(RunRange("run-a", 1, 6, 6), RunRange("run-b", 3, 5, 3)),
    )
    tables = {
        name: TableEntry(f"snapshots/{name}/{_sha(name)}.avro", _sha(name), rows)
        for name, rows in (("runs", 2), ("blobs", 1))
    }
    return Manifest(
        number=number,
        previous=previous,
        topic=TOPIC,
        created_at=created_at.isoformat(),
        segments=(segment,),
        positions={0: first + 10, 1: 7},
        snapshot=SnapshotEntry(
            taken_at=created_at.isoformat(),
            tables=tables,
            kek_versions=("kek-1", "kek-2"),
            blobs=1,
        ),
        lost=(LostRange(1, 0, 7),),
    ).signed(SIGNER)


MANIFEST = _manifest(7)
KEY = MANIFEST.key
STORED = MANIFEST.to_bytes()


# Manifests: the stored form, and what a reader refuses.


def test_manifest_keys_are_zero_padded_so_they_sort_in_number_order() -> None:
    assert manifest_key(7) == "manifests/000000000007.json"
    numbers = [10, 9, 100, 1]
    assert sorted(manifest_key(n) for n in numbers) == [manifest_key(n) for n in sorted(numbers)]


def test_a_signed_manifest_reads_back_equal_and_verifies() -> None:
    parsed = Manifest.from_bytes(STORED, key=KEY)
    assert parsed == MANIFEST
    assert parsed.signer_key_id == SIGNER.key_id
    assert parsed.signature_problem(VERIFIER) is None
    assert parsed.to_bytes() == STORED


def test_the_digest_is_the_sha256_of_the_stored_form() -> None:
    assert MANIFEST.digest == hashlib.sha256(STORED).hexdigest()
    assert _manifest(8).digest != MANIFEST.digest


def test_the_stored_form_is_the_signed_statement_and_the_signature_in_base64() -> None:
    doc = json.loads(STORED)
    assert base64.b64decode(doc.pop("signature")) == MANIFEST.signature
    assert doc == MANIFEST.statement()
    assert doc["purpose"] == "agent-blackbox backup manifest v1"


@pytest.mark.parametrize(
    ("data", "says"),
    [
        pytest.param(STORED[:-1], "not valid JSON", id="truncated"),
        pytest.param(STORED[: len(STORED) // 2], "not valid JSON", id="half"),
        pytest.param(b"", "not valid JSON", id="empty"),
        pytest.param(b"manifest", "not valid JSON", id="not-json"),
        pytest.param(b"\xff\xfe\xfd", "not valid JSON", id="not-utf8"),
        pytest.param(b"[1, 2]", "manifest is not an object", id="a-list"),
        pytest.param(b'"text"', "manifest is not an object", id="a-string"),
        pytest.param(b"null", "manifest is not an object", id="null"),
        pytest.param(b"{}", "not a backup manifest", id="empty-object"),
        pytest.param(
            b"[" * 100_000,
            "not valid JSON",
            id="nested-too-deep",
        ),
    ],
)
def test_bytes_that_are_not_a_manifest_are_corrupt_naming_the_key(data: bytes, says: str) -> None:
    with pytest.raises(BackupCorrupt) as refused:
        Manifest.from_bytes(data, key=KEY)
    assert KEY in str(refused.value)
    assert says in str(refused.value)


_GONE = object()


def _edited(path: tuple[str | int, ...], value: object) -> bytes:
    """The stored manifest with the field at ``path`` set to ``value`` (or removed)."""
    doc: Any = json.loads(STORED)
    *parents, last = path
    target = doc
    for step in parents:
        target = target[step]
    if value is _GONE:
        del target[last]
    else:
        target[last] = value
    return canonical_json(doc)


@pytest.mark.parametrize(
    ("path", "value", "says"),
    [
        (("topic",), _GONE, "field 'topic' is missing or not a str"),
        (("segments",), _GONE, "field 'segments' is missing or not a list"),
        (("signature",), _GONE, "field 'signature' is missing or not a str"),
        (("number",), "7", "field 'number' is missing or not a int"),
        (("number",), True, "field 'number' is missing or not a int"),
        (("number",), 7.0, "field 'number' is missing or not a int"),
        (("segments", 0, "count"), True, "field 'count' is missing or not a int"),
        (("segments", 0, "size"), "2048", "field 'size' is missing or not a int"),
        (("segments", 0, "key"), None, "field 'key' is missing or not a str"),
        (("snapshot", "blobs"), False, "field 'blobs' is missing or not a int"),
        (("snapshot", "tables", "runs", "rows"), "2", "field 'rows' is missing or not a int"),
        (("snapshot", "tables", "runs"), "x", "snapshot table 'runs' is not an object"),
        (("snapshot", "kek_versions"), ["kek-1", 2], "kek_versions holds something other"),
        (("snapshot",), [], "field 'snapshot' is missing or not a dict"),
        (("segments", 0), "x", "a segment entry is not an object"),
        (("purpose",), "agent-blackbox checkpoint v1", "not a backup manifest of this format"),
        (("purpose",), _GONE, "not a backup manifest of this format"),
        (("previous",), "A" * 64, "field 'previous' is not a SHA-256 in hex"),
        (("previous",), "0" * 63, "field 'previous' is not a SHA-256 in hex"),
        (("previous",), "0" * 65, "field 'previous' is not a SHA-256 in hex"),
        (("previous",), "g" * 64, "field 'previous' is not a SHA-256 in hex"),
        (("previous",), "sha256:" + "0" * 57, "field 'previous' is not a SHA-256 in hex"),
        (("segments", 0, "sha256"), "ab", "field 'sha256' is not a SHA-256 in hex"),
        (("segments", 0, "event_digest"), 1, "field 'event_digest' is missing or not a str"),
        (("signature",), "not base64!", "the signature is not base64"),
        (("signature",), "QUJ", "the signature is not base64"),
        (("positions",), {"0": "3"}, "positions are malformed"),
        (("positions",), {"0": True}, "positions are malformed"),
        (("positions",), {"p0": 3}, "positions are malformed"),
        (("segments", 0, "runs"), "run-a", "field 'runs' is missing or not a list"),
        (("segments", 0, "runs", 0), {"run_id": "run-a"}, "a run range is not a list"),
        (("segments", 0, "runs", 0), ["run-a", 1], "a run range is malformed"),
        (("segments", 0, "runs", 0), ["run-a", "one", 6, 6], "a run range is malformed"),
        pytest.param(
            ("segments", 0, "runs", 0),
            ["run-a", "1", 6, 6],
            "a run range is malformed",
            id="run-range-string-number",
        ),
        pytest.param(
            ("segments", 0, "runs", 0),
            ["run-a", True, 6, 6],
            "a run range is malformed",
            id="run-range-boolean",
        ),
        pytest.param(
            ("segments", 0, "runs", 0),
            ["run-a", 1, 6, 6, 99],
            "a run range is malformed",
            id="run-range-too-long",
        ),
        (("lost",), "x", "field 'lost' is missing or not a list"),
        (("lost", 0), 5, "a lost range is not a list"),
        (("lost", 0), [1, 0], "a lost range is malformed"),
        (("lost", 0), [1, "0", 7], "a lost range is malformed"),
        (("lost", 0), [1, False, 7], "a lost range is malformed"),
        (("lost", 0), [1, 0, 7.5], "a lost range is malformed"),
        pytest.param(
            ("lost", 0),
            [1, 0, 7, 99],
            "a lost range is malformed",
            id="lost-range-too-long",
        ),
    ],
)
def test_a_broken_field_is_corrupt_naming_the_key_and_what_is_wrong(
    path: tuple[str | int, ...], value: object, says: str
) -> None:
    with pytest.raises(BackupCorrupt) as refused:
        Manifest.from_bytes(_edited(path, value), key=KEY)
    assert str(refused.value).startswith(f"manifest {KEY}")
    assert says in str(refused.value)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("segments", 0, "count"), 11),
        (("segments", 0, "runs", 0, 2), 7),
        (("segments", 0, "event_digest"), _sha("other events")),
        (("positions", "0"), 0),
        (("previous",), _sha("another manifest")),
        (("created_at",), "2026-03-02T12:00:00+00:00"),
        (("snapshot", "tables", "runs", "rows"), 3),
        (("snapshot", "kek_versions"), ["kek-1"]),
        (("lost",), []),
        (("topic",), "other.events"),
    ],
)
def test_a_manifest_changed_after_signing_no_longer_verifies(
    path: tuple[str | int, ...], value: object
) -> None:
    changed = Manifest.from_bytes(_edited(path, value), key=KEY)
    assert changed != MANIFEST
    problem = changed.signature_problem(VERIFIER)
    assert problem is not None
    assert "does not verify" in problem


def test_a_manifest_signed_by_an_unknown_key_names_that_key() -> None:
    stranger = CheckpointSigner.generate(key_id="stranger-key")
    signed = Manifest.from_bytes(MANIFEST.signed(stranger).to_bytes(), key=KEY)
    problem = signed.signature_problem(VERIFIER)
    assert problem is not None
    assert "'stranger-key'" in problem


def test_a_manifest_signed_by_another_key_under_a_known_key_id_does_not_verify() -> None:
    impostor = CheckpointSigner.generate(key_id=SIGNER.key_id)
    problem = MANIFEST.signed(impostor).signature_problem(VERIFIER)
    assert problem is not None
    assert "does not verify" in problem


def test_an_unsigned_manifest_does_not_verify() -> None:
    unsigned = Manifest.from_bytes(_edited(("signature",), ""), key=KEY)
    assert unsigned.signature == b""
    assert unsigned.signature_problem(VERIFIER) is not None


# Event segments.


MESSAGES = [
    Message(100, 1_772_366_400_000, b"run-a", b"\x00\x01 envelope", (("trace", b"t-1"),)),
    Message(101, 1_772_366_400_001, None, b"keyless"),
    Message(102, 1_772_366_400_002, b"run-a", None, (("why", None), ("who", b""))),
    Message(104, 1_772_366_400_009, b"", bytes(range(256)), (("a", b"1"), ("a", b"2"))),
]


def test_the_same_messages_encode_to_the_same_bytes() -> None:
    assert encode_segment(TOPIC, 3, MESSAGES) == encode_segment(TOPIC, 3, list(MESSAGES))


@pytest.mark.parametrize(
    ("topic", "partition", "shift"),
    [(TOPIC, 3, 1), (TOPIC, 4, 0), ("other.events", 3, 0)],
)
def test_another_range_encodes_to_other_bytes(topic: str, partition: int, shift: int) -> None:
    moved = [Message(m.offset + shift, m.timestamp_ms, m.key, m.value, m.headers) for m in MESSAGES]
    assert encode_segment(topic, partition, moved) != encode_segment(TOPIC, 3, MESSAGES)


def test_a_segment_decodes_to_its_messages() -> None:
    data = encode_segment(TOPIC, 3, MESSAGES)
    assert list(decode_segment(data, key="segments/3/x.avro")) == MESSAGES


def test_a_segment_holds_at_least_one_message() -> None:
    with pytest.raises(ValueError, match="at least one message"):
        encode_segment(TOPIC, 3, [])


SEGMENT_KEY = "segments/3/00000000000000000100.avro"


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"garbage, not avro", id="garbage"),
        pytest.param(b"Obj\x01", id="header-cut-short"),
        pytest.param(encode_segment(TOPIC, 3, MESSAGES)[:-20], id="truncated"),
        pytest.param(
            encode_table(
                TABLES_BY_NAME["blobs"], [{"digest": "sha256:" + _sha("b"), "tenant_id": "t"}]
            )[0],
            id="a-snapshot-table",
        ),
    ],
)
def test_bytes_that_are_not_a_segment_are_corrupt_naming_the_key(data: bytes) -> None:
    with pytest.raises(BackupCorrupt, match=re.escape(SEGMENT_KEY)):
        list(decode_segment(data, key=SEGMENT_KEY))


# Building a segment: what the manifest says of it.


def _envelope(run_id: str, sequence: int) -> Envelope:
    return Envelope(
        event_id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"{run_id}/{sequence}")),
        run_id=run_id,
        sequence=sequence,
        event_type="tool.call",
        body_version=1,
        recorded_at=datetime(2026, 3, 1, tzinfo=UTC),
        tenant_id="acme",
        agent_id="agent",
        input_digest="sha256:" + "0" * 64,
        output_digest="sha256:" + "0" * 64,
        chain_hash="",
    )


def _message(offset: int, value: bytes | None, key: bytes | None = b"k") -> Message:
    return Message(offset, 1_772_366_400_000 + offset, key, value)


# In offset order; run-a's sequences arrive out of order, run-b starts mid-run.
ENVELOPES = [
    _envelope("run-a", 2),
    _envelope("run-b", 4),
    _envelope("run-a", 1),
    _envelope("run-a", 3),
    _envelope("run-b", 5),
]


def _built() -> SegmentBuilder:
    builder = SegmentBuilder(TOPIC, 3, CODEC)
    values: list[bytes | None] = [CODEC.encode(e) for e in ENVELOPES[:2]]
    values += [b"not an envelope", None]
    values += [CODEC.encode(e) for e in ENVELOPES[2:]]
    for offset, value in enumerate(values, start=50):
        builder.add(_message(offset, value))
    return builder


def test_a_builder_keeps_each_runs_first_and_last_sequence_and_count() -> None:
    builder = _built()
    assert builder.runs == {"run-a": RunSpan(1, 3, 3), "run-b": RunSpan(4, 5, 2)}
    assert (builder.first_offset, builder.last_offset) == (50, 56)


def test_the_event_digest_rolls_over_the_event_ids_in_offset_order() -> None:
    expected = NO_EVENTS_DIGEST
    for envelope in ENVELOPES:
        expected = roll_digest(expected, envelope.event_id)
    assert _built().event_digest == expected


def test_the_rolling_digest_is_sha256_of_the_digest_and_the_event_id() -> None:
    event_id = ENVELOPES[0].event_id
    step = hashlib.sha256(bytes.fromhex(NO_EVENTS_DIGEST) + event_id.encode()).hexdigest()
    assert roll_digest(NO_EVENTS_DIGEST, event_id) == step
    a, b = (e.event_id for e in ENVELOPES[:2])
    assert roll_digest(roll_digest(NO_EVENTS_DIGEST, a), b) != roll_digest(
        roll_digest(NO_EVENTS_DIGEST, b), a
    )


def test_the_digest_of_no_events_never_changes() -> None:
    # Every stored manifest's digests start here: changing it breaks every backup.
    assert hashlib.sha256(b"agent-blackbox backup event ids").hexdigest() == NO_EVENTS_DIGEST
    assert SegmentBuilder(TOPIC, 3, CODEC).event_digest == NO_EVENTS_DIGEST


def test_an_undecodable_value_is_kept_and_counted_without_a_run() -> None:
    builder = SegmentBuilder(TOPIC, 3, CODEC)
    builder.add(_message(7, b"not an envelope"))
    builder.add(_message(8, None, key=None))
    assert builder.undecodable == 2
    assert builder.runs == {}
    assert builder.event_digest == NO_EVENTS_DIGEST
    assert [m.offset for m in builder.messages] == [7, 8]
    assert builder.size == len(b"not an envelope") + len(b"k")


def test_a_built_segment_is_the_encoding_of_its_messages_and_decodes_back() -> None:
    builder = _built()
    data = builder.encode()
    assert data == encode_segment(TOPIC, 3, builder.messages)
    assert list(decode_segment(data, key=SEGMENT_KEY)) == builder.messages
    assert builder.size == sum(len(m.value or b"") + len(m.key or b"") for m in builder.messages)


# Snapshot tables.


AT = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)
ELSEWHERE = datetime(2026, 3, 1, 14, 30, tzinfo=timezone(timedelta(hours=2)))

SAMPLE_ROWS: dict[str, list[dict[str, Any]]] = {
    "runs": [
        {
            "run_id": "run-a",
            "tenant_id": "acme",
            "agent_id": "agent",
            "subject_ids": ["customer-1", "customer-2"],
            "status": "finished",
            "last_sequence": 7,
            "chain_head": _sha("head"),
            "parent_run_id": None,
            "code_version": "v1",
            "state": None,
            "classification": "internal",
            "retention_class": "standard",
            "created_at": AT,
            "updated_at": ELSEWHERE,
        },
    ],
    "effects": [
        {
            "run_id": "run-a",
            "idempotency_key": "idem-1",
            "effect": "email.send",
            "intent_sequence": 3,
            "status": "done",
            "external_id": None,
            "created_at": AT,
            "updated_at": AT,
        },
    ],
    "data_keys": [
        {
            "key_id": "dk-1",
            "run_id": "run-a",
            "tenant_id": "acme",
            "kek_version": "kek-1",
            "wrapped": b"\x00\xffwrapped",
            "created_at": AT,
            "destroyed_at": None,
            "destroyed_reason": None,
        },
        {
            "key_id": "dk-2",
            "run_id": "run-b",
            "tenant_id": "acme",
            "kek_version": "kek-2",
            "wrapped": None,
            "created_at": AT,
            "destroyed_at": ELSEWHERE,
            "destroyed_reason": "erasure request",
        },
    ],
    "tenant_keys": [
        {"tenant_id": "acme", "kek_version": "kek-1", "wrapped": b"\x01\x02", "created_at": AT},
    ],
    "deletion_ledger": [
        {
            "id": 1,
            "at": AT,
            "action": "shred",
            "run_id": "run-b",
            "key_ids": ["dk-2"],
            "subject_id": "customer-2",
            "reason": "erasure request",
            "principal": "dpo@acme",
        },
        {
            "id": 2,
            "at": ELSEWHERE,
            "action": "expire",
            "run_id": "run-c",
            "key_ids": [],
            "subject_id": None,
            "reason": "retention",
            "principal": "retention-job",
        },
    ],
    "checkpoints": [
        {
            "run_id": "run-a",
            "tenant_id": "acme",
            "last_sequence": 7,
            "chain_head": _sha("head"),
            "signer_key_id": "signer-1",
            "signature": "c2lnbmF0dXJl",
            "signed_at": AT,
            "finished": True,
        },
        {
            "run_id": "run-b",
            "tenant_id": "acme",
            "last_sequence": 2,
            "chain_head": _sha("b"),
            "signer_key_id": "signer-1",
            "signature": "c2lnbmF0dXJl",
            "signed_at": AT,
            "finished": None,
        },
    ],
    "blobs": [
        {"digest": "sha256:" + _sha("blob 1"), "tenant_id": "t"},
        {"digest": "sha256:" + _sha("blob 2"), "tenant_id": "t"},
    ],
}


def test_every_snapshot_table_has_sample_rows_here() -> None:
    assert [table.name for table in TABLES] == list(TABLES_BY_NAME)
    assert set(SAMPLE_ROWS) == set(TABLES_BY_NAME)


@pytest.mark.parametrize("name", list(TABLES_BY_NAME))
def test_the_same_rows_encode_to_the_same_bytes_and_count(name: str) -> None:
    table, rows = TABLES_BY_NAME[name], SAMPLE_ROWS[name]
    data, count = encode_table(table, rows)
    assert count == len(rows)
    assert encode_table(table, iter(rows)) == (data, count)


@pytest.mark.parametrize("name", list(TABLES_BY_NAME))
def test_a_table_decodes_to_its_rows(name: str) -> None:
    table, rows = TABLES_BY_NAME[name], SAMPLE_ROWS[name]
    data, _ = encode_table(table, rows)
    assert list(decode_table(table, data, key=f"snapshots/{name}/x.avro")) == rows


def test_timestamps_come_back_timezone_aware_and_bytes_and_nulls_as_they_were() -> None:
    table = TABLES_BY_NAME["data_keys"]
    data, _ = encode_table(table, SAMPLE_ROWS["data_keys"])
    kept, destroyed = decode_table(table, data, key="snapshots/data_keys/x.avro")
    assert kept["created_at"] == AT
    assert kept["created_at"].utcoffset() == timedelta(0)
    assert destroyed["destroyed_at"] == ELSEWHERE
    assert destroyed["destroyed_at"].tzinfo is not None
    assert (kept["wrapped"], destroyed["wrapped"]) == (b"\x00\xffwrapped", None)
    assert (kept["destroyed_at"], kept["destroyed_reason"]) == (None, None)


@pytest.mark.parametrize(
    ("written", "read"),
    [(w, r) for w in TABLES_BY_NAME for r in TABLES_BY_NAME if w != r],
)
def test_a_file_of_one_table_read_as_another_is_corrupt_naming_the_key(
    written: str, read: str
) -> None:
    data, _ = encode_table(TABLES_BY_NAME[written], SAMPLE_ROWS[written])
    key = f"snapshots/{written}/x.avro"
    with pytest.raises(BackupCorrupt) as refused:
        list(decode_table(TABLES_BY_NAME[read], data, key=key))
    assert f"backup object {key} is not a readable copy of table {read}" in str(refused.value)


@pytest.mark.parametrize("data", [b"", b"garbage", encode_segment(TOPIC, 3, MESSAGES)])
def test_bytes_that_are_not_a_table_are_corrupt_naming_the_key(data: bytes) -> None:
    key = "snapshots/runs/x.avro"
    with pytest.raises(BackupCorrupt, match=re.escape(key)):
        list(decode_table(TABLES_BY_NAME["runs"], data, key=key))


def _leaks(data: bytes, decode: Any) -> set[str]:
    """The exception types other than BackupCorrupt that ``decode`` raises on ``data``
    cut short at every length or with any one byte changed."""
    damaged = [data[:n] for n in range(len(data))]
    for position in range(len(data)):
        flipped = bytearray(data)
        flipped[position] ^= 0x40
        damaged.append(bytes(flipped))
    leaks = set()
    for candidate in damaged:
        try:
            list(decode(candidate))
        except BackupCorrupt:
            pass
        except Exception as exc:
            leaks.add(type(exc).__name__)
    return leaks


def test_a_damaged_segment_or_table_is_corrupt_never_another_error() -> None:
    segment = encode_segment(TOPIC, 3, MESSAGES)
    table = TABLES_BY_NAME["deletion_ledger"]
    ledger, _ = encode_table(table, SAMPLE_ROWS["deletion_ledger"])
    assert _leaks(segment, lambda d: decode_segment(d, key=SEGMENT_KEY)) == set()
    assert _leaks(ledger, lambda d: decode_table(table, d, key="snapshots/x.avro")) == set()


def test_a_blob_is_kept_under_its_algorithm_and_hex_digest() -> None:
    hexdigest = _sha("a body")
    key = blob_key(f"sha256:{hexdigest}")
    assert key == f"blobs/sha256/{hexdigest}"
    assert check_key(key) == key


# The manifest chain.


def _hour(number: int) -> datetime:
    return CREATED + timedelta(hours=number)


def _write_chain(store: FolderStore, count: int = 3) -> list[Manifest]:
    manifests, previous = [], GENESIS_MANIFEST
    for number in range(1, count + 1):
        manifest = _manifest(number, previous=previous, created_at=_hour(number))
        store.put(manifest.key, manifest.to_bytes())
        manifests.append(manifest)
        previous = manifest.digest
    return manifests


@pytest.fixture
def store(tmp_path: Path) -> FolderStore:
    return FolderStore(tmp_path / "backup")


def _where(problems: list[ChainProblem]) -> set[str]:
    return {problem.where for problem in problems}


def test_an_unbroken_chain_passes(store: FolderStore) -> None:
    manifests = _write_chain(store)
    chain = load_chain(store, VERIFIER)
    assert chain.problems == []
    assert chain.manifests == manifests
    assert chain.cut == manifests[-1]


def test_only_numbered_manifest_files_count(store: FolderStore) -> None:
    _write_chain(store)
    store.put("manifests/latest.json", b"{}")
    store.put("manifests/000000000004.json.bak", b"{}")
    store.put("segments/000000000005.json", b"{}")
    assert manifest_numbers(store) == [1, 2, 3]
    assert load_chain(store, VERIFIER).problems == []


def test_an_empty_store_has_no_cut_and_no_problem(store: FolderStore) -> None:
    chain = load_chain(store, VERIFIER)
    assert (chain.cut, chain.problems) == (None, [])


def test_a_missing_middle_manifest_is_named_at_the_one_after_it(store: FolderStore) -> None:
    manifests = _write_chain(store)
    store.delete(manifest_key(2))
    chain = load_chain(store, VERIFIER)
    gap = ChainProblem(manifest_key(3), f"manifest {manifest_key(2)} is missing before it")
    assert gap in chain.problems
    assert _where(chain.problems) == {manifest_key(3)}
    assert chain.manifests == [manifests[0], manifests[2]]


def test_a_missing_first_manifest_is_named(store: FolderStore) -> None:
    _write_chain(store)
    store.delete(manifest_key(1))
    chain = load_chain(store, VERIFIER)
    gap = ChainProblem(manifest_key(2), f"manifest {manifest_key(1)} is missing before it")
    assert gap in chain.problems


def test_a_signed_manifest_that_does_not_name_its_predecessor_breaks_the_chain(
    store: FolderStore,
) -> None:
    manifests = _write_chain(store)
    forged = _manifest(2, previous=_sha("somewhere else"), created_at=_hour(2))
    store.put(forged.key, forged.to_bytes())
    chain = load_chain(store, VERIFIER)
    assert forged.signature_problem(VERIFIER) is None
    broken = [p for p in chain.problems if p.where == manifest_key(2)]
    assert len(broken) == 1
    assert "does not name the SHA-256 of the manifest before it" in broken[0].problem
    # The original manifest 3 names the digest of the manifest 2 that was replaced.
    assert _where(chain.problems) == {manifest_key(2), manifest_key(3)}
    assert chain.manifests == [manifests[0], forged, manifests[2]]


def test_a_manifest_replaced_by_a_signed_one_is_found_at_the_next(store: FolderStore) -> None:
    manifests = _write_chain(store)
    replacement = _manifest(
        2, previous=manifests[0].digest, created_at=_hour(2) + timedelta(minutes=5)
    )
    store.put(replacement.key, replacement.to_bytes())
    chain = load_chain(store, VERIFIER)
    assert _where(chain.problems) == {manifest_key(3)}
    assert "does not name the SHA-256" in chain.problems[0].problem


def test_a_manifest_edited_in_the_store_fails_its_signature(store: FolderStore) -> None:
    _write_chain(store)
    doc = json.loads(store.get(manifest_key(2)))
    doc["segments"][0]["count"] = 9
    store.put(manifest_key(2), canonical_json(doc))
    chain = load_chain(store, VERIFIER)
    signature = [p for p in chain.problems if p.problem.startswith("signature:")]
    assert _where(signature) == {manifest_key(2)}
    assert _where(chain.problems) == {manifest_key(2), manifest_key(3)}


def test_a_manifest_numbered_wrongly_is_named(store: FolderStore) -> None:
    manifests = _write_chain(store, count=2)
    store.put(manifest_key(3), _manifest(4, previous=manifests[1].digest).to_bytes())
    chain = load_chain(store, VERIFIER)
    assert ChainProblem(manifest_key(3), "it says it is number 4") in chain.problems


def test_a_truncated_last_manifest_is_named_and_the_cut_is_the_one_before(
    store: FolderStore,
) -> None:
    manifests = _write_chain(store)
    store.put(manifest_key(3), manifests[2].to_bytes()[:-20])
    chain = load_chain(store, VERIFIER)
    assert len(chain.problems) == 1
    assert chain.problems[0].where == manifest_key(3)
    assert "not valid JSON" in chain.problems[0].problem
    assert chain.cut == manifests[1]


def test_an_unreadable_middle_manifest_stops_the_chain_before_it(store: FolderStore) -> None:
    manifests = _write_chain(store)
    store.put(manifest_key(2), b"[]")
    chain = load_chain(store, VERIFIER)
    assert _where(chain.problems) == {manifest_key(2)}
    assert chain.manifests == manifests[:1]


@pytest.mark.parametrize(
    ("at", "cut"),
    [
        (_hour(2) + timedelta(minutes=30), 2),
        (_hour(2), 2),
        (_hour(2) - timedelta(microseconds=1), 1),
        (_hour(3) + timedelta(days=365), 3),
    ],
)
def test_at_stops_at_the_last_manifest_created_at_or_before_it(
    store: FolderStore, at: datetime, cut: int
) -> None:
    manifests = _write_chain(store)
    chain = load_chain(store, VERIFIER, at=at)
    assert chain.problems == []
    assert chain.manifests == manifests[:cut]


def test_at_before_the_first_manifest_gives_no_cut(store: FolderStore) -> None:
    _write_chain(store)
    chain = load_chain(store, VERIFIER, at=_hour(1) - timedelta(seconds=1))
    assert (chain.cut, chain.problems) == (None, [])


def test_at_over_a_manifest_with_an_unreadable_time_is_a_problem(store: FolderStore) -> None:
    manifests = _write_chain(store, count=1)
    doc = json.loads(manifests[0].to_bytes())
    doc["created_at"] = "yesterday"
    store.put(manifest_key(1), json.dumps(doc).encode())
    chain = load_chain(store, VERIFIER, at=_hour(5))
    assert _where(chain.problems) == {manifest_key(1)}


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(json.dumps(json.loads(STORED), indent=1).encode(), id="reformatted"),
        pytest.param(canonical_json({**json.loads(STORED), "extra": 1}), id="extra-field"),
    ],
)
def test_a_manifest_not_in_its_canonical_form_is_corrupt(data: bytes) -> None:
    with pytest.raises(BackupCorrupt, match="canonical form"):
        Manifest.from_bytes(data, key=KEY)


def test_a_manifest_whose_time_was_moved_is_named_even_past_the_disaster_point(
    store: FolderStore,
) -> None:
    manifests = _write_chain(store)
    doc = json.loads(manifests[1].to_bytes())
    doc["created_at"] = "2999-01-01T00:00:00+00:00"
    store.put(manifest_key(2), canonical_json(doc))
    chain = load_chain(store, VERIFIER, at=datetime.fromisoformat(manifests[2].created_at))
    assert manifest_key(2) in _where(chain.problems)
