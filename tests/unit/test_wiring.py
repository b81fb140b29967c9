"""One wiring point: the pool policy builds every engine, the ``blackbox`` command reads the
settings once per invocation and hands them down, and only the few public conveniences
listed here read the environment themselves."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import Engine, NullPool, QueuePool
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_blackbox.cli import main
from agent_blackbox.outbox import AsyncRecorder, MemoryRecorder, Recorder, RunSnapshot
from agent_blackbox.replayer import write_archive
from agent_blackbox.schemas import Settings
from agent_blackbox.wiring import (
    AGENT_POOL,
    COMMAND_POOL,
    POOLS,
    SERVICE_POOL,
    Pool,
)

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = (
    *("blackbox", "schemas", "outbox", "consumers", "replayer", "backup", "console"),
    *("keystore", "broker", "stack", "cli", "wiring", "examples"),
)
# Nothing listens there: a command that reached the database fails at once.
NOWHERE = "postgresql+psycopg://nobody@127.0.0.1:1/none"

# The public conveniences that read BLACKBOX_* themselves when given no settings, and why.
READS_THE_ENVIRONMENT = {
    # The composition root of the `blackbox` command: once per invocation.
    "cli/_wiring.py": 1,
    # An agent's one-line recorder, sync and async: the agent has no root of its own.
    "outbox/_recorder.py": 1,
    "outbox/_async.py": 1,
    # A recorder made without settings (Recorder(engine), MemoryRecorder()).
    "outbox/_core.py": 1,
    # A relay embedded in another process, made without settings.
    "outbox/relay/_relay.py": 1,
    # bb.replay(run_id, entry) in an agent's own code: the one-call replay reads the
    # environment as the one-line recorder does.
    "blackbox/_replay.py": 1,
}


def _product_files() -> Iterator[tuple[str, str]]:
    for part in PRODUCT:
        for path in sorted((ROOT / part).rglob("*.py")):
            yield str(path.relative_to(ROOT)), path.read_text(encoding="utf-8")


def _calls(source: str, names: set[str], *, on: str | None = None) -> int:
    """Calls of the functions ``names`` (as names or attributes; with ``on``, only as
    attributes of that name, e.g. ``Settings.from_env()``). Docstrings hold no calls."""
    found = 0
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute):
            owner = func.value.id if isinstance(func.value, ast.Name) else None
            # Settings.from_env(environ) reads the mapping it is given, not the process's.
            found += func.attr in names and (on is None or (owner == on and not node.args))
        elif isinstance(func, ast.Name):
            found += func.id in names and on is None
    return found


def test_every_engine_of_the_product_is_built_by_the_pool_policy() -> None:
    builders = {
        path: count
        for path, source in _product_files()
        if (count := _calls(source, {"create_engine", "create_async_engine"}))
    }
    assert builders == {"wiring/_pools.py": 2}


def test_kafka_clients_and_backup_stores_are_each_built_in_one_place() -> None:
    kafka = {"Producer", "Consumer", "AdminClient"}
    stores = {"FolderStore", "S3Store"}
    built = {
        (path, "kafka" if names is kafka else "store")
        for path, source in _product_files()
        for names in (kafka, stores)
        if _calls(source, names)
    }
    assert built == {("broker/_clients.py", "kafka"), ("backup/_open.py", "store")}


def test_only_the_listed_conveniences_read_the_settings_from_the_environment() -> None:
    readers = {
        path: count
        for path, source in _product_files()
        if (count := _calls(source, {"from_env"}, on="Settings"))
    }
    assert readers == READS_THE_ENVIRONMENT


@pytest.mark.parametrize("pool", POOLS, ids=lambda pool: pool.role)
def test_an_engine_has_its_pools_sizes(pool: Pool) -> None:
    engine = pool.engine(NOWHERE)
    try:
        _assert_sized(engine, pool)
    finally:
        engine.dispose()


@pytest.mark.parametrize("pool", POOLS, ids=lambda pool: pool.role)
def test_an_async_engine_has_its_pools_sizes(pool: Pool) -> None:
    engine = pool.async_engine(NOWHERE)
    assert isinstance(engine, AsyncEngine)
    _assert_sized(engine.sync_engine, pool)


def _assert_sized(engine: Engine, pool: Pool) -> None:
    if pool.size == 0:
        assert isinstance(engine.pool, NullPool)
        return
    assert isinstance(engine.pool, QueuePool)
    assert engine.pool.size() == pool.size
    assert engine.pool._max_overflow == pool.overflow
    assert engine.pool._pre_ping is pool.pre_ping


def test_the_policy_names_a_pool_for_each_kind_of_process() -> None:
    assert {pool.role for pool in POOLS} == {"agent", "command", "service", "migration"}
    # An agent records an event per transaction: a pre-ping would add a round trip to each.
    assert not AGENT_POOL.pre_ping
    # A process that runs for days survives the database's restarts.
    assert SERVICE_POOL.pre_ping
    assert COMMAND_POOL.size < SERVICE_POOL.size < AGENT_POOL.size


def test_an_engine_may_commit_each_statement_itself() -> None:
    engine = COMMAND_POOL.engine(NOWHERE, isolation_level="AUTOCOMMIT")
    try:
        assert engine.dialect._on_connect_isolation_level == "AUTOCOMMIT"
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    ("size", "overflow"), [(-1, 0), (2, -1), (0, 3)], ids=["size", "overflow", "nothing"]
)
def test_a_pool_that_cannot_work_is_refused(size: int, overflow: int) -> None:
    with pytest.raises(ValueError, match="pool 'odd'"):
        Pool("odd", size=size, overflow=overflow)


def test_the_recorders_convenience_builds_an_agents_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BLACKBOX_KEK_PUBLIC_FILE", raising=False)
    monkeypatch.delenv("BLACKBOX_KEK_FILE", raising=False)
    monkeypatch.delenv("BLACKBOX_KEK", raising=False)
    settings = Settings(database_url=NOWHERE)
    recorder = Recorder.from_settings(settings)
    try:
        _assert_sized(recorder.engine, AGENT_POOL)
        assert recorder.settings is settings
    finally:
        recorder.engine.dispose()
    recorder_async = AsyncRecorder.from_settings(settings)
    _assert_sized(recorder_async.engine.sync_engine, AGENT_POOL)


# -- the settings, read once per invocation ------------------------------------------


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    recorder = MemoryRecorder()
    snapshot = RunSnapshot(code_version="wiring.1", input={"n": 2})
    run, _ = recorder.record(doubler, snapshot, agent_id="doubler")
    path = tmp_path_factory.mktemp("wiring") / "runs.avro"
    write_archive(path, recorder.events)
    return path, run.run_id


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[Settings]:
    """Every read of the settings from the environment, as it happens."""
    made: list[Settings] = []
    real = Settings.from_env.__func__  # type: ignore[attr-defined]

    def counted(cls: type[Settings], environ: Any = None) -> Settings:
        made.append(real(cls, environ))
        return made[-1]

    monkeypatch.setattr(Settings, "from_env", classmethod(counted))
    return made


def _invoke(*args: str) -> Result:
    env = {"BLACKBOX_DATABASE_URL": NOWHERE, "BLACKBOX_KEK": None, "BLACKBOX_KEK_FILE": None}
    return CliRunner(env=env).invoke(main, list(args))


_REPLAY = ["--purpose", "a wiring test", "--agent", "doubler=tests.unit.test_wiring:doubler"]


@pytest.mark.parametrize(
    ("words", "exit_code"),
    [
        (["export", "--archive", "{archive}", "{run}"], 0),
        (["timeline", "--archive", "{archive}", "{run}"], 0),
        (["replay", "--archive", "{archive}", "{run}", *_REPLAY], 0),
        (["schemas", "check"], 0),
        # These reach for the database, which is not there: exit 2, said once.
        (["verify", "--archive", "{archive}", "{run}"], 2),
        (["stats"], 2),
        (["tenants", "list"], 2),
        (["keys", "rotate"], 2),
    ],
    ids=lambda words: words[0] if isinstance(words, list) else None,
)
def test_a_command_reads_the_settings_once(
    words: list[str], exit_code: int, archive: tuple[Path, str], reads: list[Settings]
) -> None:
    path, run_id = archive
    result = _invoke(*(w.format(archive=path, run=run_id) for w in words))
    assert result.exit_code == exit_code, result.output
    assert len(reads) == 1
    assert reads[0].database_url == NOWHERE


def doubler(run: Any, value: Any) -> Any:
    """The recorded agent, as replay drives it."""
    return run.call("double", lambda n: 2 * n, value["n"])


@pytest.mark.parametrize(
    "args",
    [
        ("dataset", "list"),
        ("dataset", "show", "x"),
        ("experiment", "list"),
        ("forget", "--subject", "cust-2"),
        ("retention", "run"),
        ("migrate",),
        ("consume",),
    ],
)
def test_a_command_whose_database_cannot_be_reached_says_so_and_exits_2(
    args: tuple[str, ...],
) -> None:
    unreachable = {"BLACKBOX_DATABASE_URL": "postgresql+psycopg://blackbox@127.0.0.1:1/none"}
    result = CliRunner(env=unreachable).invoke(main, list(args))
    assert result.exit_code == 2, result.output
    assert "cannot reach the database" in result.output
    assert "BLACKBOX_DATABASE_URL" in result.output
    assert "\\n" not in result.output, "the driver's first line, not its escaped rest"
    assert result.exception is None or isinstance(result.exception, SystemExit)


@pytest.mark.parametrize(
    ("url", "said"),
    [("not a url", "is not a URL"), ("postgres://u:secret@h/db", "begins with postgres://")],
)
def test_a_database_url_no_driver_takes_is_a_usage_error_without_its_password(
    url: str, said: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BLACKBOX_DATABASE_URL", url)
    result = CliRunner().invoke(main, ["runs"])
    assert result.exit_code == 2, result.output
    assert said in result.output
    assert "postgresql+psycopg://" in result.output
    assert "secret" not in result.output


@pytest.mark.parametrize("command", [["runs"], ["stats"]])
def test_views_out_of_reach_say_what_to_check_in_a_line(
    command: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BLACKBOX_DATABASE_URL", NOWHERE)
    result = CliRunner().invoke(main, command)
    assert result.exit_code == 2, result.output
    assert "check BLACKBOX_DATABASE_URL" in result.output
    assert "sqlalche.me" not in result.output
