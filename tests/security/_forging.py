"""What a test plays as someone who may produce to the event topic."""

from __future__ import annotations

from confluent_kafka import Producer

from agent_blackbox.schemas import Envelope, EnvelopeCodec, Settings


def produce_to(settings: Settings, envelope: Envelope, partition: int) -> None:
    """Write ``envelope`` to one chosen partition of the topic, as any producer may."""
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap})
    producer.produce(
        settings.topic,
        EnvelopeCodec().encode(envelope),
        key=envelope.run_id.encode(),
        partition=partition,
    )
    assert producer.flush(30) == 0, "the forged event was not acknowledged"
