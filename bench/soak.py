"""The fault matrix, long form: ``make soak`` (or ``python -m bench.soak``).

Runs every fault of ``tests/faults`` in a random order over ``SOAK_EVENTS`` events in
all (1,000,000 by default), each experiment on services of its own (free ports, caches
under ``.cache/blackbox/soak``; the services in the environment are not touched):

- on one Postgres and one Kafka: relay kill -9, two relays, a relay paused past its
  lease, broker kill -9, Postgres immediate stop, consumer kill -9, a held transaction,
  poison messages, ambiguous commits;
- on a three-node Kafka (replication factor 3, ``min.insync.replicas`` 2): the leader of
  the busiest partitions killed, one node stopped, two nodes stopped, a node frozen (each
  away ``SOAK_AWAY_S``, 30 s by default);
- a Postgres primary killed and its synchronous standby promoted, with recorder, relay,
  consumers, analytics and backup on the multi-host URL;
- the backup's object store away for 15 s.

Each experiment repeats its fault every 10,000 events (the promotion happens once: a
promoted pair cannot fail over again) and ends with the after-heal check, whose reader
decodes the topic itself and compares it with what committed (the outbox trigger's
copy), never with the project's views. Prints one JSON line per experiment and a
``total`` line; progress goes to stderr. ``SOAK_SEED`` fixes the order (the total line
names the seed used); ``SOAK_SCENARIOS`` (comma-separated names) runs a subset. Exit
status 1 when any experiment broke a guarantee, 0 otherwise.
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from agent_blackbox.backup import S3Store
from agent_blackbox.stack import LocalS3
from bench._common import console
from tests.faults import _cluster
from tests.faults._backup import store_outage
from tests.faults._check import Figures
from tests.faults._cluster import ClusterStack
from tests.faults._harness import ROOT, FaultStack, free_port
from tests.faults._scenarios import SCENARIOS
from tests.faults._standby import promotion, standby_pair, standby_settings
from tests.integration._backups import SIGNER

DEFAULT_EVENTS = 1_000_000
_TICK_S = 15.0
CACHE = ROOT / ".cache" / "blackbox" / "soak"


class Stacks:
    """The soak's services, each started the first time an experiment needs it and
    stopped at the end."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self._single: FaultStack | None = None
        self._cluster: ClusterStack | None = None
        self._s3: LocalS3 | None = None

    def single(self) -> FaultStack:
        if self._single is None:
            self._single = FaultStack(CACHE / "single")
            self._single.start()
        return self._single

    def cluster(self) -> ClusterStack:
        if self._cluster is None:
            self._cluster = ClusterStack(CACHE / "cluster")
            self._cluster.start()
        return self._cluster

    def s3(self) -> LocalS3:
        if self._s3 is None:
            self._s3 = LocalS3(CACHE / "s3", free_port(set()))
            self._s3.start()
        return self._s3

    def stop(self) -> None:
        for stop in (self._s3, self._cluster, self._single):
            if stop is not None:
                try:
                    stop.stop()
                except Exception:  # the others are stopped all the same
                    console.print_exception()


Experiment = Callable[[Stacks, int], Figures]


def _single(name: str) -> Experiment:
    return lambda stacks, events: SCENARIOS[name](stacks.single(), stacks.logs, events)


def _away_s() -> float:
    return float(os.environ.get("SOAK_AWAY_S", "30"))


def _replicated(name: str) -> Experiment:
    def run(stacks: Stacks, events: int) -> Figures:
        cluster, logs = stacks.cluster(), stacks.logs
        if name == "leader_kill":
            return _cluster.leader_kill(cluster, logs, events)
        fault = getattr(_cluster, name)
        return fault(cluster, logs, events, away_s=_away_s())  # type: ignore[no-any-return]

    return run


def _promotion(stacks: Stacks, events: int) -> Figures:
    """The standby promotion, with the backup on the multi-host URL too."""
    s3 = stacks.s3()
    endpoint = s3.start()
    prefix = f"standby-{int(time.time())}"
    url = f"s3://{endpoint.bucket}/{prefix}?endpoint={endpoint.endpoint_url}"
    key = stacks.logs / f"{prefix}.pem"
    key.write_bytes(SIGNER.private_key_pem())
    key.chmod(0o600)
    # The workers inherit this process's environment; the store's client reads it too.
    os.environ.update(
        AWS_ACCESS_KEY_ID=endpoint.access_key,
        AWS_SECRET_ACCESS_KEY=endpoint.secret_key,
        BLACKBOX_BACKUP_URL=url,
        BLACKBOX_SIGNING_KEY_FILE=str(key),
    )
    store = S3Store(endpoint.bucket, prefix=prefix, endpoint=endpoint.endpoint_url)
    with standby_pair(CACHE / "standby") as pair:
        settings = standby_settings(pair.url, stacks.single().kafka.bootstrap)
        done = promotion(
            pair, settings, stacks.logs, before=events // 2, after=events // 2, store=store
        )
    figures = done.figures
    figures.acknowledged_lost = len(done.lost)
    figures.takeovers_s.append(done.writing_again_s or -1.0)
    figures.writer_failures = len(done.writers.heard)
    if done.false_nothing:
        figures.broken.append(f"{len(done.false_nothing)} errors said nothing was recorded")
    if done.writers.unexpected:
        figures.broken.append(f"writers raised {done.writers.unexpected[:3]}")
    figures.broken.extend(done.backup_problems)
    if missing := done.not_backed_up:
        figures.broken.append(f"{len(missing)} events acknowledged after promotion not backed up")
    figures.notes["cuts"] = done.cuts
    figures.notes["promoted_after_s"] = round(done.promoted - done.killed, 2)
    figures.notes["acknowledged"] = done.writers.events
    return figures


EXPERIMENTS: dict[str, Experiment] = {
    **{name: _single(name) for name in SCENARIOS},
    **{
        name: _replicated(name)
        for name in ("leader_kill", "broker_stop", "two_brokers_stop", "broker_freeze")
    },
    "pg_standby_promotion": _promotion,
    "store_outage": lambda stacks, events: store_outage(
        stacks.single(), stacks.logs, events, s3=stacks.s3()
    ),
}
"""Every experiment of the soak, by name (the single-node ones, then the replicated)."""

STACK_OF = {
    **{name: "single-node" for name in SCENARIOS},
    "leader_kill": "kafka x3",
    "broker_stop": "kafka x3",
    "two_brokers_stop": "kafka x3",
    "broker_freeze": "kafka x3",
    "pg_standby_promotion": "postgres + standby",
    "store_outage": "single-node + backup",
}


def _events() -> int:
    raw = os.environ.get("SOAK_EVENTS", str(DEFAULT_EVENTS))
    try:
        events = int(raw.replace("_", ""))
    except ValueError:
        raise SystemExit(f"SOAK_EVENTS={raw!r} is not a whole number of events") from None
    if events < 1:
        raise SystemExit(f"SOAK_EVENTS={raw!r} must be positive")
    return events


def _seed() -> int:
    raw = os.environ.get("SOAK_SEED", "")
    if not raw:
        return random.SystemRandom().randrange(2**32)
    try:
        return int(raw)
    except ValueError:
        raise SystemExit(f"SOAK_SEED={raw!r} is not a whole number") from None


def _chosen() -> list[str]:
    raw = os.environ.get("SOAK_SCENARIOS", "")
    names = [n.strip() for n in raw.split(",") if n.strip()] or list(EXPERIMENTS)
    unknown = [n for n in names if n not in EXPERIMENTS]
    if unknown:
        raise SystemExit(
            f"SOAK_SCENARIOS names unknown experiments {unknown}; choose from {list(EXPERIMENTS)}"
        )
    return names


def schedule(names: Sequence[str], seed: int) -> list[str]:
    """``names`` in the random order ``seed`` gives (the same seed, the same order)."""
    order = list(names)
    random.Random(seed).shuffle(order)
    return order


def _ticking(name: str, done: threading.Event) -> None:
    started = time.monotonic()
    while not done.wait(_TICK_S):
        console.log(f"soak: {name} running for {time.monotonic() - started:.0f} s")


def _total(results: list[Figures], seconds: float, seed: int) -> dict[str, object]:
    def total(field: str) -> int:
        return sum(int(getattr(f, field)) for f in results)

    takeovers = {f.scenario: [round(t, 2) for t in f.takeovers_s] for f in results}
    return {
        "bench": "soak",
        "figure": "total",
        "seed": seed,
        "order": [f.scenario for f in results],
        "scenarios": len(results),
        "events": total("events"),
        "lost": total("lost"),
        "acknowledged_lost": total("acknowledged_lost"),
        "reordered": total("reordered"),
        "stale_applied": total("stale_applied"),
        "duplicates_published": total("duplicates_published"),
        "stale_published": total("stale_published"),
        "committed_twice": total("committed_twice"),
        "broken": [f.scenario for f in results if f.problems()],
        "takeovers_s": takeovers,
        "duration_s": round(seconds, 1),
    }


def _one(stacks: Stacks, name: str, events: int) -> Figures:
    """One experiment; a harness failure becomes a figure that says so."""
    done = threading.Event()
    ticker = threading.Thread(target=_ticking, args=(name, done), daemon=True)
    ticker.start()
    started = time.monotonic()
    try:
        figures = EXPERIMENTS[name](stacks, events)
    except Exception as exc:  # one experiment's harness failure: go on with the rest
        console.print_exception()
        figures = Figures(scenario=name, notes={"error": f"{type(exc).__name__}: {exc}"})
    finally:
        done.set()
    figures.scenario = name
    figures.duration_s = figures.duration_s or time.monotonic() - started
    figures.notes["stack"] = STACK_OF[name]
    return figures


def main(argv: Sequence[str] = ()) -> int:
    events, seed = _events(), _seed()
    names = schedule(_chosen(), seed)
    each = max(1, events // len(names))
    console.log(f"soak: {len(names)} experiments × {each:,} events, seed {seed}: {names}")
    results: list[Figures] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="blackbox-soak-") as logs:
        stacks = Stacks(Path(logs))
        try:
            for name in names:
                figures = _one(stacks, name, each)
                print(json.dumps({"bench": "soak", **json.loads(figures.json_line())}), flush=True)
                problems = figures.problems()
                console.log(
                    f"soak: {name} {'BROKEN: ' + '; '.join(problems) if problems else 'ok'}"
                )
                results.append(figures)
        finally:
            stacks.stop()
    print(json.dumps(_total(results, time.monotonic() - started, seed)), flush=True)
    return 1 if any(f.problems() for f in results) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
