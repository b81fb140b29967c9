"""Envelope encryption without a database: sealing, opening, and each bad input's error."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from agent_blackbox.keystore import (
    LEGACY_SEALED_ENCODING,
    SEALED_ENCODING,
    AesGcmSealer,
    CiphertextCorrupt,
    KeystoreError,
    LocalKeyProvider,
    UnknownKeyVersion,
    WrongKey,
    wrapping_aad,
)
from agent_blackbox.outbox import MemoryRecorder, RunSnapshot
from agent_blackbox.replayer import read_archive
from agent_blackbox.schemas import (
    DataKey,
    Envelope,
    KeyUnavailable,
    PayloadContext,
    PayloadPipeline,
)

KEY = DataKey("dk-test", os.urandom(32))


class OneKey:
    """Opening keys that know one data key."""

    def opening_key(self, run_id: str, key_id: str) -> bytes:
        if key_id != KEY.key_id:
            raise KeystoreError(f"run {run_id} key {key_id}: unknown")
        return KEY.secret


def _sealed_run() -> list[Envelope]:
    """A run's events, their bodies sealed under :data:`KEY` as a recorder would."""
    recorder = MemoryRecorder()
    run = recorder.start_run(RunSnapshot("s.1", {"q": "secret question"}), agent_id="s")
    run.call("lookup", lambda q: {"answer": "secret answer"}, "q")
    run.finish(output="done")
    plain, sealing = PayloadPipeline(), PayloadPipeline(sealer=AesGcmSealer())
    sealed = []
    for e in recorder.events[1:]:
        context = PayloadContext(e.run_id, e.sequence, e.event_id, e.tenant_id, data_key=KEY)
        out = sealing.pack(e.event_type, e.body_version, plain.unpack(e), context)
        sealed.append(
            replace(e, payload=out.data, key_id=out.key_id, payload_encoding=out.encoding)
        )
    return sealed


def test_sealed_bodies_open_with_their_key_and_hold_no_plaintext() -> None:
    events = _sealed_run()
    assert {e.payload_encoding for e in events} == {SEALED_ENCODING}
    assert all(b"secret answer" not in (e.payload or b"") for e in events)
    body = PayloadPipeline(sealer=AesGcmSealer(OneKey())).unpack(events[0])
    assert "secret answer" in body["result_json"]


@pytest.mark.parametrize(
    ("mangle", "complaint"),
    [
        (lambda e: replace(e, payload=(e.payload or b"")[:-1]), "does not authenticate"),
        (lambda e: replace(e, payload=(e.payload or b"")[:10]), "truncated"),
        (lambda e: replace(e, sequence=e.sequence + 1), "belongs to another event"),
        (lambda e: replace(e, payload_encoding="avro+rot13"), "not one this release opens"),
    ],
    ids=["cut", "truncated", "moved", "unknown encoding"],
)
def test_a_bad_ciphertext_names_the_run_and_the_key(mangle: object, complaint: str) -> None:
    envelope = mangle(_sealed_run()[0])  # type: ignore[operator]
    with pytest.raises(CiphertextCorrupt, match=complaint) as caught:
        PayloadPipeline(sealer=AesGcmSealer(OneKey())).unpack(envelope)
    assert f"run {envelope.run_id}" in str(caught.value)
    assert "key dk-test" in str(caught.value)


class AnyKeyId:
    """Opening keys that give :data:`KEY`'s secret for any key id: only the additional
    data can tell a body moved to another key id."""

    def opening_key(self, run_id: str, key_id: str) -> bytes:
        return KEY.secret


@pytest.mark.parametrize(
    "move",
    [
        lambda e: replace(
            e, event_type="run.finished" if e.event_type != "run.finished" else "tool.call"
        ),
        lambda e: replace(e, body_version=e.body_version + 1),
        lambda e: replace(e, tenant_id="tenant-b"),
        lambda e: replace(e, key_id="dk-other"),
        lambda e: replace(e, run_id="another-run"),
        lambda e: replace(e, event_id="00000000-0000-4000-8000-000000000000"),
        lambda e: replace(e, payload_encoding=LEGACY_SEALED_ENCODING),
    ],
    ids=["event type", "body version", "tenant", "key id", "run", "event id", "old AAD label"],
)
def test_a_sealed_body_moved_to_another_binding_does_not_open(move: object) -> None:
    envelope = _sealed_run()[0]
    pipeline = PayloadPipeline(sealer=AesGcmSealer(AnyKeyId()))
    assert "secret answer" in pipeline.unpack(envelope)["result_json"]
    moved = move(envelope)  # type: ignore[operator]
    with pytest.raises(CiphertextCorrupt, match="does not authenticate"):
        pipeline.unpack(moved)


GOLDEN_AAD1 = Path(__file__).resolve().parents[1] / "golden" / "sealed-aad1.avro"
GOLDEN_AAD1_KEY = DataKey("dk-golden-aad1", bytes(range(32)))


class GoldenKey:
    def opening_key(self, run_id: str, key_id: str) -> bytes:
        assert (run_id, key_id) == ("sealed-aad1-run", GOLDEN_AAD1_KEY.key_id)
        return GOLDEN_AAD1_KEY.secret


def test_payloads_sealed_under_the_first_aad_still_open() -> None:
    """``sealed-aad1.avro`` was written by the release before the AAD bound event type,
    body version, tenant and key id (commit 5e921dc's sealer, memory recorder, this
    fixed test key); it must open forever, and its bodies must not be re-labelled."""
    events = list(read_archive(GOLDEN_AAD1))
    assert {e.payload_encoding for e in events} == {LEGACY_SEALED_ENCODING}
    pipeline = PayloadPipeline(sealer=AesGcmSealer(GoldenKey()))
    bodies = [pipeline.unpack(e) for e in events]
    assert "secret answer" in bodies[1]["result_json"]
    with pytest.raises(CiphertextCorrupt, match="does not authenticate"):
        pipeline.unpack(replace(events[1], payload_encoding=SEALED_ENCODING))
    with pytest.raises(CiphertextCorrupt, match="does not authenticate"):
        pipeline.unpack(replace(events[1], sequence=events[2].sequence))


def test_sealing_refuses_a_context_without_event_type() -> None:
    context = PayloadContext("run-1", 1, "e", "t", data_key=KEY)
    with pytest.raises(KeystoreError, match="names no event type"):
        AesGcmSealer().seal(b"body", context)


def test_key_encryption_keys_refuse_the_wrong_key_and_unknown_versions() -> None:
    aad = wrapping_aad("run-1", "dk-1")
    wrapped = LocalKeyProvider({"v1": os.urandom(32)}).wrap(KEY.secret, aad=aad)
    with pytest.raises(WrongKey, match="KEK version v1"):
        LocalKeyProvider({"v1": os.urandom(32)}).unwrap(wrapped, aad=aad)
    with pytest.raises(UnknownKeyVersion, match="v1 is not held"):
        LocalKeyProvider({"v2": os.urandom(32)}).unwrap(wrapped, aad=aad)
    assert isinstance(WrongKey("x"), KeyUnavailable)  # replay reports it, not tampering


def test_a_key_file_round_trips_and_a_bad_one_says_what_to_fix(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "kek.json"
    LocalKeyProvider.write_file(path, version="v1")
    LocalKeyProvider.write_file(path, version="v2", add_to=path)
    provider = LocalKeyProvider.from_file(path)
    assert (provider.versions, provider.current_version) == (("v1", "v2"), "v2")
    assert path.stat().st_mode & 0o077 == 0
    path.write_text("{}", encoding="utf-8")
    with pytest.raises(KeystoreError, match="is not a key file"):
        LocalKeyProvider.from_file(path)
