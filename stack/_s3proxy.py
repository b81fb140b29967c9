"""S3Proxy: a local S3-compatible object store for backups, kept in plain files.

S3Proxy runs from its self-contained jar, which Maven copies once into
``<cache>/s3proxy/jars``; later starts need neither Maven nor the network. Layout under
``<cache>/s3proxy``: ``jars/``, ``data/`` (one folder per bucket), ``logs/s3proxy.out``,
``credentials`` (the access key and secret, made once and reused), ``s3proxy.conf``
(written on every start), ``backup.env`` (what a shell sources to reach the store) and
``s3proxy.pid``. Every file holding the secret is readable by its owner only.
"""

from __future__ import annotations

import logging
import os
import secrets
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from agent_blackbox.schemas import safe_console, write_owner_only
from agent_blackbox.stack._maven import MavenJars
from agent_blackbox.stack._process import (
    ChildService,
    PidFile,
    ServiceError,
    find_java,
    require_free_port,
    tail_file,
)
from agent_blackbox.stack._settings import BACKUP_URL_ENV

if TYPE_CHECKING:
    from types_boto3_s3 import S3Client

POM = Path(__file__).resolve().parent / "s3proxy" / "pom.xml"
DEFAULT_BUCKET = "blackbox-backups"
_MAIN_CLASS = "org.gaul.s3proxy.Main"
# Backups stream objects through S3Proxy rather than holding them: a small heap is enough
# and leaves the machine's memory to PostgreSQL and Kafka.
_JVM_HEAP = ("-Xms32m", "-Xmx256m")
# The jar's logging configuration draws a warning from its own logging library, which then
# prints its whole setup report first; the log should start with S3Proxy's own lines.
_QUIET_LOGGING_SETUP = "-Dlogback.statusListenerClass=ch.qos.logback.core.status.NopStatusListener"
_ELSEWHERE = f"set {BACKUP_URL_ENV} to use an object store you already run"
# S3Proxy signs with whatever region the request names; one fixed value keeps the
# readiness check independent of the user's AWS configuration.
_SIGNING_REGION = "us-east-1"
_client_log = logging.getLogger("agent_blackbox.stack.s3proxy")


@dataclass(frozen=True)
class S3Credentials:
    """The access key and secret S3Proxy accepts; the secret never appears in a repr."""

    access_key: str
    secret_key: str = field(repr=False)

    @classmethod
    def generate(cls) -> S3Credentials:
        """Fresh random credentials (hex, so they need no quoting anywhere)."""
        return cls(access_key=secrets.token_hex(10), secret_key=secrets.token_hex(20))


@dataclass(frozen=True)
class S3Endpoint:
    """Where the local object store listens and how to sign requests to it.

    Attributes:
        endpoint_url: e.g. ``http://127.0.0.1:29900``.
        bucket: The bucket backups go to; it exists once ``start()`` returns.
        access_key: ``AWS_ACCESS_KEY_ID`` for the store.
        secret_key: ``AWS_SECRET_ACCESS_KEY`` for the store (left out of the repr).
        env_file: A file of ``export`` lines setting the backup URL and both keys, for
            ``. env_file`` in a shell; readable by its owner only.
    """

    endpoint_url: str
    bucket: str
    access_key: str
    secret_key: str = field(repr=False)
    env_file: Path

    @property
    def backup_url(self) -> str:
        """The ``BLACKBOX_BACKUP_URL`` value naming the bucket at this endpoint."""
        return f"s3://{self.bucket}/?endpoint={self.endpoint_url}"


def load_credentials(path: Path) -> S3Credentials:
    """The credentials kept in ``path``, generated and written (mode 0600) the first time.

    Two launchers racing on a fresh cache folder agree: the file is created by linking a
    complete copy into place, which fails for the second, which then reads the first's.

    Raises:
        ServiceError: the file exists but is not one the stack wrote.
    """
    if not path.exists():
        partial = path.with_name(f"{path.name}.{os.getpid()}.new")
        write_private(partial, _render_credentials(S3Credentials.generate()))
        try:
            os.link(partial, path)
        except FileExistsError:
            pass  # another launcher won the race; its credentials are the ones to keep
        finally:
            partial.unlink()
    return _parse_credentials(path)


def _render_credentials(credentials: S3Credentials) -> str:
    return (
        "# The local S3Proxy's credentials, made once for this cache folder.\n"
        f"access_key={credentials.access_key}\nsecret_key={credentials.secret_key}\n"
    )


def _parse_credentials(path: Path) -> S3Credentials:
    lines = path.read_text().splitlines()
    pairs = dict(line.split("=", 1) for line in lines if "=" in line and line[0] != "#")
    if not pairs.get("access_key") or not pairs.get("secret_key"):
        raise ServiceError(
            f"{path} does not hold S3Proxy credentials (access_key=... and secret_key=...). "
            "Delete it and start again: S3Proxy then gets new credentials, and the "
            "objects it keeps stay readable with them."
        )
    return S3Credentials(access_key=pairs["access_key"], secret_key=pairs["secret_key"])


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable and writable by its owner only (0600).

    The file is replaced atomically, and never exists with wider permissions, not even
    for a moment: the mode is set on a fresh file before the secret is written to it.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    write_owner_only(path, text.encode())


def render_s3proxy_conf(*, port: int, credentials: S3Credentials, base_dir: Path) -> str:
    """``s3proxy.conf``: loopback only, signed requests only, objects as files."""
    settings = {
        "s3proxy.endpoint": f"http://127.0.0.1:{port}",
        # Both signature versions: boto3 signs with v4, older tools still with v2.
        "s3proxy.authorization": "aws-v2-or-v4",
        "s3proxy.identity": credentials.access_key,
        "s3proxy.credential": credentials.secret_key,
        "jclouds.provider": "filesystem",
        "jclouds.filesystem.basedir": str(base_dir),
    }
    lines = [f"{key}={value}" for key, value in settings.items()]
    return "# Written by the blackbox stack launcher on every start.\n" + "\n".join(lines) + "\n"


def render_env_file(endpoint: S3Endpoint) -> str:
    """``export`` lines for a shell: the backup URL and the store's credentials."""
    exports = {
        BACKUP_URL_ENV: endpoint.backup_url,
        "AWS_ACCESS_KEY_ID": endpoint.access_key,
        "AWS_SECRET_ACCESS_KEY": endpoint.secret_key,
    }
    lines = [f"export {name}={shlex.quote(value)}" for name, value in exports.items()]
    header = (
        "# Written by the blackbox stack launcher on every start of S3Proxy.\n"
        f"# `. {shlex.quote(str(endpoint.env_file))}` points the backup commands at it.\n"
    )
    return header + "\n".join(lines) + "\n"


class LocalS3(ChildService):
    """S3Proxy on loopback, storing objects as files under one cache folder.

    Args:
        cache_dir: The stack's cache folder; S3Proxy lives in ``<cache_dir>/s3proxy``.
        port: Loopback port of its S3 endpoint.
        bucket: The bucket made ready for backups.
        console: Where progress messages go (stderr by default).
        start_timeout: Seconds to wait for it to answer a signed request after launch.
        stop_timeout: Seconds to wait for a clean shutdown before SIGKILL.
    """

    name = "s3"
    label = "S3Proxy"

    def __init__(
        self,
        cache_dir: Path,
        port: int = 29900,
        *,
        bucket: str = DEFAULT_BUCKET,
        console: Console | None = None,
        start_timeout: float = 60.0,
        stop_timeout: float = 15.0,
    ) -> None:
        self._root = cache_dir.resolve() / "s3proxy"
        self._port = port
        self._bucket = bucket
        self._console = console or safe_console(stderr=True, soft_wrap=True)
        self._start_timeout = start_timeout
        self._stop_timeout = stop_timeout
        self._jars = MavenJars(
            self._root / "jars",
            pom=POM,
            service="s3",
            what="the S3Proxy jar",
            alternative=_ELSEWHERE,
            console=self._console,
        )
        self._child: subprocess.Popen[bytes] | None = None

    @property
    def endpoint_url(self) -> str:
        """The URL S3 clients use as their endpoint."""
        return f"http://127.0.0.1:{self._port}"

    @property
    def address(self) -> str:
        """Where clients connect."""
        return self.endpoint_url

    @property
    def data_dir(self) -> Path:
        """The filesystem backend's base folder: one folder per bucket."""
        return self._root / "data"

    @property
    def conf_path(self) -> Path:
        """The generated ``s3proxy.conf``."""
        return self._root / "s3proxy.conf"

    @property
    def credentials_path(self) -> Path:
        """The access key and secret, kept across restarts."""
        return self._root / "credentials"

    @property
    def env_file(self) -> Path:
        """``backup.env``: what a shell sources to reach the store."""
        return self._root / "backup.env"

    @property
    def log_path(self) -> Path:
        """S3Proxy's own output (it logs to the console)."""
        return self._root / "logs" / "s3proxy.out"

    def start(self) -> S3Endpoint:
        """Start S3Proxy and wait until it answers a signed request for the bucket.

        Also (re)writes :attr:`env_file`.

        Returns:
            The endpoint and credentials. When S3Proxy already runs this only returns them.

        Raises:
            MissingPrerequisiteError: Java or (on the first start) Maven is missing.
            ServiceError: S3Proxy exited or did not answer in time (the message quotes
                the end of its log), or its port is taken by another program.
        """
        credentials = load_credentials(self.credentials_path)
        pid = self.pid()
        if pid is not None:
            self._console.print(f"s3: already running (pid {pid}) at {self.endpoint_url}")
            return self._endpoint(credentials)
        self._remove_stale_pid_file()
        require_free_port(self._port, service="S3Proxy", option="--s3-port")
        java = find_java(service="S3Proxy", alternative=_ELSEWHERE)
        self._jars.ensure()
        # The filesystem backend lists each folder of its base as a bucket: making the
        # folder is how the bucket is created, and it is there before the first request.
        (self.data_dir / self._bucket).mkdir(parents=True, exist_ok=True)
        write_private(self.conf_path, self._conf(credentials))
        began = time.monotonic()
        self._launch(java, credentials)
        elapsed = time.monotonic() - began
        self._console.print(
            f"s3: started S3Proxy (pid {self.pid()}) at {self.endpoint_url} in {elapsed:.1f}s"
        )
        return self._endpoint(credentials)

    # -- steps of start() ----------------------------------------------------------

    def _pid_file(self) -> PidFile:
        return PidFile(self._root / "s3proxy.pid", marker=self._marker())

    def _marker(self) -> str:
        return f"{_MAIN_CLASS} --properties {self.conf_path}"

    def _conf(self, credentials: S3Credentials) -> str:
        return render_s3proxy_conf(port=self._port, credentials=credentials, base_dir=self.data_dir)

    def _endpoint(self, credentials: S3Credentials) -> S3Endpoint:
        endpoint = S3Endpoint(
            endpoint_url=self.endpoint_url,
            bucket=self._bucket,
            access_key=credentials.access_key,
            secret_key=credentials.secret_key,
            env_file=self.env_file,
        )
        write_private(self.env_file, render_env_file(endpoint))
        return endpoint

    def _launch(self, java: str, credentials: S3Credentials) -> None:
        argv = [java, *_JVM_HEAP, _QUIET_LOGGING_SETUP, "-cp", self._jars.classpath, _MAIN_CLASS]
        argv += ["--properties", str(self.conf_path)]
        client: S3Client | None = None

        def answers() -> bool:
            nonlocal client
            client = client or _client(self.endpoint_url, credentials)
            return self._bucket_answers(client)

        self._launch_child(argv, out=self.log_path, answers=answers)

    def _bucket_answers(self, client: S3Client) -> bool:
        """Whether a signed request for the bucket succeeds; ``False`` while S3Proxy
        cannot take requests yet.

        Raises:
            ServiceError: S3Proxy answered, but refused the request.
        """
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            client.head_bucket(Bucket=self._bucket)
        except ClientError as exc:
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            if status >= 500:
                return False
            raise ServiceError(
                f"S3Proxy on {self.endpoint_url} answered HTTP {status} to a signed request "
                f"for bucket {self._bucket!r}. Stop it, check {self.conf_path} and "
                f"{self.data_dir / self._bucket}, then start again.\n{self._logs()}"
            ) from exc
        except BotoCoreError as exc:
            _client_log.debug("S3Proxy not ready yet: %s", exc)
            return False
        return True

    def _logs(self) -> str:
        out = self.log_path  # each launch starts it afresh: all of it is this launch's
        return f"Last lines of {out}:\n{tail_file(out)}"


def _client(endpoint_url: str, credentials: S3Credentials) -> S3Client:
    """An S3 client for the readiness check: one attempt per call, short timeouts.

    Raises:
        ServiceError: boto3 could not build a client (a broken AWS configuration).
    """
    # Imported here: boto3 takes a fifth of a second to import, and every `blackbox`
    # command loads this module, most of them without ever starting S3Proxy.
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError

    config = Config(
        # S3Proxy serves buckets as paths and lacks the newer checksum headers.
        s3={"addressing_style": "path"},
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        retries={"max_attempts": 1},
        connect_timeout=1,
        read_timeout=5,
    )
    try:
        return boto3.client(
            "s3",
            endpoint_url=endpoint_url,
            aws_access_key_id=credentials.access_key,
            aws_secret_access_key=credentials.secret_key,
            region_name=_SIGNING_REGION,
            config=config,
        )
    except BotoCoreError as exc:
        raise ServiceError(
            f"Could not make an S3 client to check S3Proxy: {exc}. Fix the AWS settings in "
            "the environment (AWS_PROFILE, AWS_CONFIG_FILE), then retry."
        ) from exc
