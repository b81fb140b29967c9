"""Handing recorded events back in their recorded completion order.

A call whose event completed later than another's waits until every earlier one was
handed back: a thread blocks on a condition, a task awaits a future its turn resolves.
When nothing is handed back for ``stall_timeout`` seconds while calls wait, the earliest
of them stalls: the code never asked for the event the others wait behind.
"""

from __future__ import annotations

import asyncio
import threading
import time

from agent_blackbox.replayer._divergence import DivergenceKind, Findings
from agent_blackbox.schemas import GENESIS_CHAIN_HASH, Envelope


class Stalled(Exception):
    """A call waited ``stall_timeout`` for its turn."""


_STALLED = Stalled()


class Turns:
    """The order recorded events go back in, and the chain they are checked along.

    ``lock`` guards the replay's reading of the log as well as the turns: calls from
    several threads take events under it.

    Args:
        findings: where a broken chain link is noted.
        stall_timeout: how long a call waits for its turn before it stalls.
    """

    def __init__(self, findings: Findings, stall_timeout: float) -> None:
        self._findings = findings
        self.stall_timeout = stall_timeout
        self.lock = threading.RLock()
        self._turn = threading.Condition(self.lock)
        """Waits for a turn; ``with self.lock`` holds it (cheaper than the condition's own)."""
        self._waiting: dict[int, asyncio.Future[None]] = {}
        """Tasks waiting for their turn, by the sequence they wait to hand back."""
        self._watchdog: asyncio.TimerHandle | None = None
        self._watched = -1
        self._sleepers = 0
        """Threads waiting for their turn."""
        self.released = 0
        """The last sequence handed back to the code: results go back in this order."""
        self.chain = GENESIS_CHAIN_HASH
        """The chain hash of the event handed back last."""
        self.consumed = 0
        """How many events were handed back."""

    def release(self, envelope: Envelope) -> None:
        """Hand ``envelope`` back (its turn has come): check its chain link, then wake
        whoever waits for the next one (held: :attr:`lock`)."""
        expected_chain = envelope.expected_chain_hash(self.chain)
        if envelope.chain_hash != expected_chain:
            self._findings.diverge(
                DivergenceKind.BROKEN_CHAIN,
                envelope.sequence,
                expected=(envelope.event_type, expected_chain, None),
                actual=(envelope.event_type, envelope.chain_hash, None),
            )
        self.chain = envelope.chain_hash
        self.released = envelope.sequence
        self.consumed += 1
        if self._sleepers:
            self._turn.notify_all()
        if self._waiting:
            waiting = self._waiting.pop(self.released + 1, None)
            if waiting is not None:
                _wake_soon(waiting, None)

    def wait(self, envelope: Envelope) -> None:
        """Block this thread until every event recorded before ``envelope`` was handed
        back (held: :attr:`lock`).

        Raises:
            ReplayDivergence: the replay stopped meanwhile.
            Stalled: nothing was handed back for ``stall_timeout`` seconds.
        """
        deadline = time.monotonic() + self.stall_timeout
        while envelope.sequence != self.released + 1:
            if self._findings.fatal is not None:
                raise self._findings.fatal
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _STALLED
            self._sleepers += 1
            try:
                self._turn.wait(remaining)
            finally:
                self._sleepers -= 1

    def future(self, envelope: Envelope) -> asyncio.Future[None]:
        """What the current task awaits until ``envelope``'s turn comes (held:
        :attr:`lock`)."""
        waiting = asyncio.get_running_loop().create_future()
        self._waiting[envelope.sequence] = waiting
        return waiting

    async def wait_async(self, waiting: asyncio.Future[None]) -> None:
        """Await a turn (:meth:`future`) without blocking the loop.

        Raises:
            ReplayDivergence: the replay stopped meanwhile.
            Stalled: nothing was handed back for ``stall_timeout`` seconds.
        """
        self._watch(waiting.get_loop())
        await waiting

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Make sure one timer watches the waiting tasks: if nothing was handed back for
        ``stall_timeout`` while some wait, the earliest of them stalls (one timer per
        period, not one per wait)."""
        if self._watchdog is None:
            self._watched = self.released
            self._watchdog = loop.call_later(self.stall_timeout, self._check, loop)

    def _check(self, loop: asyncio.AbstractEventLoop) -> None:
        self._watchdog = None
        if not self._waiting:
            return
        if self.released != self._watched:
            self._watch(loop)  # progress since the last look: look again later
            return
        earliest = min(self._waiting)
        _wake(self._waiting.pop(earliest), _STALLED)

    def unwatch(self) -> None:
        """The run ended: no more stalls to watch for."""
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None

    def wake_all(self) -> None:
        """The replay stopped: every call waiting for its turn raises why."""
        with self.lock:
            self._turn.notify_all()
        for waiting in self._waiting.values():
            _wake_soon(waiting, self._findings.fatal)
        self._waiting.clear()


def _wake_soon(waiting: asyncio.Future[None], error: BaseException | None) -> None:
    """Wake a task waiting for its turn: at once from its own loop's thread, else through
    its loop."""
    loop = waiting.get_loop()
    if asyncio.events._get_running_loop() is loop:
        _wake(waiting, error)
    else:
        loop.call_soon_threadsafe(_wake, waiting, error)


def _wake(waiting: asyncio.Future[None], error: BaseException | None) -> None:
    if waiting.done():
        return
    if error is None:
        waiting.set_result(None)
    else:
        waiting.set_exception(error)
