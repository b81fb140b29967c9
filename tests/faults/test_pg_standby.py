"""A Postgres standby takes over (issue 31, item 5): a primary and a synchronous
streaming standby of this module's own (the stack launcher's ``PostgresStandby``, free
ports, its own cache folder; never the shared stack's Postgres), writer threads recording
runs through the multi-host URL, a ``blackbox relay``, a ``blackbox consume``, a
``blackbox analytics`` and a ``blackbox backup run`` on the same URL, with the suite's
Kafka and object store and a fresh topic and prefix. The primary's postmaster is killed
(SIGKILL) under load and the standby promoted; nobody is restarted.

Afterwards: every event a writer was told was recorded is in the promoted database (the
outbox trigger's copy) and on the topic; every error a writer heard was a
``DatabaseUnavailable`` (``MaybeRecorded`` included), and one that said nothing was
recorded names an event that is not in the promoted database; the after-heal check holds
(committed = published, order, views, effects, ``verify --all``) and the analytics views
caught up; the backup went on to the topic's end, its manifests hold every event
acknowledged after the promotion, each in exactly one segment, and it holds its store's
lock on the promoted database (a second writer is refused). The time from the kill to the
first write acknowledged again is measured.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_blackbox.backup import BackupStore, open_store
from agent_blackbox.stack import LocalStack, StackError, StackPorts
from tests.conftest import Services, _cache_dir
from tests.faults._harness import free_port
from tests.faults._standby import Pair, kill_postmaster, promotion, standby_pair, standby_settings
from tests.integration._backups import SIGNER

pytestmark = [pytest.mark.integration, pytest.mark.faults, pytest.mark.timeout(300)]

BEFORE_KILL = 600
"""Events acknowledged before the primary is killed."""
AFTER_PROMOTION = 600
"""Events acknowledged after the promotion, before the writers stop."""


@pytest.fixture
def pair() -> Iterator[Pair]:
    """A fresh primary and synchronous standby of this test's own (a promoted pair
    cannot be reused)."""
    with standby_pair(_cache_dir() / "faults-standby") as fresh:
        yield fresh


@pytest.mark.parametrize("replication", ["synchronous", "asynchronous"])
def test_standby_takes_over(
    pair: Pair,
    services: Services,
    s3_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    replication: str,
) -> None:
    """Synchronous: nothing acknowledged is lost and the after-heal check holds.
    Asynchronous: what is lost (acknowledged on the primary, not yet on the standby) is
    measured, and errors stay honest. Both: the backup goes on through the failover."""
    if replication == "asynchronous":
        pair.standby.require_synchronous(False)
    settings = standby_settings(pair.url, services.kafka_bootstrap)  # the suite's own Kafka
    store = _backup_env(s3_url, tmp_path, monkeypatch)  # the suite's own object store
    done = promotion(
        pair, settings, tmp_path, before=BEFORE_KILL, after=AFTER_PROMOTION, store=store
    )
    writers, figures = done.writers, done.figures

    assert not writers.unexpected, writers.unexpected
    assert done.backup_problems == []  # each event in exactly one segment, the chain sound
    assert writers.acked_after(done.promoted), "nothing was acknowledged after the promotion"
    assert done.not_backed_up == set(), f"{len(done.not_backed_up)} later events not backed up"
    assert done.writing_again_s is not None
    print(
        f"pg-standby ({replication}): {writers.events} events acknowledged, "
        f"{len(writers.heard)} errors "
        f"({sum(h.maybe_recorded for h in writers.heard)} may-have-been-recorded); "
        f"kill -> promoted {done.promoted - done.killed:.2f}s, kill -> writing again "
        f"{done.writing_again_s:.2f}s; backup: {done.cuts} cuts, {len(done.backed_up)} "
        f"events; {len(done.lost)} acknowledged events lost; {figures.json_line()}",
        file=sys.stderr,
    )
    assert done.false_nothing == [], "an error said nothing was recorded of a committed event"
    assert figures.lost == 0, "a committed event of the promoted database is not on the topic"
    if replication == "synchronous":
        assert done.lost == set(), f"{len(done.lost)} acknowledged events missing after failover"
        assert figures.problems() == [], figures.json_line()


def _backup_env(s3_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> BackupStore:
    """Point the scenario's ``blackbox backup run`` at ``s3_url`` with the suite's signing
    key (through this test's environment, which its subprocesses inherit); the store."""
    key = tmp_path / "signer.pem"
    key.write_bytes(SIGNER.private_key_pem())
    key.chmod(0o600)
    monkeypatch.setenv("BLACKBOX_SIGNING_KEY_FILE", str(key))
    monkeypatch.setenv("BLACKBOX_BACKUP_URL", s3_url)
    return open_store(s3_url)


def test_stack_up_with_a_standby_status_promote_and_down(tmp_path: Path) -> None:
    """``stack up --pg-standby`` as the launcher does it: both servers, the URL naming
    both, the roles in ``status``; ``promote`` refuses while the primary runs; ``down``
    stops both; once promoted, ``up`` starts the promoted server alone."""
    taken: set[int] = set()
    port = free_port(taken)
    while port + 1 in taken or not _free(port + 1):
        port = free_port(taken)
    ports = StackPorts(port, *(free_port(taken | {port + 1}) for _ in range(4)))
    environ = {"BLACKBOX_KAFKA_BOOTSTRAP": os.environ.get("BLACKBOX_KAFKA_BOOTSTRAP", "x:1")}
    stack = LocalStack(_cache_dir() / "faults-standby-cli", ports, environ=environ)
    for root in (stack.postgres.root, stack.postgres_standby.root):
        shutil.rmtree(root, ignore_errors=True)
    try:
        endpoints = stack.up(pg_standby=True)
        assert endpoints.database_url == (
            f"postgresql+psycopg://blackbox@/blackbox?host=127.0.0.1:{port}"
            f"&host=127.0.0.1:{port + 1}&target_session_attrs=read-write"
        )
        roles = {s.name: (s.state, s.role) for s in stack.status()}
        assert roles["postgres"] == ("running", "primary")
        assert roles["postgres-standby"] == ("running", "standby")
        with pytest.raises(StackError, match="still runs"):
            stack.promote()
        stack.down()
        roles = {s.name: (s.state, s.role) for s in stack.status()}
        assert roles["postgres"] == ("stopped", None)
        assert roles["postgres-standby"] == ("stopped", None)

        stack.up(pg_standby=True)  # again: the standby streams from where it was
        kill_postmaster(stack.postgres)
        assert stack.promote() == stack.postgres_standby.url
        roles = {s.name: (s.state, s.role) for s in stack.status()}
        assert roles["postgres"] == ("stopped", None)
        assert roles["postgres-standby"] == ("running", "primary")
        stack.down()
        assert stack.up().database_url == stack.postgres_standby.url
        assert stack.postgres.pid() is None, "the old primary must not serve again"
    finally:
        stack.down()
        for root in (stack.postgres.root, stack.postgres_standby.root):
            shutil.rmtree(root, ignore_errors=True)


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
