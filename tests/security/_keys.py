"""What the key tests share: key files made as an operator makes them, the recorded
events of a run, and the replayer's reading of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from click.testing import CliRunner
from sqlalchemy import Engine, text

from agent_blackbox.cli.main import main
from agent_blackbox.keystore import AesGcmSealer, AuditedKeys, LocalKeyProvider
from agent_blackbox.schemas import Envelope, PayloadPipeline
from tests.integration._outbox import outbox_envelopes


def key_pair_files(folder: Path, *more: str) -> tuple[Path, Path]:
    """``blackbox keys init --pair``: the private file (replayer) and the public one
    (agent hosts)."""
    private = folder / "kek.json"
    result = CliRunner().invoke(main, ["keys", "init", str(private), "--pair", *more])
    assert result.exit_code == 0, result.output
    return private, folder / "kek.pub.json"


def envelopes(engine: Engine, run_id: str) -> list[Envelope]:
    """The run's events still in the outbox, in sequence order (read as the owner)."""
    return outbox_envelopes(engine, run_id)


def replaying(engine: Engine, private: Path, purpose: str) -> dict[str, Any]:
    """``replay_run`` keywords of a replayer holding the private KEK file."""
    keys = AuditedKeys(engine, LocalKeyProvider.from_file(private), purpose=purpose)
    return {"pipeline": PayloadPipeline(sealer=AesGcmSealer(keys)), "digests": keys}


def table(engine: Engine, query: str) -> list[tuple[Any, ...]]:
    """Every row of ``query``, sorted (read as the owner, to compare before and after)."""
    with engine.connect() as conn:
        return sorted((tuple(row) for row in conn.execute(text(query))), key=repr)
