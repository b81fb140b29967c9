"""The size of a sealed body does not give its secrets away.

Attack (a compression oracle): the attacker controls text recorded in the same body as
a secret (a search query next to a tool result that quotes a password), and sees only
the sealed payloads' sizes (on the topic, in a backup). For each next character it
records one body per guess, ``password=<known part><guess>``, and keeps the guess whose
body came out smallest: compressed as the previous release stored them, that recovers
most of the secret. The recorder pads a compressed body to a size bucket before sealing
it, so the guesses' bodies come out the same size and the attack recovers nothing; a
tenant set to ``none`` gets no compression at all, and every guess the same size.
"""

from __future__ import annotations

import os
import string
from collections.abc import Callable
from dataclasses import replace

import pytest

from agent_blackbox.keystore import AesGcmSealer
from agent_blackbox.outbox import MemoryRecorder, RunSnapshot
from agent_blackbox.outbox._core import recording_pipeline
from agent_blackbox.schemas import (
    BodyCodec,
    DataKey,
    Envelope,
    PayloadContext,
    PayloadPipeline,
    Settings,
    UndecodableMessage,
    canonical_text,
)
from agent_blackbox.schemas._compression import Compressor

SECRET = "hunter2-Qx7Zp9"
GUESSES = string.ascii_letters + string.digits + "-"
TENANT = "acme"
KEY = DataKey("dk-oracle", os.urandom(32))
CONTEXT = PayloadContext("run-oracle", 3, "event-oracle", TENANT, data_key=KEY)


def _body(attacker_text: str) -> dict[str, object]:
    return {
        "tool": "search",
        "arguments_json": canonical_text({"q": attacker_text}),
        "result_json": canonical_text(
            {"note": f"customer said: password={SECRET}; ticket 4411 open", "hits": []}
        ),
        "result_codec": None,
        "error": None,
        "latency_ms": 1.5,
    }


Sizer = Callable[[str], int]


def _recovered(size: Sizer, characters: int = 10) -> int:
    """How many of the secret's first ``characters`` the attack singles out right."""
    right = 0
    for i in range(characters):
        sizes = {c: size(f"password={SECRET[:i]}{c}") for c in GUESSES}
        smallest = min(sizes.values())
        right += [c for c, n in sizes.items() if n == smallest] == [SECRET[i]]
    return right


def _stored_size(settings: Settings) -> Sizer:
    pipeline = recording_pipeline(settings, sealed=True)
    return lambda text: len(pipeline.pack("tool.call", 2, _body(text), CONTEXT).data)


def _unpadded_size(compression: str) -> Sizer:
    """The size the previous release stored: compressed, sealed (28 bytes more), no
    padding."""
    codec, compressor = BodyCodec(), Compressor(compression)

    def size(text: str) -> int:
        packed = compressor.compress(codec.encode("tool.call", 2, _body(text)))
        assert packed is not None
        return len(packed) + 28

    return size


def test_the_attack_works_on_unpadded_compressed_bodies() -> None:
    assert _recovered(_unpadded_size("zstd")) >= 5


@pytest.mark.parametrize("compression", ["zstd", "zstd-nodict", "deflate"])
def test_padded_sealed_bodies_give_no_character_away(compression: str) -> None:
    assert _recovered(_stored_size(Settings(payload_compression=compression))) == 0


def test_a_tenant_set_to_none_stores_every_guess_at_one_size() -> None:
    settings = Settings(
        payload_compression="zstd", payload_compression_tenants=f"other=deflate,{TENANT}=none"
    )
    size = _stored_size(settings)
    assert len({size(f"password={c}") for c in GUESSES}) == 1
    sealed = recording_pipeline(settings, sealed=True).pack("tool.call", 2, _body("x"), CONTEXT)
    assert sealed.encoding == "avro+aes256gcm+aad2"  # no compression step
    assert _recovered(size) == 0


def _envelope(sealed_data: bytes, encoding: str) -> Envelope:
    """A recorded ``tool.call`` envelope carrying ``sealed_data`` as ``encoding``."""
    recorder = MemoryRecorder()
    recorder.record(
        lambda run, _input: run.call("search", lambda q: q, "x"),
        RunSnapshot(code_version="oracle.1"),
        agent_id="oracle",
    )
    recorded = next(e for e in recorder.events if e.event_type == "tool.call")
    return replace(
        recorded,
        run_id=CONTEXT.run_id,
        sequence=CONTEXT.sequence,
        event_id=CONTEXT.event_id,
        tenant_id=TENANT,
        body_version=2,
        payload=sealed_data,
        payload_encoding=encoding,
        key_id=KEY.key_id,
    )


class _OneKey:
    def opening_key(self, run_id: str, key_id: str) -> bytes:
        assert key_id == KEY.key_id
        return KEY.secret


def _opener() -> PayloadPipeline:
    """A pipeline that opens what :data:`KEY` sealed."""
    return PayloadPipeline(sealer=AesGcmSealer(_OneKey()))


def test_padded_and_earlier_unpadded_bodies_both_open() -> None:
    pipeline = recording_pipeline(Settings(payload_compression="zstd"), sealed=True)
    body = _body("password=a")
    padded = pipeline.pack("tool.call", 2, body, CONTEXT)
    assert padded.encoding == "avro+zstd-d1+pad1+aes256gcm+aad2"
    opener = _opener()
    assert (
        opener.unpack(_envelope(padded.data, padded.encoding))["result_json"]
        == (body["result_json"])
    )
    # As the previous release sealed it: compressed, no padding step.
    plain = BodyCodec().encode("tool.call", 2, body)
    packed = Compressor("zstd").compress(plain)
    assert packed is not None
    context = replace(CONTEXT, event_type="tool.call", body_version=2)
    earlier = AesGcmSealer().seal(packed, context)
    opened = opener.unpack(_envelope(earlier.data, "avro+zstd-d1+aes256gcm+aad2"))
    assert opened["result_json"] == body["result_json"]


def test_a_padding_without_its_mark_is_refused_by_name() -> None:
    context = replace(CONTEXT, event_type="tool.call", body_version=2)
    packed = Compressor("zstd").compress(BodyCodec().encode("tool.call", 2, _body("x")))
    assert packed is not None
    unmarked = AesGcmSealer().seal(packed + bytes(40), context)
    opener = _opener()
    with pytest.raises(UndecodableMessage, match="padded payload has no padding mark"):
        opener.unpack(_envelope(unmarked.data, "avro+zstd-d1+pad1+aes256gcm+aad2"))


@pytest.mark.parametrize("listed", ["acme", "acme=gzip", "=none", "acme=none,,b=lz4"])
def test_a_malformed_tenant_setting_is_named(listed: str) -> None:
    with pytest.raises(ValueError, match="BLACKBOX_PAYLOAD_COMPRESSION_TENANTS"):
        Settings.from_env({"BLACKBOX_PAYLOAD_COMPRESSION_TENANTS": listed})
