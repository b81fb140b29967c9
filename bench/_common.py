"""What every bench shares: settings, fresh topics, figures on stdout, progress on stderr.

Each figure is one JSON line on stdout, so a run can be piped into a file or ``jq``;
everything a person watches (progress bars, timings) goes to stderr.
"""

from __future__ import annotations

import json
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

from confluent_kafka import KafkaException
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from sqlalchemy import Engine, create_engine, make_url, text

from agent_blackbox.broker import new_admin, settle_heap
from agent_blackbox.consumers import BatchOutcome, ConsumerRuntime, migrate_views
from agent_blackbox.outbox.storage import migrate_write_side
from agent_blackbox.schemas import Settings, safe_console

PARTITIONS = 12

console = safe_console(stderr=True)


def bench_settings(bench: str) -> Settings:
    """The services from the environment, with a fresh topic of :data:`PARTITIONS`.

    The write side's schema is migrated first (a no-op when it is current), so a bench
    also runs against a database nothing has used yet.
    """
    settings = Settings.from_env()
    migrate_write_side(settings.database_url)
    return replace(settings, topic=fresh_topic(bench), partitions=PARTITIONS)


@contextmanager
def own_database(settings: Settings, label: str, *, views: bool = False) -> Iterator[Settings]:
    """``settings`` on a fresh database of the bench's own (named after ``label``), its
    write side migrated and, with ``views``, its views; dropped at the end."""
    base = make_url(settings.database_url)
    name = f"{base.database}_{label}_{uuid.uuid4().hex[:8]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = base.set(database=name).render_as_string(hide_password=False)
    try:
        migrate_write_side(url)
        if views:
            migrate_views(url)
        yield replace(settings, database_url=url)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def fresh_topic(bench: str) -> str:
    """A topic name no earlier run has used."""
    return f"blackbox.bench.{bench}.{uuid.uuid4().hex[:12]}"


def emit(
    bench: str,
    figure: str,
    value: float,
    *,
    unit: str,
    target: float | None = None,
    at_least: bool = True,
    **labels: int | str,
) -> None:
    """Print one figure as a JSON line; ``met`` says whether it reached ``target``.

    ``at_least`` says which way the target points: a rate should reach it, a latency
    (``at_least=False``) should stay under it.
    """
    line: dict[str, object] = {"bench": bench, "figure": figure, **labels}
    line.update(value=round(value, 3), target=target, unit=unit)
    if target is not None:
        line["met"] = value >= target if at_least else value <= target
    print(json.dumps(line), flush=True)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values``, interpolating between ranks."""
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def progress() -> Progress:
    """A progress display on stderr."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )


@contextmanager
def stage(name: str) -> Iterator[None]:
    """Report on stderr how long the block took."""
    started = time.perf_counter()
    yield
    console.log(f"{name}: {time.perf_counter() - started:.1f}s")


def drop_runs(engine: Engine, run_ids: Sequence[str]) -> None:
    """Delete the bench's runs and whatever of them is still in the outbox."""
    with engine.begin() as conn:
        conn.execute(
            text("DELETE FROM blackbox.outbox WHERE run_id = ANY(:ids)"), {"ids": list(run_ids)}
        )
        conn.execute(
            text("DELETE FROM blackbox.runs WHERE run_id = ANY(:ids)"), {"ids": list(run_ids)}
        )
        conn.execute(
            text("DELETE FROM blackbox.data_keys WHERE run_id = ANY(:ids)"), {"ids": list(run_ids)}
        )


def delete_topics(settings: Settings, topics: Sequence[str]) -> None:
    """Delete the bench's topics; a failure is reported, not raised."""
    if not topics:
        return  # a bench that stopped before making any (the admin client refuses none)
    admin = new_admin(settings.kafka_bootstrap)
    for topic, future in admin.delete_topics(list(topics), request_timeout=30).items():
        try:
            future.result()
        except KafkaException as exc:
            console.log(f"could not delete topic {topic}: {exc}")


def delete_group(settings: Settings, group_id: str) -> None:
    """Delete the bench's consumer group; a failure is reported, not raised."""
    admin = new_admin(settings.kafka_bootstrap)
    for group, future in admin.delete_consumer_groups([group_id], request_timeout=30).items():
        try:
            future.result()
        except KafkaException as exc:
            console.log(f"could not delete consumer group {group}: {exc}")


@dataclass
class Batches:
    """When a consumer's batches were committed, counted as :func:`run_counted` counts
    them: the first batch's wall and CPU time and count, and the last's times."""

    opened: float
    first: tuple[float, float, int] | None = None
    last: tuple[float, float] = (0.0, 0.0)
    counted: int = 0

    def measured(self, events: int, what: str) -> tuple[int, float, float]:
        """After the first batch (whose poll also joins the group): how many were
        counted, in how many wall seconds and how many CPU seconds of this process.

        Raises:
            RuntimeError: fewer than ``events`` were counted in time.
            ValueError: every one of them came in the first batch.
        """
        if self.first is None or self.counted < events:
            raise RuntimeError(f"only {self.counted} of {events} {what} in time")
        first_at, cpu_at, first_count = self.first
        if self.counted == first_count:
            raise ValueError(f"{events} events fit one batch; ask for more to measure a rate")
        done, cpu_done = self.last
        return self.counted - first_count, done - first_at, cpu_done - cpu_at


def run_counted(
    consumer: ConsumerRuntime,
    *,
    events: int,
    label: str,
    count: Callable[[BatchOutcome], int],
    deadline_s: float,
) -> Batches:
    """Run ``consumer`` as its command runs it (:meth:`ConsumerRuntime.run`, batches
    pipelined) until ``count`` of its batches adds up to ``events``, or ``deadline_s``
    passed; with a progress bar named ``label``."""
    batches = Batches(opened=time.perf_counter())
    stop = threading.Event()
    deadline = threading.Timer(deadline_s, stop.set)
    with progress() as display:
        task = display.add_task(label, total=events)

        def counted(outcome: BatchOutcome) -> None:
            batches.counted += count(outcome)
            display.advance(task, count(outcome))
            batches.last = (time.perf_counter(), time.process_time())
            batches.first = batches.first or (*batches.last, batches.counted)
            if batches.counted >= events:
                stop.set()

        deadline.start()
        settle_heap()  # as the commands do; the bench's rows are not scanned
        try:
            consumer.run(stop, on_batch=counted, poll_timeout_s=0.1)
        finally:
            deadline.cancel()
    return batches
