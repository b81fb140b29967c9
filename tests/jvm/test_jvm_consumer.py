"""The JVM consumer (``examples/jvm-consumer``), written from the published contract,
checks every golden history: it reads them as the topic carries them (single-object
messages) and as archives, verifies every run's chain, decodes every unsealed body,
checks the digests of runs hashed over RFC 8785 (floats in exponent form included) and
the requests rebuilt from references, finds Avro compatibility between all body
versions, and writes the recorder's RFC 8785 vectors alike. A tampered history fails.

Maven builds it once into the cache folder (``BLACKBOX_CACHE_DIR`` or
``.cache/blackbox``); later runs reuse the build while the pom and sources are the same,
and build offline once the pom's dependencies were resolved.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import struct
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from agent_blackbox.replayer import read_archive
from agent_blackbox.schemas import (
    GENESIS_CHAIN_HASH,
    BodyCodec,
    Envelope,
    EnvelopeCodec,
    canonical_text,
    default_registry,
    rfc8785_json,
    split_encoding,
)
from agent_blackbox.schemas._compression import Inflater
from agent_blackbox.schemas._payload import DEFAULT_MAX_BODY_BYTES

pytestmark = [pytest.mark.jvm, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ROOT / "examples" / "jvm-consumer"
GOLDEN = sorted((ROOT / "tests" / "golden").glob("*.avro"))
CONTRACT = "contract.rfc8785.avro"


@dataclass(frozen=True)
class Consumer:
    """The built consumer: how to run it."""

    classpath: str

    def run(self, histories: Sequence[Path], *extra: str) -> subprocess.CompletedProcess[str]:
        argv = ["java", "-cp", self.classpath, "dev.agentblackbox.consumer.Main"]
        argv += ["--schemas", str(ROOT / "schemas" / "avsc")]
        argv += ["--dictionaries", str(ROOT / "schemas" / "dictionaries"), *extra]
        argv += [str(h) for h in histories]
        return subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)


def _fingerprint(paths: Iterable[Path]) -> str:
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(str(path.relative_to(PROJECT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def consumer() -> Consumer:
    if shutil.which("mvn") is None or shutil.which("java") is None:
        pytest.skip("Maven and a Java 17 JDK are needed to build the JVM consumer")
    base = os.environ.get("BLACKBOX_CACHE_DIR")
    cache = (Path(base) if base else ROOT / ".cache" / "blackbox") / "jvm-consumer"
    cache.mkdir(parents=True, exist_ok=True)
    sources = [PROJECT / "pom.xml", *(PROJECT / "src").rglob("*.java")]
    built, resolved = cache / ".built", cache / ".resolved"
    classpath_file = cache / "classpath.txt"
    pom = _fingerprint([PROJECT / "pom.xml"])
    if not built.exists() or built.read_text() != _fingerprint(sources):
        argv = ["mvn", "-B", "-q", "-f", str(PROJECT / "pom.xml")]
        if resolved.exists() and resolved.read_text() == pom:
            argv.append("-o")  # every dependency is in the local repository already
        argv += [f"-Dconsumer.buildDirectory={cache / 'target'}", "clean", "compile"]
        argv += ["dependency:build-classpath", f"-Dmdep.outputFile={classpath_file}"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=540, check=False)
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
        resolved.write_text(pom)
        built.write_text(_fingerprint(sources))
    classes = cache / "target" / "classes"
    return Consumer(f"{classes}{os.pathsep}{classpath_file.read_text().strip()}")


def write_messages(envelopes: Iterable[Envelope], target: Path) -> Path:
    """The envelopes as the topic carries them: each message value (single-object Avro,
    as the recorder encoded it) after its length, 4 bytes big-endian."""
    codec = EnvelopeCodec()
    with target.open("wb") as out:
        for envelope in envelopes:
            value = codec.encode(envelope)
            out.write(struct.pack(">I", len(value)) + value)
    return target


def summaries(output: str, kind: str) -> list[dict[str, Any]]:
    prefix = f"{kind} "
    return [
        json.loads(line[len(prefix) :]) for line in output.splitlines() if line.startswith(prefix)
    ]


@pytest.fixture(scope="module")
def checked(consumer: Consumer, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The consumer's output on every golden history, as messages then as archives,
    with the recorder's RFC 8785 vectors."""
    folder = tmp_path_factory.mktemp("jvm")
    messages = [write_messages(read_archive(a), folder / f"{a.stem}.messages") for a in GOLDEN]
    vectors = write_vectors(folder / "vectors.jsonl")
    done = consumer.run([*messages, *GOLDEN], "--vectors", str(vectors))
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-4000:]
    return done.stdout


def write_vectors(target: Path, count: int = 2_000) -> Path:
    """Random values as Python writes them (version 1 text), beside what the recorder's
    RFC 8785 serialiser makes of them: the JVM's JCS library must agree."""
    draw = random.Random(8785)
    lines = []
    for _ in range(count):
        value = [_value(draw)]  # the JVM library takes an array or object only
        lines.append(json.dumps([canonical_text(value), rfc8785_json(value).decode()]))
    for bits in (0x1, 0x7FEFFFFFFFFFFFFF, 0x3EB0C6F7A0B5ED8C, 0x444B1AE4D6E2EF50):
        double = struct.unpack(">d", bits.to_bytes(8, "big"))[0]
        lines.append(json.dumps([canonical_text([double]), rfc8785_json([double]).decode()]))
    target.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return target


_TEXT = ["a", "Z", '"', "\\", "\n", "\x1f", "\x7f", "é", "\u2028", "\ue000", "\ufb33", "\U0001f600"]


def _value(draw: random.Random, depth: int = 0) -> Any:
    kind = draw.choice(
        ["str", "int", "float", "float", "bool", "null"] + ["list", "dict"] * (depth < 3)
    )
    if kind == "str":
        return "".join(draw.choice(_TEXT) for _ in range(draw.randint(0, 5)))
    if kind == "int":
        return draw.choice([draw.randint(-(2**53), 2**53), 2**53 + draw.randint(1, 99), 10**21])
    if kind == "float":
        bits = draw.getrandbits(64)
        double = struct.unpack(">d", bits.to_bytes(8, "big"))[0]
        if double != double or double in (float("inf"), float("-inf")):
            double = 1e-7
        return draw.choice([double, 10.0 ** draw.randint(-12, 25), draw.uniform(-1, 1), -0.0])
    if kind == "bool":
        return draw.random() < 0.5
    if kind == "null":
        return None
    if kind == "list":
        return [_value(draw, depth + 1) for _ in range(draw.randint(0, 4))]
    keys = ["".join(draw.choice(_TEXT) for _ in range(2)) for _ in range(draw.randint(0, 4))]
    return {key: _value(draw, depth + 1) for key in keys}


# What the consumer found -----------------------------------------------------------------


def test_every_run_of_every_history_chains_and_every_unsealed_body_decodes(checked: str) -> None:
    found = summaries(checked, "summary")
    assert len(found) == 2 * len(GOLDEN)  # as messages, then as archives
    for summary in found:
        assert summary["failures"] == 0, summary
        assert summary["runs"] > 0
        assert summary["chains_verified"] == summary["runs"], summary
        assert summary["bodies_decoded"] + summary["sealed"] == summary["events"], summary
    by_file = {s["file"]: s for s in found}
    for archive in GOLDEN:
        events = list(read_archive(archive))
        as_messages = by_file[f"{archive.stem}.messages"]
        assert as_messages == {**by_file[archive.name], "file": as_messages["file"]}
        assert as_messages["events"] == len(events)
        assert as_messages["runs"] == len({e.run_id for e in events})
    assert by_file["sealed-aad1.avro"]["sealed"] == 3


def test_the_rfc8785_history_checks_every_digest_and_every_rebuilt_request(checked: str) -> None:
    summary = next(s for s in summaries(checked, "summary") if s["file"] == CONTRACT)
    events = list(read_archive(GOLDEN[[a.name for a in GOLDEN].index(CONTRACT)]))
    assert summary["canonicalisations"] == {"rfc8785": 4}
    assert summary["digests_checked"] == 2 * len(events)  # every input and output digest
    calls = [_stored_body(e) for e in events if e.event_type == "llm.call"]
    by_reference = sum(1 for body in calls if body["request_prefix"] is not None)
    assert by_reference == 8
    assert summary["requests_rebuilt"] == by_reference
    assert set(summary["encodings"]) == {"avro", "avro+deflate", "avro+zstd", "avro+zstd-d1"}
    # The floats that split Python's JSON from Jackson's are in the requests checked.
    request = json.loads(calls[0]["raw_request_json"])
    assert request["top_p"] == 1e-05
    assert request["seed"] == 2**53 + 1


def _stored_body(envelope: Envelope) -> dict[str, Any]:
    """The body as stored (a request by reference stays one)."""
    scheme, _ = split_encoding(envelope.payload_encoding)
    data = envelope.payload or b""
    if scheme is not None:
        data = Inflater(DEFAULT_MAX_BODY_BYTES).inflate(scheme, data, "the golden history")
    return BodyCodec().decode(envelope.event_type, envelope.body_version, data)


def test_apache_avro_on_the_jvm_finds_every_body_version_compatible(checked: str) -> None:
    [result] = summaries(checked, "compatibility")
    registry = default_registry()
    pairs = sum(len(v) * (len(v) - 1) // 2 for v in map(registry.versions, registry.event_types()))
    assert result == {"pairs": pairs, "incompatible": 0}


def test_the_jvm_jcs_library_writes_what_the_recorder_writes(checked: str) -> None:
    [result] = summaries(checked, "vectors")
    assert result == {"checked": 2_004, "differ": 0}


# What it refuses -------------------------------------------------------------------------


def _rechained(events: list[Envelope], changed: dict[int, Envelope]) -> list[Envelope]:
    """``events`` with ``changed`` (by index) swapped in, the chain written anew over
    them: only what changed is wrong."""
    out, heads = [], {}
    for index, envelope in enumerate(events):
        envelope = replace(changed.get(index, envelope), chain_hash="")
        envelope = envelope.linked(heads.get(envelope.run_id, GENESIS_CHAIN_HASH))
        heads[envelope.run_id] = envelope.chain_hash
        out.append(envelope)
    return out


def test_a_changed_payload_breaks_the_chain_and_a_wrong_digest_is_found(
    consumer: Consumer, tmp_path: Path
) -> None:
    events = list(read_archive(GOLDEN[[a.name for a in GOLDEN].index(CONTRACT)]))
    tool = next(i for i, e in enumerate(events) if e.event_type == "tool.call")
    payload = bytearray(events[tool].payload or b"")
    payload[-2] ^= 0x01  # the body's last double (its latency)
    tampered = list(events)
    tampered[tool] = replace(events[tool], payload=bytes(payload))
    llm = next(i for i, e in enumerate(events) if e.event_type == "llm.call")
    wrong = "sha256:" + "0" * 64
    relinked = _rechained(events, {llm: replace(events[llm], input_digest=wrong)})
    done = consumer.run(
        [
            write_messages(tampered, tmp_path / "tampered.messages"),
            write_messages(relinked, tmp_path / "relinked.messages"),
        ]
    )
    assert done.returncode == 1
    failures = [line for line in done.stdout.splitlines() if line.startswith("failure ")]
    run, sequence = events[tool].run_id, events[tool].sequence
    assert any(
        "tampered.messages" in f and f"run {run} sequence {sequence}: chain hash" in f
        for f in failures
    ), failures
    run, sequence = events[llm].run_id, events[llm].sequence
    assert [f for f in failures if "relinked.messages" in f] == [
        f"failure relinked.messages: run {run} sequence {sequence} input digest {wrong}, "
        f"rebuilt {events[llm].input_digest}"
    ]
