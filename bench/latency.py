"""Commit → visible latency at a steady write rate, beside the relay's own metric.

Writers in processes of their own (``--writers``) record ``--runs`` runs through the
public :class:`~agent_blackbox.outbox.Recorder`, one thread per run, paced to ``--rate``
events/s in all (clock reads, random draws and small tool calls: the recorder costs
about a millisecond of CPU per event, so the writers keep their events cheap). One
relay runs in another process (the library's ``Relay``, its defaults unless told
otherwise), and the bench process watches the topic with a plain consumer with
librdkafka's defaults, assigned every partition (no group join).

How the two ends are timed (wall clock, one machine):

- commit: the writer takes ``time.time()`` right after the recorder call that appended
  the event returned, i.e. once the agent was told the event is durable;
- visible: the plain consumer takes ``time.time()`` right after ``poll()`` handed the
  message over. Events are matched by ``(run_id, sequence)`` from the decoded envelope.

The first ``--warmup`` seconds are left out. The path is split in two by the message's
create time (taken by the relay's client at ``produce()``, in milliseconds):
``commit_to_produce_ms`` (the relay noticing the row, reading it, producing it) and
``produce_to_visible_ms`` (linger, the broker's acknowledgement, the consumer's fetch).
``plain_commit_to_visible_ms`` (p50, p95, p99; target p99 ≤ 50 ms) is printed beside
``relay_publish_latency_ms``: the relay's ``blackbox_publish_latency_seconds``
histogram from the same run (one sample per batch, its oldest row, from the row's
``created_at``, the start of the writer's transaction, to the broker's
acknowledgement; percentiles interpolated inside its buckets), and where the relay's
batches spent their time (``relay_batch_ms``, ``relay_database_ms`` per statement kind
and COMMIT, ``relay_produce_and_ack_ms``: the rest).

The ``views`` phase (``--phases``) adds a view consumer in its own process, polling as
``blackbox consume`` does, and times commit → the run's row in the runs view covering
the event, by polling that view every 5 ms (``view_commit_to_visible_ms``, reported, not
targeted; the plain figure of the same phase is printed too), with where the view
consumer's batches spent their time (``view_batch_*``: in the database, and outside it:
the wait in ``consume()``, decoding, projecting).

Client and session settings can be overridden to show what each costs, e.g.
``--producer linger.ms=0``, ``--relay-session synchronous_commit=off``,
``--consumer fetch.wait.max.ms=10``, ``--view-poll-timeout 0.01``.

    python -m bench.latency [--rate 1000] [--seconds 20] [--runs 20] [--phases plain,views]
"""

from __future__ import annotations

import argparse
import statistics
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import Engine, create_engine, text

from agent_blackbox.broker import ensure_topics
from agent_blackbox.consumers import migrate_views
from agent_blackbox.outbox import Recorder, RunSnapshot
from agent_blackbox.outbox.relay import RelayOptions
from agent_blackbox.schemas import Settings
from bench import _pipeline, _spawned
from bench._common import (
    bench_settings,
    console,
    delete_group,
    delete_topics,
    drop_runs,
    emit,
    fresh_topic,
    percentile,
    stage,
)
from bench.relay import require_empty_outbox
from bench.views import clean_views

BENCH = "latency"
P99_TARGET_MS = 50.0
QUANTILES = (50, 95, 99)


@dataclass(frozen=True, slots=True)
class Tuning:
    """The settings a run overrides (empty: the library's defaults)."""

    producer: Mapping[str, Any] = field(default_factory=dict)
    consumer: Mapping[str, Any] = field(default_factory=dict)
    view_consumer: Mapping[str, Any] = field(default_factory=dict)
    relay_session: Mapping[str, str] = field(default_factory=dict)
    relay: RelayOptions = field(default_factory=RelayOptions)
    view_batch: int = 2000
    view_poll_timeout_s: float = 0.5

    def label(self) -> str:
        """The overrides, as one short string for the figures."""
        parts = [f"producer.{k}={v}" for k, v in self.producer.items()]
        parts += [f"consumer.{k}={v}" for k, v in self.consumer.items()]
        parts += [f"views.{k}={v}" for k, v in self.view_consumer.items()]
        parts += [f"relay_session.{k}={v}" for k, v in self.relay_session.items()]
        if self.relay != RelayOptions():
            parts.append(f"relay={self.relay}")
        if (self.view_batch, self.view_poll_timeout_s) != (2000, 0.5):
            parts.append(f"views.batch={self.view_batch},poll={self.view_poll_timeout_s}s")
        return ",".join(parts) or "defaults"


@dataclass(frozen=True, slots=True)
class Phase:
    """What one phase measured."""

    written: _pipeline.Written
    plain: _pipeline.Latencies
    pickup: _pipeline.Latencies
    """Commit → the relay's ``produce()`` (the message's create time)."""
    delivery: _pipeline.Latencies
    """The relay's ``produce()`` → the plain consumer's ``poll()``."""
    relay: _spawned.RelayFigures
    views: _pipeline.Latencies | None = None
    view_consumer: _spawned.ViewFigures | None = None
    view_poll_ms: float = 0.0


def probe(engine: Engine, settings: Settings, *, agent_id: str) -> int:
    """Record one short run so the bench can see the whole path is live before it
    starts measuring; the events it recorded."""
    recorder = Recorder(engine, settings=settings)
    run = recorder.start_run(RunSnapshot(code_version="bench", input={}), agent_id=agent_id)
    run.finish(output={})
    return run.last_sequence


def measure(
    engine: Engine,
    settings: Settings,
    load: _pipeline.Load,
    tuning: Tuning,
    *,
    agent_id: str,
    group_id: str,
    views: bool,
    warmup_s: float,
) -> Phase:
    """One phase: relay (and view consumer) up, a probe through, the paced load, the tail.

    1. Start the relay, the plain watcher and, with ``views``, the view consumer.
    2. Record a probe run and wait until it is visible at every end (relay has its
       shards, consumer has joined); nothing of it is measured.
    3. Run the writers; wait until every event they committed was seen.
    4. Stop everything; the relay reports its histogram.
    """
    relay = _spawned.relay_process(
        settings,
        owner=f"bench-latency-{settings.topic}",
        options=tuning.relay,
        producer_overrides=tuning.producer,
        session=tuning.relay_session,
    )
    watcher = _pipeline.PlainWatcher(settings, overrides=tuning.consumer)
    view_watcher = _pipeline.ViewWatcher(settings.database_url, agent_id=agent_id)
    consumer = None
    view_figures = None
    try:
        watcher.start()
        if views:
            consumer = _spawned.views_process(
                settings,
                group_id=group_id,
                batch_size=tuning.view_batch,
                poll_timeout_s=tuning.view_poll_timeout_s,
                overrides=tuning.view_consumer,
            )
            view_watcher.start()
        with stage("probe run through the pipeline"):
            probed = probe(engine, settings, agent_id=agent_id)
            _pipeline.wait_for(lambda: watcher.received >= probed, timeout=60, what="the probe")
            if views:
                _pipeline.wait_for(
                    lambda: len(view_watcher.seen) >= probed, timeout=90, what="the probe's view"
                )
        with (
            stage(f"{load.rate:,.0f} events/s for {load.seconds:.0f} s over {load.runs} runs"),
            _pipeline.Writers(settings, load, agent_id=agent_id) as writers,
        ):
            written = writers.result()
        expected = probed + len(written.commits)
        _pipeline.wait_until_counted(
            lambda: watcher.received, expected, timeout=30, what="plain consumer"
        )
        if views:
            _pipeline.wait_until_counted(
                lambda: len(view_watcher.seen), expected, timeout=60, what="runs view"
            )
    finally:
        plain_seen, produced = watcher.stop()
        view_seen = view_watcher.stop() if views else {}
        if consumer is not None:
            view_figures = consumer.stop()
        relay_figures: _spawned.RelayFigures = relay.stop()
    return Phase(
        written=written,
        plain=_pipeline.Latencies.between(written, plain_seen, warmup_s=warmup_s),
        pickup=_pipeline.Latencies.between(written, produced, warmup_s=warmup_s),
        delivery=_pipeline.Latencies.between(
            _pipeline.Written(commits=produced, started=written.started),
            plain_seen,
            warmup_s=warmup_s,
        ),
        relay=relay_figures,
        views=_pipeline.Latencies.between(written, view_seen, warmup_s=warmup_s) if views else None,
        view_consumer=view_figures,
        view_poll_ms=statistics.fmean(view_watcher.poll_ms) if view_watcher.poll_ms else 0.0,
    )


def report(phase: Phase, *, name: str, tuning: Tuning) -> None:
    """The phase's figures as JSON lines."""
    rate, label = round(phase.written.rate), tuning.label()

    def out(figure: str, value: float, **extra: Any) -> None:
        emit(BENCH, figure, value, phase=name, rate=rate, tuning=label, **extra)

    for q in QUANTILES:
        target = P99_TARGET_MS if q == 99 else None
        out(
            "plain_commit_to_visible_ms",
            phase.plain.at(q),
            unit="ms",
            target=target,
            at_least=False,
            percentile=q,
            events=len(phase.plain.ms),
            missing=phase.plain.missing,
        )
    for figure, part in (
        ("commit_to_produce_ms", phase.pickup),
        ("produce_to_visible_ms", phase.delivery),
    ):
        for q in QUANTILES:
            out(figure, part.at(q), unit="ms", percentile=q)
    for q in QUANTILES:
        out(
            "relay_publish_latency_ms",
            phase.relay.at(q),
            unit="ms",
            percentile=q,
            batches=int(phase.relay.count),
        )
    mean_ms = phase.relay.sum / max(phase.relay.count, 1) * 1000
    out("relay_publish_latency_mean_ms", mean_ms, unit="ms")
    per_batch = phase.relay.published / max(phase.relay.count, 1)
    out("relay_events_per_batch", per_batch, unit="events")
    report_relay_time(phase.relay, out)
    for q in (50, 99):
        out(
            "writer_append_ms",
            percentile(phase.written.append_ms, q),
            unit="ms",
            percentile=q,
        )
    if phase.views is not None:
        for q in QUANTILES:
            out(
                "view_commit_to_visible_ms",
                phase.views.at(q),
                unit="ms",
                percentile=q,
                events=len(phase.views.ms),
                missing=phase.views.missing,
                view_poll_ms=f"{phase.view_poll_ms + 5.0:.1f}",
            )
    if (consumer := phase.view_consumer) is not None and consumer.batches:
        poll_ms = consumer.poll_seconds * 1000 / consumer.batches
        out("view_batch_ms", poll_ms, unit="ms", batches=consumer.batches)
        out("view_batch_messages", consumer.messages / consumer.batches, unit="messages")
        out("view_batch_database_ms", consumer.database_ms, unit="ms")
        # What poll_once spent outside the database: waiting in consume() for the batch
        # (up to the poll timeout unless the batch fills), decoding and projecting.
        out("view_batch_outside_database_ms", poll_ms - consumer.database_ms, unit="ms")


def report_relay_time(relay: _spawned.RelayFigures, out: Any) -> None:
    """Where a relay batch's time goes: its mean, each kind of statement and COMMIT
    (mean per call), and what is left for producing and awaiting acknowledgements."""
    batches = max(relay.batches, 1)
    batch_ms = relay.batch_seconds * 1000 / batches
    out("relay_batch_ms", batch_ms, unit="ms", batches=int(relay.batches))
    for part, spent in sorted(relay.database.items()):
        out("relay_database_ms", spent.ms / spent.calls, unit="ms", part=part, calls=spent.calls)
    # Every batch reads once, deletes once and commits the delete; empty reads (the relay
    # looking again before it waits) are outside the batches, so reads count at their mean.
    database_ms = sum(
        relay.database[part].ms / relay.database[part].calls
        for part in ("read", "delete", "commit after delete")
        if part in relay.database
    )
    out("relay_produce_and_ack_ms", batch_ms - database_ms, unit="ms")


def _settings_pairs(pairs: Sequence[str], flag: str) -> dict[str, Any]:
    """``KEY=VALUE`` pairs as a dict, numbers as numbers."""
    parsed: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"{flag} {pair!r}: expected KEY=VALUE, e.g. {flag} linger.ms=0")
        parsed[key] = int(value) if value.lstrip("-").isdigit() else value
    return parsed


def parse(argv: Sequence[str] | None) -> tuple[argparse.Namespace, Tuning]:
    """The command line, and the tuning it asks for."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=1_000.0, help="events/s in all")
    parser.add_argument("--seconds", type=float, default=20.0, help="paced window")
    parser.add_argument("--runs", type=int, default=20, help="concurrent runs (threads)")
    parser.add_argument("--writers", type=int, default=2, help="writer processes")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds left out")
    parser.add_argument(
        "--phases", default="plain,views", help="plain (relay + plain consumer), views (+ views)"
    )
    for flag in ("--producer", "--consumer", "--view-consumer", "--relay-session"):
        parser.add_argument(flag, action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--relay-idle-wait", type=float, default=None, metavar="SECONDS")
    parser.add_argument("--relay-batch", type=int, default=None, metavar="ROWS")
    parser.add_argument("--view-batch", type=int, default=2000, metavar="MESSAGES")
    parser.add_argument("--view-poll-timeout", type=float, default=0.5, metavar="SECONDS")
    args = parser.parse_args(argv)
    relay = RelayOptions()
    if args.relay_idle_wait is not None:
        relay = replace(relay, idle_wait_s=args.relay_idle_wait)
    if args.relay_batch is not None:
        relay = replace(relay, batch_size=args.relay_batch)
    tuning = Tuning(
        producer=_settings_pairs(args.producer, "--producer"),
        consumer=_settings_pairs(args.consumer, "--consumer"),
        view_consumer=_settings_pairs(args.view_consumer, "--view-consumer"),
        relay_session={
            k: str(v) for k, v in _settings_pairs(args.relay_session, "--relay-session").items()
        },
        relay=relay,
        view_batch=args.view_batch,
        view_poll_timeout_s=args.view_poll_timeout,
    )
    return args, tuning


def bench_runs(engine: Engine, agent_ids: Sequence[str]) -> list[str]:
    """The runs the bench's agents recorded."""
    query = text("SELECT run_id FROM blackbox.runs WHERE agent_id = ANY(:ids)")
    with engine.connect() as conn:
        return [str(row[0]) for row in conn.execute(query, {"ids": list(agent_ids)})]


def main(argv: Sequence[str] | None = None) -> None:
    args, tuning = parse(argv)
    load = _pipeline.Load(
        rate=args.rate, seconds=args.seconds, runs=args.runs, processes=args.writers
    )
    settings = bench_settings(BENCH)
    engine = create_engine(settings.database_url)
    asked = [name.strip() for name in args.phases.split(",") if name.strip()]
    if not asked or set(asked) - {"plain", "views"}:
        raise SystemExit(f"--phases {args.phases!r}: name plain, views or both")
    phases = [(name, replace(settings, topic=fresh_topic(f"{BENCH}-{name}"))) for name in asked]
    tag = uuid.uuid4().hex[:8]
    agent_ids = [f"bench-latency-{name}-{tag}" for name, _ in phases]
    group_ids = [f"blackbox.bench.latency.{name}.{tag}" for name, _ in phases]
    try:
        require_empty_outbox(engine)
        migrate_views(settings.database_url)
        for (name, each), agent_id, group_id in zip(phases, agent_ids, group_ids, strict=True):
            ensure_topics(each, {each.topic: each.partitions})
            console.log(f"phase {name}: topic {each.topic}, tuning {tuning.label()}")
            phase = measure(
                engine,
                each,
                load,
                tuning,
                agent_id=agent_id,
                group_id=group_id,
                views=name == "views",
                warmup_s=args.warmup,
            )
            report(phase, name=name, tuning=tuning)
    finally:
        run_ids = bench_runs(engine, agent_ids)
        for (_, each), group_id in zip(phases, group_ids, strict=True):
            clean_views(engine, topic=each.topic, group_id=group_id, run_ids=run_ids)
        drop_runs(engine, run_ids)
        topics = [each.topic for _, each in phases]
        topics += [each.dlq_topic for name, each in phases if name == "views"]
        delete_topics(settings, topics)
        for (name, _), group_id in zip(phases, group_ids, strict=True):
            if name == "views":
                delete_group(settings, group_id)
        engine.dispose()


if __name__ == "__main__":
    main()
