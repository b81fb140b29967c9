"""How long a relay may still publish for its shards: the local deadline of its leases.

A relay's leases (and its membership heartbeat) are renewed together every
``heartbeat_s``; each renewal sets them to expire ``ttl_s`` after the renewing
transaction's start. The relay takes the monotonic time just *before* it starts that
transaction, so its local idea of the expiry, ``start + ttl``, is never later than the
expiry other relays see in the database: they can claim the shards only after it.

What the relay may do with that deadline:

- **Produce** a message only while ``now + message_timeout + margin <= deadline``. The
  producer's ``message.timeout.ms`` is set to ``message_timeout``, so a message the
  producer could not send in time is failed before the lease can pass to another relay.
  The deadline is looked at again after each produce: a process that stood still
  between the check and the produce (its message's timeout started only then) purges
  what it queued at once.
- **Not a fence at the broker.** A process frozen whole (a SIGSTOP, a frozen VM) with
  messages in librdkafka's queues sends them when it is continued, before librdkafka
  looks at their timeouts and before the relay's own thread runs: measured, messages
  produced within a few milliseconds of a freeze went out the moment it ended. Such a
  copy carries the old lease epoch, and every reader's ``EpochFence`` drops it.
- **Purge** what it queued as soon as ``now >= deadline - margin`` without a renewal
  (the database is away, or the renewal is slower than the margin), or when a renewal
  shows a shard is no longer its own: it stops producing at once and the rows stay in
  the outbox for the next owner.

The defaults scale with the lease: a heartbeat every fifth of the TTL, a margin of a
tenth and a message timeout of half. A relay that renews on time can then always
produce (``heartbeat + margin < ttl - message_timeout``, with a heartbeat's worth of
slack for a slow renewal), and a relay killed outright is replaced one TTL after its
last heartbeat. At the default TTL of 2 s: heartbeat 0.4 s, margin 0.2 s, message
timeout 1 s, takeover about 2 s after a kill.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

HEARTBEAT_SHARE = 0.2
MARGIN_SHARE = 0.1
MESSAGE_TIMEOUT_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class LeaseTiming:
    """The lease's time to live and what is derived from it, in seconds."""

    ttl_s: float
    heartbeat_s: float
    margin_s: float
    message_timeout_s: float

    @classmethod
    def for_ttl(cls, ttl_s: float, heartbeat_s: float | None = None) -> LeaseTiming:
        """The timing of a lease of ``ttl_s``; the heartbeat defaults to a fifth of it.

        Raises:
            ValueError: a TTL or heartbeat that is not positive, or a heartbeat too long
                for the relay ever to hold a lease valid enough to produce under.
        """
        if not (math.isfinite(ttl_s) and ttl_s >= 0.01):
            raise ValueError(
                f"lease TTL {ttl_s!r} s is not usable: give a number of seconds of at least "
                "0.01 (the default is 2)"
            )
        margin = ttl_s * MARGIN_SHARE
        timeout = ttl_s * MESSAGE_TIMEOUT_SHARE
        beat = ttl_s * HEARTBEAT_SHARE if heartbeat_s is None else heartbeat_s
        longest = ttl_s - timeout - margin
        if not (math.isfinite(beat) and 0 < beat < longest):
            raise ValueError(
                f"heartbeat {beat!r} s does not fit a lease of {ttl_s:g} s: renew more often "
                f"than every {longest:g} s (the lease minus the producer's message timeout "
                f"{timeout:g} s and the safety margin {margin:g} s), or leave it out to "
                f"renew every {ttl_s * HEARTBEAT_SHARE:g} s"
            )
        return cls(ttl_s=ttl_s, heartbeat_s=beat, margin_s=margin, message_timeout_s=timeout)

    @property
    def message_timeout_ms(self) -> int:
        """The producer's ``message.timeout.ms`` (at least 1: 0 would mean forever)."""
        return max(int(self.message_timeout_s * 1000), 1)


class LeaseDeadline:
    """Until when (monotonic seconds) this relay can show its leases valid."""

    def __init__(self, timing: LeaseTiming) -> None:
        self.timing = timing
        self.valid_until = -math.inf

    def renewed(self, started_at: float) -> None:
        """The leases were renewed by a transaction that started at ``started_at``."""
        self.valid_until = started_at + self.timing.ttl_s

    def lapse(self) -> None:
        """Forget the leases: nothing may be produced until the next renewal."""
        self.valid_until = -math.inf

    @property
    def produce_until(self) -> float:
        """The last moment a message may be handed to the producer."""
        return self.valid_until - self.timing.message_timeout_s - self.timing.margin_s

    def may_produce(self, now: float) -> bool:
        """Whether a message produced at ``now`` is settled before the lease can move."""
        return now < self.produce_until

    def expired(self, now: float) -> bool:
        """Whether the lease is within the margin of its end (or past it)."""
        return now >= self.valid_until - self.timing.margin_s
