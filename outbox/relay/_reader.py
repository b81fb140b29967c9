"""Where the relay reads the outbox next, and the deletes of what it published.

The relay reads its shards in id order, a batch at a time, after the last row it
produced; each read also counts, in its own snapshot, the rows at or below that row.
More than the relay has in flight means a writer committed a lower id late (or an
acknowledged row outlived a fenced delete): the relay then reads from the lowest id
again. Reads and deletes run on the outbox lane (``_lane``), so the database works while
the relay produces: a full batch has the next one read ahead, and acknowledged rows are
deleted while the next batch goes out.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.exc import SQLAlchemyError

from agent_blackbox.outbox.relay._batch import Row
from agent_blackbox.outbox.relay._lane import OutboxLane
from agent_blackbox.outbox.relay._log import first_line, log

# The rows after the last one produced (``:after``), and, in the same snapshot, how many
# rows of these shards lie at or below it: more than the relay has in flight means a
# writer committed a lower id late (see ``OutboxReader.next_rows``). The rows must come
# from the primary key in order, the scan stopping at the limit: ``shard + 0`` keeps them
# from the (shard, id) index, and ``enable_sort`` off keeps the planner (whose row
# estimates lag behind a fast-changing outbox) from reading every row after ``:after`` to
# sort them, which made each read cost in proportion to the whole outbox (set for the
# lane's session).
# Run on the driver's cursor with binary results: envelopes arrive as they are stored
# (no hex text to decode). Each row comes in the form ``produce()`` takes it, so the
# produce loop converts nothing: the key (run id) and the event id header as UTF-8
# bytes, made by the server, and the creation time as epoch seconds (a float costs a
# fraction of a datetime to load, and only a batch's first is used). See ``Row``.
_READ = """
    SELECT id, convert_to(run_id, 'UTF8'), convert_to(event_id::text, 'UTF8'), envelope,
           date_part('epoch', created_at), shard,
           (SELECT count(*) FROM blackbox.outbox
             WHERE shard = ANY(%(shards)s) AND id <= %(after)s) AS below
      FROM blackbox.outbox
     WHERE shard + 0 = ANY(%(shards)s) AND id > %(after)s
     ORDER BY id LIMIT %(limit)s
"""
# The outbox lane's sessions (see ``_lane``): reads and deletes are single statements in
# autocommit, one round trip each. Deletes need not wait for the
# disk: a delete lost in a database crash only publishes those rows again (duplicates,
# which readers absorb), never loses one. The idle bound is kept for any transaction
# the session might be left in. Sequential scans and parallel workers are off for the
# same reason as sorts: after a bulk insert the statistics show a large outbox, and the
# planner counted the rows below ``:after`` with a parallel scan of the whole table
# (dead rows included) instead of the primary key's few thousand live entries, which
# cost more than the read itself; no read or delete of a batch makes a worker process or
# a full scan pay. JIT is off with them: the penalty a disabled plan node carries pushes
# every statement's estimate over the JIT threshold, and compiling took longer (about
# 100 ms) than the deletes it compiled.
_LANE_SETTINGS = (
    "SELECT set_config('idle_in_transaction_session_timeout', :idle_ms, false), "
    "set_config('synchronous_commit', 'off', false), set_config('enable_sort', 'off', false), "
    "set_config('enable_seqscan', 'off', false), "
    "set_config('max_parallel_workers_per_gather', '0', false), set_config('jit', 'off', false)"
)
_DELETE_SESSION = text(_LANE_SETTINGS)
# The reading session plans no bitmap scans either, so that the count walks the index: a
# bitmap scan visits the heap for every entry of a deleted row and leaves it as it was,
# so each count of a drain cost more than the last (17 ms at 100k rows deleted); an
# index scan marks the entries of rows no snapshot can see as dead, and the next count
# steps over them (2 ms). The deleting session keeps them: the outbox's statistics may
# say it is empty (vacuumed empty, then filled by a burst), and without bitmap scans the
# planner then probed the (shard, id) index for each of a batch's ids, 2-7 s a delete.
_READ_SESSION = text(_LANE_SETTINGS + ", set_config('enable_bitmapscan', 'off', false)")
_ANALYZE = text("SELECT blackbox.analyze_outbox()")
_ANALYZE_EVERY_S = 60.0
# Fenced by the leases this relay still holds. The lease set is computed once, as an
# array, so the planner probes the primary key per id instead of per id and lease; and it
# is compared as ``shard + 0``, so that no index serves it: the planner cannot know that
# the array may hold every shard, guessed it selective, and walked every row of the
# leased shards through the (shard, id) index, comparing each with the 5,000 ids.
_DELETE = """
    DELETE FROM blackbox.outbox
     WHERE id = ANY(string_to_array(%(ids)s, ',')::bigint[])
       AND shard + 0 = ANY(ARRAY(SELECT shard FROM blackbox.relay_leases WHERE owner = %(me)s))
"""


@dataclass(frozen=True, slots=True)
class _ReadAhead:
    """The read of the batch after a full one, running while that one is produced."""

    key: tuple[tuple[int, ...], int]
    """The shards and the last row id it reads after."""
    rows: Future[list[Any]]
    expected: int
    """Rows at or below ``key``'s id that the relay itself leaves in the outbox then."""


class OutboxReader:
    """Reads the shards the relay follows after the last row produced, and deletes the
    rows Kafka acknowledged, on the outbox lane's threads and sessions.

    Args:
        engine: the write side's database.
        owner: the relay's lease owner id: names the lane's threads and fences deletes
            to the shards it still leases.
        batch_size: rows a read gives at most.
        read_ahead: read the batch after a full one while that one is produced (the
            relay pipelines batches).
        idle_ms: how long a session of the lane may sit idle in a transaction.

    Only the relay's loop calls it; results and errors of the lane come back here.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        owner: str,
        batch_size: int,
        read_ahead: bool,
        idle_ms: int,
    ) -> None:
        self._engine = engine
        self._owner = owner
        self._batch_size = batch_size
        self._read_ahead = read_ahead
        self._lane = OutboxLane(
            engine,
            name=owner,
            read_setup=_READ_SESSION,
            delete_setup=_DELETE_SESSION,
            setup_params={"idle_ms": str(idle_ms)},
        )
        self._shards: list[int] = []
        self._after = 0
        """The last row produced; reads go on after it (0: from the lowest id)."""
        self._ahead: _ReadAhead | None = None
        self._deletes: deque[Future[None]] = deque()
        self._analyzed_at = -math.inf
        self._analyzing: threading.Thread | None = None

    @property
    def shards(self) -> list[int]:
        """The shards read (``follow``)."""
        return self._shards

    @property
    def deleting(self) -> bool:
        """Deletes were handed to the lane and not yet collected (``collect``)."""
        return bool(self._deletes)

    def follow(self, shards: list[int]) -> None:
        """Read ``shards`` from now on (from the lowest id, once ``rewind`` was called)."""
        self._shards = shards

    def advance(self, row_id: int) -> None:
        """Read after ``row_id`` next: it was produced."""
        self._after = row_id

    def rewind(self) -> None:
        """Read from the lowest id next: nothing is in flight any more."""
        self._after = 0

    def next_rows(self, in_flight: int) -> Sequence[Row] | None:
        """The next rows of the shards followed after the last one produced; None when a
        row at or below it is in the outbox that the relay has not produced (committed
        late, or acknowledged rows whose delete failed or the lease no longer covered).

        Args:
            in_flight: rows the relay produced and has not settled: they are still in
                the outbox at or below the last one produced.

        Reads run on the outbox lane behind the deletes already handed to it, so the
        rows counted at or below the last one produced are exactly those still in
        flight, plus any left behind. A full batch means a backlog: the batch after it
        is read at once, on the lane, while this one is produced, on the guess that all
        of it will be; the guess is dropped if the relay ends up elsewhere (a cut or
        failed batch, other shards).
        """
        key = (tuple(self._shards), self._after)
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead.key == key:
            rows, expected = ahead.rows.result(), ahead.expected
        else:
            expected = in_flight
            rows = self._read(self._after).result()
        if rows and rows[0][6] > expected:
            return None
        if len(rows) == self._batch_size:
            self._refresh_statistics()
            if self._read_ahead:
                # (One batch at a time reads from the lowest id after each: nothing to guess.)
                after = rows[-1][0]
                self._ahead = _ReadAhead(
                    key=(tuple(self._shards), after),
                    rows=self._read(after),
                    # Counted now: the deletes handed to the lane so far run before it.
                    expected=in_flight + len(rows),
                )
        return rows

    def delete(self, acked: Sequence[int]) -> None:
        """Delete the rows ``acked`` on the lane, fenced by the leases still held, while
        the next batch is produced; reads queue behind it."""
        ids = ",".join(map(str, acked))  # one text, not a Python-built array of ints
        self._deletes.append(self._lane.delete(_DELETE, {"ids": ids, "me": self._owner}))

    def collect(self, *, wait: bool) -> None:
        """Collect the deletes that finished (all of them with ``wait``), raising the
        first that failed; its rows stay and the next read finds them (see next_rows)."""
        deletes = self._deletes
        while deletes and (wait or deletes[0].done()):
            deletes.popleft().result()

    def close(self) -> None:
        """Wait for the deletes handed over, then close the lane's sessions. A delete
        that failed is logged: its rows are published again by the next relay."""
        try:
            self.collect(wait=True)
        except SQLAlchemyError as exc:
            log.warning("could not delete acknowledged rows: %s", first_line(exc))
        self._deletes.clear()
        self._ahead = None
        self._lane.close()
        if self._analyzing is not None:
            self._analyzing.join(timeout=10)
        self._shards, self._after = [], 0

    def _read(self, after: int) -> Future[list[Any]]:
        """Up to a batch of rows of the shards followed after ``after``, on the lane."""
        params = {"shards": self._shards, "after": after, "limit": self._batch_size}
        return self._lane.read(_READ, params)

    def _refresh_statistics(self) -> None:
        """A full batch: a backlog, perhaps in an outbox whose statistics still say it is
        empty (see migration 0008). Ask for an ANALYZE of it, at most once a minute, on a
        thread of its own; the statements planned after it see the backlog as it is."""
        now = time.monotonic()
        if now - self._analyzed_at < _ANALYZE_EVERY_S:
            return
        if self._analyzing is not None and self._analyzing.is_alive():
            return
        self._analyzed_at = now
        self._analyzing = threading.Thread(
            target=self._analyze, name=f"outbox statistics {self._owner}", daemon=True
        )
        self._analyzing.start()

    def _analyze(self) -> None:
        try:
            with self._engine.begin() as conn:
                conn.execute(_ANALYZE)
        except SQLAlchemyError as exc:
            log.warning(
                "could not refresh the outbox's statistics (%s); a backlog may drain slowly "
                "until autovacuum analyzes the outbox: run `blackbox migrate`",
                first_line(exc),
            )
