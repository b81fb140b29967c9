"""What the backup and drill tests share: keys, an agent to record, and the steps of
recording, relaying and backing up."""

from __future__ import annotations

import os
from typing import Any

from sqlalchemy import Engine, text

from agent_blackbox.backup import BackupStore, BackupWriter, Manifest
from agent_blackbox.keystore import DataKeyStore, LocalKeyProvider
from agent_blackbox.outbox import AgentRun, Recorder, RunSnapshot
from agent_blackbox.outbox.relay import Relay
from agent_blackbox.schemas import CheckpointSigner, CheckpointVerifier, Settings
from tests.integration._agents import large_reply, large_reply_agent

KEK = os.urandom(32)
PROVIDER = LocalKeyProvider({"v1": KEK})
SIGNER = CheckpointSigner.generate()  # known by its fingerprint, as a PEM file is
VERIFIER = CheckpointVerifier({SIGNER.key_id: SIGNER.public_key})
AGENTS = (
    "backup=tests.integration._backups:lookup_agent,"
    "backup-large=tests.integration._backups:large_entry"
)
"""``BLACKBOX_AGENTS`` for replaying the runs recorded here."""


def lookup_agent(run: AgentRun, input: Any) -> Any:
    found = run.call("lookup", lambda who: {"address": f"{who} lives at 1 Main St"}, input["who"])
    run.transition("found", state={"address": found["address"]})
    return found["address"]


large_entry = large_reply_agent(large_reply(100_000))  # out of line, compressed or not
"""An agent whose LLM reply is stored out of line (over the 64 KiB blob threshold)."""


def record(engine: Engine, settings: Settings, who: str, *, sealed: bool = True) -> str:
    """One run of :func:`lookup_agent` for subject ``who``, encrypted unless not ``sealed``."""
    keys = DataKeyStore(PROVIDER) if sealed else None
    recorder = Recorder(engine, settings=settings, keys=keys)
    snapshot = RunSnapshot(code_version="backup.1", input={"who": who})
    run, _ = recorder.record(lookup_agent, snapshot, agent_id="backup", subject_ids=(who,))
    return run.run_id


def record_large(engine: Engine, settings: Settings) -> str:
    """One encrypted run with a body stored out of line."""
    recorder = Recorder(engine, settings=settings, keys=DataKeyStore(PROVIDER))
    snapshot = RunSnapshot(code_version="backup.1", input={"q": "weather"})
    run, _ = recorder.record(large_entry, snapshot, agent_id="backup-large")
    return run.run_id


def relay(engine: Engine, settings: Settings) -> None:
    """Publish the whole outbox."""
    worker = Relay(engine, settings=settings)
    try:
        worker.drain(timeout=60)
    finally:
        worker.close()


def events(engine: Engine) -> int:
    """Events recorded in all (the sum of the runs' last sequences)."""
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT sum(last_sequence) FROM blackbox.runs")).scalar_one())


def cut(settings: Settings, engine: Engine, store: BackupStore) -> Manifest:
    """Back up what the topic holds now; the cut written."""
    with BackupWriter(settings, store, signer=SIGNER, engine=engine) as writer:
        return writer.catch_up(timeout_s=60)


def corrupt(store: BackupStore, key: str) -> None:
    """Flip one byte in the middle of the object under ``key``."""
    data = bytearray(store.get(key))
    data[len(data) // 2] ^= 0xFF
    store.put(key, bytes(data))
