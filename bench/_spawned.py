"""A relay and a view consumer in processes of their own, driven through the library's
classes so that a bench can override their client and session settings, and a record of
where the relay's time goes.

:func:`relay_process` runs :class:`~agent_blackbox.outbox.relay.Relay` as
``blackbox relay`` does (its heap settled before the loop), and times every statement
and COMMIT on its engine with SQLAlchemy's event hooks (no change to the relay): how
long its reads, its deletes and their COMMITs, and its lease upkeep take, beside its own
histograms. What a batch spends outside the database is producing and waiting for the
broker's acknowledgements.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry
from sqlalchemy import Engine, create_engine, event

from agent_blackbox.broker import settle_heap
from agent_blackbox.consumers import ViewConsumer
from agent_blackbox.outbox.relay import Relay, RelayOptions
from agent_blackbox.schemas import Settings


@dataclass(frozen=True, slots=True)
class RelayFigures:
    """What a relay measured itself: its ``blackbox_publish_latency_seconds`` histogram
    (cumulative ``(upper bound, count)`` pairs), their sum, and events published; the
    sum and count of its ``blackbox_relay_batch_seconds``; and the bench's timing of
    its database work (:class:`StatementTimes`)."""

    buckets: list[tuple[float, float]]
    count: float
    sum: float
    published: int
    batch_seconds: float = 0.0
    batches: float = 0.0
    database: dict[str, StatementTime] = field(default_factory=dict)

    def at(self, q: float) -> float:
        """The ``q``-th percentile in milliseconds, interpolated inside its bucket (so
        only as exact as the buckets: 5, 10, 25, 50, 100 ms, ...)."""
        rank = self.count * q / 100.0
        lower, below = 0.0, 0.0
        for upper, cumulative in self.buckets:
            if cumulative >= rank and cumulative > below:
                if upper == float("inf"):
                    return lower * 1000
                return (lower + (upper - lower) * (rank - below) / (cumulative - below)) * 1000
            lower, below = upper, cumulative
        return lower * 1000


@dataclass(slots=True)
class StatementTime:
    """How often a kind of statement ran and how long it took in all."""

    calls: int = 0
    ms: float = 0.0


_KINDS = (
    ("SELECT id, run_id", "read"),
    ("DELETE FROM blackbox.outbox", "delete"),
    ("SELECT count(*) FROM blackbox.outbox", "depth"),
)


def _kind(statement: str) -> str:
    flat = " ".join(statement.split())
    return next((kind for prefix, kind in _KINDS if flat.startswith(prefix)), "leases")


def time_statements(engine: Engine) -> dict[str, StatementTime]:
    """Time every statement run on ``engine`` by kind (``read``, ``delete``, ``depth``,
    ``leases``), and every COMMIT by the kind of the statement before it
    (``commit after delete``, ...), from SQLAlchemy's commit hook until the connection
    is back in the pool."""
    times: dict[str, StatementTime] = {}

    def add(kind: str, began: float) -> None:
        entry = times.setdefault(kind, StatementTime())
        entry.calls += 1
        entry.ms += (time.perf_counter() - began) * 1000

    @event.listens_for(engine, "before_cursor_execute")
    def before(conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        conn.info["bench.kind"] = _kind(statement)
        conn.info["bench.began"] = time.perf_counter()

    @event.listens_for(engine, "after_cursor_execute")
    def after(conn: Any, *_args: Any) -> None:
        add(conn.info["bench.kind"], conn.info.pop("bench.began"))

    @event.listens_for(engine, "commit")
    def commit(conn: Any) -> None:
        conn.info["bench.commit"] = time.perf_counter()

    @event.listens_for(engine.pool, "checkin")
    def checkin(_dbapi: Any, record: Any) -> None:
        if record is not None and (began := record.info.pop("bench.commit", None)):
            add(f"commit after {record.info.get('bench.kind', '?')}", began)

    return times


class Spawned:
    """A function run in a fresh interpreter until :meth:`stop`; it gets a stop event and
    a queue for its one result (or the text of what it raised)."""

    def __init__(self, target: Any, *args: Any, name: str) -> None:
        context = multiprocessing.get_context("spawn")
        self.name = name
        self._stop = context.Event()
        self._results: multiprocessing.Queue[Any] = context.Queue()
        self._process = context.Process(
            target=_run_reporting,
            args=(target, self._stop, self._results, *args),
            name=name,
            daemon=True,
        )
        self._process.start()

    def stop(self, *, timeout: float = 30.0) -> Any:
        """Ask it to stop; its result.

        Raises:
            RuntimeError: it failed, or sent nothing within ``timeout``.
        """
        self._stop.set()
        try:
            outcome = self._results.get(timeout=timeout)
        except Exception as exc:  # queue.Empty
            raise RuntimeError(f"{self.name} sent no result in {timeout:.0f} s") from exc
        finally:
            self._process.join(10)
            if self._process.is_alive():
                self._process.kill()
        if isinstance(outcome, _Failed):
            raise RuntimeError(f"{self.name} failed: {outcome.text}")
        return outcome


@dataclass(frozen=True, slots=True)
class _Failed:
    text: str


def _run_reporting(target: Any, stop: Any, results: Any, *args: Any) -> None:
    try:
        results.put(target(stop, *args))
    except BaseException as exc:  # reported to the parent, which raises it
        results.put(_Failed(f"{type(exc).__name__}: {exc}"))


def relay_process(
    settings: Settings,
    *,
    owner: str,
    options: RelayOptions,
    producer_overrides: Mapping[str, Any],
    session: Mapping[str, str],
) -> Spawned:
    """A :class:`~agent_blackbox.outbox.relay.Relay` in its own process, with librdkafka
    ``producer_overrides`` and Postgres ``session`` settings (``SET`` for each of its
    database connections); :meth:`Spawned.stop` returns its :class:`RelayFigures`."""
    return Spawned(
        _relay, settings, owner, options, dict(producer_overrides), dict(session), name=owner
    )


def _relay(
    stop: Any,
    settings: Settings,
    owner: str,
    options: RelayOptions,
    overrides: dict[str, Any],
    session: dict[str, str],
) -> RelayFigures:
    flags = " ".join(f"-c {name}={value}" for name, value in session.items())
    engine = create_engine(
        settings.database_url, pool_size=4, connect_args={"options": flags} if flags else {}
    )
    database = time_statements(engine)
    relay = Relay(
        engine, settings=settings, owner=owner, options=options, producer_overrides=overrides
    )
    stopping = threading.Event()

    def relay_stop() -> None:
        stop.wait()
        stopping.set()

    threading.Thread(target=relay_stop, daemon=True).start()
    settle_heap()
    relay.run(stopping)
    engine.dispose()
    buckets: list[tuple[float, float]] = []
    values: dict[str, float] = {}
    for metric in relay.metrics.registry.collect():
        for sample in metric.samples:
            if sample.name == "blackbox_publish_latency_seconds_bucket":
                buckets.append((float(sample.labels["le"]), sample.value))
            else:
                values[sample.name] = sample.value
    return RelayFigures(
        sorted(buckets),
        count=values.get("blackbox_publish_latency_seconds_count", 0.0),
        sum=values.get("blackbox_publish_latency_seconds_sum", 0.0),
        published=relay.published,
        batch_seconds=values.get("blackbox_relay_batch_seconds_sum", 0.0),
        batches=values.get("blackbox_relay_batch_seconds_count", 0.0),
        database=dict(database),
    )


def views_process(
    settings: Settings,
    *,
    group_id: str,
    batch_size: int,
    poll_timeout_s: float,
    overrides: Mapping[str, Any],
) -> Spawned:
    """A :class:`~agent_blackbox.consumers.ViewConsumer` in its own process, polling as
    ``blackbox consume`` does (``poll_once(poll_timeout_s)`` in a loop) with librdkafka
    ``overrides``; :meth:`Spawned.stop` returns its :class:`ViewFigures`."""
    return Spawned(
        _views, settings, group_id, batch_size, poll_timeout_s, dict(overrides), name="views"
    )


@dataclass(frozen=True, slots=True)
class ViewFigures:
    """Where a view consumer's time went: its committed batches, the messages in them,
    the seconds ``poll_once`` took for them in all, and the time of its database work
    (statements and COMMITs, as for the relay)."""

    batches: int
    messages: int
    poll_seconds: float
    database: dict[str, StatementTime]

    @property
    def database_ms(self) -> float:
        """Milliseconds of database work per batch."""
        return sum(t.ms for t in self.database.values()) / max(self.batches, 1)


def _views(
    stop: Any,
    settings: Settings,
    group_id: str,
    batch_size: int,
    poll_timeout_s: float,
    overrides: dict[str, Any],
) -> ViewFigures:
    engine = create_engine(settings.database_url, pool_pre_ping=True)
    batches = messages = 0
    seconds = 0.0
    with ViewConsumer(
        settings,
        group_id=group_id,
        engine=engine,
        batch_size=batch_size,
        client_config=overrides,
        registry=CollectorRegistry(),
    ) as consumer:
        consumer.poll_once(poll_timeout_s)  # joins the group: not counted
        database = time_statements(engine)
        settle_heap()
        while not stop.is_set():
            began = time.perf_counter()
            if outcome := consumer.poll_once(poll_timeout_s):
                seconds += time.perf_counter() - began
                batches += 1
                messages += outcome.messages
    engine.dispose()
    return ViewFigures(batches, messages, seconds, dict(database))
