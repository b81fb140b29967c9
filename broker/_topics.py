"""Creating the topics the pipeline writes to, idempotently."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from agent_blackbox.broker._clients import ClientConfig, new_admin
from agent_blackbox.broker._errors import CHECK_BROKER, KafkaUnavailable, describe, kafka_errors
from agent_blackbox.schemas import Settings

_MAX_DLQ_PARTITIONS = 3
_REPLICATED = 3
"""The replication factor of a cluster of three brokers or more, when none is set."""
_MIN_IN_SYNC = 2
"""In sync replicas a replicated topic requires for a write: one broker may be away and
writes go on; with two away, producers wait instead of trusting a single copy."""


def ensure_topics(
    settings: Settings,
    topics: Mapping[str, int] | None = None,
    *,
    client_config: ClientConfig | None = None,
    timeout_s: float = 30.0,
) -> None:
    """Create the topics of ``topics`` (name → partitions) that are missing; by default
    the event topic (``settings.partitions``) and its dead-letter topic (1 to 3
    partitions). Each gets ``settings.replication_factor`` replicas, or when it is unset
    (0) three on a cluster of three brokers or more and one otherwise; a topic of three
    replicas or more requires two in sync for a write (``min.insync.replicas=2``). A topic
    that exists, or that someone else creates first, is left as it is. Returns once the
    broker reports every topic with leaders; a broker still starting is asked again until
    ``timeout_s``.

    Raises:
        KafkaUnavailable: the broker is unreachable or refused to create a topic.
    """
    wanted = dict(topics) if topics is not None else default_topics(settings)
    admin = new_admin(settings.kafka_bootstrap, client_config)
    deadline = time.monotonic() + timeout_s
    missing = [name for name in wanted if not _has_leaders(admin, name, deadline)]
    if missing:
        replicas = settings.replication_factor or _replicas_for(admin, deadline)
        _create(admin, {name: wanted[name] for name in missing}, settings, replicas, deadline)
        _await_leaders(admin, missing, deadline)


def default_topics(settings: Settings) -> dict[str, int]:
    """The event topic and its dead-letter topic, with their partition counts."""
    return {
        settings.topic: settings.partitions,
        settings.dlq_topic: max(1, min(_MAX_DLQ_PARTITIONS, settings.partitions)),
    }


def topic_replication(replicas: int) -> dict[str, str]:
    """The topic-level settings of a topic with ``replicas`` replicas."""
    return {"min.insync.replicas": str(_MIN_IN_SYNC)} if replicas >= _REPLICATED else {}


def _replicas_for(admin: AdminClient, deadline: float) -> int:
    """3 on a cluster that reports three brokers or more, else 1."""
    try:
        metadata = admin.list_topics(timeout=max(0.1, deadline - time.monotonic()))
    except KafkaException as exc:
        raise KafkaUnavailable(
            f"cannot read the cluster's brokers: {describe(exc)}; {CHECK_BROKER}"
        ) from exc
    return _REPLICATED if len(metadata.brokers) >= _REPLICATED else 1


def _create(
    admin: AdminClient,
    wanted: dict[str, int],
    settings: Settings,
    replicas: int,
    deadline: float,
) -> None:
    pause = threading.Event()
    for name, partitions in wanted.items():
        new = NewTopic(
            name,
            num_partitions=partitions,
            replication_factor=replicas,
            config=topic_replication(replicas),
        )
        while True:
            remaining = deadline - time.monotonic()
            try:
                admin.create_topics([new], request_timeout=max(remaining, 1.0))[name].result(
                    timeout=max(remaining, 0.1)
                )
                break
            except KafkaException as exc:
                error = exc.args[0]
                if (
                    isinstance(error, KafkaError)
                    and error.code() == KafkaError.TOPIC_ALREADY_EXISTS
                ):
                    break
                if remaining <= 0 or not (isinstance(error, KafkaError) and error.retriable()):
                    raise KafkaUnavailable(
                        f"could not create topic {name!r} on {settings.kafka_bootstrap}: "
                        f"{describe(exc)}; {CHECK_BROKER}, or create the topic by hand"
                    ) from exc
            except TimeoutError as exc:  # concurrent.futures raises the builtin since 3.11
                raise KafkaUnavailable(
                    f"topic {name!r} was not created in time on {settings.kafka_bootstrap}; "
                    f"{CHECK_BROKER}"
                ) from exc
            pause.wait(0.5)  # the broker is starting or electing a controller; ask again


def _has_leaders(admin: AdminClient, topic: str, deadline: float) -> bool:
    try:
        metadata = admin.list_topics(topic=topic, timeout=max(0.1, deadline - time.monotonic()))
    except KafkaException as exc:
        raise KafkaUnavailable(
            f"cannot read topic metadata from the broker: {describe(exc)}; {CHECK_BROKER}"
        ) from exc
    found = metadata.topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        return False
    return all(p.leader >= 0 for p in found.partitions.values())


def _await_leaders(admin: AdminClient, topics: list[str], deadline: float) -> None:
    # A topic just created may take a moment to reach every broker's metadata.
    pause = threading.Event()
    for topic in topics:
        while not _has_leaders(admin, topic, deadline):
            if time.monotonic() >= deadline:
                raise KafkaUnavailable(
                    f"topic {topic!r} exists but has no leader yet; check the broker logs"
                )
            pause.wait(0.05)


def delete_topics(settings: Settings, topics: Sequence[str], *, timeout_s: float = 60.0) -> None:
    """Delete those of ``topics`` that exist (a drill's restored copy, a test's topics).

    Raises:
        KafkaUnavailable: the broker is unreachable or refused a deletion.
    """
    admin = new_admin(settings.kafka_bootstrap)
    with kafka_errors("cannot delete topics"):
        existing = set(admin.list_topics(timeout=timeout_s).topics)
        doomed = [t for t in topics if t in existing]
        if not doomed:
            return
        futures = admin.delete_topics(doomed, operation_timeout=timeout_s)
        for future in futures.values():
            future.result(timeout=timeout_s)
