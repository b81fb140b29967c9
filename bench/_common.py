"""What every bench shares: settings, fresh topics, figures on stdout, progress on stderr.

Each figure is one JSON line on stdout, so a run can be piped into a file or ``jq``;
everything a person watches (progress bars, timings) goes to stderr.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

from confluent_kafka import KafkaException
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from sqlalchemy import Engine, text

from agent_blackbox.broker import new_admin
from agent_blackbox.outbox import migrate_write_side
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
