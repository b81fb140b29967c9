"""Real PostgreSQL and real Kafka for the integration and security tests.

Where they come from, in order: ``BLACKBOX_DATABASE_URL`` / ``BLACKBOX_KAFKA_BOOTSTRAP``
when set; testcontainers when a Docker engine answers; otherwise the project's local
stack, started on test-only ports under the cache folder and stopped at the end.
Each test gets its own database (cloned from a migrated template) and its own topic
names, so tests never see each other's rows or messages.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import socket
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from sqlalchemy import Engine, create_engine, make_url, text

from agent_blackbox.broker import KafkaUnavailable, delete_topics
from agent_blackbox.consumers import migrate_views
from agent_blackbox.outbox.storage import grant_tenant_txn, migrate_write_side
from agent_blackbox.schemas import Settings
from agent_blackbox.stack import LocalKafka, LocalS3, LocalStack, StackPorts

ROOT = Path(__file__).resolve().parents[1]
# Several checkouts may share one set of services (BLACKBOX_DATABASE_URL): each names its
# own template database so that no suite drops another's.
TEMPLATE_DB = os.environ.get("BLACKBOX_TEST_TEMPLATE_DB", "blackbox_test_template")


def _cache_dir() -> Path:
    base = os.environ.get("BLACKBOX_CACHE_DIR")
    return (Path(base) if base else ROOT / ".cache" / "blackbox") / "test"


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    """A SIGTERM (a CI job's time limit, ``kill``) ends the session as Ctrl-C does:
    Python's default would end the process at once, and the Postgres, Kafka and S3Proxy
    the session started would outlive it; as an interrupt, the fixtures stop them."""
    signal.signal(signal.SIGTERM, _interrupted)


@dataclass(frozen=True)
class Services:
    """Where the test services listen."""

    database_url: str
    kafka_bootstrap: str


def _docker_answers() -> bool:
    try:
        import docker  # type: ignore[import-untyped]

        docker.from_env(timeout=2).ping()
    except Exception:
        return False
    return True


@pytest.fixture(scope="session")
def services() -> Iterator[Services]:
    env_db = os.environ.get("BLACKBOX_DATABASE_URL")
    env_kafka = os.environ.get("BLACKBOX_KAFKA_BOOTSTRAP")
    if env_db and env_kafka:
        yield Services(env_db, env_kafka)
        return
    if _docker_answers():
        yield from _containers()
        return
    ports = StackPorts(postgres=_port(POSTGRES), kafka=_port(KAFKA), controller=_port(CONTROLLER))
    stack = LocalStack(_cache_dir(), ports)
    endpoints = stack.up()
    try:
        yield Services(endpoints.database_url, endpoints.kafka_bootstrap)
    finally:
        stack.down()


# Test-only ports, below Linux's ephemeral range (32768-60999) so that no outgoing
# connection of the suite can hold one of them when a broker (re)binds it.
POSTGRES, KAFKA, CONTROLLER, OUTAGE_KAFKA, OUTAGE_CONTROLLER, S3 = (
    25442,
    29192,
    29193,
    29292,
    29293,
    29990,
)


@functools.cache
def _shift() -> int:
    """How far up this suite's ports move: 0, or ten at a time while another checkout's
    suite holds one of them (two worktrees may run their tests at once)."""
    ours = (POSTGRES, KAFKA, CONTROLLER, OUTAGE_KAFKA, OUTAGE_CONTROLLER, S3)
    for shift in range(0, 200, 10):
        if all(_bindable(port + shift) for port in ours):
            return shift
    raise RuntimeError(
        f"no free test ports from {POSTGRES} up: stop the other checkouts' test services "
        "(blackbox stack down --cache-dir <their .cache/blackbox/test>)"
    )


def _port(port: int) -> int:
    return port + _shift()


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _containers() -> Iterator[Services]:
    from testcontainers.kafka import KafkaContainer
    from testcontainers.postgres import PostgresContainer

    with (
        PostgresContainer("postgres:16", driver="psycopg") as pg,
        KafkaContainer("confluentinc/cp-kafka:7.6.0").with_kraft() as kafka,
    ):
        yield Services(pg.get_connection_url(), kafka.get_bootstrap_server())


@pytest.fixture(scope="session")
def template_database(services: Services) -> str:
    """A database with both sides migrated, cloned for every test."""
    admin = create_engine(services.database_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"DROP DATABASE IF EXISTS {TEMPLATE_DB}"))
        conn.execute(text(f"CREATE DATABASE {TEMPLATE_DB}"))
    admin.dispose()
    url = make_url(services.database_url).set(database=TEMPLATE_DB).render_as_string(False)
    migrate_write_side(url)
    migrate_views(url)
    return url


@pytest.fixture
def database_url(services: Services, template_database: str) -> Iterator[str]:
    name = f"bb_{uuid.uuid4().hex[:12]}"
    admin = create_engine(services.database_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE_DB}"))
    try:
        yield make_url(services.database_url).set(database=name).render_as_string(False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()


@pytest.fixture
def settings(services: Services, database_url: str) -> Iterator[Settings]:
    suffix = uuid.uuid4().hex[:10]
    chosen = replace(
        Settings(),
        database_url=database_url,
        kafka_bootstrap=services.kafka_bootstrap,
        topic=f"test.events.{suffix}",
        consumer_group=f"test-views-{suffix}",
    )
    yield chosen
    _delete_topics(chosen)


def _delete_topics(settings: Settings) -> None:
    """Delete the test's topic and those named after it (dead letters, a test's own).

    A broker shared by many runs of the suite otherwise keeps every test's partitions,
    and a broker with tens of thousands of them runs out of heap."""
    with contextlib.suppress(KafkaException, KafkaUnavailable):  # the broker is down
        topics = AdminClient({"bootstrap.servers": settings.kafka_bootstrap}).list_topics(
            timeout=10
        )
        named = [name for name in topics.topics if name.startswith(settings.topic)]
        delete_topics(settings, named, timeout_s=30)


@pytest.fixture
def engine(settings: Settings) -> Iterator[Engine]:
    engine = create_engine(settings.database_url, pool_size=10, max_overflow=10)
    try:
        yield engine
    finally:
        engine.dispose()


@pytest.fixture
def own_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    """A Kafka broker this test may stop and start, apart from the shared one."""
    if shutil.which("java") is None:
        pytest.skip("no Java runtime: the broker-outage test needs a broker it controls")
    cache = _cache_dir()
    broker = LocalKafka(cache / "outage", _port(OUTAGE_KAFKA), _port(OUTAGE_CONTROLLER))
    try:
        broker.start()
        yield broker
    finally:
        broker.stop()


Login = Callable[..., Engine]
"""``login(role, *, tenant=None) -> Engine`` (the :func:`login` fixture)."""


@pytest.fixture
def login(engine: Engine, database_url: str) -> Iterator[Login]:
    """Engines for fresh login users in a role (``blackbox_writer``, ``blackbox_reader``,
    ``blackbox_replayer``, ``blackbox_relay``), granted ``tenant`` when one is given;
    the users are dropped at the end of the test."""
    made: list[tuple[str, Engine]] = []

    def connect(role: str, *, tenant: str | None = None) -> Engine:
        user = f"sec_{role.removeprefix('blackbox_')}_{uuid.uuid4().hex[:8]}"
        with engine.begin() as conn:
            conn.execute(text(f"CREATE ROLE {user} LOGIN IN ROLE {role}"))
            if tenant is not None:
                grant_tenant_txn(conn, user, tenant)
        user_engine = create_engine(make_url(database_url).set(username=user, password=None))
        made.append((user, user_engine))
        return user_engine

    yield connect
    for user, user_engine in made:
        user_engine.dispose()
        with engine.begin() as conn:
            conn.execute(text(f"REASSIGN OWNED BY {user} TO CURRENT_USER"))
            conn.execute(text(f"DROP OWNED BY {user}"))
            conn.execute(text(f"DROP ROLE IF EXISTS {user}"))


@dataclass(frozen=True)
class ObjectStore:
    """Where the test object store listens, and the credentials it takes."""

    url: str
    """``s3://bucket/?endpoint=...``: a bucket that exists."""
    access_key: str
    secret_key: str


@pytest.fixture(scope="session")
def object_store() -> Iterator[ObjectStore]:
    """A real S3-compatible object store: ``BLACKBOX_BACKUP_URL`` (an ``s3://`` URL, with
    ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``) when set; MinIO by testcontainers
    when a Docker engine answers; otherwise the local stack's S3Proxy, on a test-only
    port, stopped at the end."""
    url = os.environ.get("BLACKBOX_BACKUP_URL", "")
    if url.startswith("s3://"):
        key, secret = os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]
        yield ObjectStore(url, key, secret)
        return
    if _docker_answers():
        yield from _minio()
        return
    if shutil.which("java") is None:
        pytest.skip("no Java runtime: the object-store tests need S3Proxy (or Docker)")
    s3 = LocalS3(_cache_dir(), _port(S3))
    endpoint = s3.start()
    try:
        yield ObjectStore(endpoint.backup_url, endpoint.access_key, endpoint.secret_key)
    finally:
        s3.stop()


def _minio() -> Iterator[ObjectStore]:
    from testcontainers.minio import MinioContainer

    with MinioContainer() as minio:
        client = minio.get_client()
        client.make_bucket("blackbox-backups")
        config = minio.get_config()
        url = f"s3://blackbox-backups/?endpoint=http://{config['endpoint']}"
        yield ObjectStore(url, config["access_key"], config["secret_key"])


@pytest.fixture
def s3_url(object_store: ObjectStore, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh, empty prefix of the test object store as a backup URL; its credentials
    are in this test's environment."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", object_store.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", object_store.secret_key)
    parts = urlsplit(object_store.url)
    prefix = f"{parts.path.strip('/')}/test-{uuid.uuid4().hex[:12]}".lstrip("/")
    return urlunsplit(parts._replace(path=f"/{prefix}"))
