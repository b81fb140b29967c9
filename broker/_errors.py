"""The one exception the Kafka edge raises, and the translation into it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from confluent_kafka import KafkaError, KafkaException

from agent_blackbox.schemas import BlackboxError

CHECK_BROKER = (
    "check that Kafka runs (blackbox stack status) and BLACKBOX_KAFKA_BOOTSTRAP points at it"
)


class KafkaUnavailable(BlackboxError):
    """Kafka could not be reached, refused a request, or a client failed for good."""


def describe(error: object) -> str:
    """The broker's own words for ``error`` (a ``KafkaError``, or what a
    ``KafkaException`` carries)."""
    if isinstance(error, KafkaException) and error.args:
        error = error.args[0]
    if isinstance(error, KafkaError):
        return str(error.str())
    return str(error) or type(error).__name__


@contextmanager
def kafka_errors(doing: str, *, hint: str = CHECK_BROKER) -> Iterator[None]:
    """Translate a ``KafkaException`` raised inside the block into
    :class:`KafkaUnavailable`: "``doing``: what the broker said; ``hint``"."""
    try:
        yield
    except KafkaException as exc:
        raise KafkaUnavailable(f"{doing}: {describe(exc)}; {hint}") from exc
