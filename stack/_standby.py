"""A streaming-replication standby of the local PostgreSQL, and its promotion.

The standby is cloned from the running primary with ``pg_basebackup`` (WAL streamed
during the copy, a physical replication slot so the primary keeps the WAL the standby
has not received yet), then runs as a hot standby on its own port. The primary names it
in ``synchronous_standby_names``: a commit returns only once the standby has the commit
record on disk, so a commit an agent was told about survives the primary's loss.

Layout: the standby's folder sits beside the primary's (``<cache>/postgres-standby``),
with the same ``data/``, ``run/`` and ``postgres.log``; a ``promoted`` file there records
that it was promoted (the old primary's data is then behind it and must not serve again).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from rich.console import Console

from agent_blackbox.stack._postgres import PG_CTL_TIMEOUT_S, ROLE, LocalPostgres
from agent_blackbox.stack._process import (
    ServiceError,
    ServiceStatus,
    as_user,
    require_free_port,
    run_checked,
    wait_for,
)

STANDBY_NAME = "blackbox_standby"
"""The standby's replication slot on the primary and its name in
``synchronous_standby_names`` (its ``cluster_name``, which its WAL receiver reports)."""
STREAMING_TIMEOUT_S = 60.0
_REPLICATION_HBA = "host    replication  all   127.0.0.1/32  trust"


def render_standby_conf(*, port: int, socket_dir: Path) -> str:
    """The standby's ``blackbox.conf``: where it listens, the name it streams under, and
    no synchronous standbys of its own (once promoted, commits must not wait for one)."""
    return "\n".join(
        [
            "# Written by the blackbox stack launcher on every start; edits are overwritten.",
            "listen_addresses = '127.0.0.1'",
            f"port = {port}",
            f"unix_socket_directories = '{socket_dir}'",
            "max_connections = 200",
            f"cluster_name = '{STANDBY_NAME}'",
            "hot_standby = on",
            "synchronous_standby_names = ''",
            "fsync = on",
            "synchronous_commit = on",
            "",
        ]
    )


def multi_host_url(*servers: LocalPostgres) -> str:
    """The database URL naming every server, that connects to the one that accepts writes
    (SQLAlchemy's form of libpq's multi-host URL)."""
    hosts = "&".join(f"host=127.0.0.1:{server.port}" for server in servers)
    return f"postgresql+psycopg://{ROLE}@/blackbox?{hosts}&target_session_attrs=read-write"


class PostgresStandby(LocalPostgres):
    """A hot standby of ``primary``, streaming synchronously, on its own port.

    Args:
        primary: The server it replicates; it must run when the standby is first made.
        port: Loopback TCP port of the standby (the stack uses the primary's + 1).
        console: Where progress messages go.
    """

    name = "postgres-standby"

    def __init__(self, primary: LocalPostgres, port: int, *, console: Console | None = None):
        super().__init__(primary.cache_dir, port, console=console)
        self._primary = primary

    @property
    def root(self) -> Path:
        """Beside the primary's folder (moved with it when it had to move)."""
        return self._primary.root.with_name(self._primary.root.name + "-standby")

    @property
    def promoted(self) -> bool:
        """Whether ``promote`` ran: the standby is the primary now."""
        return (self.root / "promoted").exists()

    def exists(self) -> bool:
        """Whether a standby cluster has been made (running or not)."""
        return (self.data_dir / "PG_VERSION").exists()

    def start(self) -> str:
        """Clone the primary (the first time), start the standby, wait until it streams,
        then make the primary's commits wait for it.

        Returns:
            The standby's own URL (it only reads until promoted).

        Raises:
            ServiceError: the primary does not run, or cloning, starting or streaming
                failed; the message says what to check.
        """
        pid = self.pid()
        if pid is not None:
            self._console.print(f"{self.name}: already running (pid {pid}) at {self.url}")
            return self.url
        self._clear_stale_files()
        require_free_port(self._port, service="the PostgreSQL standby", option="--standby-port")
        if not self.exists():
            self._clone()
        self._write(self.data_dir / "blackbox.conf", self._conf())
        self._pg_ctl_start(self._bin_dir())
        if not self.promoted:
            self._wait_streaming()
            self.require_synchronous(True)
        self._console.print(f"{self.name}: started (pid {self.pid()}) at {self.url}")
        return self.url

    def promote(self) -> str:
        """Make the standby the primary (``pg_ctl promote``), waiting until it accepts
        writes. Commits no longer wait for any standby.

        Returns:
            Its URL.

        Raises:
            ServiceError: it does not run, or the promotion did not finish in time.
        """
        if self.pid() is None:
            raise ServiceError(
                f"The standby is not running, so it cannot be promoted. Start it with "
                f"`blackbox stack up --pg-standby` (see {self.log_path})."
            )
        if self.promoted and self.role() == "primary":
            self._console.print(f"{self.name}: already promoted; it is the primary")
            return self.url
        argv = [str(self._bin_dir() / "pg_ctl"), "promote", "-D", str(self.data_dir)]
        run_checked(
            as_user([*argv, "-w", "-t", str(PG_CTL_TIMEOUT_S), "-s"], self._os_user),
            what="Promoting the standby",
            hint=f"See {self.log_path}.",
            cwd=self.root,
        )
        (self.root / "promoted").write_text(
            f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n"
        )
        self._console.print(f"{self.name}: promoted; it accepts writes at {self.url}")
        return self.url

    def role(self) -> str | None:
        """``"primary"`` or ``"standby"`` as the running server says, ``None`` when it
        does not run or does not answer."""
        return server_role(self)

    def status(self) -> ServiceStatus:
        """A snapshot for ``stack status``, with the server's role."""
        return with_role(super().status(), self)

    def require_synchronous(self, wait: bool) -> None:
        """Whether the primary's commits wait for this standby (``ALTER SYSTEM`` on the
        primary, then a reload). Off when the standby is not started with the stack:
        otherwise every commit would wait for a server that is not there."""
        value = f"'{STANDBY_NAME}'" if wait else "''"
        current = _sql(self._primary, "SHOW synchronous_standby_names", what="Reading the primary")
        if current == (STANDBY_NAME if wait else ""):
            return
        _sql(
            self._primary,
            f"ALTER SYSTEM SET synchronous_standby_names = {value}",
            what="ALTER SYSTEM",
        )
        _sql(self._primary, "SELECT pg_reload_conf()", what="Reloading the primary's settings")
        if wait:
            self._console.print(f"postgres: commits now wait for {STANDBY_NAME} (synchronous)")
        else:
            self._console.print("postgres: commits no longer wait for a standby")

    # -- steps of start() ----------------------------------------------------------

    def _conf(self) -> str:
        return render_standby_conf(port=self._port, socket_dir=self._socket_dir())

    def _make_reachable_for_postgres(self) -> None:
        # The primary's start made the folders above both clusters traversable already.
        self.root.mkdir(parents=True, exist_ok=True)

    def _bin_dir(self) -> Path:
        # Before the clone exists, the primary's version decides (they must match).
        return super()._bin_dir() if self.exists() else self._primary.bin_dir()

    def _clone(self) -> None:
        if self._primary.pid() is None:
            raise ServiceError(
                "The primary PostgreSQL is not running, so there is nothing to clone the "
                "standby from. Start both with `blackbox stack up --pg-standby`."
            )
        self._prepare_dirs()
        self._allow_replication()
        _sql(
            self._primary,
            f"SELECT pg_create_physical_replication_slot('{STANDBY_NAME}') WHERE NOT EXISTS "
            f"(SELECT 1 FROM pg_replication_slots WHERE slot_name = '{STANDBY_NAME}')",
            what="Creating the replication slot",
        )
        self._console.print(f"{self.name}: cloning the primary into {self.data_dir}")
        argv = [str(self._bin_dir() / "pg_basebackup"), "-D", str(self.data_dir)]
        argv += ["-h", "127.0.0.1", "-p", str(self._primary.port), "-U", "postgres"]
        argv += ["-X", "stream", "-S", STANDBY_NAME, "-R", "-c", "fast"]
        run_checked(
            as_user(argv, self._os_user),
            what="pg_basebackup",
            hint=f"Delete {self.root} and try again; see {self._primary.log_path}.",
            cwd=self.root,
        )
        # The clone carries the primary's ALTER SYSTEM settings, which win over the
        # standby's own file: a promoted standby waiting for a standby of its own would
        # never commit again.
        auto_conf = self.data_dir / "postgresql.auto.conf"
        kept = [
            line
            for line in auto_conf.read_text().splitlines()
            if not line.strip().startswith("synchronous_standby_names")
        ]
        self._write(auto_conf, "\n".join([*kept, ""]))

    def _allow_replication(self) -> None:
        """Let replication connections in over loopback (the stack's ``pg_hba.conf``
        predates the standby), and reload the primary when that changed."""
        hba = self._primary.data_dir / "pg_hba.conf"
        if _REPLICATION_HBA in hba.read_text():
            return
        with hba.open("a") as handle:
            handle.write(f"{_REPLICATION_HBA}\n")
        _sql(self._primary, "SELECT pg_reload_conf()", what="Reloading the primary's settings")

    def _wait_streaming(self) -> None:
        query = (
            "SELECT count(*) FROM pg_stat_replication "
            f"WHERE application_name = '{STANDBY_NAME}' AND state = 'streaming'"
        )
        if not wait_for(
            lambda: _sql(self._primary, query, what="Reading pg_stat_replication") == "1",
            timeout=STREAMING_TIMEOUT_S,
        ):
            raise ServiceError(
                f"The standby started but does not stream from the primary after "
                f"{STREAMING_TIMEOUT_S:g}s. See {self.log_path} and {self._primary.log_path}."
            )


def server_role(server: LocalPostgres) -> str | None:
    """``"primary"`` or ``"standby"`` as ``server`` says (``pg_is_in_recovery``), ``None``
    when it does not run or does not answer."""
    if server.pid() is None:
        return None
    try:
        answer = _sql(server, "SELECT pg_is_in_recovery()", what="Asking the server its role")
    except ServiceError:
        return None
    return "standby" if answer == "t" else "primary"


def with_role(status: ServiceStatus, server: LocalPostgres) -> ServiceStatus:
    """``status`` with the server's role filled in."""
    role = server_role(server) if status.state == "running" else None
    return ServiceStatus(
        status.name, status.state, status.pid, status.address, status.data_dir, role
    )


def _sql(server: LocalPostgres, sql: str, *, what: str) -> str:
    """Run one statement as the superuser over ``server``'s socket; its output, trimmed."""
    argv = [str(server.bin_dir() / "psql"), "-X", "-q", "-tA", "-v", "ON_ERROR_STOP=1"]
    argv += ["-h", str(server.socket_dir), "-p", str(server.port)]
    return run_checked(
        [*argv, "-U", "postgres", "-d", "postgres", "-c", sql],
        what=what,
        hint=f"See {server.log_path}.",
        env={**os.environ, "PGCONNECT_TIMEOUT": "5"},
    ).strip()
