"""The consumer runtime's Kafka side: one member of a consumer group, its reads, its
view of the broker's watermarks, and the offsets it reports to Kafka for dashboards.

Kafka's committed offsets are informational here: the offsets that count are stored in
the database with the rows they produced (see :mod:`._assignment`), and the ones this
member commits to Kafka, at most once a second, are never read back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping

from confluent_kafka import Consumer, KafkaError, KafkaException, Message
from confluent_kafka import TopicPartition as KafkaPartition

from agent_blackbox.broker import ClientConfig, KafkaUnavailable, kafka_errors, new_consumer
from agent_blackbox.consumers._errors import MemberFenced
from agent_blackbox.consumers._offsets import TopicPartition
from agent_blackbox.schemas import Settings

# These are the runtime's log lines: they keep its logger's name.
log = logging.getLogger("agent_blackbox.consumers._runtime")

_KAFKA_COMMIT_EVERY_S = 1.0
_FENCED_REJOINS = 3
_FENCED_WINDOW_S = 60.0
"""A member fenced more than _FENCED_REJOINS times in _FENCED_WINDOW_S fails for good."""


def _fenced(error: KafkaError) -> bool:
    """Whether a fatal error is the fencing of a static member (librdkafka reports it as
    a generic fatal error whose text names the reason)."""
    return error.code() == KafkaError.FENCED_INSTANCE_ID or "fenced" in error.str().lower()


Rebalanced = Callable[[Consumer, list[KafkaPartition]], None]
"""A rebalance callback: the client and the partitions assigned or revoked."""


class GroupMember:
    """One consumer's membership of its group on Kafka, from joining to leaving.

    Args:
        settings: the broker and the topic.
        name: the consumer's name, for the log and the errors.
        group_id: the consumer group.
        instance_id: static membership (``group.instance.id``), or ``None``.
        client_config: extra client settings, applied last.
        batch_size: the most messages one :meth:`consume` returns.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        name: str,
        group_id: str,
        instance_id: str | None,
        client_config: ClientConfig,
        batch_size: int,
    ) -> None:
        self._settings = settings
        self._name = name
        self._group_id = group_id
        self._instance_id = instance_id
        self._client_config = client_config
        self._batch_size = batch_size
        self._client: Consumer | None = None
        self._uncommitted: dict[TopicPartition, int] = {}
        self._committed_at = 0.0
        self._fenced_at: list[float] = []

    @property
    def joined(self) -> bool:
        """Whether :meth:`join` succeeded (a member that left stays joined: it is not
        joined again)."""
        return self._client is not None

    def config(self) -> dict[str, str | int | float | bool]:
        """The client settings this member joins with."""
        static = {"group.instance.id": self._instance_id} if self._instance_id else {}
        return {
            "enable.auto.offset.store": False,
            "partition.assignment.strategy": "range",
            **static,
            **self._client_config,
        }

    def join(self, *, on_assign: Rebalanced, on_revoke: Rebalanced) -> None:
        """Subscribe to the topic; the callbacks run inside :meth:`consume`.

        Raises:
            KafkaUnavailable: the client could not start.
        """
        client = new_consumer(self._settings, group_id=self._group_id, config=self.config())
        with kafka_errors(
            f"consumer {self._name!r} could not start", hint="check the Kafka settings"
        ):
            client.subscribe([self._settings.topic], on_assign=on_assign, on_revoke=on_revoke)
        self._client = client

    def consume(self, timeout: float) -> list[Message]:
        """Wait up to ``timeout`` for one message, then take what is already fetched.

        Waiting for a full batch would hold a message that arrived alone for the whole
        timeout; taking what the client has prefetched keeps batches large under load.

        Raises:
            KafkaUnavailable: the client failed.
        """
        client = self.client
        with kafka_errors(f"consumer {self._name!r} failed", hint="restart it"):
            first = client.poll(timeout)
            if first is None or self._batch_size == 1:
                return [] if first is None else [first]
            return [first, *client.consume(num_messages=self._batch_size - 1, timeout=0)]

    def handle_error(self, error: KafkaError) -> None:
        """Judge an error the client handed over as a message: a fatal one raises
        :class:`KafkaUnavailable`, any other is logged and skipped."""
        if error.code() == KafkaError._PARTITION_EOF:
            return
        # A fenced static member gets its fatal error as a message whose own flag may
        # not say so; the client is unusable either way.
        if error.fatal() or error.code() == KafkaError._FATAL:
            if self._instance_id and _fenced(error) and self._may_rejoin():
                self.drop()
                raise MemberFenced(
                    f"consumer {self._name!r} was fenced ({error.str()}); joining again "
                    "with a new client"
                )
            hint = (
                f"; if another consumer of group {self._group_id!r} runs with instance id "
                f"{self._instance_id!r}, give each its own (--instance-id)"
                if self._instance_id
                else ""
            )
            raise KafkaUnavailable(f"consumer {self._name!r} failed fatally: {error.str()}{hint}")
        log.warning("consumer %s: Kafka reported %s; skipping it", self._name, error.str())

    def lag(
        self, positions: Mapping[TopicPartition, int | None], *, timeout_s: float
    ) -> int | None:
        """Messages past ``positions`` (``None``: from the start), from the broker's
        high watermarks; ``None`` when nothing is held or the broker did not answer."""
        if self._client is None or not positions:
            return None
        behind = 0
        try:
            for tp, position in list(positions.items()):
                low, high = self._client.get_watermark_offsets(
                    KafkaPartition(*tp), timeout=timeout_s, cached=False
                )
                behind += max(0, high - (low if position is None else max(position, low)))
        except KafkaException as exc:
            log.warning("consumer %s: could not read the high watermarks: %s", self._name, exc)
            return None
        return behind

    def cached_lag(self, positions: Mapping[TopicPartition, int]) -> dict[int, int]:
        """Partition -> messages past ``positions``, from the watermark of the last fetch
        that the client keeps (no request to the broker); partitions not fetched yet are
        left out."""
        found: dict[int, int] = {}
        if self._client is None:
            return found
        for tp, position in positions.items():
            try:
                _low, high = self._client.get_watermark_offsets(KafkaPartition(*tp), cached=True)
            except KafkaException:
                continue  # not fetched yet: the next batch reports it
            if high >= 0:
                found[tp[1]] = high - position
        return found

    def committed(
        self, next_offsets: Mapping[TopicPartition, int], *, held: Collection[TopicPartition]
    ) -> None:
        """The database now stores ``next_offsets``: tell Kafka too, when a second passed
        since it was last told (of the partitions still ``held``)."""
        self._uncommitted.update(next_offsets)
        if time.monotonic() - self._committed_at >= _KAFKA_COMMIT_EVERY_S:
            self.commit(held=held)

    def commit(self, *, held: Collection[TopicPartition]) -> None:
        """Informational only (lag dashboards): the database holds the offsets that count."""
        if self._client is None:
            return
        offsets = {tp: o for tp, o in self._uncommitted.items() if tp in held}
        self._uncommitted.clear()
        self._committed_at = time.monotonic()
        if not offsets:
            return
        try:
            self._client.commit(
                offsets=[KafkaPartition(t, p, o) for (t, p), o in offsets.items()],
                asynchronous=True,
            )
        except KafkaException as exc:
            log.debug("consumer %s: informational Kafka commit failed: %s", self._name, exc)

    def leave(self, *, held: Collection[TopicPartition]) -> None:
        """Report the last offsets to Kafka and leave the group; a client that does not
        close cleanly is logged, not raised."""
        if self._client is None:
            return
        try:
            self.commit(held=held)
            self._client.close()
        except (KafkaException, RuntimeError) as exc:
            log.warning("consumer %s did not close cleanly: %s", self._name, exc)

    def drop(self) -> None:
        """Let go of an unusable client without leaving the group (a fenced member is no
        member any more); :meth:`join` makes a new one."""
        client, self._client = self._client, None
        self._uncommitted.clear()
        if client is not None:
            try:
                client.close()
            except (KafkaException, RuntimeError) as exc:
                log.debug("consumer %s: the fenced client did not close: %s", self._name, exc)

    def _may_rejoin(self) -> bool:
        """Whether a fencing is the first few of the last minute: more, and another
        consumer holds the same instance id (rejoining would fence it in turn)."""
        now = time.monotonic()
        self._fenced_at = [t for t in self._fenced_at if now - t < _FENCED_WINDOW_S]
        self._fenced_at.append(now)
        return len(self._fenced_at) <= _FENCED_REJOINS

    @property
    def client(self) -> Consumer:
        """The Kafka client, for what the assignment does with it (seeking)."""
        assert self._client is not None, "join() first"
        return self._client
