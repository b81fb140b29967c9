"""Finding 13: the AEAD's additional data bound run, sequence and event id only.

A sealed body moved to an envelope of another event type, body version, tenant or key id
(of the same run and event) opened as if it belonged there. It is now bound to all of
them; payloads sealed under the old additional data (``tests/golden/sealed-aad1.avro``)
still open through the audited path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from agent_blackbox.keystore import (
    LEGACY_SEALED_ENCODING,
    AesGcmSealer,
    AuditedKeys,
    CiphertextCorrupt,
    DataKeyStore,
    LocalKeyProvider,
    wrapping_aad,
)
from agent_blackbox.outbox import Recorder, RunSnapshot
from agent_blackbox.replayer import read_archive
from agent_blackbox.schemas import Envelope, PayloadPipeline, Settings
from tests.conftest import Login
from tests.security._keys import envelopes, key_pair_files
from tests.security.conftest import TENANT_A, TENANT_B

pytestmark = pytest.mark.integration

GOLDEN_AAD1 = Path(__file__).resolve().parents[1] / "golden" / "sealed-aad1.avro"
GOLDEN_AAD1_KEY = bytes(range(32))  # the fixed test key it was sealed under
ALIAS = "dk-alias-of-the-same-secret"

Move = Callable[[Envelope], Envelope]


def _store_key(
    engine: Engine, provider: LocalKeyProvider, run: str, key: str, secret: bytes
) -> None:
    wrapped = provider.wrap(secret, aad=wrapping_aad(run, key))
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO blackbox.data_keys (key_id, run_id, tenant_id, kek_version, wrapped) "
                "VALUES (:k, :r, :t, :v, :w)"
            ),
            {"k": key, "r": run, "t": TENANT_A, "v": wrapped.kek_version, "w": wrapped.blob},
        )


@pytest.mark.parametrize(
    "move",
    [
        lambda e: replace(e, event_type="llm.call"),
        lambda e: replace(e, body_version=e.body_version + 1),
        lambda e: replace(e, tenant_id=TENANT_B),
        # The same secret stored under a second key id: only the binding tells them apart.
        lambda e: replace(e, key_id=ALIAS),
    ],
    ids=["event type", "body version", "tenant", "key id"],
)
def test_a_sealed_body_moved_to_another_binding_does_not_open(
    engine: Engine, settings: Settings, login: Login, tmp_path: Path, move: Move
) -> None:
    private, public = key_pair_files(tmp_path)
    keys = DataKeyStore.from_env({"BLACKBOX_KEK_PUBLIC_FILE": str(public)})
    recorder = Recorder(login("blackbox_writer", tenant=TENANT_A), settings=settings, keys=keys)
    run = recorder.start_run(RunSnapshot("keys.13"), agent_id="keys-13", tenant_id=TENANT_A)
    run.call("lookup", lambda q: {"answer": "sealed answer"}, "q")
    tool_call = envelopes(engine, run.run_id)[1]
    assert tool_call.event_type == "tool.call"
    provider = LocalKeyProvider.from_file(private)
    opening = AuditedKeys(login("blackbox_replayer", tenant="*"), provider, purpose="aad check")
    secret = opening.opening_key(run.run_id, str(tool_call.key_id))
    _store_key(engine, provider, run.run_id, ALIAS, secret)
    pipeline = PayloadPipeline(sealer=AesGcmSealer(opening))
    assert "sealed answer" in pipeline.unpack(tool_call)["result_json"]
    with pytest.raises(CiphertextCorrupt, match="does not authenticate"):
        pipeline.unpack(move(tool_call))


def test_payloads_sealed_under_the_old_aad_still_open_through_the_audited_path(
    engine: Engine, login: Login, tmp_path: Path
) -> None:
    events = list(read_archive(GOLDEN_AAD1))
    assert {e.payload_encoding for e in events} == {LEGACY_SEALED_ENCODING}
    private, _ = key_pair_files(tmp_path)
    provider = LocalKeyProvider.from_file(private)
    _store_key(engine, provider, events[0].run_id, str(events[0].key_id), GOLDEN_AAD1_KEY)
    keys = AuditedKeys(login("blackbox_replayer", tenant="*"), provider, purpose="golden aad1")
    pipeline = PayloadPipeline(sealer=AesGcmSealer(keys))
    bodies = [pipeline.unpack(e) for e in events]
    assert "secret answer" in bodies[1]["result_json"]
    # Under the old binding a move to another sequence still fails.
    with pytest.raises(CiphertextCorrupt, match="does not authenticate"):
        pipeline.unpack(replace(events[1], sequence=events[2].sequence))
