"""A batch of outbox rows on its way to Kafka: what was produced, what Kafka answered.

The relay reads a batch of rows, takes them in order and keeps the batch until every
row taken has settled (``pending`` at 0): produced and reported, or dropped unproduced.
A row is produced at once, or held until Kafka acknowledged the event of its run before
it (``_run_order``); ``settle`` then sorts the taken rows into acknowledged (deleted from
the outbox), failed and left (both stay for the next read). A failed report tells its
row by the message's value, the envelope, which is unique to its event: reports of
failed deliveries carry no headers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, Message

from agent_blackbox.outbox.relay._log import log
from agent_blackbox.outbox.relay._run_order import RunOrder

Row = tuple[int, bytes, bytes, bytes, float, int, int]
"""An outbox row as the relay reads it: id, key (the run id), event id header value,
value (the envelope), creation time (epoch seconds), shard, and the rows of the read's
shards at or below the id it read after (the same in every row of a read)."""

_TIMED_OUT = KafkaError._MSG_TIMED_OUT
_PURGED = (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT)


@dataclass(slots=True)
class Batch:
    """Rows read together, produced in order, and settled together."""

    rows: Sequence[Row]
    produced: int = 0
    """Rows taken, the first ones of ``rows``: produced, or held behind an unacknowledged
    event of their run (and then produced or dropped)."""
    acked: list[int] = field(default_factory=list)
    """Row ids Kafka acknowledged, known once the batch settled (``settle``)."""
    failed: list[int] = field(default_factory=list)
    """Row ids whose delivery failed, known once the batch settled."""
    failed_values: list[bytes] = field(default_factory=list)
    """The values of the failed deliveries, as the reports give them."""
    left: list[int] = field(default_factory=list)
    """Row ids taken and never produced: an earlier event of their run failed, or the
    lease no longer allowed producing when their turn came. They stay in the outbox."""
    order: RunOrder = field(default_factory=RunOrder)
    """The publisher's one-message-per-run rule, shared by the batches in flight."""
    refused: int = 0
    timed_out: int = 0
    purged: int = 0
    pending: int = 0
    cut: bool = False
    """Rows were left unproduced: the lease deadline came first."""

    def delivered(self, err: KafkaError | None, msg: Message) -> None:
        """A delivery report of one of the batch's messages (inside ``poll``). Kept
        minimal, and the same bound method for every message of the batch: it runs once
        per event, and a callback made per message costs more than the produce itself.
        A failed report carries the message's key and value but no headers; the value
        (an envelope, unique to its event) tells the row at ``settle``."""
        self.pending -= 1
        if err is None:
            # RunOrder.acknowledged, inlined: it runs once per event.
            key: bytes = msg.key()  # type: ignore[assignment]  # the relay's keys are bytes
            held = self.order.open.pop(key, None)
            if held:
                self.order.release(key, held)
            return
        self.order.failed(msg.key())  # type: ignore[arg-type]
        self.failed_values.append(msg.value() or b"")
        code = err.code()
        if code == _TIMED_OUT:
            self.timed_out += 1
        elif code in _PURGED:
            self.purged += 1
        else:
            self.refused += 1
            log.error("delivery of an event of run %s failed: %s", _text(msg.key()), err)

    def settle(self) -> None:
        """Sort the produced rows into acknowledged and failed; a row still unsettled
        (shutdown cut the wait) is neither, and stays in the outbox. Two rows with the
        same value (one event in the outbox twice) both count as failed if one did:
        published again, never lost."""
        if self.pending == 0:
            produced = self.rows[: self.produced]
            if self.failed_values:
                values = set(self.failed_values)
                self.failed = [row[0] for row in produced if row[3] in values]
            failed = set(self.failed).union(self.left)
            self.acked = [row[0] for row in produced if row[0] not in failed]

    def drop(self, row: Row) -> None:
        """``row`` was taken and will not be produced (see ``left``)."""
        self.pending -= 1
        self.left.append(row[0])

    @property
    def left_rows(self) -> bool:
        """Rows of the batch stay in the outbox: a delivery failed, a row was left, or
        the batch was cut."""
        return bool(self.failed) or bool(self.left) or self.cut


def order_gaps(rows: Sequence[Sequence[Any]], acked: Sequence[int], failed: Sequence[int]) -> int:
    """How many acknowledged rows of ``rows`` (id, run id, ...; in id order) come after a
    failed row of their run: events the topic now holds before an earlier one of theirs."""
    failed_ids, acked_ids = set(failed), set(acked)
    first_failed: dict[Any, int] = {}
    gaps = 0
    for row in rows:
        row_id, run_id = row[0], row[1]
        if row_id in failed_ids:
            first_failed.setdefault(run_id, row_id)
        elif row_id in acked_ids and run_id in first_failed:
            gaps += 1
    return gaps


def _text(value: str | bytes | None) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value or ""
