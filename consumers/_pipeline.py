"""The consumer runtime's pipeline: a batch commits on a worker thread while the next
is read and decoded.

A batch's Python work (decoding, sorting) and its database work (one transaction)
take about as long each; done one after the other, the process waits on Postgres half
the time. Here the database work of batch N overlaps the decoding of batch N+1, and
the rules of the runtime hold as they did: one transaction per batch with its offsets,
in order, and nothing applied that a rebalance or a failure made stale.
"""

from __future__ import annotations

import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

from agent_blackbox.consumers._batch import BatchOutcome

if TYPE_CHECKING:
    from agent_blackbox.consumers._runtime import ConsumerRuntime
    from agent_blackbox.consumers._sorting import Batch

_SWITCH_INTERVAL_S = 0.001


class _SwitchInterval:
    """The interpreter's switch interval, lowered while any pipeline of the process
    runs and put back when the last one stops (several consumers may share a process)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._saved = 0.0

    def lower(self) -> None:
        with self._lock:
            if self._users == 0:
                self._saved = sys.getswitchinterval()
                sys.setswitchinterval(min(self._saved, _SWITCH_INTERVAL_S))
            self._users += 1

    def restore(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0:
                sys.setswitchinterval(self._saved)


_switch_interval = _SwitchInterval()


class Pipeline:
    """Commits one batch on a worker thread while the next is read and decoded.

    A turn: 1. consume (nothing is in flight, so rebalance callbacks find no work
    under way); 2. hand the batch decoded last turn to the worker, its offset moves
    taken now, from the positions its predecessor's commit left; 3. sort and decode
    what step 1 consumed while it commits; 4. wait for the commit. The worker runs
    one transaction at a time, in order, so offsets still commit with the rows they
    cover. A batch read before a rebalance is dropped unapplied (the assignment
    rewound to the stored offsets), and so is the one decoded behind a failed
    commit: the rewind that follows reads it again.

    While it runs, the interpreter's switch interval is at most 1 ms: the worker takes
    the interpreter back after every reply of the database (a dozen per batch), and
    with the default 5 ms, each would wait for the decoding thread that long.
    """

    def __init__(self, runtime: ConsumerRuntime) -> None:
        self._runtime = runtime
        self._worker = ThreadPoolExecutor(1, thread_name_prefix=f"{runtime.name}-commit")
        self._waiting: Batch | None = None

    def __enter__(self) -> Pipeline:
        _switch_interval.lower()
        return self

    def __exit__(self, *_exc: object) -> None:
        try:
            self._worker.shutdown(wait=True)
        finally:
            _switch_interval.restore()

    @property
    def holding(self) -> bool:
        """Whether a decoded batch waits for its commit."""
        return self._waiting is not None

    def turn(self, timeout: float) -> BatchOutcome | None:
        """One turn (see the class); the outcome of the batch it committed, if any."""
        runtime = self._runtime
        if runtime._assignment.unsynced:
            self._waiting = None
        messages = runtime._receive(0.0 if self._waiting is not None else timeout)
        previous, self._waiting = self._waiting, None
        if previous is not None and previous.assignment != runtime._assignment.rebalances:
            previous = None
        committing = self._submit(previous) if previous is not None else None
        try:
            batch = runtime._sort(messages)
        except BaseException:
            if committing is not None and previous is not None:
                runtime._settle(previous, committing.result)
            runtime._batch_failed()
            raise
        outcome = None
        if committing is not None and previous is not None:
            outcome = runtime._settle(previous, committing.result)
            if outcome is None:  # it raced another consumer: the rewind reads this again
                return None
        self._waiting = batch if batch.next_offsets else None
        return outcome

    def flush(self) -> BatchOutcome | None:
        """Commit the batch still waiting, if any."""
        waiting, self._waiting = self._waiting, None
        if waiting is None or waiting.assignment != self._runtime._assignment.rebalances:
            return None
        return self._runtime._settle(waiting, self._submit(waiting).result)

    def _submit(self, batch: Batch) -> Future[BatchOutcome]:
        return self._worker.submit(self._runtime._commit, batch, self._runtime._moves(batch))
