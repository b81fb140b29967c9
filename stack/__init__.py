"""The local development stack, without Docker: PostgreSQL, Kafka and (optionally) S3Proxy.

PostgreSQL comes from the machine's Debian package and is initialised into a cache folder;
Kafka (one KRaft node, or three replicating nodes with ``up(brokers=3)``) runs from the
official jars, fetched once with Maven; S3Proxy, an
S3-compatible object store for backups, runs from its jar the same way, only when asked
for. Everything (data, logs, pid files, sockets) lives under one cache folder and a set of
ports, so several stacks can run side by side::

    from agent_blackbox.stack import LocalStack

    endpoints = LocalStack().up(with_s3=True)  # idempotent
    print(endpoints.database_url, endpoints.kafka_bootstrap, endpoints.backup.backup_url)

``BLACKBOX_DATABASE_URL``, ``BLACKBOX_KAFKA_BOOTSTRAP`` or ``BLACKBOX_BACKUP_URL`` in the
environment point at services of your own; the stack then leaves that service alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from agent_blackbox.schemas import safe_console
from agent_blackbox.stack._cluster import LocalKafkaCluster
from agent_blackbox.stack._kafka import LocalKafka
from agent_blackbox.stack._postgres import LocalPostgres
from agent_blackbox.stack._process import (
    MissingPrerequisiteError,
    ServiceError,
    ServiceStatus,
    StackError,
)
from agent_blackbox.stack._s3proxy import LocalS3, S3Endpoint
from agent_blackbox.stack._settings import (
    StackPorts,
    StackSettings,
    redact_password,
    redact_url,
)
from agent_blackbox.stack._standby import PostgresStandby, multi_host_url, with_role
from agent_blackbox.stack._web import LocalWeb

__all__ = [
    "Endpoints",
    "LocalKafka",
    "LocalKafkaCluster",
    "LocalPostgres",
    "LocalS3",
    "LocalStack",
    "MissingPrerequisiteError",
    "PostgresStandby",
    "S3Endpoint",
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
        backup: The local object store, when S3Proxy was asked for and is not external.
    """

    database_url: str
    kafka_bootstrap: str
    backup: S3Endpoint | None = None


class LocalStack:
    """The services of the local stack, honouring the environment overrides.

    Args:
        cache_dir: Root folder for everything the stack writes; defaults to
            ``BLACKBOX_CACHE_DIR`` or ``<project root>/.cache/blackbox``.
        ports: Loopback ports; defaults to 25432 (Postgres), 29092 and 29093 (Kafka),
            29900 (S3Proxy).
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
        # The standby takes the next port (only started with --pg-standby).
        self.postgres_standby = PostgresStandby(
            self.postgres, chosen.postgres + 1, console=self._console
        )
        self.kafka = LocalKafka(cache, chosen.kafka, chosen.controller, console=self._console)
        self.kafka_cluster = LocalKafkaCluster(
            cache, chosen.kafka, chosen.controller, console=self._console
        )
        self.s3 = LocalS3(cache, chosen.s3, console=self._console)
        self.web = LocalWeb(cache, chosen.console, console=self._console)

    @property
    def settings(self) -> StackSettings:
        """The cache folder, ports and overrides in effect."""
        return self._settings

    def up(
        self, *, with_s3: bool = False, brokers: int | None = None, pg_standby: bool = False
    ) -> Endpoints:
        """Start whatever is not running yet; a no-op for services already up.

        Args:
            with_s3: Also start S3Proxy, the object store for backups.
            brokers: 1 for a single Kafka broker, 3 for a three-node cluster (replication
                factor 3, ``min.insync.replicas=2``); by default the cluster when it
                already runs, else one broker.
            pg_standby: Also start a streaming standby of PostgreSQL on the next port,
                which every commit waits for; the database URL then names both servers.

        Returns:
            The endpoints, external ones included.

        Raises:
            StackError: a service could not be installed, started or reached.
        """
        clustered = self._clustered(brokers)
        nodes = self.kafka_cluster.nodes
        kafka_names = {node.name for node in nodes} if clustered else {self.kafka.name}
        before = [
            entry
            for entry in self.status(clustered=clustered)
            if (with_s3 or entry.name != self.s3.name)
            and (pg_standby or entry.name != self.postgres_standby.name)
            and entry.name != self.web.name
            and (entry.name in kafka_names or not entry.name.startswith("kafka"))
        ]
        database_url = self._settings.external_database_url
        if database_url is None:
            database_url = self._start_postgres(pg_standby=pg_standby)
        elif pg_standby:
            raise StackError(
                "--pg-standby starts a standby of the local PostgreSQL, but "
                "BLACKBOX_DATABASE_URL points at a server of your own. Unset it, or give "
                "--cache-dir or --postgres-port to manage the local servers."
            )
        else:
            self._console.print(
                f"postgres: external ({redact_password(database_url)}), not started"
            )
        bootstrap = self._settings.external_kafka_bootstrap
        if bootstrap is None:
            bootstrap = self._start_kafka(clustered=clustered)
        else:
            self._console.print(f"kafka: external ({bootstrap}), not started")
        backup = self._start_s3() if with_s3 else None
        if all(entry.state != "stopped" for entry in before):
            self._console.print(f"nothing to start: {_states(before)}")
        return Endpoints(database_url=database_url, kafka_bootstrap=bootstrap, backup=backup)

    def _clustered(self, brokers: int | None) -> bool:
        if brokers is None:
            return self.kafka_cluster.is_running()
        if brokers not in (1, 3):
            raise StackError(f"--brokers must be 1 or 3, got {brokers}.")
        return brokers == 3

    def _start_kafka(self, *, clustered: bool) -> str:
        """The single broker or the cluster; refuses to start one while the other runs
        (they share the first ports)."""
        cache = self._settings.cache_dir
        if clustered and self.kafka.is_running():
            raise StackError(
                f"A single Kafka broker runs from {cache} at {self.kafka.bootstrap}: stop it "
                "with `blackbox stack down` (its data is kept), then `blackbox stack up "
                "--brokers 3`."
            )
        if not clustered and self.kafka_cluster.is_running():
            raise StackError(
                f"A three-broker Kafka cluster runs from {cache} at "
                f"{self.kafka_cluster.bootstrap}: use `blackbox stack up --brokers 3`, or "
                "stop it with `blackbox stack down` first (its data is kept)."
            )
        return self.kafka_cluster.start() if clustered else self.kafka.start()

    def _start_postgres(self, *, pg_standby: bool) -> str:
        """Start the primary (and the standby); the URL clients should use."""
        standby = self.postgres_standby
        if standby.promoted:
            # The old primary's data is behind the promoted standby: starting it would
            # give two servers accepting writes.
            self._console.print(
                f"postgres: not started: the standby was promoted, and the old primary's "
                f"data in {self.postgres.root} is behind it. Delete that folder and "
                f"{standby.root} to start over with a fresh pair."
            )
            return standby.start()
        url = self.postgres.start()
        if pg_standby or standby.is_running():
            standby.start()  # a no-op for a standby that runs
            return multi_host_url(self.postgres, standby)
        if standby.exists():
            # Commits would wait for a standby that is not there.
            standby.require_synchronous(False)
        return url

    def promote(self) -> str:
        """Promote the PostgreSQL standby to primary (after the primary is lost).

        Returns:
            The URL of the new primary.

        Raises:
            StackError: the primary still runs (both would accept writes), there is no
                running standby, or promoting it failed.
        """
        pid = self.postgres.pid()
        if pid is not None and not self.postgres_standby.promoted:
            raise StackError(
                f"The primary PostgreSQL still runs (pid {pid}): promoting the standby now "
                "would leave two servers accepting writes. Stop the primary first (`pg_ctl "
                f"stop -D {self.postgres.data_dir} -m fast` as the postgres user), then promote."
            )
        return self.postgres_standby.promote()

    def _start_s3(self) -> S3Endpoint | None:
        backup_url = self._settings.external_backup_url
        if backup_url is None:
            return self.s3.start()
        self._console.print(f"s3: external ({redact_url(backup_url)}), not started")
        return None

    def down(self) -> None:
        """Stop the services this stack manages; their data is kept.

        S3Proxy is stopped whenever it runs, even with ``BLACKBOX_BACKUP_URL`` set: the
        one in this cache folder is the stack's own.

        Raises:
            StackError: a service did not stop.
        """
        before = self.status()
        if self.web.is_running():
            self.web.stop()
        s3_running = self.s3.is_running()
        backup_url = self._settings.external_backup_url
        if s3_running:
            self.s3.stop()
        elif backup_url is not None:
            self._console.print(f"s3: external ({redact_url(backup_url)}), left alone")
        bootstrap = self._settings.external_kafka_bootstrap
        if bootstrap is None:
            cluster_ran = self.kafka_cluster.is_running()
            if cluster_ran:
                self.kafka_cluster.stop()
            if not cluster_ran or self.kafka.is_running():
                self.kafka.stop()
        else:
            self._console.print(f"kafka: external ({bootstrap}), left alone")
        database_url = self._settings.external_database_url
        if database_url is None:
            self.postgres.stop()
            if self.postgres_standby.exists():
                # After the primary: a clean shutdown sends its last WAL to the standby.
                self.postgres_standby.stop()
        else:
            self._console.print(f"postgres: external ({redact_password(database_url)}), left alone")
        if not s3_running and all(entry.state != "running" for entry in before):
            self._console.print(f"nothing to stop: {_states(before)}")

    def status(self, *, clustered: bool | None = None) -> list[ServiceStatus]:
        """One entry per service: running, stopped, or external.

        Args:
            clustered: List the three nodes of the Kafka cluster (``kafka-1`` ...)
                besides the single broker; by default when the cluster was ever started
                from this cache folder.
        """
        database_url = self._settings.external_database_url
        backup_url = self._settings.external_backup_url
        if clustered is None:
            clustered = self.kafka_cluster.exists()
        return [
            *self._postgres_status(database_url),
            *self._kafka_status(clustered=clustered),
            self.s3.status()
            if backup_url is None
            else ServiceStatus(self.s3.name, "external", None, redact_url(backup_url), None),
            self.web.status(),
        ]

    def _kafka_status(self, *, clustered: bool) -> list[ServiceStatus]:
        bootstrap = self._settings.external_kafka_bootstrap
        if bootstrap is not None:
            return [ServiceStatus("kafka", "external", None, bootstrap, None)]
        if not clustered:
            return [self.kafka.status()]
        # The single broker is left out of a cluster's listing unless it ever ran here.
        single = [self.kafka.status()] if self.kafka.data_dir.exists() else []
        return [*single, *self.kafka_cluster.status()]

    def _postgres_status(self, external_url: str | None) -> list[ServiceStatus]:
        """The primary's entry, and the standby's with both roles once one was made."""
        if external_url is not None:
            shown = redact_password(external_url)
            return [ServiceStatus("postgres", "external", None, shown, None)]
        if not self.postgres_standby.exists():
            return [self.postgres.status()]
        primary = with_role(self.postgres.status(), self.postgres)
        return [primary, self.postgres_standby.status()]


def _states(statuses: list[ServiceStatus]) -> str:
    words = {"running": "already running", "stopped": "not running", "external": "external"}
    return ", ".join(f"{entry.name} {words[entry.state]}" for entry in statuses)
