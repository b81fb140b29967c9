"""PostgreSQL from the machine's Debian package, initialised into the stack's cache folder.

Layout under ``<cache>/postgres``: ``data/`` (the cluster), ``run/`` (the unix socket, so
several instances never share a socket directory) and ``postgres.log``.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import stat
import subprocess
from pathlib import Path

from rich.console import Console

from agent_blackbox.schemas import safe_console
from agent_blackbox.stack._process import (
    MissingPrerequisiteError,
    PidFile,
    PidService,
    ServiceError,
    as_user,
    file_size,
    require_free_port,
    run_checked,
    tail_file,
)

DATABASE = "blackbox"
ROLE = "blackbox"
SUPERUSER = "postgres"
OS_USER = "postgres"
"""The account Debian's package creates; PostgreSQL refuses to run as root."""
INCLUDE_LINE = "include_if_exists = 'blackbox.conf'"
PG_CTL_TIMEOUT_S = 60
_PG_LIB = Path("/usr/lib/postgresql")
_MAX_SOCKET_PATH = 107  # sun_path is 108 bytes including the terminating NUL


def find_bin_dir(major: str | None = None) -> Path | None:
    """The newest ``/usr/lib/postgresql/<major>/bin`` holding ``initdb``, if any.

    Args:
        major: Only consider this major version (the one a data directory was made by).
    """
    found = [
        initdb.parent
        for initdb in _PG_LIB.glob("*/bin/initdb")
        if major is None or initdb.parent.parent.name == major
    ]
    found.sort(key=lambda path: _version_key(path.parent.name))
    return found[-1] if found else None


def _version_key(name: str) -> tuple[int, ...]:
    return tuple(int(part) for part in name.split(".") if part.isdigit())


def install_postgres(console: Console) -> Path:
    """Install Debian's ``postgresql`` package when running as root.

    Returns:
        The ``bin`` directory of the installed version.

    Raises:
        MissingPrerequisiteError: when not root, or when the installation fails.
    """
    if os.geteuid() != 0:
        raise MissingPrerequisiteError(
            f"PostgreSQL is not installed (no {_PG_LIB}/*/bin/initdb). Install Debian's "
            "package with `sudo apt-get install postgresql`, or point BLACKBOX_DATABASE_URL "
            "at a server you already have."
        )
    console.print(
        "[bold]PostgreSQL is not installed: installing Debian's package[/] "
        "(apt-get update && apt-get install -y postgresql)"
    )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update"], ["apt-get", "install", "-y", "postgresql"]):
        if subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, check=False).returncode:
            raise MissingPrerequisiteError(
                f"`{' '.join(argv)}` failed (output above). Fix the package sources and run "
                "`apt-get install postgresql` yourself, then try again."
            )
    bin_dir = find_bin_dir()
    if bin_dir is None:
        raise MissingPrerequisiteError(
            f"apt-get installed postgresql but {_PG_LIB}/*/bin/initdb is still missing. "
            "Check `dpkg -L postgresql-common` and install a postgresql-<version> package."
        )
    return bin_dir


def render_conf(*, port: int, socket_dir: Path) -> str:
    """The settings the launcher adds to ``postgresql.conf`` (as ``blackbox.conf``)."""
    return "\n".join(
        [
            "# Written by the blackbox stack launcher on every start; edits are overwritten.",
            "listen_addresses = '127.0.0.1'",
            f"port = {port}",
            f"unix_socket_directories = {_quote(str(socket_dir))}",
            "max_connections = 200",
            # Durability stays at PostgreSQL's defaults: the outbox relies on a commit
            # being on disk before the relay may publish it.
            "fsync = on",
            "synchronous_commit = on",
            "",
        ]
    )


def render_hba() -> str:
    """``pg_hba.conf``: password-less access over the socket and loopback IPv4 only."""
    return "\n".join(
        [
            "# Written by the blackbox stack launcher: a dev server, reachable only locally.",
            "# TYPE  DATABASE  USER  ADDRESS       METHOD",
            "local   all       all                 trust",
            "host    all       all   127.0.0.1/32  trust",
            "",
        ]
    )


def _quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


class LocalPostgres(PidService):
    """A PostgreSQL server for development, owned by one cache folder and one port.

    Args:
        cache_dir: The stack's cache folder; the cluster lives in ``<cache_dir>/postgres``.
        port: Loopback TCP port to listen on.
        console: Where progress messages go (stderr by default).
    """

    name = "postgres"

    def __init__(self, cache_dir: Path, port: int = 25432, *, console: Console | None = None):
        self._cache_dir = cache_dir.resolve()
        self._port = port
        self._console = console or safe_console(stderr=True, soft_wrap=True)
        self._os_user = OS_USER if os.geteuid() == 0 else None

    @property
    def url(self) -> str:
        """The SQLAlchemy URL of the ``blackbox`` database."""
        return f"postgresql+psycopg://{ROLE}@127.0.0.1:{self._port}/{DATABASE}"

    @property
    def port(self) -> int:
        """The loopback TCP port it listens on."""
        return self._port

    @property
    def cache_dir(self) -> Path:
        """The stack's cache folder this server belongs to."""
        return self._cache_dir

    @property
    def socket_dir(self) -> Path:
        """The folder of its unix socket (the superuser connects there)."""
        return self._socket_dir()

    def bin_dir(self) -> Path:
        """The ``bin`` folder of the PostgreSQL version its data directory needs.

        Raises:
            MissingPrerequisiteError: that version is not installed (and cannot be).
        """
        return self._bin_dir()

    @property
    def root(self) -> Path:
        """The folder holding ``data/``, ``run/`` and the server log."""
        primary = self._cache_dir / "postgres"
        pointer = primary / "location"
        return Path(pointer.read_text().strip()) if pointer.exists() else primary

    @property
    def data_dir(self) -> Path:
        """The cluster's data directory."""
        return self.root / "data"

    @property
    def log_path(self) -> Path:
        """The server log that ``pg_ctl -l`` appends to."""
        return self.root / "postgres.log"

    @property
    def address(self) -> str:
        """Where clients connect."""
        return self.url

    def start(self) -> str:
        """Start the server (installing and initialising it first if needed).

        Returns:
            The database URL. When the server already runs this is a no-op.

        Raises:
            MissingPrerequisiteError: PostgreSQL is not installed and cannot be installed.
            ServiceError: initdb, start-up or creating the database failed.
        """
        pid = self.pid()
        if pid is not None:
            self._console.print(f"postgres: already running (pid {pid}) at {self.url}")
            return self.url
        self._clear_stale_files()
        require_free_port(self._port, service="PostgreSQL", option="--postgres-port")
        bin_dir = self._bin_dir()
        self._prepare_dirs()
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb(bin_dir)
        self._write(self.data_dir / "blackbox.conf", self._conf())
        self._pg_ctl_start(bin_dir)
        self._ensure_database(bin_dir)
        self._console.print(f"postgres: started (pid {self.pid()}) at {self.url}")
        return self.url

    def stop(self) -> None:
        """Stop the server with a fast shutdown; a no-op when it is not running.

        Raises:
            ServiceError: ``pg_ctl stop`` did not finish within its timeout.
        """
        if self.pid() is None:
            self._clear_stale_files()
            self._console.print(f"{self.name}: not running")
            return
        argv = [str(self._bin_dir() / "pg_ctl"), "stop", "-D", str(self.data_dir)]
        run_checked(
            as_user([*argv, "-m", "fast", "-w", "-t", str(PG_CTL_TIMEOUT_S), "-s"], self._os_user),
            what="Stopping PostgreSQL",
            hint=f"See {self.log_path}.",
            cwd=self.root,
        )
        self._console.print(f"{self.name}: stopped")

    # -- steps of start() ----------------------------------------------------------

    def _pid_file(self) -> PidFile:
        return PidFile(self.data_dir / "postmaster.pid", marker=str(self.data_dir))

    def _socket_dir(self) -> Path:
        return self.root / "run"

    def _conf(self) -> str:
        return render_conf(port=self._port, socket_dir=self._socket_dir())

    def _clear_stale_files(self) -> None:
        """Remove a postmaster.pid and socket lock left by a server that died.

        PostgreSQL refuses to start when such a pid now belongs to another user's process.
        """
        if self._pid_file().is_stale():
            self._pid_file().remove()
        if self._socket_dir().is_dir():
            for leftover in self._socket_dir().glob(".s.PGSQL.*"):
                leftover.unlink(missing_ok=True)

    def _bin_dir(self) -> Path:
        version_file = self.data_dir / "PG_VERSION"
        if version_file.exists():
            major = version_file.read_text().strip()
            if (bin_dir := find_bin_dir(major)) is not None:
                return bin_dir
            raise MissingPrerequisiteError(
                f"{self.data_dir} was created by PostgreSQL {major}, which is not installed. "
                f"Install postgresql-{major}, or delete {self.root} to start from scratch."
            )
        return find_bin_dir() or install_postgres(self._console)

    def _prepare_dirs(self) -> None:
        if self._os_user is not None:
            self._make_reachable_for_postgres()
        socket = self._socket_dir() / f".s.PGSQL.{self._port}"
        if len(str(socket)) > _MAX_SOCKET_PATH:
            raise ServiceError(
                f"The socket path {socket} is longer than {_MAX_SOCKET_PATH} bytes. "
                "Use a shorter cache folder (--cache-dir or BLACKBOX_CACHE_DIR)."
            )
        for folder in (self.root, self.data_dir, self._socket_dir()):
            folder.mkdir(parents=True, exist_ok=True)
            self._chown(folder)
        self.data_dir.chmod(0o700)

    def _make_reachable_for_postgres(self) -> None:
        """Let the ``postgres`` account traverse the folders above the cluster.

        Adds o+x (never read) to folders that lack it. Where that is impossible (a
        read-only or root-squashed mount), the cluster moves under the account's home
        and ``<cache>/postgres/location`` records where.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        account = _account(OS_USER)
        blocked = _untraversable(self.root.parent, account)
        try:
            for folder in blocked:
                folder.chmod(folder.stat().st_mode | stat.S_IXOTH)
        except OSError:
            self._relocate(Path(account.pw_dir))
            return
        if blocked:
            names = ", ".join(str(folder) for folder in blocked)
            self._console.print(f"postgres: made {names} traversable (o+x) for the postgres user")

    def _relocate(self, home: Path) -> None:
        digest = hashlib.sha256(str(self._cache_dir).encode()).hexdigest()[:12]
        target = home / "blackbox" / digest
        target.mkdir(parents=True, exist_ok=True)
        (self._cache_dir / "postgres" / "location").write_text(f"{target}\n")
        self._console.print(
            f"postgres: the postgres user cannot reach {self._cache_dir}; "
            f"keeping the cluster in {target} instead"
        )

    def _initdb(self, bin_dir: Path) -> None:
        self._console.print(f"postgres: initialising a new cluster in {self.data_dir}")
        argv = [str(bin_dir / "initdb"), "-D", str(self.data_dir), "-U", SUPERUSER]
        run_checked(
            as_user([*argv, "-E", "UTF8", "--locale=C", "--auth=trust"], self._os_user),
            what="initdb",
            hint=f"If {self.data_dir} holds a half-made cluster, delete it and retry.",
            cwd=self.root,
        )
        self._write(self.data_dir / "pg_hba.conf", render_hba())
        with (self.data_dir / "postgresql.conf").open("a") as conf:
            conf.write(f"\n{INCLUDE_LINE}\n")

    def _pg_ctl_start(self, bin_dir: Path) -> None:
        argv = [str(bin_dir / "pg_ctl"), "start", "-D", str(self.data_dir)]
        argv += ["-l", str(self.log_path), "-w", "-t", str(PG_CTL_TIMEOUT_S), "-s"]
        offset = file_size(self.log_path)
        try:
            run_checked(
                as_user(argv, self._os_user),
                what="Starting PostgreSQL",
                hint=f"See {self.log_path}.",
                cwd=self.root,
            )
        except ServiceError as exc:
            raise ServiceError(
                f"{exc}\nLast lines of {self.log_path}:\n{tail_file(self.log_path, since=offset)}"
            ) from exc

    def _ensure_database(self, bin_dir: Path) -> None:
        if not self._psql(bin_dir, f"SELECT 1 FROM pg_roles WHERE rolname = '{ROLE}'"):
            self._psql(bin_dir, f"CREATE ROLE {ROLE} LOGIN SUPERUSER")
        if not self._psql(bin_dir, f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE}'"):
            self._psql(bin_dir, f"CREATE DATABASE {DATABASE} OWNER {ROLE}")

    def _psql(self, bin_dir: Path, sql: str) -> str:
        argv = [str(bin_dir / "psql"), "-X", "-q", "-tA", "-v", "ON_ERROR_STOP=1"]
        argv += ["-h", str(self._socket_dir()), "-p", str(self._port), "-U", SUPERUSER]
        return run_checked(
            [*argv, "-d", "postgres", "-c", sql],
            what=f"Creating the {DATABASE} role and database",
            hint=f"See {self.log_path}.",
        ).strip()

    def _write(self, path: Path, text: str) -> None:
        path.write_text(text)
        self._chown(path)

    def _chown(self, path: Path) -> None:
        if self._os_user is not None:
            account = _account(self._os_user)
            os.chown(path, account.pw_uid, account.pw_gid)


def _account(name: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        raise MissingPrerequisiteError(
            f"PostgreSQL refuses to run as root and there is no {name!r} account to run it as. "
            f"Reinstall Debian's package (`apt-get install --reinstall postgresql-common`), "
            f"which creates it, or run the stack as an ordinary user."
        ) from None


def _untraversable(folder: Path, account: pwd.struct_passwd) -> list[Path]:
    """``folder`` and its parents that ``account`` may not enter, outermost first."""
    groups = {account.pw_gid, *os.getgrouplist(account.pw_name, account.pw_gid)}
    blocked = []
    for candidate in [*reversed(folder.parents), folder]:
        info = candidate.stat()
        if info.st_uid == account.pw_uid:
            allowed = info.st_mode & stat.S_IXUSR
        elif info.st_gid in groups:
            allowed = info.st_mode & stat.S_IXGRP
        else:
            allowed = info.st_mode & stat.S_IXOTH
        if not allowed:
            blocked.append(candidate)
    return blocked
