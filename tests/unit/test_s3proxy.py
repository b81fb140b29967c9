"""The local stack's S3Proxy: configuration, credentials and commands, without starting it."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError
from click.testing import CliRunner, Result
from rich.console import Console

from agent_blackbox.cli.commands.stack import _backup_rows
from agent_blackbox.stack import (
    Endpoints,
    LocalS3,
    LocalStack,
    MissingPrerequisiteError,
    S3Endpoint,
    ServiceError,
    ServiceStatus,
    StackPorts,
    StackSettings,
)
from agent_blackbox.stack._process import PidFile
from agent_blackbox.stack._s3proxy import (
    S3Credentials,
    load_credentials,
    render_env_file,
    render_s3proxy_conf,
    write_private,
)
from agent_blackbox.stack._settings import redact_url

QUIET = Console(quiet=True)
EXTERNAL_URL = "s3://team-backups/agents?endpoint=https://objects.invalid&X-Amz-Signature=abc"
SHOWN_URL = "s3://team-backups/agents?endpoint=https://objects.invalid&X-Amz-Signature=***"
# Every variable that names an external service, unset unless a test sets it.
NO_EXTERNAL: dict[str, str | None] = {
    "BLACKBOX_DATABASE_URL": None,
    "BLACKBOX_KAFKA_BOOTSTRAP": None,
    "BLACKBOX_BACKUP_URL": None,
}


def _properties(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if line and line[0] != "#")
    return dict(pairs)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.fixture
def open_umask() -> Iterator[None]:
    """A umask that would leave new files readable by everyone."""
    previous = os.umask(0o022)
    yield
    os.umask(previous)


# -- rendered files -------------------------------------------------------------------


def test_the_conf_listens_on_loopback_and_signs_with_the_stack_credentials(
    tmp_path: Path,
) -> None:
    credentials = S3Credentials(access_key="id123", secret_key="secret456")
    conf = _properties(
        render_s3proxy_conf(port=27901, credentials=credentials, base_dir=tmp_path / "data")
    )
    assert conf == {
        "s3proxy.endpoint": "http://127.0.0.1:27901",
        "s3proxy.authorization": "aws-v2-or-v4",
        "s3proxy.identity": "id123",
        "s3proxy.credential": "secret456",
        "jclouds.provider": "filesystem",
        "jclouds.filesystem.basedir": str(tmp_path / "data"),
    }


def test_the_env_file_exports_the_url_and_keys_to_a_shell(tmp_path: Path) -> None:
    endpoint = S3Endpoint(
        endpoint_url="http://127.0.0.1:27901",
        bucket="blackbox-backups",
        access_key="id123",
        secret_key="secret456",
        env_file=tmp_path / "it's here" / "backup.env",
    )
    endpoint.env_file.parent.mkdir()
    endpoint.env_file.write_text(render_env_file(endpoint))
    variables = '"$BLACKBOX_BACKUP_URL" "$AWS_ACCESS_KEY_ID" "$AWS_SECRET_ACCESS_KEY"'
    script = f'. "$1" && printf "%s\\n" {variables}'
    shown = subprocess.run(
        ["sh", "-c", script, "sh", str(endpoint.env_file)],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": os.environ["PATH"]},
    ).stdout.splitlines()
    assert shown == [
        "s3://blackbox-backups/?endpoint=http://127.0.0.1:27901",
        "id123",
        "secret456",
    ]


def test_an_endpoint_names_its_bucket_and_hides_the_secret(tmp_path: Path) -> None:
    endpoint = S3Endpoint("http://127.0.0.1:29900", "b", "id", "very-secret", tmp_path / "e")
    assert endpoint.backup_url == "s3://b/?endpoint=http://127.0.0.1:29900"
    assert "very-secret" not in repr(endpoint)
    assert "very-secret" not in repr(S3Credentials("id", "very-secret"))


# -- credentials and private files ------------------------------------------------------


def test_credentials_are_made_once_private_and_reused(tmp_path: Path, open_umask: None) -> None:
    path = tmp_path / "credentials"
    first = load_credentials(path)
    assert _mode(path) == 0o600
    assert len(first.access_key) == 20
    assert len(first.secret_key) == 40
    assert load_credentials(path) == first
    assert [entry.name for entry in tmp_path.iterdir()] == ["credentials"]  # nothing left over


def test_every_cache_folder_gets_its_own_credentials(tmp_path: Path) -> None:
    assert load_credentials(tmp_path / "a") != load_credentials(tmp_path / "b")


@pytest.mark.parametrize("content", ["", "access_key=only\n", "garbage\n"])
def test_a_damaged_credentials_file_says_to_delete_it(tmp_path: Path, content: str) -> None:
    path = tmp_path / "credentials"
    path.write_text(content)
    with pytest.raises(ServiceError, match="Delete it and start again"):
        load_credentials(path)


def test_private_files_replace_wider_ones(tmp_path: Path, open_umask: None) -> None:
    path = tmp_path / "sub" / "backup.env"
    path.parent.mkdir()
    path.write_text("old")
    path.chmod(0o644)
    write_private(path, "new")
    assert path.read_text() == "new"
    assert _mode(path) == 0o600


# -- ports and settings -----------------------------------------------------------------


def test_the_s3_port_has_a_default_of_its_own() -> None:
    assert StackPorts().s3 == 29900
    assert len({*vars(StackPorts()).values()}) == 5


@pytest.mark.parametrize("s3", [0, 65536, 25432, 29092, 29093])
def test_an_s3_port_out_of_range_or_shared_is_rejected(s3: int) -> None:
    with pytest.raises(ValueError, match=r"(?i)port"):
        StackPorts(s3=s3)


def test_the_backup_url_variable_marks_the_store_external(tmp_path: Path) -> None:
    settings = StackSettings.from_env({"BLACKBOX_BACKUP_URL": EXTERNAL_URL}, cache_dir=tmp_path)
    assert settings.external_backup_url == EXTERNAL_URL
    assert StackSettings.from_env({"BLACKBOX_BACKUP_URL": ""}).external_backup_url is None


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (EXTERNAL_URL, SHOWN_URL),
        ("s3://b/?endpoint=http://127.0.0.1:29900", "s3://b/?endpoint=http://127.0.0.1:29900"),
        ("s3://b/x?aws_secret_access_key=zz&flag", "s3://b/x?aws_secret_access_key=***&flag"),
        ("s3://b/?token=t&region=eu-west-1", "s3://b/?token=***&region=eu-west-1"),
        ("https://me:pw@objects.invalid/b", "https://me:***@objects.invalid/b"),
        ("file:///srv/backups", "file:///srv/backups"),
    ],
)
def test_secrets_in_a_backup_url_never_reach_the_screen(url: str, shown: str) -> None:
    assert redact_url(url) == shown


# -- the service, without starting it -----------------------------------------------------


def test_s3proxy_lives_in_its_own_folder_of_the_cache(tmp_path: Path) -> None:
    s3 = LocalS3(tmp_path, 27901, console=QUIET)
    assert s3.endpoint_url == "http://127.0.0.1:27901"
    assert s3.data_dir == tmp_path.resolve() / "s3proxy" / "data"
    assert s3.env_file == tmp_path.resolve() / "s3proxy" / "backup.env"
    assert s3.status() == ServiceStatus(
        "s3", "stopped", None, "http://127.0.0.1:27901", s3.data_dir
    )


def test_stopping_a_dead_s3proxy_removes_its_stale_pid_file(tmp_path: Path) -> None:
    s3 = LocalS3(tmp_path, 27901, console=QUIET)
    pid_path = tmp_path / "s3proxy" / "s3proxy.pid"
    PidFile(pid_path, marker="x").write(_dead_pid())
    assert not s3.is_running()
    s3.stop()
    assert not pid_path.exists()


def test_without_java_the_message_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(MissingPrerequisiteError, match="openjdk-17") as raised:
        LocalS3(tmp_path, _free_port(), console=QUIET).start()
    assert "BLACKBOX_BACKUP_URL" in str(raised.value)


def test_without_maven_the_first_start_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    java = shutil.which("java")
    if java is None:
        pytest.skip("no Java runtime: the Maven step comes after the Java check")
    only_java = tmp_path / "bin"
    only_java.mkdir()
    (only_java / "java").symlink_to(java)
    monkeypatch.setenv("PATH", str(only_java))
    with pytest.raises(MissingPrerequisiteError, match="apt-get install maven"):
        LocalS3(tmp_path, _free_port(), console=QUIET).start()


class _Client:
    """Answers ``head_bucket`` with the given error, or succeeds."""

    def __init__(self, error: Exception | None) -> None:
        self._error = error

    def head_bucket(self, **_: Any) -> dict[str, Any]:
        if self._error is not None:
            raise self._error
        return {}


def _http_error(status: int) -> ClientError:
    response: Any = {"Error": {"Code": str(status)}, "ResponseMetadata": {"HTTPStatusCode": status}}
    return ClientError(response, "HeadBucket")


def test_readiness_waits_through_a_refused_connection_or_a_server_error(tmp_path: Path) -> None:
    s3 = LocalS3(tmp_path, 27901, console=QUIET)
    refused = EndpointConnectionError(endpoint_url="http://127.0.0.1:27901")
    assert not s3._bucket_answers(_Client(refused))  # type: ignore[arg-type]
    assert not s3._bucket_answers(_Client(_http_error(503)))  # type: ignore[arg-type]
    assert s3._bucket_answers(_Client(None))  # type: ignore[arg-type]


def test_a_refused_signed_request_fails_the_start_at_once(tmp_path: Path) -> None:
    s3 = LocalS3(tmp_path, 27901, console=QUIET)
    with pytest.raises(ServiceError, match="answered HTTP 403"):
        s3._bucket_answers(_Client(_http_error(403)))  # type: ignore[arg-type]


# -- the stack and its commands -----------------------------------------------------------


def test_an_external_store_is_reported_and_left_alone(tmp_path: Path) -> None:
    env = {
        "BLACKBOX_DATABASE_URL": "postgresql+psycopg://me@db.invalid:5432/x",
        "BLACKBOX_KAFKA_BOOTSTRAP": "broker.invalid:9092",
        "BLACKBOX_BACKUP_URL": EXTERNAL_URL,
    }
    console = Console(record=True, width=300)
    stack = LocalStack(tmp_path, console=console, environ=env)
    assert stack.status()[2] == ServiceStatus("s3", "external", None, SHOWN_URL, None)
    endpoints = stack.up(with_s3=True)  # starts nothing: all three are external
    assert endpoints.backup is None
    stack.down()
    said = console.export_text()
    assert f"s3: external ({SHOWN_URL}), not started" in said
    assert f"s3: external ({SHOWN_URL}), left alone" in said
    assert "nothing to start: postgres external, kafka external, s3 external" in said
    assert "X-Amz-Signature=abc" not in said
    assert not (tmp_path / "s3proxy").exists()


def test_s3proxy_starts_only_when_asked_for(tmp_path: Path) -> None:
    env = {
        "BLACKBOX_DATABASE_URL": "postgresql+psycopg://me@db.invalid:5432/x",
        "BLACKBOX_KAFKA_BOOTSTRAP": "broker.invalid:9092",
    }
    console = Console(record=True, width=300)
    endpoints = LocalStack(tmp_path, console=console, environ=env).up()
    assert endpoints.backup is None
    assert "nothing to start: postgres external, kafka external\n" in console.export_text()
    assert not (tmp_path / "s3proxy").exists()


def test_the_up_table_names_the_credentials_file_not_the_secret(tmp_path: Path) -> None:
    backup = S3Endpoint("http://127.0.0.1:29900", "b", "id", "very-secret", tmp_path / "b.env")
    rows = dict(_backup_rows(Endpoints("db", "kafka", backup), None))
    assert rows["backup url"] == "s3://b/?endpoint=http://127.0.0.1:29900"
    assert str(tmp_path / "b.env") in rows["backup credentials"]
    assert "very-secret" not in repr(rows)
    external = dict(_backup_rows(Endpoints("db", "kafka"), EXTERNAL_URL))
    assert external["backup url"] == SHOWN_URL


def _stack_cli(*args: str, env: dict[str, str | None]) -> Result:
    from agent_blackbox.cli import main

    return CliRunner(env=env).invoke(main, ["stack", *args])


def test_every_command_takes_the_s3_port_and_up_takes_with_s3() -> None:
    for command in ("up", "down", "status"):
        result = _stack_cli(command, "--help", env=NO_EXTERNAL)
        assert result.exit_code == 0, result.output
        assert "--s3-port" in result.stdout
        assert "29900" in result.stdout
        assert ("--with-s3" in result.stdout) == (command == "up")


def test_status_shows_s3proxy_on_the_port_given(tmp_path: Path) -> None:
    result = _stack_cli(
        "status", "--cache-dir", str(tmp_path), "--s3-port", "27901", env=NO_EXTERNAL
    )
    assert result.exit_code == 0, result.output
    s3_row = next(line for line in result.stdout.splitlines() if " s3 " in line)
    assert "stopped" in s3_row
    assert "http://127.0.0.1:27901" in s3_row


def test_an_s3_port_shared_with_kafka_is_a_usage_error(tmp_path: Path) -> None:
    result = _stack_cli(
        "status", "--cache-dir", str(tmp_path), "--s3-port", "29092", env=NO_EXTERNAL
    )
    assert result.exit_code == 2
    assert "Each service needs its own port" in result.stderr


def test_an_explicit_s3_port_sets_the_backup_url_aside(tmp_path: Path) -> None:
    env = {**NO_EXTERNAL, "BLACKBOX_BACKUP_URL": EXTERNAL_URL, "BLACKBOX_CACHE_DIR": str(tmp_path)}
    result = _stack_cli("down", "--s3-port", "27901", env=env)
    assert result.exit_code == 0, result.output
    assert "--s3-port given: ignoring BLACKBOX_BACKUP_URL" in result.stderr
    assert "s3 not running" in result.stderr


def test_up_with_an_external_store_shows_its_url_without_secrets(tmp_path: Path) -> None:
    env = {
        "BLACKBOX_DATABASE_URL": "postgresql+psycopg://me@db.invalid:5432/x",
        "BLACKBOX_KAFKA_BOOTSTRAP": "broker.invalid:9092",
        "BLACKBOX_BACKUP_URL": EXTERNAL_URL,
        "BLACKBOX_CACHE_DIR": str(tmp_path),
    }
    result = _stack_cli("up", "--with-s3", env={**NO_EXTERNAL, **env})
    assert result.exit_code == 0, result.output
    assert "backup url" in result.stdout
    assert "X-Amz-Signature=abc" not in result.stdout + result.stderr
