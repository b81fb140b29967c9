"""What a consumed batch becomes before it is committed: records to project, poison
for the dead-letter topic, stale relay copies dropped, and how far each partition got."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, Message

from agent_blackbox.consumers._assignment import Assignment
from agent_blackbox.consumers._batch import Delivered, delivered
from agent_blackbox.consumers._dead_letters import Poison
from agent_blackbox.consumers._offsets import TopicPartition
from agent_blackbox.schemas import BlackboxError, Envelope, EnvelopeCodec

Screen = Callable[[Envelope], str | None]
"""Says why a decoded envelope cannot be projected (it is dead-lettered), or ``None``."""


@dataclass(slots=True)
class Batch:
    """One batch, sorted, as it waits for its commit."""

    records: list[Delivered] = field(default_factory=list)
    poison: list[Poison] = field(default_factory=list)
    stale: int = 0
    next_offsets: dict[TopicPartition, int] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    assignment: int = 0
    """The rebalance count when the batch was read: one read before a rebalance is
    dropped unapplied (the new assignment rewinds to the stored offsets)."""


class BatchSorter:
    """Decodes and sorts consumed messages into a :class:`Batch`.

    Args:
        codec: decodes the envelopes.
        screen: refuses envelopes this consumer cannot project (they become poison).
        on_error: judges an error the client handed over as a message (it raises to
            stop the consumer, or returns to skip the message).
    """

    def __init__(
        self,
        codec: EnvelopeCodec,
        *,
        screen: Screen | None,
        on_error: Callable[[KafkaError], None],
    ) -> None:
        self._codec = codec
        self._screen = screen
        self._on_error = on_error

    def sort(self, messages: Sequence[Message], assignment: Assignment) -> Batch:
        """Sort ``messages`` into a batch: records, poison and stale copies.

        Only messages at or past ``assignment``'s floors count; each is judged by its
        fence (which this moves). Every message costs a few microseconds here, on the
        thread that also decodes: what does not change within a batch (the lowest
        offset ours to apply of each partition, the bound methods) is looked up once.
        """
        batch = Batch(assignment=assignment.rebalances)
        records, next_offsets = batch.records, batch.next_offsets
        floors = assignment.floors()
        admit = assignment.fence.admit
        decode = self.decode
        for message in messages:
            error = message.error()
            if error is not None:
                self._on_error(error)
                continue
            tp = (message.topic() or "", message.partition() or 0)
            offset = message.offset() or 0
            floor = floors.get(tp)
            if floor is None or offset < floor:
                continue
            next_offsets[tp] = offset + 1
            headers = message.headers()
            if isinstance(headers, dict):  # the client hands a list; typed as either
                headers = list(headers.items())
            if not admit(tp[1], headers):
                batch.stale += 1
                continue
            decoded = decode(message.value())
            if isinstance(decoded, str):
                batch.poison.append(Poison.of(message, decoded))
            else:
                records.append(delivered(decoded, tp[0], tp[1], offset))
        return batch

    def decode(self, value: bytes | str | None) -> Envelope | str:
        """The envelope, or the reason it cannot be projected."""
        if not value:
            return "message has no value (empty or tombstone); expected an envelope"
        data = value.encode() if isinstance(value, str) else value
        try:
            envelope = self._codec.decode(data)
        except BlackboxError as exc:
            return str(exc)
        except Exception as exc:  # a poison message must never stop the consumer
            return f"decoder failed unexpectedly: {exc!r}"
        return (self._screen(envelope) if self._screen else None) or envelope
