"""Where the local stack lives and which services it manages, read from the environment once."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote_plus, urlsplit, urlunsplit

from agent_blackbox.schemas import normalize_database_url

CACHE_DIR_ENV = "BLACKBOX_CACHE_DIR"
DATABASE_URL_ENV = "BLACKBOX_DATABASE_URL"
KAFKA_BOOTSTRAP_ENV = "BLACKBOX_KAFKA_BOOTSTRAP"
BACKUP_URL_ENV = "BLACKBOX_BACKUP_URL"
# Query options whose values are never printed: a URL pasted with a signed request's
# parameters or an access key in it must not reach a terminal or a log.
_SECRET_OPTION = re.compile(r"(?i)secret|passw|token|signature|credential|key")


@dataclass(frozen=True)
class StackPorts:
    """Loopback ports of the local services.

    The defaults are deliberately not the services' usual ports (5432, 9092, 9093, 80, 8765), so
    the stack does not collide with a PostgreSQL, Kafka or web server the machine already
    runs. ``s3`` and ``console`` are checked like the others even when not asked for.

    Raises:
        ValueError: when a port is out of range or two services share a port.
    """

    postgres: int = 25432
    kafka: int = 29092
    controller: int = 29093
    s3: int = 29900
    console: int = 28765

    def __post_init__(self) -> None:
        ports = (self.postgres, self.kafka, self.controller, self.s3, self.console)
        if any(not 1 <= port <= 65535 for port in ports):
            raise ValueError(f"Ports must be between 1 and 65535, got {ports}.")
        if len(set(ports)) != len(ports):
            raise ValueError(f"Each service needs its own port, got {ports}.")


@dataclass(frozen=True)
class StackSettings:
    """Everything the launcher reads from the environment.

    Attributes:
        cache_dir: Root folder for data, logs, pid files and the Kafka jars.
        ports: Ports of the locally started services.
        external_database_url: ``BLACKBOX_DATABASE_URL``; when set, Postgres is not started.
        external_kafka_bootstrap: ``BLACKBOX_KAFKA_BOOTSTRAP``; when set, Kafka is not
            started.
        external_backup_url: ``BLACKBOX_BACKUP_URL``; when set, S3Proxy is not started.
    """

    cache_dir: Path
    ports: StackPorts = field(default_factory=StackPorts)
    external_database_url: str | None = None
    external_kafka_bootstrap: str | None = None
    external_backup_url: str | None = None

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        cache_dir: Path | None = None,
        ports: StackPorts | None = None,
    ) -> StackSettings:
        """Read the settings; explicit arguments win over the environment.

        Args:
            environ: The environment to read; ``os.environ`` when omitted.
            cache_dir: Overrides ``BLACKBOX_CACHE_DIR`` and the default cache folder.
            ports: Overrides the default ports.
        """
        env = os.environ if environ is None else environ
        return cls(
            cache_dir=(cache_dir or default_cache_dir(env)).expanduser().resolve(),
            ports=ports or StackPorts(),
            # A URL naming a primary and standbys, in the form the rest of the code parses.
            external_database_url=normalize_database_url(env.get(DATABASE_URL_ENV) or "") or None,
            external_kafka_bootstrap=env.get(KAFKA_BOOTSTRAP_ENV) or None,
            external_backup_url=env.get(BACKUP_URL_ENV) or None,
        )


def default_cache_dir(environ: Mapping[str, str]) -> Path:
    """``BLACKBOX_CACHE_DIR``, else ``<project root>/.cache/blackbox``.

    Outside a source checkout (no ``pyproject.toml`` next to the package) the per-user
    cache folder is used instead, so an installed package never writes into
    site-packages.
    """
    configured = environ.get(CACHE_DIR_ENV)
    if configured:
        return Path(configured)
    project_root = Path(__file__).resolve().parent.parent
    if (project_root / "pyproject.toml").exists():
        return project_root / ".cache" / "blackbox"
    xdg_cache = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg_cache) / "blackbox"


def redact_password(url: str) -> str:
    """``url`` with any password replaced by ``***``, safe to print."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    netloc = f"{parts.username or ''}:***@{host}"
    return urlunsplit(parts._replace(netloc=netloc))


def redact_url(url: str) -> str:
    """``url`` with its password and every secret-looking query value (an option named
    like a key, token, signature, credential or password) replaced by ``***``."""
    parts = urlsplit(redact_password(url))
    if not parts.query:
        return urlunsplit(parts)
    options = []
    for option in parts.query.split("&"):
        name, equals, _ = option.partition("=")
        secret = equals and _SECRET_OPTION.search(unquote_plus(name))
        options.append(f"{name}=***" if secret else option)
    return urlunsplit(parts._replace(query="&".join(options)))
