"""The standby's settings, its place beside the primary, the multi-host URL and how
``stack status`` shows roles (issue 31, item 5); the failover itself is
tests/faults/test_pg_standby.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console
from sqlalchemy import create_engine, make_url

from agent_blackbox.cli.commands.stack import status_table
from agent_blackbox.schemas import Settings, normalize_database_url
from agent_blackbox.stack import LocalPostgres, PostgresStandby, ServiceStatus
from agent_blackbox.stack._settings import StackSettings, redact_password
from agent_blackbox.stack._standby import STANDBY_NAME, multi_host_url, render_standby_conf

PAIR = "postgresql+psycopg://blackbox@/blackbox?host=127.0.0.1:25432&host=127.0.0.1:25433"


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (
            "postgresql+psycopg://blackbox@127.0.0.1:25432,127.0.0.1:25433/blackbox"
            "?target_session_attrs=read-write",
            f"{PAIR}&target_session_attrs=read-write",
        ),
        (
            "postgresql+psycopg://u:p%40ss@db-a:5432,db-b:5432,db-c/app",
            "postgresql+psycopg://u:p%40ss@/app?host=db-a:5432&host=db-b:5432&host=db-c",
        ),
        ("postgresql+psycopg://u@h1:1,h2:2", "postgresql+psycopg://u@/?host=h1:1&host=h2:2"),
    ],
)
def test_a_multi_host_authority_becomes_host_options(given: str, expected: str) -> None:
    assert normalize_database_url(given) == expected
    assert Settings(database_url=given).database_url == expected


@pytest.mark.parametrize(
    "url",
    [
        "postgresql+psycopg://blackbox@127.0.0.1:25432/blackbox",
        f"{PAIR}&target_session_attrs=read-write",
        "postgresql+psycopg://u:p,w@h:5432/db",  # a comma in a password is not a host list
        "sqlite://",
    ],
)
def test_other_urls_are_kept_character_for_character(url: str) -> None:
    assert normalize_database_url(url) == url


@pytest.mark.parametrize(
    "url",
    [
        "postgresql+psycopg://u@h1:1,/db",
        "postgresql+psycopg://u@h1:1,h2:2/db?host=h3:3",
    ],
)
def test_ambiguous_host_lists_are_refused(url: str) -> None:
    with pytest.raises(ValueError, match="database URL"):
        normalize_database_url(url)


def test_the_stack_prints_a_multi_host_url_it_was_given_without_its_password(
    tmp_path: Path,
) -> None:
    given = "postgresql+psycopg://u:secret@h1:5432,h2:5433/db?target_session_attrs=read-write"
    settings = StackSettings.from_env({"BLACKBOX_DATABASE_URL": given}, cache_dir=tmp_path)
    assert settings.external_database_url == normalize_database_url(given)
    shown = redact_password(settings.external_database_url or "")
    assert "secret" not in shown
    assert "host=h1:5432&host=h2:5433" in shown


def test_psycopg_is_handed_libpq_host_and_port_lists() -> None:
    url = make_url(normalize_database_url(f"{PAIR}&target_session_attrs=read-write"))
    engine = create_engine(url)
    try:
        _, options = engine.dialect.create_connect_args(url)
    finally:
        engine.dispose()
    assert options["host"] == "127.0.0.1,127.0.0.1"
    assert options["port"] == "25432,25433"
    assert options["target_session_attrs"] == "read-write"


def test_the_standby_lives_beside_the_primary_and_names_both_in_its_url(tmp_path: Path) -> None:
    primary = LocalPostgres(tmp_path, 25432)
    standby = PostgresStandby(primary, 25433)
    assert standby.root == tmp_path.resolve() / "postgres-standby"
    assert standby.data_dir == standby.root / "data"
    assert not standby.exists()
    assert not standby.promoted
    assert multi_host_url(primary, standby) == f"{PAIR}&target_session_attrs=read-write"


def test_standby_conf_streams_under_its_name_and_waits_for_no_standby(tmp_path: Path) -> None:
    conf = render_standby_conf(port=25433, socket_dir=tmp_path)
    assert "port = 25433" in conf
    assert f"cluster_name = '{STANDBY_NAME}'" in conf
    # Once promoted it is the primary: a standby list of its own would block every commit.
    assert "synchronous_standby_names = ''" in conf
    assert "listen_addresses = '127.0.0.1'" in conf


def test_status_shows_which_server_is_the_primary(tmp_path: Path) -> None:
    base = ServiceStatus("postgres", "running", 10, "postgresql+psycopg://x", tmp_path)
    rows = [replace(base, role="primary"), replace(base, name="postgres-standby", role="standby")]
    console = Console(width=200, record=True)
    console.print(status_table([*rows, replace(base, name="kafka")]))
    lines = console.export_text().splitlines()
    assert any("postgres " in line and "running (primary)" in line for line in lines)
    assert any("postgres-standby" in line and "running (standby)" in line for line in lines)
    assert any("kafka" in line and "running " in line and "(" not in line for line in lines)
