"""An Apache Kafka node in KRaft mode, broker and controller in one JVM.

Alone it is the single-node cluster of the default stack; three of them (see
``stack._cluster``) form a replicated cluster whose controller quorum has three voters.
The broker runs from the official jars, which Maven copies once into
``<cache>/kafka/jars``; later starts need neither Maven nor the network. Layout under
``<cache>/kafka``: ``jars/``, ``data/`` (log.dirs), ``logs/`` (``server.log`` from log4j2
and ``server.out`` for the JVM's own output), ``server.properties`` and ``kafka.pid``.
"""

from __future__ import annotations

import base64
import logging
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from confluent_kafka.admin import AdminClient
from rich.console import Console

from agent_blackbox.broker import broker_answers, new_admin
from agent_blackbox.schemas import safe_console
from agent_blackbox.stack._maven import MavenJars
from agent_blackbox.stack._process import (
    ChildService,
    PidFile,
    ServiceError,
    file_size,
    find_java,
    require_free_port,
    run_checked,
    tail_file,
)
from agent_blackbox.stack._settings import KAFKA_BOOTSTRAP_ENV

_RESOURCES = Path(__file__).resolve().parent / "kafka"
POM = _RESOURCES / "pom.xml"
LOG4J2_CONFIG = _RESOURCES / "log4j2.xml"
_MAIN_CLASS = "kafka.Kafka"
_STORAGE_TOOL = "kafka.tools.StorageTool"
_JVM_HEAP = ("-Xms256m", "-Xmx512m")
# The collector settings Kafka's own start scripts give a broker: G1 aiming at pauses of
# 20 ms (the JVM's default aim is 200 ms, and a young collection stalls every produce
# and fetch in flight), concurrent cycles started early, no full collection on request.
_JVM_COLLECTOR = (
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
)
_ELSEWHERE = f"set {KAFKA_BOOTSTRAP_ENV} to use a broker you already run"
_client_log = logging.getLogger("agent_blackbox.stack.kafka.admin")


def new_cluster_id() -> str:
    """A fresh KRaft cluster id: 16 random bytes, URL-safe base64 without padding.

    Ids starting with ``-`` are skipped: command-line tools would read them as an option.
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(secrets.token_bytes(16)).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


def read_cluster_id(data_dir: Path) -> str | None:
    """The ``cluster.id`` of the storage formatted in ``data_dir``, or ``None``."""
    try:
        meta = (data_dir / "meta.properties").read_text()
    except (FileNotFoundError, NotADirectoryError):
        return None
    for line in meta.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "cluster.id":
            return value.strip()
    return None


def render_server_properties(
    *,
    port: int,
    controller_port: int,
    log_dir: Path,
    node_id: int = 1,
    voters: Mapping[int, int] | None = None,
) -> str:
    """``server.properties`` for a node listening on loopback only.

    Args:
        port: The node's client (PLAINTEXT) port.
        controller_port: The node's controller port.
        log_dir: Its ``log.dirs``.
        node_id: Its ``node.id``.
        voters: Every voter of the controller quorum, node id → controller port; by
            default this node alone (a one-node cluster). With three voters or more the
            internal topics take three replicas and every topic at least two in sync
            replicas for a write (``min.insync.replicas=2``).
    """
    quorum = dict(voters) if voters is not None else {node_id: controller_port}
    settings = {
        "node.id": str(node_id),
        "process.roles": "broker,controller",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "inter.broker.listener.name": "PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "controller.quorum.voters": ",".join(
            f"{voter}@127.0.0.1:{voter_port}" for voter, voter_port in sorted(quorum.items())
        ),
        "log.dirs": str(log_dir),
        **_replication(len(quorum)),
        # Consumers in tests join alone; waiting for more members only adds latency.
        "group.initial.rebalance.delay.ms": "0",
        # After a crash the controller refuses the restarted broker's registration until
        # the dead incarnation's session expires (default 9 s); a short session keeps a
        # kill-and-restart in tests quick. Heartbeats must come well inside the session.
        # In a cluster the same session bounds how long a frozen or dead leader keeps its
        # partitions: once fenced, the controller moves leadership and shrinks the ISRs.
        "broker.heartbeat.interval.ms": "500",
        "broker.session.timeout.ms": "3000",
        # Topics are created on purpose, with the partition count the code asks for.
        "auto.create.topics.enable": "false",
        "num.partitions": "1",
    }
    lines = [f"{key}={value}" for key, value in settings.items()]
    return "# Written by the blackbox stack launcher on every start.\n" + "\n".join(lines) + "\n"


def _replication(nodes: int) -> dict[str, str]:
    """How many copies internal and default topics keep on a cluster of ``nodes``."""
    if nodes < 3:
        # One broker: every internal topic must make do with a single replica.
        return {
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
        }
    # Three copies, two of them needed for a write: one node may be away (a restart, a
    # crash) while producers with acks=all go on; with two away they wait rather than
    # have a write acknowledged by a single copy. Never elect a replica that fell out
    # of sync: that would drop acknowledged writes.
    return {
        "default.replication.factor": "3",
        "min.insync.replicas": "2",
        "unclean.leader.election.enable": "false",
        "offsets.topic.replication.factor": "3",
        "transaction.state.log.replication.factor": "3",
        "transaction.state.log.min.isr": "2",
        "share.coordinator.state.topic.replication.factor": "3",
        "share.coordinator.state.topic.min.isr": "2",
    }


class LocalKafka(ChildService):
    """A Kafka node for development, owned by one cache folder and two ports: a
    one-node cluster by default, or one node of a cluster (``node_id``, ``voters``).

    Args:
        cache_dir: The stack's cache folder; the broker lives in ``<cache_dir>/<folder>``.
        port: Loopback port of the PLAINTEXT listener clients use.
        controller_port: Loopback port of the KRaft controller listener.
        console: Where progress messages go (stderr by default).
        start_timeout: Seconds to wait for the broker to answer after launch.
        stop_timeout: Seconds to wait for a clean shutdown before SIGKILL.
        node_id: The node's id in its cluster.
        voters: The cluster's controller quorum, node id → controller port (this node
            alone by default).
        folder: The node's folder under ``cache_dir``.
        name: How ``status`` and messages call it.
        cluster_id: The id to format empty storage with (every node of a cluster needs
            the same); a fresh one by default.
        jars_dir: Where the Kafka jars are kept (``<cache_dir>/<folder>/jars`` by
            default); the nodes of a cluster share one copy.
    """

    name = "kafka"
    label = "Kafka"

    def __init__(
        self,
        cache_dir: Path,
        port: int = 29092,
        controller_port: int = 29093,
        *,
        console: Console | None = None,
        start_timeout: float = 120.0,
        stop_timeout: float = 30.0,
        node_id: int = 1,
        voters: Mapping[int, int] | None = None,
        folder: str = "kafka",
        name: str = "kafka",
        cluster_id: str | None = None,
        jars_dir: Path | None = None,
    ) -> None:
        self._root = cache_dir.resolve() / folder
        self.name = name
        self._port = port
        self._controller_port = controller_port
        self._node_id = node_id
        self._voters = dict(voters) if voters is not None else None
        self._cluster_id = cluster_id
        self._console = console or safe_console(stderr=True, soft_wrap=True)
        self._start_timeout = start_timeout
        self._stop_timeout = stop_timeout
        self._jars = MavenJars(
            jars_dir or self._root / "jars",
            pom=POM,
            service="kafka",
            what="the Kafka jars",
            alternative=_ELSEWHERE,
            console=self._console,
        )
        self._child: subprocess.Popen[bytes] | None = None
        self._log_offset = 0  # where this launch's lines start in server.log

    @property
    def bootstrap(self) -> str:
        """The ``bootstrap.servers`` value for clients."""
        return f"127.0.0.1:{self._port}"

    @property
    def data_dir(self) -> Path:
        """The broker's ``log.dirs``."""
        return self._root / "data"

    @property
    def log_dir(self) -> Path:
        """Where ``server.log`` and ``server.out`` are written."""
        return self._root / "logs"

    @property
    def properties_path(self) -> Path:
        """The generated ``server.properties``."""
        return self._root / "server.properties"

    @property
    def address(self) -> str:
        """Where clients connect."""
        return self.bootstrap

    def start(self) -> str:
        """Start the broker and wait until it answers metadata requests.

        Returns:
            The bootstrap address. When the broker already runs this is a no-op.

        Raises:
            MissingPrerequisiteError: Java or (on the first start) Maven is missing.
            ServiceError: the broker exited or did not answer in time; the message
                quotes the end of its logs.
        """
        pid = self.pid()
        if pid is not None:
            self._console.print(f"{self.name}: already running (pid {pid}) at {self.bootstrap}")
            return self.bootstrap
        self._remove_stale_pid_file()
        require_free_port(self._port, service="Kafka", option="--kafka-port")
        require_free_port(self._controller_port, service="Kafka", option="--controller-port")
        java = find_java(service="Kafka", alternative=_ELSEWHERE)
        self._jars.ensure()
        self._root.mkdir(parents=True, exist_ok=True)
        self.properties_path.write_text(self._properties())
        if not (self.data_dir / "meta.properties").exists():
            self._format(java)
        began = time.monotonic()
        self._launch(java)
        elapsed = time.monotonic() - began
        self._console.print(
            f"{self.name}: started (pid {self.pid()}) at {self.bootstrap} in {elapsed:.1f}s"
        )
        return self.bootstrap

    def install(self) -> None:
        """Fetch the jars unless a complete copy is there (Maven, first start only).

        Raises:
            MissingPrerequisiteError: Maven is missing.
            ServiceError: Maven could not fetch them.
        """
        self._jars.ensure()

    def freeze(self) -> None:
        """SIGSTOP the node: alive but silent, as a node cut off by the network; for
        fault tests. :meth:`thaw` lets it go on."""
        self._signal(signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT a node :meth:`freeze` stopped."""
        self._signal(signal.SIGCONT)

    def _signal(self, signum: signal.Signals) -> None:
        pid = self.pid()
        if pid is None:
            raise ServiceError(f"{self.name} is not running: nothing to signal")
        os.kill(pid, signum)

    # -- steps of start() ----------------------------------------------------------

    def _pid_file(self) -> PidFile:
        return PidFile(self._root / "kafka.pid", marker=self._marker())

    def _marker(self) -> str:
        return f"{_MAIN_CLASS} {self.properties_path}"

    @property
    def node_id(self) -> int:
        """The node's ``node.id`` in its cluster."""
        return self._node_id

    @property
    def controller_port(self) -> int:
        """The node's KRaft controller port."""
        return self._controller_port

    def cluster_id(self) -> str | None:
        """The cluster id its storage was formatted with, ``None`` before the first start."""
        return read_cluster_id(self.data_dir)

    def _properties(self) -> str:
        return render_server_properties(
            port=self._port,
            controller_port=self._controller_port,
            log_dir=self.data_dir,
            node_id=self._node_id,
            voters=self._voters,
        )

    def _jvm(self, java: str, *options: str) -> list[str]:
        logging_options = [f"-Dlog4j2.configurationFile={LOG4J2_CONFIG}"]
        logging_options.append(f"-Dkafka.logs.dir={self.log_dir}")
        return [java, *options, *logging_options, "-cp", self._jars.classpath]

    def _format(self, java: str) -> None:
        cluster_id, properties = self._cluster_id or new_cluster_id(), str(self.properties_path)
        self._console.print(
            f"{self.name}: formatting storage in {self.data_dir} (cluster {cluster_id})"
        )
        run_checked(
            [*self._jvm(java), _STORAGE_TOOL, "format", "-t", cluster_id, "-c", properties],
            what="Formatting the Kafka storage",
            hint=f"Delete {self.data_dir} if it holds a half-formatted directory, then retry.",
        )

    def _launch(self, java: str) -> None:
        argv = [
            *self._jvm(java, *_JVM_HEAP, *_JVM_COLLECTOR),
            _MAIN_CLASS,
            str(self.properties_path),
        ]
        self._log_offset = file_size(self.log_dir / "server.log")
        admin: AdminClient | None = None

        def answers() -> bool:
            nonlocal admin
            admin = admin or new_admin(self.bootstrap, logger=_client_log)
            return broker_answers(admin)

        self._launch_child(argv, out=self.log_dir / "server.out", answers=answers)

    def _logs(self) -> str:
        log, out = self.log_dir / "server.log", self.log_dir / "server.out"
        log_tail = tail_file(log, since=self._log_offset)
        return f"Last lines of {log}:\n{log_tail}\nLast lines of {out}:\n{tail_file(out)}"
