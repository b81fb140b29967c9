"""One unacknowledged message per run: what keeps a run's order through any failed delivery.

The relay hands a run's next event to the producer only once Kafka acknowledged the one
before it. Until then the later rows are *held*; the acknowledgement releases the next
one, and a failed delivery *stops* the run: its held rows, and any row of it read later,
are dropped (left in the outbox, neither produced nor failed) until every batch in flight
has settled and the relay reads again from the lowest id (``_pipeline``).

Why this order cannot break. An acknowledgement (``acks=all``) means the message is in
the partition's log; a message produced after that is appended after it, whichever
broker leads the partition by then. So every copy of a run's event ``n + 1``, from any
attempt and any relay, lands after the first copy of event ``n``: each was produced only
after some copy of ``n`` was acknowledged. Nothing depends on what the producer does with
a message it gave up on: a delivery that timed out (a broker failover longer than the
message timeout), was refused, or was purged when the relay was fenced only stops its run,
and may at most leave a copy that readers count as a duplicate.

What it replaces: the idempotent producer alone keeps a partition's order across retries,
but librdkafka fails messages individually once ``message.timeout.ms`` passes (its
gap-less guarantee explicitly leaves such timeouts out), so a failover that outlasted the
timeout could fail a run's earlier event and deliver its later one. Kafka transactions
would hide such a batch from read_committed readers, but a relay killed with a
transaction open holds back every partition it wrote (the last stable offset) until the
coordinator times the transaction out, far longer than a relay takeover; each batch would
wait for its commit before the next could start; and every stack would need the
transaction state log. Holding a run's later events costs nothing while runs have one
event a batch, which is the steady state; a backlog of one run drains at one event per
acknowledgement round trip (``bench/relay.py`` measures the cost on a backlog).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agent_blackbox.outbox.relay._batch import Batch, Row

Held = tuple["Row", "Batch"]
"""A row taken by the publisher and not yet produced, and the batch it belongs to."""


class RunOrder:
    """The runs the producer holds an unacknowledged message of, and what waits behind it.

    Only the relay's producing thread uses it (delivery reports are served inside its
    polls): no lock.
    """

    __slots__ = ("open", "ready", "stopped")

    def __init__(self) -> None:
        self.open: dict[bytes, deque[Held] | None] = {}
        """Run key → rows held behind its message in the producer (None: none held)."""
        self.ready: list[Held] = []
        """Rows released by an acknowledgement, to be produced after the poll returns."""
        self.stopped: set[bytes] = set()
        """Runs whose delivery failed: nothing more of them until everything settled."""

    def hold(self, row: Row, batch: Batch) -> None:
        """Hold ``row`` behind its run's message in the producer, or, its run stopped,
        drop it into ``batch.left``. (The publisher produces a row of a run in neither
        state at once, and marks the run open: ``open[key] = None``.)"""
        key = row[1]
        if key in self.open:
            held = self.open[key]
            if held is None:
                self.open[key] = deque([(row, batch)])
            else:
                held.append((row, batch))
        else:
            batch.drop(row)

    def acknowledged(self, key: bytes) -> None:
        """Kafka acknowledged run ``key``'s message: its next held row becomes ready."""
        held = self.open.pop(key, None)
        if held:
            self.release(key, held)

    def release(self, key: bytes, held: deque[Held]) -> None:
        """Make the first of ``held`` (run ``key``'s, just taken out of ``open``)
        ready; the run stays open, for the rest."""
        self.ready.append(held.popleft())
        self.open[key] = held or None

    def failed(self, key: bytes) -> None:
        """Run ``key``'s message failed: drop what it holds and stop the run."""
        self.stop(key)

    def stop(self, key: bytes) -> None:
        """Stop run ``key``: its held rows are dropped, and rows of it read later too."""
        self.stopped.add(key)
        for row, batch in self.open.pop(key, None) or ():
            batch.drop(row)

    def settled(self) -> None:
        """Every batch settled: the next read starts from the lowest id, stopped runs
        with it."""
        self.stopped.clear()

    @property
    def holding(self) -> bool:
        """Rows are held or ready: they still need their turn."""
        return bool(self.ready) or any(held for held in self.open.values())
