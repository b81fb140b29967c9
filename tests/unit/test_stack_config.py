"""The local stack's configuration and bookkeeping, checked without starting a service."""

from __future__ import annotations

import base64
import os
import pwd
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from rich.console import Console

from agent_blackbox.cli.commands.stack import status_table
from agent_blackbox.stack import (
    LocalKafka,
    LocalPostgres,
    LocalStack,
    MissingPrerequisiteError,
    ServiceStatus,
    StackError,
    StackPorts,
    StackSettings,
)
from agent_blackbox.stack._kafka import new_cluster_id, render_server_properties
from agent_blackbox.stack._maven import downloaded_artifact, downloading_artifact
from agent_blackbox.stack._postgres import (
    _untraversable,
    find_bin_dir,
    install_postgres,
    render_conf,
    render_hba,
)
from agent_blackbox.stack._process import PidFile, process_matches, tail_file, wait_for
from agent_blackbox.stack._settings import default_cache_dir, redact_password

QUIET = Console(quiet=True)


def _properties(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if line and line[0] != "#")
    return dict(pairs)


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


# -- ports and settings -------------------------------------------------------------


def test_default_ports_avoid_the_services_usual_ones() -> None:
    assert StackPorts() == StackPorts(postgres=25432, kafka=29092, controller=29093)


@pytest.mark.parametrize(
    ("postgres", "kafka", "controller"),
    [(0, 29092, 29093), (25432, 70000, 29093), (25432, 29092, 29092)],
)
def test_ports_out_of_range_or_shared_are_rejected(
    postgres: int, kafka: int, controller: int
) -> None:
    with pytest.raises(ValueError, match=r"(?i)port"):
        StackPorts(postgres=postgres, kafka=kafka, controller=controller)


def test_settings_read_overrides_from_the_environment(tmp_path: Path) -> None:
    env = {
        "BLACKBOX_CACHE_DIR": str(tmp_path / "cache"),
        "BLACKBOX_DATABASE_URL": "postgresql+psycopg://me@db:5432/x",
        "BLACKBOX_KAFKA_BOOTSTRAP": "broker:9092",
    }
    settings = StackSettings.from_env(env)
    assert settings.cache_dir == (tmp_path / "cache").resolve()
    assert settings.external_database_url == "postgresql+psycopg://me@db:5432/x"
    assert settings.external_kafka_bootstrap == "broker:9092"


def test_empty_variables_count_as_unset_and_arguments_win(tmp_path: Path) -> None:
    env = {"BLACKBOX_CACHE_DIR": "/elsewhere", "BLACKBOX_DATABASE_URL": ""}
    settings = StackSettings.from_env(env, cache_dir=tmp_path, ports=StackPorts(postgres=1))
    assert settings.cache_dir == tmp_path.resolve()
    assert settings.ports.postgres == 1
    assert settings.external_database_url is None
    assert settings.external_kafka_bootstrap is None


def test_default_cache_dir_is_inside_the_project_checkout() -> None:
    project_root = Path(__file__).resolve().parents[2]
    assert default_cache_dir({}) == project_root / ".cache" / "blackbox"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql+psycopg://me:s3cret@db:5432/x", "postgresql+psycopg://me:***@db:5432/x"),
        (
            "postgresql+psycopg://blackbox@127.0.0.1:25432/bb",
            "postgresql+psycopg://blackbox@127.0.0.1:25432/bb",
        ),
        ("postgresql://u:p@[::1]:5432/x", "postgresql://u:***@[::1]:5432/x"),
    ],
)
def test_passwords_never_reach_the_screen(url: str, shown: str) -> None:
    assert redact_password(url) == shown


# -- rendered configuration ---------------------------------------------------------


def test_cluster_ids_are_16_random_bytes_in_url_safe_base64() -> None:
    ids = {new_cluster_id() for _ in range(500)}
    assert len(ids) == 500
    for cluster_id in ids:
        assert len(cluster_id) == 22
        assert not cluster_id.startswith("-")
        assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16


def test_server_properties_describe_a_single_loopback_kraft_node(tmp_path: Path) -> None:
    props = _properties(
        render_server_properties(port=29192, controller_port=29193, log_dir=tmp_path / "data")
    )
    assert props["process.roles"] == "broker,controller"
    assert props["node.id"] == "1"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:29192,CONTROLLER://127.0.0.1:29193"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:29192"
    assert props["controller.listener.names"] == "CONTROLLER"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:29193"
    assert props["log.dirs"] == str(tmp_path / "data")
    assert props["auto.create.topics.enable"] == "false"
    for single_replica in (
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
        "share.coordinator.state.topic.replication.factor",
        "share.coordinator.state.topic.min.isr",
    ):
        assert props[single_replica] == "1"
    assert int(props["broker.heartbeat.interval.ms"]) < int(props["broker.session.timeout.ms"])


def test_postgres_conf_listens_on_loopback_with_its_own_socket_dir() -> None:
    conf = render_conf(port=25442, socket_dir=Path("/tmp/it's here/run"))
    assert "listen_addresses = '127.0.0.1'" in conf
    assert "port = 25442" in conf
    assert "unix_socket_directories = '/tmp/it''s here/run'" in conf
    assert "max_connections = 200" in conf
    assert "synchronous_commit = on" in conf


def test_pg_hba_trusts_only_the_socket_and_ipv4_loopback() -> None:
    rules = [line.split() for line in render_hba().splitlines() if line and line[0] != "#"]
    assert rules == [
        ["local", "all", "all", "trust"],
        ["host", "all", "all", "127.0.0.1/32", "trust"],
    ]


def test_maven_download_lines_name_the_file() -> None:
    line = "[INFO] Downloaded from repo: https://host/org/kafka_2.13-4.1.1.jar (6.6 MB at 9 MB/s)"
    assert downloaded_artifact(line) == "kafka_2.13-4.1.1.jar"
    assert downloaded_artifact("[INFO] Copying kafka-clients-4.1.1.jar to /x") is None
    assert downloading_artifact(line) is None
    assert downloading_artifact(line.replace("Downloaded", "Downloading")) == "kafka_2.13-4.1.1.jar"


def test_the_newest_postgres_wins_unless_a_data_dir_asks_for_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for major in ("13", "15", "9.6"):
        (tmp_path / major / "bin").mkdir(parents=True)
        (tmp_path / major / "bin" / "initdb").touch()
    monkeypatch.setattr("agent_blackbox.stack._postgres._PG_LIB", tmp_path)
    assert find_bin_dir() == tmp_path / "15" / "bin"
    assert find_bin_dir("13") == tmp_path / "13" / "bin"
    assert find_bin_dir("16") is None


def test_without_postgres_an_ordinary_user_is_told_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("agent_blackbox.stack._postgres._PG_LIB", tmp_path)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(MissingPrerequisiteError, match="apt-get install postgresql"):
        install_postgres(QUIET)


def test_folders_the_postgres_account_cannot_enter_are_found(tmp_path: Path) -> None:
    account = pwd.getpwnam("nobody")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o700)
    locked.chmod(0o700)
    assert locked in _untraversable(locked, account)
    locked.chmod(0o701)
    assert locked not in _untraversable(locked, account)


# -- pid files and waiting ----------------------------------------------------------


def test_a_pid_file_of_our_own_live_process_is_running(tmp_path: Path) -> None:
    own_program = Path("/proc/self/cmdline").read_bytes().split(b"\0")[0].decode()
    pid_file = PidFile(tmp_path / "x.pid", marker=own_program)
    pid_file.write(os.getpid())
    assert pid_file.running_pid() == os.getpid()
    assert not pid_file.is_stale()


def test_a_pid_reused_by_another_program_is_stale(tmp_path: Path) -> None:
    pid_file = PidFile(tmp_path / "x.pid", marker="kafka.Kafka /nowhere/server.properties")
    pid_file.write(os.getpid())
    assert pid_file.running_pid() is None
    assert pid_file.is_stale()


def test_a_pid_of_a_dead_process_is_stale(tmp_path: Path) -> None:
    pid_file = PidFile(tmp_path / "x.pid", marker="python")
    pid_file.write(_dead_pid())
    assert pid_file.is_stale()


@pytest.mark.parametrize("content", ["", "not a pid\n", "12ab\n"])
def test_unreadable_pid_files_hold_no_pid(tmp_path: Path, content: str) -> None:
    (tmp_path / "x.pid").write_text(content)
    assert PidFile(tmp_path / "x.pid", marker="x").read() is None


def test_a_missing_pid_file_is_neither_running_nor_stale(tmp_path: Path) -> None:
    pid_file = PidFile(tmp_path / "absent.pid", marker="x")
    assert pid_file.read() is None
    assert not pid_file.is_stale()
    assert not process_matches(_dead_pid(), "python")


def test_wait_for_gives_up_at_the_deadline() -> None:
    began = time.monotonic()
    assert not wait_for(lambda: False, timeout=0.2)
    assert 0.2 <= time.monotonic() - began < 2.0
    assert wait_for(lambda: True, timeout=0)


def test_wait_for_lets_the_condition_abort() -> None:
    def dead() -> bool:
        raise StackError("the process died")

    with pytest.raises(StackError, match="died"):
        wait_for(dead, timeout=5)


def test_log_tails_skip_an_earlier_run(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("old run\n")
    offset = log.stat().st_size
    with log.open("a") as handle:
        handle.write("new run\n")
    assert "old run" not in tail_file(log, since=offset)
    assert "new run" in tail_file(log, since=offset)
    assert "old run" in tail_file(log, since=10_000)  # rotated: read from the start
    assert "does not exist" in tail_file(tmp_path / "absent.log")


# -- services, without starting them --------------------------------------------------


def test_services_expose_their_addresses(tmp_path: Path) -> None:
    postgres = LocalPostgres(tmp_path, 25442, console=QUIET)
    kafka = LocalKafka(tmp_path, 29192, 29193, console=QUIET)
    assert postgres.url == "postgresql+psycopg://blackbox@127.0.0.1:25442/blackbox"
    assert kafka.bootstrap == "127.0.0.1:29192"
    assert postgres.data_dir == tmp_path.resolve() / "postgres" / "data"
    assert kafka.data_dir == tmp_path.resolve() / "kafka" / "data"


def test_stopping_a_dead_kafka_removes_its_stale_pid_file(tmp_path: Path) -> None:
    kafka = LocalKafka(tmp_path, 29192, 29193, console=QUIET)
    pid_path = tmp_path / "kafka" / "kafka.pid"
    PidFile(pid_path, marker="x").write(_dead_pid())
    assert not kafka.is_running()
    kafka.stop()
    assert not pid_path.exists()


def test_status_of_an_unstarted_stack(tmp_path: Path) -> None:
    stack = LocalStack(tmp_path, StackPorts(25442, 29192, 29193), console=QUIET, environ={})
    assert [(s.name, s.state, s.pid) for s in stack.status()] == [
        ("postgres", "stopped", None),
        ("kafka", "stopped", None),
        ("s3", "stopped", None),
        ("console", "stopped", None),
    ]


def test_external_services_are_reported_and_left_alone(tmp_path: Path) -> None:
    env = {
        "BLACKBOX_DATABASE_URL": "postgresql+psycopg://me:pw@db:5432/x",
        "BLACKBOX_KAFKA_BOOTSTRAP": "broker:9092",
    }
    stack = LocalStack(tmp_path, console=QUIET, environ=env)
    statuses = stack.status()
    assert statuses[:2] == [
        ServiceStatus("postgres", "external", None, "postgresql+psycopg://me:***@db:5432/x", None),
        ServiceStatus("kafka", "external", None, "broker:9092", None),
    ]
    assert (statuses[2].name, statuses[2].state) == ("s3", "stopped")
    endpoints = stack.up()  # starts nothing: both services are external
    assert endpoints.database_url == env["BLACKBOX_DATABASE_URL"]
    assert endpoints.kafka_bootstrap == "broker:9092"
    stack.down()
    assert not (tmp_path / "postgres").exists()
    assert not (tmp_path / "kafka").exists()
    assert not (tmp_path / "s3proxy").exists()


def test_the_status_table_says_external_with_the_address(tmp_path: Path) -> None:
    console = Console(record=True, width=200)
    console.print(status_table([ServiceStatus("kafka", "external", None, "broker:9092", None)]))
    assert "external: broker:9092" in console.export_text()


# -- the commands: explicit options beat the environment; doing nothing is said ----

EXTERNAL_ENV = {
    "BLACKBOX_DATABASE_URL": "postgresql+psycopg://me:pw@db.invalid:5432/x",
    "BLACKBOX_KAFKA_BOOTSTRAP": "broker.invalid:9092",
}
# Unset for every command, so a backup store configured in the developer's shell does
# not change what these tests see.
NO_BACKUP_URL: dict[str, str | None] = {"BLACKBOX_BACKUP_URL": None}


def _stack_cli(*args: str, env: dict[str, str | None]) -> Result:
    from agent_blackbox.cli import main

    return CliRunner(env=env).invoke(main, ["stack", *args])


def test_down_with_nothing_running_says_so(tmp_path: Path) -> None:
    env: dict[str, str | None] = {**NO_BACKUP_URL, **{k: None for k in EXTERNAL_ENV}}
    result = _stack_cli("down", "--cache-dir", str(tmp_path), env=env)
    assert result.exit_code == 0, result.output
    assert (
        "nothing to stop: postgres not running, kafka not running, s3 not running" in result.stderr
    )
    assert "ignoring" not in result.stderr  # nothing was set aside


def test_explicit_options_set_the_external_variables_aside(tmp_path: Path) -> None:
    env: dict[str, str | None] = {**NO_BACKUP_URL, **EXTERNAL_ENV}
    down = _stack_cli("down", "--cache-dir", str(tmp_path), env=env)
    assert down.exit_code == 0, down.output
    assert (
        "--cache-dir given: ignoring BLACKBOX_DATABASE_URL and BLACKBOX_KAFKA_BOOTSTRAP"
        in down.stderr
    )
    assert "nothing to stop: postgres not running, kafka not running" in down.stderr
    status = _stack_cli("status", "--cache-dir", str(tmp_path), "--postgres-port", "25442", env=env)
    assert status.exit_code == 0, status.output
    assert "--cache-dir and --postgres-port given" in status.stderr
    assert "external" not in status.stdout
    assert "stopped" in status.stdout


def test_without_explicit_options_the_variables_still_mean_external(tmp_path: Path) -> None:
    env: dict[str, str | None] = {
        **NO_BACKUP_URL,
        **EXTERNAL_ENV,
        "BLACKBOX_CACHE_DIR": str(tmp_path),
    }
    up = _stack_cli("up", env=env)  # starts nothing: both are external
    assert up.exit_code == 0, up.output
    assert "nothing to start: postgres external, kafka external" in up.stderr
    assert "broker.invalid:9092" in up.stdout
    down = _stack_cli("down", env=env)
    assert down.exit_code == 0, down.output
    assert "kafka: external (broker.invalid:9092), left alone" in down.stderr
    assert "postgres: external (postgresql+psycopg://me:***@db.invalid:5432/x)" in down.stderr
    assert "nothing to stop" in down.stderr
    assert not (tmp_path / "postgres").exists()


def test_status_and_down_find_the_ports_the_stack_was_started_on(tmp_path: Path) -> None:
    """``stack up --postgres-port 27432`` then ``stack status`` (no port): the status shows
    the service on 27432, not the default port (another stack's, maybe)."""
    from agent_blackbox.cli.commands.stack import _remember_ports

    _remember_ports(tmp_path, StackPorts(postgres=27432, kafka=27092, controller=27093))
    env: dict[str, str | None] = {**NO_BACKUP_URL, **{k: None for k in EXTERNAL_ENV}}
    status = _stack_cli("status", "--cache-dir", str(tmp_path), env=env)
    assert status.exit_code == 0, status.output
    flat = "".join(status.stdout.split())
    assert "127.0.0.1:27432" in flat
    assert "127.0.0.1:27092" in flat
    assert ":25432" not in flat
    given = _stack_cli("status", "--cache-dir", str(tmp_path), "--kafka-port", "27192", env=env)
    flat = "".join(given.stdout.split())
    assert "127.0.0.1:27192" in flat
    assert "127.0.0.1:27432" in flat


def test_a_damaged_ports_file_is_set_aside_for_the_defaults(tmp_path: Path) -> None:
    (tmp_path / "ports.json").write_text('{"postgres": "x", "kafka": 0, "other": 1}')
    env: dict[str, str | None] = {**NO_BACKUP_URL, **{k: None for k in EXTERNAL_ENV}}
    status = _stack_cli("status", "--cache-dir", str(tmp_path), env=env)
    assert status.exit_code == 0, status.output
    assert "127.0.0.1:25432" in "".join(status.stdout.split())
