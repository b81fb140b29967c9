"""Broker faults on a three-node Kafka (issue 31, item 4), under load.

The module starts its own cluster with the stack launcher (``stack up --brokers 3``: three
KRaft nodes, replication factor 3, ``min.insync.replicas`` 2) on free ports and a cache
folder of its own, never the shared services. Each fault runs once over :data:`EVENTS`
events recorded by writer threads and published by a ``blackbox relay`` at its default
lease (deliveries time out after 1 s, well within a failover; no run may come out of order
all the same): the leader of the busiest partitions killed (SIGKILL), a node stopped for
:data:`AWAY_S`, two nodes stopped (nothing may be acknowledged: producers wait), a node
frozen (SIGSTOP, a partitioned node) and thawed. After each, the after-heal check reads
the topic with a plain consumer and compares it with what committed: nothing lost, no run
out of order, copies counted; the time until the partitions the fault took away grew
again is measured.

``AWAY_S`` is 10 s, to keep the module CI-sized; ``BLACKBOX_FAULT_AWAY_S=30`` runs the
issue's 30 s (the figures in the high-availability guide).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent_blackbox.broker import ensure_topics
from agent_blackbox.schemas import Settings
from tests.conftest import _cache_dir
from tests.faults._check import Figures
from tests.faults._cluster import (
    NODES,
    ClusterStack,
    broker_freeze,
    broker_stop,
    leader_kill,
    replication_of,
    two_brokers_stop,
)

pytestmark = [pytest.mark.integration, pytest.mark.faults, pytest.mark.timeout(900)]

EVENTS = 1_000
"""Events before and after each fault: half before it; the writers go on during it (a
few thousand events more)."""
AWAY_S = float(os.environ.get("BLACKBOX_FAULT_AWAY_S", "10"))
"""How long a stopped or frozen node stays away."""

Run = Callable[[str], Figures]


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterStack]:
    if shutil.which("java") is None:
        pytest.skip("no Java runtime: the cluster faults need Kafka nodes they control")
    stack = ClusterStack(_cache_dir() / "faults-cluster")
    try:
        stack.start()
        yield stack
    finally:
        stack.stop()


@pytest.fixture(scope="module")
def run_fault(cluster: ClusterStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """Runs each fault once per module; prints the figures table at the end."""
    done: dict[str, Figures] = {}
    logs = Path(tmp_path_factory.mktemp("cluster-fault-logs"))
    faults: dict[str, Callable[[], Figures]] = {
        "leader_kill": lambda: leader_kill(cluster, logs, EVENTS),
        "broker_stop": lambda: broker_stop(cluster, logs, EVENTS, away_s=AWAY_S),
        "two_brokers_stop": lambda: two_brokers_stop(cluster, logs, EVENTS, away_s=AWAY_S),
        "broker_freeze": lambda: broker_freeze(cluster, logs, EVENTS, away_s=AWAY_S),
    }

    def run(name: str) -> Figures:
        if name not in done:
            done[name] = faults[name]()
            print(done[name].json_line(), file=sys.stderr)
        return done[name]

    yield run
    print(_table(done), file=sys.stderr)


def _table(done: dict[str, Figures]) -> str:
    """The docs' table: fault × acknowledged, lost, duplicates, order, recovery."""
    lines = [
        "| fault | acknowledged | lost | duplicates | order violations | publishing again |",
        "|---|---|---|---|---|---|",
    ]
    for name, f in done.items():
        recovery = ", ".join(f"{t:.1f} s" for t in f.takeovers_s)
        lines.append(
            f"| {name} | {f.events} | {f.lost} | {f.duplicates_published} | {f.reordered} "
            f"| {recovery} |"
        )
    return "\n".join(lines)


def _holds(figures: Figures) -> None:
    problems = figures.problems()
    assert not problems, f"{figures.scenario}: {problems}; figures: {figures.json_line()}"
    assert figures.lost == 0
    assert figures.reordered == 0
    assert figures.phantom == 0
    assert figures.events >= EVENTS
    assert len(figures.takeovers_s) == 1, figures.json_line()


def test_the_stack_runs_three_nodes_and_lists_them(cluster: ClusterStack) -> None:
    nodes = [s for s in cluster.local.status() if s.name.startswith("kafka-")]
    assert [(s.name, s.state) for s in nodes] == [
        (f"kafka-{i}", "running") for i in range(1, NODES + 1)
    ]
    assert cluster.cluster.bootstrap.count(",") == NODES - 1


def test_topics_get_three_replicas_and_two_in_sync(cluster: ClusterStack) -> None:
    settings = Settings(kafka_bootstrap=cluster.cluster.bootstrap, topic="replicated.check")
    ensure_topics(settings)
    try:
        for topic in (settings.topic, settings.dlq_topic):
            partitions = cluster.partitions(topic)
            assert all(len(isrs) == NODES for _, isrs in partitions.values()), partitions
        assert len(cluster.partitions(settings.topic)) == settings.partitions
        assert replication_of(cluster, settings.topic) == {"replicas": 3, "min_insync": 2}
    finally:
        cluster.admin().delete_topics([settings.topic, settings.dlq_topic])


FAULTS = ["leader_kill", "broker_stop", "two_brokers_stop", "broker_freeze"]


@pytest.mark.parametrize("name", FAULTS)
def test_nothing_acknowledged_is_lost_or_reordered(name: str, run_fault: Run) -> None:
    figures = run_fault(name)
    _holds(figures)
    # The relay's topic was created replicated: the guarantees rest on it.
    assert figures.notes["replicas"] == {"replicas": 3, "min_insync": 2}


def test_one_node_away_does_not_stop_publication(run_fault: Run) -> None:
    figures = run_fault("broker_stop")
    assert figures.notes["published_while_away"] > 0, figures.json_line()


def test_two_nodes_away_block_the_relay_until_they_return(run_fault: Run) -> None:
    figures = run_fault("two_brokers_stop")
    # With one replica left nothing is acknowledged: no partition grew while the writers
    # went on committing, and the relay held their rows until the nodes returned.
    assert figures.notes["partitions_read_while_away"] > 0, figures.json_line()
    assert figures.notes["published_while_away"] == 0, figures.json_line()
    assert figures.notes["outbox_backlog"] > 100, figures.json_line()
