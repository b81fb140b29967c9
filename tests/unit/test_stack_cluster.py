"""The three-node Kafka of ``stack up --brokers 3``, checked without starting a node."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from agent_blackbox.broker._topics import topic_replication
from agent_blackbox.stack import LocalKafkaCluster, LocalStack, ServiceError, StackError, StackPorts
from agent_blackbox.stack._kafka import read_cluster_id, render_server_properties

QUIET = Console(quiet=True)


def _properties(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if line and line[0] != "#")
    return dict(pairs)


def test_a_cluster_node_votes_with_the_two_others_and_keeps_three_copies(tmp_path: Path) -> None:
    props = _properties(
        render_server_properties(
            port=29194,
            controller_port=29195,
            log_dir=tmp_path,
            node_id=2,
            voters={1: 29193, 2: 29195, 3: 29197},
        )
    )
    assert props["node.id"] == "2"
    assert props["process.roles"] == "broker,controller"
    assert props["controller.quorum.voters"] == (
        "1@127.0.0.1:29193,2@127.0.0.1:29195,3@127.0.0.1:29197"
    )
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:29194,CONTROLLER://127.0.0.1:29195"
    assert props["default.replication.factor"] == "3"
    assert props["min.insync.replicas"] == "2"
    assert props["unclean.leader.election.enable"] == "false"
    assert props["offsets.topic.replication.factor"] == "3"
    assert props["transaction.state.log.min.isr"] == "2"


def test_a_single_node_keeps_its_one_replica_settings(tmp_path: Path) -> None:
    props = _properties(render_server_properties(port=1, controller_port=2, log_dir=tmp_path))
    assert props["controller.quorum.voters"] == "1@127.0.0.1:2"
    assert props["offsets.topic.replication.factor"] == "1"
    assert "min.insync.replicas" not in props
    assert "default.replication.factor" not in props


def test_the_nodes_take_their_ports_two_by_two(tmp_path: Path) -> None:
    cluster = LocalKafkaCluster(tmp_path, 29192, 29193, console=QUIET)
    assert cluster.bootstrap == "127.0.0.1:29192,127.0.0.1:29194,127.0.0.1:29196"
    assert [node.controller_port for node in cluster.nodes] == [29193, 29195, 29197]
    assert [node.name for node in cluster.nodes] == ["kafka-1", "kafka-2", "kafka-3"]
    assert [node.node_id for node in cluster.nodes] == [1, 2, 3]
    assert cluster.node(2).data_dir == tmp_path.resolve() / "kafka-cluster" / "node-2" / "data"
    assert not cluster.exists()
    assert not cluster.is_running()


def test_ports_that_would_collide_are_refused_before_anything_starts(tmp_path: Path) -> None:
    cluster = LocalKafkaCluster(tmp_path, 29192, 29194, console=QUIET)
    with pytest.raises(ServiceError, match="six distinct ports"):
        cluster.start()
    assert not (tmp_path / "kafka-cluster").exists()


def test_a_cluster_formatted_once_keeps_its_id_for_every_node(tmp_path: Path) -> None:
    data = tmp_path / "kafka-cluster" / "node-3" / "data"
    data.mkdir(parents=True)
    (data / "meta.properties").write_text("version=1\ncluster.id=abcDEF123\nnode.id=3\n")
    assert read_cluster_id(data) == "abcDEF123"
    assert read_cluster_id(tmp_path / "absent") is None
    cluster = LocalKafkaCluster(tmp_path, console=QUIET)
    assert {node._cluster_id for node in cluster.nodes} == {"abcDEF123"}
    assert cluster.exists()


def test_status_lists_the_three_nodes_once_the_cluster_exists(tmp_path: Path) -> None:
    stack = LocalStack(tmp_path, StackPorts(25442, 29192, 29193), console=QUIET, environ={})
    assert [s.name for s in stack.status()] == ["postgres", "kafka", "s3", "console"]
    (tmp_path / "kafka-cluster" / "node-1" / "data").mkdir(parents=True)
    names = [(s.name, s.state, s.address) for s in stack.status()]
    assert names == [
        ("postgres", "stopped", "postgresql+psycopg://blackbox@127.0.0.1:25442/blackbox"),
        ("kafka-1", "stopped", "127.0.0.1:29192"),
        ("kafka-2", "stopped", "127.0.0.1:29194"),
        ("kafka-3", "stopped", "127.0.0.1:29196"),
        ("s3", "stopped", "http://127.0.0.1:29900"),
        ("console", "stopped", "http://127.0.0.1:28765/runs"),
    ]


def test_only_one_or_three_brokers(tmp_path: Path) -> None:
    stack = LocalStack(tmp_path, console=QUIET, environ={})
    with pytest.raises(StackError, match="must be 1 or 3"):
        stack.up(brokers=2)
    from agent_blackbox.cli import main

    result = CliRunner().invoke(
        main, ["stack", "up", "--cache-dir", str(tmp_path), "--brokers", "2"]
    )
    assert result.exit_code == 2
    assert "--brokers" in result.output


def test_replicated_topics_need_two_copies_in_sync() -> None:
    assert topic_replication(3) == {"min.insync.replicas": "2"}
    assert topic_replication(1) == {}
