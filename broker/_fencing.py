"""Fencing epochs: how a reader of the topic tells a stale relay's copy from a live one.

Every outbox shard is published by the one relay that holds its lease, and every claim of
a lease raises the shard's epoch. The relay stamps each message with its shard and the
epoch it held (the ``blackbox.lease`` header, ASCII ``"<shard>:<epoch>"``). A relay that
was paused past its lease (a long GC pause, a frozen VM) may still deliver what it had
queued after the shard's next owner has published newer events; those copies carry the
older epoch.

A header is what its producer wrote, and anyone who may produce to the topic can write
one: an epoch no relay was granted would make every reader drop the shard's real events
as stale. So a fence given the write side's granted epochs (:class:`GrantedEpochs`)
moves only to an epoch the write side granted; a message claiming a later one is read
as if it had no stamp (what it holds is judged as any message's is).

Within one partition, offset order is publish order. So a message whose epoch is lower
than one already read for its shard *in the same partition* was published after the
lease moved on, and it is dropped. Nothing is lost by dropping it: the new owner
republishes every row the stale relay had not deleted, and a relay deletes a row only
while it holds the row's lease. Messages without the header (older relays, other
producers) are not fenced.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

log = logging.getLogger(__name__)

LEASE_HEADER = "blackbox.lease"

Headers = Sequence[tuple[str, bytes | str | None]]


@dataclass(frozen=True, slots=True)
class LeaseStamp:
    """The shard a message was published from and the lease epoch its relay held."""

    shard: int
    epoch: int

    def header(self) -> tuple[str, bytes]:
        """The ``(name, value)`` pair the relay adds to the message."""
        return LEASE_HEADER, f"{self.shard}:{self.epoch}".encode("ascii")


def read_stamp(headers: Headers | None) -> LeaseStamp | None:
    """The message's lease stamp; None when it has none or it is malformed."""
    for name, value in headers or ():
        if name != LEASE_HEADER or value is None:
            continue
        if len(value) > _STAMP_MAX:
            # Not a stamp: longer than any, and a number of thousands of digits would
            # not even convert. Never parsed or remembered (hostile headers cannot
            # fill the cache below).
            return None
        # A topic holds a handful of distinct stamps (shards times epochs), asked for
        # once per message by every reader: each is parsed once.
        return _remembered_stamp(value)
    return None


_STAMP_MAX = 48
"""Longer than any ``<shard>:<epoch>`` of two 64-bit numbers."""


def _stamp_of(value: bytes | str) -> LeaseStamp | None:
    raw = value.decode("ascii", "replace") if isinstance(value, bytes) else value
    shard, _, epoch = raw.partition(":")
    if shard.isdecimal() and epoch.isdecimal():
        return LeaseStamp(int(shard), int(epoch))
    return None


_remembered_stamp = lru_cache(maxsize=4_096)(_stamp_of)


class GrantedEpochs:
    """Each shard's newest lease epoch as the write side granted it, asked again when a
    message claims a later one (at most once per ``every_s``).

    Args:
        lookup: every shard's granted epoch (``outbox.lifecycle.lease_epochs``);
            None when there is no write side to ask (then every stamp is taken at its
            word, as before the check). An exception is logged, and the stamp is not
            taken until an answer allows it.
        every_s: the least time between two lookups.
    """

    def __init__(
        self, lookup: Callable[[], Mapping[int, int] | None], *, every_s: float = 1.0
    ) -> None:
        self._lookup = lookup
        self._every_s = every_s
        self._known: dict[int, int] = {}
        self._asked_at = -math.inf
        self._unasked = False
        """The lookup said there is no write side to ask."""

    def allows(self, shard: int, epoch: int) -> bool:
        """Whether a relay may have been granted ``epoch`` of ``shard``."""
        if epoch <= self._known.get(shard, -1) or self._unasked:
            return True
        now = time.monotonic()
        if now - self._asked_at < self._every_s:
            return False
        self._asked_at = now
        try:
            known = self._lookup()
        except Exception as exc:  # a reader goes on; the fence stays where it is
            log.warning("cannot ask the write side which lease epochs it granted: %s", exc)
            return False
        if known is None:
            log.warning(
                "the write side's lease epochs cannot be read here: lease stamps are taken "
                "at their word (run the outbox migrations, or grant blackbox.lease_epochs())"
            )
            self._unasked = True
            return True
        self._known = dict(known)
        return epoch <= self._known.get(shard, -1)

    def known(self, shard: int) -> int:
        """The newest epoch of ``shard`` known to be granted (-1: none)."""
        return self._known.get(shard, -1)


class EpochFence:
    """Admits a message unless a newer epoch of its shard was already read in its partition.

    A reader keeps one fence per consumer and asks :meth:`admit` for every message in
    offset order. :meth:`state` and :meth:`restore` let a reader that stores its offsets
    store the fence beside them, so a restart resumes with the same judgement.

    Args:
        granted: the write side's granted epochs; without them (a reader with no write
            side to ask) every stamp is taken at its word.
    """

    def __init__(self, granted: GrantedEpochs | None = None) -> None:
        self._newest: dict[tuple[int, int], int] = {}
        self._granted = granted
        self.dropped = 0
        """Messages refused since the fence was made."""
        self.unproven = 0
        """Messages whose stamp claimed an epoch the write side did not grant (read as
        unstamped)."""

    def admit(self, partition: int, headers: Headers | None) -> bool:
        """True when the message is to be read; False for a stale relay's copy."""
        stamp = read_stamp(headers)
        if stamp is None:
            return True
        key = (partition, stamp.shard)
        newest = self._newest.get(key, -1)
        if stamp.epoch < newest:
            self.dropped += 1
            return False
        if stamp.epoch > newest:
            granted = self._granted
            if granted is not None and not granted.allows(stamp.shard, stamp.epoch):
                self.unproven += 1
                return True  # as a message without a stamp: it moves no fence
            self._newest[key] = stamp.epoch
        return True

    def forget(self, partitions: Iterable[int]) -> None:
        """Drop what is known of partitions this reader no longer reads."""
        gone = set(partitions)
        self._newest = {k: v for k, v in self._newest.items() if k[0] not in gone}

    def state(self, partition: int) -> dict[int, int]:
        """The newest epoch read per shard in ``partition``."""
        return {shard: epoch for (p, shard), epoch in self._newest.items() if p == partition}

    def restore(self, partition: int, newest: Mapping[int, int]) -> None:
        """Resume a partition from a stored :meth:`state`."""
        for shard, stored in newest.items():
            key, epoch = (partition, int(shard)), int(stored)
            if self._granted is not None and not self._granted.allows(key[1], epoch):
                # Stored from a stamp no relay was granted (before the check): forgotten.
                epoch = min(epoch, self._granted.known(key[1]))
            self._newest[key] = max(self._newest.get(key, -1), epoch)
