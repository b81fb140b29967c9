"""CPU counters of other processes, for ``bench.cpu``: a pid's utime + stime from
``/proc/<pid>/stat``, the process listening on a TCP port, the Postgres backends of a
database grouped by ``application_name``, and a topic read back whole."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from sqlalchemy import create_engine, text

from agent_blackbox.broker import watermarks
from agent_blackbox.schemas import Settings

_TICKS = os.sysconf("SC_CLK_TCK")
_SAMPLE_EVERY_S = 0.2


def cpu_seconds(pid: int | None) -> float:
    """utime + stime of ``pid`` (all its threads), in seconds; 0 once it is gone (or
    without one)."""
    if pid is None:
        return 0.0
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    # The command name (field 2) is in parentheses and may hold spaces: count after it.
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def cpu_rate(pid: int | None, *, seconds: float) -> float:
    """CPU seconds per second ``pid`` spends, over the next ``seconds`` (0 without one)."""
    if pid is None:
        return 0.0
    before = cpu_seconds(pid)
    time.sleep(seconds)  # the span measured, not a synchronisation
    return (cpu_seconds(pid) - before) / seconds


def listening_pid(address: str) -> int | None:
    """The process with a TCP socket listening on ``address``'s port (``host:port``; the
    first address of a list), or None when none is found."""
    port = int(address.split(",")[0].rsplit(":", 1)[1])
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{fields[9]}]")
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in inodes for fd in (proc / "fd").iterdir()):
                return int(proc.name)
        except (FileNotFoundError, PermissionError, ProcessLookupError):
            continue
    return None


@contextmanager
def paused(pid: int) -> Iterator[None]:
    """``pid`` stopped (SIGSTOP) inside the block, continued (SIGCONT) after it."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


class BackendSampler(threading.Thread):
    """While open, samples the backends of the database of ``database_url``: which pid
    serves which ``application_name`` and its CPU counter. A backend there at the start
    counts from its first reading, one that starts later from zero (its start-up is work
    of the window); one that ends counts to its last sample."""

    def __init__(self, database_url: str) -> None:
        super().__init__(name="backend-sampler", daemon=True)
        self._engine = create_engine(database_url, pool_size=1)
        self._stop_event = threading.Event()
        self._first: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._names: dict[int, str] = {}
        self._opened = False
        self._lock = threading.Lock()

    def __enter__(self) -> BackendSampler:
        self._sample()
        self._first = dict(self._last)
        self._opened = True
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop_event.set()
        self.join()
        self._sample()
        self._engine.dispose()

    def run(self) -> None:
        while not self._stop_event.wait(_SAMPLE_EVERY_S):
            with self._lock:
                self._sample()

    def _sample(self) -> None:
        query = text(
            "SELECT pid, application_name FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        with self._engine.connect() as conn:
            rows = conn.execute(query).all()
        for pid, name in rows:
            if (seconds := cpu_seconds(pid)) > 0:
                self._last[pid] = seconds
                self._names[pid] = str(name or "unnamed")
                if self._opened:
                    self._first.setdefault(pid, 0.0)

    def split(self) -> dict[str, float]:
        """:meth:`by_application` until now; from now on, count from here."""
        with self._lock:
            self._sample()
            spent = self.by_application()
            self._first = dict(self._last)
        return spent

    def by_application(self) -> dict[str, float]:
        """CPU seconds the backends spent in the window, per ``application_name``."""
        spent: dict[str, float] = defaultdict(float)
        for pid, last in self._last.items():
            spent[self._names[pid]] += last - self._first.get(pid, 0.0)
        return dict(spent)


def read_topic(settings: Settings, topic: str) -> list[tuple[Any, Any, Any]]:
    """Every message of ``topic`` as (key, value, headers), partition by partition."""
    ends = watermarks(settings, topic)
    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka_bootstrap,
            "group.id": f"blackbox.bench.read.{uuid.uuid4().hex[:12]}",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
    wanted = sum(high - low for low, high in ends.values())
    messages: list[tuple[Any, Any, Any]] = []
    deadline = time.monotonic() + 120
    try:
        while len(messages) < wanted and time.monotonic() < deadline:
            for message in consumer.consume(1000, 1.0):
                if message.error() is None:
                    messages.append((message.key(), message.value(), message.headers()))
    finally:
        consumer.close()
    if len(messages) < wanted:
        raise RuntimeError(f"read {len(messages)} of {wanted} messages of {topic} in time")
    return messages
