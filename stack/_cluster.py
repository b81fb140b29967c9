"""A three-node Kafka cluster for development: KRaft, every node a broker and a controller.

Three combined nodes (``process.roles=broker,controller``) make a controller quorum of
three voters, so one node may be away while the quorum still elects a controller, and
room for three replicas of every partition (``min.insync.replicas=2``: see
:func:`~agent_blackbox.stack._kafka.render_server_properties`). A dedicated controller
would be one more JVM on a developer's machine and a single point of failure the
production layout does not have.

Node ``i`` (1, 2, 3) listens on ``port + 2(i-1)`` for clients and on
``controller_port + 2(i-1)`` for the quorum: with the default ports, 29092/29093,
29094/29095 and 29096/29097. Layout under ``<cache>/kafka-cluster``: ``jars/`` (one copy
for the three) and ``node-<i>/``, each laid out as the single broker's folder.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from confluent_kafka import KafkaException
from rich.console import Console

from agent_blackbox.broker import new_admin
from agent_blackbox.schemas import safe_console
from agent_blackbox.stack._kafka import LocalKafka, new_cluster_id, read_cluster_id
from agent_blackbox.stack._process import ServiceError, ServiceStatus, wait_for

CLUSTER_SIZE = 3
NODE_PORT_STEP = 2
"""How far apart two nodes' ports are: each node takes a client and a controller port."""
CLUSTER_FOLDER = "kafka-cluster"


class LocalKafkaCluster:
    """Three Kafka nodes in one KRaft cluster, owned by one cache folder and a block of
    ports.

    Args:
        cache_dir: The stack's cache folder; the cluster lives in
            ``<cache_dir>/kafka-cluster``.
        port: The first node's client port; the others follow two by two.
        controller_port: The first node's controller port; likewise.
        console: Where progress messages go (stderr by default).
        start_timeout: Seconds to wait for every node to answer and register.
        stop_timeout: Seconds to wait for each node's clean shutdown before SIGKILL.
    """

    name = "kafka"

    def __init__(
        self,
        cache_dir: Path,
        port: int = 29092,
        controller_port: int = 29093,
        *,
        console: Console | None = None,
        start_timeout: float = 120.0,
        stop_timeout: float = 30.0,
    ) -> None:
        self.root = cache_dir.resolve() / CLUSTER_FOLDER
        self._console = console or safe_console(stderr=True, soft_wrap=True)
        self._start_timeout = start_timeout
        ports = [
            (port + NODE_PORT_STEP * index, controller_port + NODE_PORT_STEP * index)
            for index in range(CLUSTER_SIZE)
        ]
        voters = {index + 1: controller for index, (_, controller) in enumerate(ports)}
        existing = (read_cluster_id(self.root / f"node-{i}" / "data") for i in voters)
        cluster_id = next((found for found in existing if found), None) or new_cluster_id()
        self.nodes = [
            LocalKafka(
                self.root,
                client,
                controller,
                console=self._console,
                start_timeout=start_timeout,
                stop_timeout=stop_timeout,
                node_id=node_id,
                voters=voters,
                folder=f"node-{node_id}",
                name=f"kafka-{node_id}",
                cluster_id=cluster_id,
                jars_dir=self.root / "jars",
            )
            for node_id, (client, controller) in zip(voters, ports, strict=True)
        ]
        self._ports = [port for pair in ports for port in pair]

    @property
    def bootstrap(self) -> str:
        """The ``bootstrap.servers`` value: every node, so a client finds the cluster
        whichever node is away."""
        return ",".join(node.bootstrap for node in self.nodes)

    def exists(self) -> bool:
        """Whether the cluster was ever started from this cache folder."""
        return any(node.data_dir.exists() for node in self.nodes)

    def is_running(self) -> bool:
        """Whether any node runs."""
        return any(node.is_running() for node in self.nodes)

    def node(self, node_id: int) -> LocalKafka:
        """The node with ``node.id`` = ``node_id`` (1, 2 or 3)."""
        return self.nodes[node_id - 1]

    def status(self) -> list[ServiceStatus]:
        """One entry per node (``kafka-1`` ...), for ``stack status``."""
        return [node.status() for node in self.nodes]

    def start(self) -> str:
        """Start the nodes that are not running and wait until all three are registered.

        The nodes are launched together: a node answers clients only once a controller
        is elected, which takes two voters of three.

        Returns:
            The bootstrap string (all three nodes). A no-op when all run.

        Raises:
            MissingPrerequisiteError: Java or (on the first start) Maven is missing.
            ServiceError: two nodes would share a port, a node did not start (the
                message quotes its logs), or the cluster did not gather in time.
        """
        if len(set(self._ports)) != len(self._ports):
            raise ServiceError(
                f"The three Kafka nodes need six distinct ports, got {self._ports}: give "
                "--kafka-port and --controller-port an odd difference (e.g. 29092 and 29093)."
            )
        stopped = [node for node in self.nodes if not node.is_running()]
        if not stopped:
            self._console.print(f"kafka: the three nodes already run at {self.bootstrap}")
            return self.bootstrap
        self.nodes[0].install()
        began = time.monotonic()
        with ThreadPoolExecutor(max_workers=len(stopped)) as pool:
            outcomes = [pool.submit(node.start) for node in stopped]
        failures = [error for error in (o.exception() for o in outcomes) if error is not None]
        if failures:
            for node in stopped:
                node.stop()
            raise failures[0]
        self.wait_registered(CLUSTER_SIZE)
        elapsed = time.monotonic() - began
        self._console.print(
            f"kafka: {CLUSTER_SIZE} brokers registered at {self.bootstrap} in {elapsed:.1f}s "
            "(replication factor 3, min.insync.replicas 2)"
        )
        return self.bootstrap

    def wait_registered(self, count: int, *, timeout: float | None = None) -> None:
        """Wait until the cluster reports ``count`` brokers (registered and not fenced).

        Raises:
            ServiceError: it did not within ``timeout`` (the start timeout by default).
        """
        admin = new_admin(self.bootstrap)

        def registered() -> bool:
            try:
                return len(admin.list_topics(timeout=2.0).brokers) >= count
            except KafkaException:  # a node still electing; asked again until the deadline
                return False

        limit = self._start_timeout if timeout is None else timeout
        if not wait_for(registered, timeout=limit):
            raise ServiceError(
                f"The Kafka cluster at {self.bootstrap} did not report {count} brokers "
                f"within {limit:g}s. Check each node's logs under {self.root}/node-*/logs."
            )

    def stop(self) -> None:
        """Stop every node that runs (together: a node alone would wait for a
        controller to hear its shutdown). Their data is kept."""
        running = [node for node in self.nodes if node.is_running()]
        with ThreadPoolExecutor(max_workers=max(1, len(running))) as pool:
            outcomes = [pool.submit(node.stop) for node in running]
        for outcome in outcomes:
            outcome.result()
