"""What the restore tests share: the environment the backup commands read, and
dropping whatever copy a test made."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from agent_blackbox.backup import drop_target
from agent_blackbox.backup._partial import RESTORE_PREFIX
from agent_blackbox.backup._target import existing_target
from agent_blackbox.cli import main
from agent_blackbox.schemas import Settings
from tests.integration._backups import AGENTS, KEK, SIGNER

ROOT = Path(__file__).resolve().parents[2]


def backup_env(settings: Settings, store_url: str, tmp_path: Path) -> dict[str, str]:
    """``BLACKBOX_*`` for the backup commands on ``settings``' database and topic, with
    the signer's public key and the KEK of :mod:`tests.integration._backups`."""
    pem = tmp_path / "signer.pem"
    pem.write_bytes(SIGNER.public_key_pem())
    return {
        "BLACKBOX_DATABASE_URL": settings.database_url,
        "BLACKBOX_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "BLACKBOX_TOPIC": settings.topic,
        "BLACKBOX_CONSUMER_GROUP": settings.consumer_group,
        "BLACKBOX_BACKUP_URL": store_url,
        "BLACKBOX_SIGNING_PUBLIC_KEYS": str(pem),
        "BLACKBOX_SIGNING_KEY_FILE": "",
        "BLACKBOX_KEK": f"v1:{base64.b64encode(KEK).decode()}",
        "BLACKBOX_AGENTS": AGENTS,
        "PYTHONPATH": str(ROOT),
    }


class Copies:
    """Runs ``blackbox`` commands; drops every restored copy they named at the end."""

    def __init__(self, settings: Settings, env: dict[str, str]) -> None:
        self.settings = settings
        self.env = env
        self.names: list[str] = []

    def cli(self, *args: str) -> Result:
        """``blackbox ARGS`` in the test's environment."""
        return CliRunner(env=self.env).invoke(main, list(args))

    def restore_name(self, name: str) -> str:
        """``name`` as ``--into`` takes it; its copy is dropped at the end."""
        self.names.append(RESTORE_PREFIX + name)
        return name

    def keep(self, database: str) -> None:
        """Drop the copy ``database`` (a drill's kept target) at the end too."""
        self.names.append(database)

    def drop_all(self) -> None:
        for name in self.names:
            assert drop_target(self.settings, existing_target(self.settings, name)) == []


@pytest.fixture
def copies(settings: Settings, s3_url: str, tmp_path: Path) -> Iterator[Copies]:
    made = Copies(settings, backup_env(settings, s3_url, tmp_path))
    yield made
    made.drop_all()
