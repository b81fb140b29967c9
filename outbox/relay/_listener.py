"""The relay's wait for work: a writer's NOTIFY, or the polling interval.

Writers announce each commit to the outbox on a channel (``NOTIFY_CHANNEL``); a relay
that found nothing to publish listens there instead of reading an empty outbox again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from sqlalchemy import Engine

from agent_blackbox.outbox._tables import NOTIFY_CHANNEL
from agent_blackbox.outbox.relay._log import log


class Listener:
    """A connection of its own that listens for writers' notifications.

    Args:
        engine: the write side's database (its URL; the connection is the driver's own,
            outside the pool, since it stays in LISTEN).
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._conn: psycopg.Connection[Any] | None = None
        self.idle = False
        """True while the relay waits for a notification (nothing left to publish)."""

    @property
    def listening(self) -> bool:
        """Whether the connection is listening now: every row committed from here on
        announces itself."""
        return self._conn is not None and not self._conn.closed

    def wait(self, stop: threading.Event, *, timeout: float, moved: Callable[[], bool]) -> None:
        """Sleep until a writer's NOTIFY or ``timeout`` seconds, whichever comes first.

        The wait is cut in short slices so that a stop request, or ``moved`` turning true
        (the relay's shards changed, or a share is to be handed back), is seen promptly.
        A LISTEN that fails falls back to sleeping out the timeout.
        """
        deadline = time.monotonic() + timeout
        try:
            listener = self._listen()
            self.idle = True
            while not stop.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0 or moved():
                    return
                first = listener.notifies(timeout=min(remaining, 0.25), stop_after=1)
                try:
                    woken = next(first, None)
                finally:
                    first.close()  # it holds the connection's lock until closed
                if woken is not None:
                    # Take the others already here too: one read covers every commit
                    # announced so far, and each one left waiting would wake a read.
                    _discard_received(listener)
                    return
        except psycopg.Error as exc:
            log.warning("LISTEN failed (%s); falling back to polling", exc)
            self.close()
            stop.wait(max(deadline - time.monotonic(), 0.0))
        finally:
            self.idle = False

    def close(self) -> None:
        """Stop listening; the next wait listens again on a new connection."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _listen(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            url = self._engine.url.set(drivername="postgresql")
            dsn = url.render_as_string(hide_password=False)
            self._conn = psycopg.connect(dsn, autocommit=True)
            self._conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
        return self._conn


_DRAIN_ROUNDS = 64
"""Reads of the socket at most per drain: writers cannot keep it busy for ever."""


def _discard_received(conn: psycopg.Connection[Any]) -> None:
    """Drop every notification that has reached ``conn`` (none is waited for).

    On libpq's connection itself: psycopg's ``notifies(timeout=0)`` made a ``Notify``
    per notification and stopped at the first packet's worth, so a relay that had been
    busy while a per-event writer committed thousands of events woke again and again on
    the rest, with a read of the outbox each time; about 4 us of its CPU an event, where
    this costs under one.
    """
    with conn.lock:
        pgconn = conn.pgconn
        for _ in range(_DRAIN_ROUNDS):
            pgconn.consume_input()  # reads what has arrived, never waits
            if pgconn.notifies() is None:
                return
            while pgconn.notifies() is not None:
                pass
