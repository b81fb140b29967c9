"""The continuous backup rides out an outage of its object store (issue 31, item 3).

``blackbox backup run`` backs up a topic that keeps receiving events into an S3Proxy of
this test's own (the stack launcher's, on a free port: the shared one is never
stopped). The S3Proxy is killed for about 15 s and started again. The backup process
does not exit: its gauges show the outage, and once the store answers it writes the cut
that failed and goes on from there. At the end every event is in exactly one segment
(no overlap, no gap per partition, no object written that no manifest names) and
``blackbox backup verify`` passes. A second writer started while the store is away
waits for it, then exits 2 after its ``--give-up-after``, saying what to do.

Postgres and Kafka are the shared test services (nothing here stops them).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from agent_blackbox.backup import (
    BackupPolicy,
    BackupStore,
    BackupWriter,
    FolderStore,
    RetryPolicy,
    S3Store,
    StoreUnreachable,
)
from agent_blackbox.backup._cut import EVENTS
from agent_blackbox.schemas import Settings
from agent_blackbox.stack import LocalS3
from tests.conftest import _cache_dir
from tests.faults._backup import assert_each_event_once, backed_up_to_the_end, manifests
from tests.faults._harness import free_port
from tests.integration._backups import SIGNER, record, relay
from tests.integration._wait import eventually

pytestmark = [pytest.mark.integration, pytest.mark.faults, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
OUTAGE_S = 15.0


@pytest.fixture(scope="module")
def s3() -> Iterator[LocalS3]:
    """An S3Proxy of this test's own, which it may kill and start again."""
    if shutil.which("java") is None:
        pytest.skip("no Java runtime: the outage test needs S3Proxy")
    proxy = LocalS3(_cache_dir() / "backup-outage", free_port(set()))
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()


def _store(
    proxy: LocalS3, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[BackupStore, str, dict[str, str]]:
    """The store under ``prefix``, its URL, and the environment that reaches it (also
    set in this test's environment, for its own client)."""
    endpoint = proxy.start()  # already running: only says where and with what
    url = f"s3://{endpoint.bucket}/{prefix}?endpoint={endpoint.endpoint_url}"
    env = {"AWS_ACCESS_KEY_ID": endpoint.access_key, "AWS_SECRET_ACCESS_KEY": endpoint.secret_key}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    store = S3Store(endpoint.bucket, prefix=prefix, endpoint=endpoint.endpoint_url)
    return store, url, env


class _Traffic:
    """Records and relays runs in a thread until stopped: events keep flowing."""

    def __init__(self, engine: Engine, settings: Settings) -> None:
        self._engine, self._settings = engine, settings
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.runs = 0
        self.error: BaseException | None = None

    def __enter__(self) -> _Traffic:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                record(self._engine, self._settings, f"who{self.runs}", sealed=False)
                relay(self._engine, self._settings)
                self.runs += 1
                # A steady trickle, not a flood: the machine is shared with the JVM
                # that has to start again.
                self._stop.wait(0.2)
        except BaseException as exc:  # the test asserts there was none
            self.error = exc


def _backup(
    settings: Settings, url: str, env: dict[str, str], log: Path, *args: str
) -> subprocess.Popen[bytes]:
    key = log.with_suffix(".pem")
    key.write_bytes(SIGNER.private_key_pem())
    key.chmod(0o600)
    child_env = {
        **os.environ,
        **env,
        "BLACKBOX_DATABASE_URL": settings.database_url,
        "BLACKBOX_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "BLACKBOX_TOPIC": settings.topic,
        "BLACKBOX_SIGNING_KEY_FILE": str(key),
        "BLACKBOX_BACKUP_URL": url,
        "PYTHONPATH": str(ROOT),
    }
    command = [sys.executable, "-m", "agent_blackbox", "backup", "run", *args]
    with log.open("wb") as out:
        return subprocess.Popen(
            command, env=child_env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT
        )


def _gauge(port: int, name: str) -> float | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as page:
            text = page.read().decode()
    except OSError:
        return None
    found = re.search(rf"^{name}\{{[^}}]*\}} (\S+)$", text, re.MULTILINE)
    return None if found is None else float(found[1])


def test_the_backup_rides_out_a_store_outage_and_catches_up(
    settings: Settings,
    engine: Engine,
    s3: LocalS3,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, url, env = _store(s3, f"outage-{uuid.uuid4().hex[:10]}", monkeypatch)
    port = free_port(set())
    log = tmp_path / "backup.log"
    args = ("--roll-seconds", "1", "--give-up-after", "120s", "--metrics-port", str(port))
    backup = _backup(settings, url, env, log, *args)
    try:
        with _Traffic(engine, settings) as traffic:
            eventually(
                lambda: _gauge(port, "blackbox_backup_store_up") == 1 and manifests(store) >= 2,
                timeout=60,
                what=f"the backup writing cuts ({log})",
            )
            s3.kill()
            down_since = time.monotonic()
            eventually(
                lambda: (_gauge(port, "blackbox_backup_store_outage_seconds") or 0) >= OUTAGE_S,
                timeout=90,
                what=f"the gauge showing a {OUTAGE_S:.0f} s outage ({log})",
            )
            assert _gauge(port, "blackbox_backup_store_up") == 0
            assert backup.poll() is None, log.read_text()
            s3.start()
            back = time.monotonic()
            outage_s = back - down_since
            eventually(
                lambda: _gauge(port, "blackbox_backup_store_up") == 1,
                timeout=60,
                what=f"the backup finding the store again ({log})",
            )
            found_s = time.monotonic() - back
        assert traffic.error is None
        assert traffic.runs >= 3
        eventually(
            lambda: backed_up_to_the_end(settings, store),
            timeout=60,
            what=f"the backup catching up with the topic ({log})",
        )
        assert backup.poll() is None, log.read_text()
    finally:
        backup.send_signal(signal.SIGTERM)
        code = backup.wait(timeout=60)
    said = log.read_text()
    assert code == 0, said
    assert "backup store unreachable, retrying with back-off" in said
    assert "backup store reachable again after" in said
    assert_each_event_once(settings, store)
    verify = subprocess.run(
        [sys.executable, "-m", "agent_blackbox", "backup", "verify", "--store", url],
        env={**os.environ, **env, "BLACKBOX_SIGNING_PUBLIC_KEYS": _public(tmp_path)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
    print(  # the figures, with -s
        f"outage {outage_s:.1f} s, store found again {found_s:.1f} s after it answered, "
        f"{traffic.runs} runs recorded meanwhile"
    )


class _FlakyStore(FolderStore):
    """A folder store whose manifests cannot be written while ``down`` is set (the
    outage falls between a cut's segments and its manifest); it counts every put."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.down = threading.Event()
        self.puts: Counter[str] = Counter()

    def put(self, key: str, data: bytes) -> None:
        if self.down.is_set() and key.startswith("manifests/"):
            raise StoreUnreachable(f"could not reach {self.describe()} to write {key!r}")
        self.puts[key] += 1
        super().put(key, data)


def test_a_cut_retried_after_an_outage_uploads_no_segment_twice(
    settings: Settings, engine: Engine, tmp_path: Path
) -> None:
    store = _FlakyStore(tmp_path / "store")
    retry = RetryPolicy(first_s=0.1, cap_s=0.2, give_up_after_s=60)
    policy = BackupPolicy(roll_seconds=0.2, retry=retry)
    writer = BackupWriter(settings, store, signer=SIGNER, engine=engine, policy=policy)
    up = {"topic": settings.topic}
    failures = "blackbox_backup_cut_failures_total"
    stop = threading.Event()
    record(engine, settings, "ada", sealed=False)
    relay(engine, settings)
    store.down.set()
    with writer:
        thread = threading.Thread(target=writer.run, args=(stop,))
        thread.start()
        try:
            eventually(
                lambda: (writer.metrics.registry.get_sample_value(failures, up) or 0) >= 3,
                timeout=60,
                what="three failed attempts at the cut",
            )
            assert writer.metrics.registry.get_sample_value("blackbox_backup_store_up", up) == 0
            record(engine, settings, "grace", sealed=False)  # not read until the store is back
            relay(engine, settings)
            store.down.clear()
            eventually(
                lambda: backed_up_to_the_end(settings, store),
                timeout=60,
                what="the backup catching up after the outage",
            )
        finally:
            stop.set()
            thread.join(timeout=30)
    assert not thread.is_alive()
    segments = {k: n for k, n in store.puts.items() if k.startswith(EVENTS)}
    assert segments
    assert set(segments.values()) == {1}, segments
    assert writer.metrics.registry.get_sample_value("blackbox_backup_store_up", up) == 1
    assert_each_event_once(settings, store)


def _public(tmp_path: Path) -> str:
    pem = tmp_path / "signer.pub.pem"
    pem.write_bytes(SIGNER.public_key_pem())
    return str(pem)


def test_a_backup_gives_up_after_the_time_given_and_says_what_to_do(
    settings: Settings, engine: Engine, tmp_path: Path
) -> None:
    nothing_there = free_port(set())  # a store that does not answer at all
    url = f"s3://blackbox-backups/give-up?endpoint=http://127.0.0.1:{nothing_there}"
    env = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test-secret"}
    record(engine, settings, "ada", sealed=False)
    relay(engine, settings)
    log = tmp_path / "backup.log"
    began = time.monotonic()
    backup = _backup(settings, url, env, log, "--give-up-after", "6s")
    try:
        code = backup.wait(timeout=120)
    finally:
        if backup.poll() is None:
            backup.kill()
            backup.wait()
    said = log.read_text()
    assert code == 2, said
    assert time.monotonic() - began >= 6
    assert "backup store unreachable, retrying with back-off" in said
    assert "was unreachable for" in said
    assert "start `blackbox backup run` again" in said
