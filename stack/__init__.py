"""The local development stack, without Docker: PostgreSQL and a one-node Kafka (KRaft).

PostgreSQL comes from the machine's Debian package and is initialised into a cache folder;
Kafka runs from the official jars, fetched once with Maven. Everything (data, logs, pid
files, sockets) lives under one cache folder and a set of ports, so several stacks can run
side by side::

    from agent_blackbox.stack import LocalStack

    endpoints = LocalStack().up()  # idempotent
    print(endpoints.database_url, endpoints.kafka_bootstrap)

``BLACKBOX_DATABASE_URL`` or ``BLACKBOX_KAFKA_BOOTSTRAP`` in the environment point at
services of your own; the stack then leaves that service alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from agent_blackbox.schemas import safe_console
from agent_blackbox.stack._kafka import LocalKafka
from agent_blackbox.stack._postgres import LocalPostgres
from agent_blackbox.stack._process import (
    MissingPrerequisiteError,
    ServiceError,
    ServiceStatus,
    StackError,
)
from agent_blackbox.stack._settings import StackPorts, StackSettings, redact_password

__all__ = [
    "Endpoints",
    "LocalKafka",
    "LocalPostgres",
    "LocalStack",
    "MissingPrerequisiteError",
    "ServiceError",
    "ServiceStatus",
    "StackError",
    "StackPorts",
    "StackSettings",
]


@dataclass(frozen=True)
class Endpoints:
    """Where the code should connect.

    Attributes:
        database_url: SQLAlchemy URL, e.g. ``postgresql+psycopg://blackbox@127.0.0.1:25432/blackbox``.
        kafka_bootstrap: ``bootstrap.servers`` value, e.g. ``127.0.0.1:29092``.
    """

    database_url: str
    kafka_bootstrap: str


class LocalStack:
    """Both services of the local stack, honouring the environment overrides.

    Args:
        cache_dir: Root folder for everything the stack writes; defaults to
            ``BLACKBOX_CACHE_DIR`` or ``<project root>/.cache/blackbox``.
        ports: Loopback ports; defaults to 25432 (Postgres), 29092 and 29093 (Kafka).
        console: Where progress messages go (stderr by default).
        environ: The environment to read overrides from; ``os.environ`` when omitted.
    """

    def __init__(
        self,
        cache_dir: Path | None = None,
        ports: StackPorts | None = None,
        *,
        console: Console | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self._settings = StackSettings.from_env(environ, cache_dir=cache_dir, ports=ports)
        self._console = console or safe_console(stderr=True, soft_wrap=True)
        cache, chosen = self._settings.cache_dir, self._settings.ports
        self.postgres = LocalPostgres(cache, chosen.postgres, console=self._console)
        self.kafka = LocalKafka(cache, chosen.kafka, chosen.controller, console=self._console)

    @property
    def settings(self) -> StackSettings:
        """The cache folder, ports and overrides in effect."""
        return self._settings

    def up(self) -> Endpoints:
        """Start whatever is not running yet; a no-op for services already up.

        Returns:
            The endpoints, external ones included.

        Raises:
            StackError: a service could not be installed, started or reached.
        """
        before = self.status()
        database_url = self._settings.external_database_url
        if database_url is None:
            database_url = self.postgres.start()
        else:
            self._console.print(
                f"postgres: external ({redact_password(database_url)}), not started"
            )
        bootstrap = self._settings.external_kafka_bootstrap
        if bootstrap is None:
            bootstrap = self.kafka.start()
        else:
            self._console.print(f"kafka: external ({bootstrap}), not started")
        if all(entry.state != "stopped" for entry in before):
            self._console.print(f"nothing to start: {_states(before)}")
        return Endpoints(database_url=database_url, kafka_bootstrap=bootstrap)

    def down(self) -> None:
        """Stop the services this stack manages; their data is kept.

        Raises:
            StackError: a service did not stop.
        """
        before = self.status()
        bootstrap = self._settings.external_kafka_bootstrap
        if bootstrap is None:
            self.kafka.stop()
        else:
            self._console.print(f"kafka: external ({bootstrap}), left alone")
        database_url = self._settings.external_database_url
        if database_url is None:
            self.postgres.stop()
        else:
            self._console.print(f"postgres: external ({redact_password(database_url)}), left alone")
        if all(entry.state != "running" for entry in before):
            self._console.print(f"nothing to stop: {_states(before)}")

    def status(self) -> list[ServiceStatus]:
        """One entry per service: running, stopped, or external."""
        database_url = self._settings.external_database_url
        bootstrap = self._settings.external_kafka_bootstrap
        return [
            self.postgres.status()
            if database_url is None
            else ServiceStatus("postgres", "external", None, redact_password(database_url), None),
            self.kafka.status()
            if bootstrap is None
            else ServiceStatus("kafka", "external", None, bootstrap, None),
        ]


def _states(statuses: list[ServiceStatus]) -> str:
    words = {"running": "already running", "stopped": "not running", "external": "external"}
    return ", ".join(f"{entry.name} {words[entry.state]}" for entry in statuses)
