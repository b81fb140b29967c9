"""Consumer resume: how soon a killed ``blackbox consume``'s partitions are read again.

A ``blackbox consume`` process builds the views of a fresh topic and is killed
(SIGKILL) while it holds every partition. At once a new process is started, once with
the dead one's instance id (a restart: static membership hands it the partitions back
without waiting for the dead member's session to expire) and once with a new id (a
replacement: the group first waits out the dead member's session), and a wave of events
is produced. Each figure is the time from the kill to the views holding every event of
the wave, so it includes the process start (imports, the migration check, joining).

    python -m bench.consumer_resume [--events 2000]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace

from sqlalchemy import Engine, create_engine

from agent_blackbox.broker import ensure_topics
from agent_blackbox.consumers import migrate_views
from agent_blackbox.schemas import Settings
from bench import _synthetic
from bench._common import bench_settings, delete_group, delete_topics, drop_runs, emit, stage
from bench.views import clean_views, indexed

BENCH = "consumer_resume"
RESTART_TARGET_S = 5.0
DEADLINE_S = 120.0


def start_consumer(settings: Settings, *, instance_id: str) -> subprocess.Popen[bytes]:
    """``blackbox consume`` of ``settings``' topic and group, as a process of its own."""
    env = {
        **os.environ,
        "BLACKBOX_DATABASE_URL": settings.database_url,
        "BLACKBOX_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "BLACKBOX_TOPIC": settings.topic,
        "BLACKBOX_PARTITIONS": str(settings.partitions),
        "BLACKBOX_CONSUMER_GROUP": settings.consumer_group,
        "BLACKBOX_CONSUMER_INSTANCE_ID": instance_id,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "agent_blackbox.cli", "consume"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def wait_indexed(
    engine: Engine,
    topic: str,
    count: int,
    process: subprocess.Popen[bytes],
    *,
    since: float | None = None,
) -> float:
    """Wait until the index holds ``count`` events of ``topic``; the seconds since
    ``since`` (a ``perf_counter`` reading; default: now)."""
    started = time.perf_counter() if since is None else since
    while indexed(engine, topic) < count:
        if process.poll() is not None:
            raise RuntimeError(f"the consumer exited with status {process.returncode}")
        if time.perf_counter() - started > DEADLINE_S:
            raise RuntimeError(f"the index did not reach {count} events in {DEADLINE_S:.0f}s")
        time.sleep(0.02)  # polling interval of the measurement
    return time.perf_counter() - started


def kill(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL: no goodbye to the group, no flush."""
    if process.poll() is None:
        process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2_000, help="events per wave")
    args = parser.parse_args(argv)
    settings = replace(
        bench_settings(BENCH), consumer_group=f"blackbox.bench.resume.{uuid.uuid4().hex[:12]}"
    )
    engine = create_engine(settings.database_url)
    run_ids: set[str] = set()
    processes: list[subprocess.Popen[bytes]] = []
    try:
        migrate_views(settings.database_url)
        ensure_topics(settings, {settings.topic: settings.partitions})
        template = _synthetic.record_template(engine, settings)
        total = 0

        def wave() -> int:
            rows = list(
                _synthetic.rows(template, events=args.events, shards=settings.outbox_shards)
            )
            run_ids.update(row.run_id for row in rows)
            _synthetic.register(engine, rows)
            _synthetic.produce(settings, settings.topic, rows)
            return len(rows)

        with stage("first consumer builds the views of the first wave"):
            total += wave()
            processes.append(start_consumer(settings, instance_id="bench-a"))
            wait_indexed(engine, settings.topic, total, processes[-1])
        figures: dict[str, float] = {}
        for figure, instance_id in (("restart_s", "bench-a"), ("replacement_s", "bench-b")):
            with stage(f"{figure}: kill -9, then a new process as {instance_id}"):
                kill(processes[-1])
                killed = time.perf_counter()
                processes.append(start_consumer(settings, instance_id=instance_id))
                total += wave()
                figures[figure] = wait_indexed(
                    engine, settings.topic, total, processes[-1], since=killed
                )
        emit(
            BENCH,
            "restart_s",
            figures["restart_s"],
            unit="s",
            target=RESTART_TARGET_S,
            at_least=False,
        )
        emit(
            BENCH,
            "replacement_s",
            figures["replacement_s"],
            unit="s",
            session_timeout_ms=settings.consumer_session_timeout_ms,
        )
    finally:
        for process in processes:
            kill(process)
        clean_views(
            engine, topic=settings.topic, group_id=settings.consumer_group, run_ids=sorted(run_ids)
        )
        drop_runs(engine, sorted(run_ids))
        delete_topics(settings, [settings.topic, settings.dlq_topic])
        # A killed static member stays in the group until its session expires.
        time.sleep(settings.consumer_session_timeout_ms / 1000 + 1)
        delete_group(settings, settings.consumer_group)
        engine.dispose()


if __name__ == "__main__":
    main()
