"""The Kafka edge every part uses: clients built from :class:`~agent_blackbox.schemas.Settings`,
topic creation, bounded reads of partitions, where a run's key puts it, one error
type, and the heap settling every long-running stream process does before its loop.

Every ``confluent_kafka`` failure leaves this package as :class:`KafkaUnavailable`, naming
what was being done and what to check. The relay, the consumers, the replayer's run
source and the local stack build their clients here and nowhere else. An agent process
never imports it.
"""

from agent_blackbox.broker._clients import (
    ClientConfig,
    broker_answers,
    new_admin,
    new_consumer,
    new_producer,
    producer_config,
)
from agent_blackbox.broker._errors import KafkaUnavailable, kafka_errors
from agent_blackbox.broker._fencing import (
    LEASE_HEADER,
    EpochFence,
    GrantedEpochs,
    LeaseStamp,
    read_stamp,
)
from agent_blackbox.broker._partitioning import (
    murmur2,
    partition_count,
    partition_of,
    run_partition,
)
from agent_blackbox.broker._process import settle_heap
from agent_blackbox.broker._reader import read_ranges, watermarks
from agent_blackbox.broker._topics import default_topics, delete_topics, ensure_topics

__all__ = [
    "LEASE_HEADER",
    "ClientConfig",
    "EpochFence",
    "GrantedEpochs",
    "KafkaUnavailable",
    "LeaseStamp",
    "broker_answers",
    "default_topics",
    "delete_topics",
    "ensure_topics",
    "kafka_errors",
    "murmur2",
    "new_admin",
    "new_consumer",
    "new_producer",
    "partition_count",
    "partition_of",
    "producer_config",
    "read_ranges",
    "read_stamp",
    "run_partition",
    "settle_heap",
    "watermarks",
]
