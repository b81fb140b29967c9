"""The write side: the Recorder SDK, the transactional outbox and the relay.

An agent process imports only this package (and ``schemas``): it never carries the
read side.
"""

from outbox._async import AsyncRecorder, AsyncRun
from outbox._core import EffectOutcome, EffectReceipt, RunSnapshot
from outbox._errors import (
    ConcurrentRunWriter,
    DatabaseUnavailable,
    EffectRejected,
    PayloadTooLarge,
    RunNotActive,
)
from outbox._migrate import migrate_write_side
from outbox._recorder import Recorder, Run
from outbox._tables import NOTIFY_CHANNEL, SCHEMA, blobs, outbox, relay_leases, runs
from outbox._writer import shard_of

__all__ = [
    "NOTIFY_CHANNEL",
    "SCHEMA",
    "AsyncRecorder",
    "AsyncRun",
    "ConcurrentRunWriter",
    "DatabaseUnavailable",
    "EffectOutcome",
    "EffectReceipt",
    "EffectRejected",
    "PayloadTooLarge",
    "Recorder",
    "Run",
    "RunNotActive",
    "RunSnapshot",
    "blobs",
    "migrate_write_side",
    "outbox",
    "relay_leases",
    "runs",
    "shard_of",
]
