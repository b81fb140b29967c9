"""Broker faults on a replicated Kafka: three KRaft nodes of the stack launcher's own.

:class:`ClusterStack` is a fault stack whose Kafka is the three-node cluster that
``blackbox stack up --brokers 3`` starts (replication factor 3, ``min.insync.replicas``
2), on a block of free ports and a cache folder of its own. Each scenario runs the usual
frame (a fresh database and topic, writer threads, a ``blackbox relay`` and a
``blackbox consume``; see ``_scenarios._run``), injects one broker fault half-way through
its events and ends with the after-heal check, whose reader consumes the topic with
confluent-kafka directly and compares it with what committed.

A node the fault took away is started again in the background: its JVM starts while
the after-heal check reads the topic, and the next scenario waits for all three nodes
(:meth:`ClusterStack.settle`) before it makes its topic (three replicas need three
nodes).

What each scenario adds is the time the fault stopped publication: from the fault (or
from the heal, when nothing can be published during the fault) until every partition the
fault took away has grown past the end offset it had before. End offsets are read from the
partitions' leaders by a plain consumer, not through the project's code.
"""

from __future__ import annotations

import random
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from agent_blackbox.stack import LocalKafka, LocalStack, StackPorts
from tests.faults._check import Figures
from tests.faults._harness import FaultStack, Load, Scenario, eventually, free_port
from tests.faults._scenarios import _loaded, _run

NODES = 3


def free_port_block(count: int, taken: set[int]) -> int:
    """The first of ``count`` consecutive free loopback ports below the ephemeral range:
    the cluster's nodes take their ports two by two from a base."""
    rng = random.Random()
    while True:
        base = rng.randrange(20_000, 32_000 - count)
        block = range(base, base + count)
        if taken.isdisjoint(block) and all(_bindable(port) for port in block):
            taken.update(block)
            return base


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class ClusterStack(FaultStack):
    """A Postgres and a three-node Kafka cluster, both started by the stack launcher."""

    def __init__(self, cache_dir: Path) -> None:
        taken: set[int] = set()
        base = free_port_block(2 * NODES, taken)
        ports = StackPorts(
            postgres=free_port(taken),
            kafka=base,
            controller=base + 1,
            s3=free_port(taken),
            console=free_port(taken),
        )
        self.cache_dir = cache_dir
        self.local = LocalStack(cache_dir, ports, environ={})
        self.postgres = self.local.postgres
        self.cluster = self.local.kafka_cluster
        self._admin: AdminClient | None = None
        self.kafka = self.cluster  # type: ignore[assignment]  # scenario() reads .bootstrap
        self._restarts: list[threading.Thread] = []
        self._restart_errors: list[BaseException] = []

    def start(self) -> None:
        """``stack up --brokers 3`` from empty Kafka storage, then the template."""
        # The ports are new each time and are part of the quorum: old storage would not fit.
        # The jars stay (fetching them again with Maven would add a JVM run of its own).
        for node in self.cluster.nodes:
            shutil.rmtree(node.data_dir, ignore_errors=True)
        self.local.up(brokers=NODES)
        self.make_template()

    def restart_in_background(self, node: LocalKafka, notes: dict[str, object]) -> None:
        """Start ``node`` again on a thread of its own (``notes["restart_s"]``: how long
        its start took); :meth:`settle` waits for it."""

        def start() -> None:
            began = time.monotonic()
            try:
                node.start()
            except BaseException as exc:  # settle() raises it in the test's thread
                self._restart_errors.append(exc)
            notes["restart_s"] = round(time.monotonic() - began, 2)

        thread = threading.Thread(target=start, name=f"restart-{node.name}", daemon=True)
        thread.start()
        self._restarts.append(thread)

    def settle(self, *, timeout: float = 180.0) -> None:
        """Until every node started in the background runs and all three are registered.

        Raises:
            AssertionError: a node did not start (its error chained), or not in time.
        """
        for thread in self._restarts:
            thread.join(timeout=timeout)
            assert not thread.is_alive(), f"{thread.name} still starting after {timeout:.0f}s"
        self._restarts.clear()
        if self._restart_errors:
            error = self._restart_errors.pop()
            raise AssertionError(f"a node did not start again: {error}") from error
        self.cluster.wait_registered(NODES, timeout=timeout)

    def stop(self) -> None:
        """``stack down``: every node, paused or not, and Postgres."""
        for thread in self._restarts:
            thread.join(timeout=180)
        for node in self.cluster.nodes:
            if node.is_running():
                node.thaw()  # a frozen node would not hear SIGTERM until the kill
        self.local.down()

    def admin(self) -> AdminClient:
        """One admin client for the stack (a client dropped while a request is in flight
        fails it)."""
        if self._admin is None:
            self._admin = AdminClient({"bootstrap.servers": self.cluster.bootstrap})
        return self._admin

    def partitions(self, topic: str) -> dict[int, tuple[int, list[int]]]:
        """Partition → (leader, in sync replicas), from the cluster's metadata."""
        metadata = self.admin().list_topics(topic, timeout=10).topics[topic]
        return {p: (meta.leader, list(meta.isrs)) for p, meta in metadata.partitions.items()}

    def busiest_leader(self, topic: str) -> tuple[LocalKafka, list[int]]:
        """The node leading most of ``topic``'s partitions, and those partitions."""
        led: dict[int, list[int]] = {}
        for partition, (leader, _) in self.partitions(topic).items():
            led.setdefault(leader, []).append(partition)
        leader = max(led, key=lambda node: (len(led[node]), -node))
        return self.cluster.node(leader), sorted(led[leader])

    def wait_fully_replicated(self, topic: str, *, timeout: float = 120.0) -> None:
        """Until every partition of ``topic`` has a leader and all three replicas in sync
        (the next fault starts from a whole cluster)."""
        eventually(
            lambda: all(
                leader >= 0 and len(isrs) == NODES
                for leader, isrs in self.partitions(topic).values()
            ),
            timeout=timeout,
            interval=0.2,
            what=f"{topic} fully replicated",
        )


class EndOffsets:
    """End offsets (high watermarks) of a topic's partitions, asked of their leaders by a
    plain consumer. A new client for every reading: a client's cached metadata would send
    the request to a dead leader for minutes."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self._bootstrap = bootstrap
        self.topic = topic

    def read(self, partitions: list[int], *, timeout: float = 2.0) -> dict[int, int]:
        """Partition → end offset, for the partitions whose leader answered in time."""
        consumer = Consumer(
            {
                "bootstrap.servers": self._bootstrap,
                "group.id": f"fault-offsets-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
            }
        )
        found: dict[int, int] = {}
        try:
            for partition in partitions:
                tp = TopicPartition(self.topic, partition)
                try:
                    _, high = consumer.get_watermark_offsets(tp, timeout=timeout, cached=False)
                except KafkaException:
                    continue  # no leader yet, or a leader that does not answer
                if high >= 0:
                    found[partition] = int(high)
        finally:
            consumer.close()
        return found

    def close(self) -> None:
        """Nothing to release: each reading closes its own client."""


def published_again(
    stack: ClusterStack,
    offsets: EndOffsets,
    before: dict[int, int],
    *,
    since: float,
    away: LocalKafka | None = None,
    timeout: float = 120.0,
) -> float:
    """Seconds from ``since`` until every partition of ``before`` grew past its offset.

    While a partition has no leader, or is still led by ``away`` (the node the fault
    took), its offset is not asked for: a request to a dead or frozen leader only waits
    out its timeout, which would blur the figure.
    """
    gone = away.node_id if away is not None else None

    def grown() -> bool:
        try:
            leaders = stack.partitions(offsets.topic)
        except KafkaException:
            return False  # the metadata request went to the node the fault froze
        if any(leaders[p][0] in (-1, gone) for p in before):
            return False
        now = offsets.read(list(before), timeout=1.0)
        return all(now.get(p, -1) > offset for p, offset in before.items())

    eventually(grown, timeout=timeout, interval=0.1, what="publishing again")
    return time.monotonic() - since


def _frame(
    stack: ClusterStack,
    log_dir: Path,
    name: str,
    events: int,
    fault: Callable[[Scenario, Figures, EndOffsets], None],
) -> Figures:
    """The common frame with one fault half-way. It starts from a whole cluster (every
    node of an earlier fault back); a node the fault took away may still be starting
    when it ends."""

    def body(current: Scenario, figures: Figures, events: int) -> None:
        offsets = EndOffsets(stack.cluster.bootstrap, current.settings.topic)
        try:

            def inject(number: int, load: Load) -> None:
                topic = current.settings.topic
                stack.settle()  # a node restarted by the round before
                figures.notes["replicas"] = replication_of(stack, topic)
                stack.wait_fully_replicated(topic)
                fault(current, figures, offsets)
                figures.notes["acknowledged_at_fault_end"] = load.events

            _loaded(current, figures, events, inject)
        finally:
            offsets.close()

    stack.settle()  # the topic gets three replicas: all three nodes must be there
    return _run(stack, log_dir, name, events, body)


def replication_of(stack: ClusterStack, topic: str) -> dict[str, int]:
    """The topic's replica count and ``min.insync.replicas``, as the cluster reports."""
    replicas = {len(isrs) for _, isrs in stack.partitions(topic).values()}
    resource = ConfigResource("topic", topic)

    def described() -> dict[str, Any] | None:
        # The request goes to any node: one that was just stopped or frozen may have its
        # connection torn down under the request (a soak round hit this). Asked again.
        try:
            return dict(stack.admin().describe_configs([resource])[resource].result(timeout=10))
        except KafkaException:
            return None

    config = eventually(described, timeout=60, what=f"the configuration of {topic}")
    return {"replicas": max(replicas), "min_insync": int(config["min.insync.replicas"].value)}


def leader_kill(stack: ClusterStack, log_dir: Path, events: int) -> Figures:
    """SIGKILL the node leading most partitions; restart it once the others took over."""

    def fault(current: Scenario, figures: Figures, offsets: EndOffsets) -> None:
        victim, led = stack.busiest_leader(current.settings.topic)
        before = offsets.read(led)
        killed_at = time.monotonic()
        victim.kill()
        figures.takeovers_s.append(
            published_again(stack, offsets, before, since=killed_at, away=victim)
        )
        figures.notes.update(victim=victim.name, partitions_led=len(led))
        stack.restart_in_background(victim, figures.notes)

    return _frame(stack, log_dir, "leader_kill", events, fault)


def broker_stop(stack: ClusterStack, log_dir: Path, events: int, *, away_s: float) -> Figures:
    """Stop (SIGTERM) the node leading most partitions for ``away_s`` under load, then
    start it again: the other two go on publishing (two replicas in sync suffice)."""

    def fault(current: Scenario, figures: Figures, offsets: EndOffsets) -> None:
        victim, led = stack.busiest_leader(current.settings.topic)
        every = list(stack.partitions(current.settings.topic))
        before = offsets.read(led)
        stopped_at = time.monotonic()
        victim.stop()
        figures.takeovers_s.append(
            published_again(stack, offsets, before, since=stopped_at, away=victim)
        )
        during = offsets.read(every)
        until = stopped_at + away_s
        # The fault lasts away_s; meanwhile the two others must keep publishing.
        eventually(
            lambda: (
                time.monotonic() >= until
                and sum(offsets.read(every).values()) > sum(during.values())
            ),
            timeout=away_s + 60,
            interval=0.5,
            what=f"publishing with {victim.name} away for {away_s:g}s",
        )
        grown = offsets.read(every)
        figures.notes["published_while_away"] = sum(
            grown.get(p, 0) - during.get(p, 0) for p in every
        )
        stack.restart_in_background(victim, figures.notes)
        figures.notes.update(victim=victim.name, away_s=away_s)

    return _frame(stack, log_dir, "broker_stop", events, fault)


def two_brokers_stop(stack: ClusterStack, log_dir: Path, events: int, *, away_s: float) -> Figures:
    """Stop two of the three nodes for ``away_s``: with one replica left nothing may be
    acknowledged (min.insync.replicas 2), so the relay holds its rows while writers go
    on; both come back and the relay publishes the backlog."""

    def fault(current: Scenario, figures: Figures, offsets: EndOffsets) -> None:
        topic = current.settings.topic
        every = list(stack.partitions(topic))
        first, second, survivor = stack.cluster.nodes
        pre = offsets.read(every)
        stopped_at = time.monotonic()
        first.stop()
        second.stop()
        figures.notes["stopped_in_s"] = round(time.monotonic() - stopped_at, 2)
        # Only the survivor answers: ask it about the partitions it leads (the stopped
        # nodes handed it theirs as they shut down).
        leaders = stack.partitions(topic)
        led = [p for p, (leader, _) in leaders.items() if leader == survivor.node_id]
        down = offsets.read(led)
        waiting = current.outbox_rows()
        until = time.monotonic() + away_s
        eventually(
            lambda: time.monotonic() >= until and current.outbox_rows() > waiting + 100,
            timeout=away_s + 60,
            interval=0.5,
            what="the outbox growing while two brokers are away",
        )
        after = offsets.read(led)
        figures.notes["published_while_away"] = sum(
            after[p] - down[p] for p in led if p in after and p in down
        )
        figures.notes["partitions_read_while_away"] = len(after.keys() & down.keys())
        figures.notes["outbox_backlog"] = current.outbox_rows()
        figures.notes["survivor"] = survivor.name
        restarted = time.monotonic()
        stack.cluster.start()
        ready = time.monotonic()
        figures.notes["restart_s"] = round(ready - restarted, 2)
        before = {p: after.get(p, pre.get(p, 0)) for p in every}
        figures.takeovers_s.append(published_again(stack, offsets, before, since=restarted))
        # Of which: after the nodes were back and registered.
        figures.notes["after_ready_s"] = round(restarted + figures.takeovers_s[-1] - ready, 2)
        figures.notes["away_s"] = away_s

    return _frame(stack, log_dir, "two_brokers_stop", events, fault)


def broker_freeze(stack: ClusterStack, log_dir: Path, events: int, *, away_s: float) -> Figures:
    """SIGSTOP the node leading most partitions (alive, silent: a partitioned node) for
    ``away_s``, then SIGCONT: the controller fences it and moves its partitions; once
    back it must not have kept, or handed out, anything the others did not."""

    def fault(current: Scenario, figures: Figures, offsets: EndOffsets) -> None:
        victim, led = stack.busiest_leader(current.settings.topic)
        before = offsets.read(led)
        frozen_at = time.monotonic()
        victim.freeze()
        try:
            figures.takeovers_s.append(
                published_again(stack, offsets, before, since=frozen_at, away=victim)
            )
            until = frozen_at + away_s
            eventually(
                lambda: time.monotonic() >= until,
                timeout=away_s + 5,
                interval=0.5,
                what=f"{victim.name} frozen for {away_s:g}s",
            )
        finally:
            victim.thaw()
        figures.notes.update(victim=victim.name, partitions_led=len(led), away_s=away_s)

    return _frame(stack, log_dir, "broker_freeze", events, fault)
