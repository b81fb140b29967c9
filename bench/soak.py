"""The fault matrix, long form: ``make soak`` (or ``python -m bench.soak``).

Runs every scenario of ``tests/faults`` (relay kill -9, two relays, a relay paused past
its lease, broker kill -9, Postgres immediate stop, consumer kill -9, a held
transaction, poison messages, ambiguous commits) over ``SOAK_EVENTS`` events in all
(1,000,000 by default), each repeating its fault every 10,000 events, against a Postgres
and a Kafka of its own on free ports (the services in the environment are not touched).

Prints one JSON line per scenario (events, lost, reordered, stale applied, duplicates
published, takeover times, duration, ...) and a ``total`` line; progress goes to stderr.
``SOAK_SCENARIOS`` (comma-separated names) runs a subset. Exit status 1 when any
scenario broke a guarantee (lost, reordered, stale applied, views or effects off, outbox
left, ``verify --all`` not clean), 0 otherwise.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from bench._common import console
from tests.faults._check import Figures
from tests.faults._harness import ROOT, FaultStack
from tests.faults._scenarios import SCENARIOS

DEFAULT_EVENTS = 1_000_000
_TICK_S = 15.0


def _events() -> int:
    raw = os.environ.get("SOAK_EVENTS", str(DEFAULT_EVENTS))
    try:
        events = int(raw.replace("_", ""))
    except ValueError:
        raise SystemExit(f"SOAK_EVENTS={raw!r} is not a whole number of events") from None
    if events < 1:
        raise SystemExit(f"SOAK_EVENTS={raw!r} must be positive")
    return events


def _chosen() -> list[str]:
    raw = os.environ.get("SOAK_SCENARIOS", "")
    names = [n.strip() for n in raw.split(",") if n.strip()] or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise SystemExit(
            f"SOAK_SCENARIOS names unknown scenarios {unknown}; choose from {list(SCENARIOS)}"
        )
    return names


def _ticking(name: str, done: threading.Event) -> None:
    started = time.monotonic()
    while not done.wait(_TICK_S):
        console.log(f"soak: {name} running for {time.monotonic() - started:.0f} s")


def _total(results: list[Figures], seconds: float) -> dict[str, object]:
    def total(field: str) -> int:
        return sum(int(getattr(f, field)) for f in results)

    takeovers = {f.scenario: [round(t, 2) for t in f.takeovers_s] for f in results}
    return {
        "bench": "soak",
        "figure": "total",
        "scenarios": len(results),
        "events": total("events"),
        "lost": total("lost"),
        "reordered": total("reordered"),
        "stale_applied": total("stale_applied"),
        "duplicates_published": total("duplicates_published"),
        "stale_published": total("stale_published"),
        "committed_twice": total("committed_twice"),
        "broken": [f.scenario for f in results if f.problems()],
        "takeovers_s": takeovers,
        "duration_s": round(seconds, 1),
    }


def main(argv: Sequence[str] = ()) -> int:
    events, names = _events(), _chosen()
    each = max(1, events // len(names))
    console.log(f"soak: {len(names)} scenarios × {each:,} events against services of its own")
    stack = FaultStack(ROOT / ".cache" / "blackbox" / "soak")
    results: list[Figures] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="blackbox-soak-") as logs:
        stack.start()
        try:
            for name in names:
                done = threading.Event()
                ticker = threading.Thread(target=_ticking, args=(name, done), daemon=True)
                ticker.start()
                try:
                    figures = SCENARIOS[name](stack, Path(logs), each)
                except Exception as exc:  # one scenario's harness failure: go on with the rest
                    console.print_exception()
                    figures = Figures(
                        scenario=name, notes={"error": f"{type(exc).__name__}: {exc}"}
                    )
                finally:
                    done.set()
                print(json.dumps({"bench": "soak", **json.loads(figures.json_line())}), flush=True)
                problems = figures.problems()
                console.log(
                    f"soak: {name} {'BROKEN: ' + '; '.join(problems) if problems else 'ok'}"
                )
                results.append(figures)
        finally:
            stack.stop()
    print(json.dumps(_total(results, time.monotonic() - started)), flush=True)
    return 1 if any(f.problems() for f in results) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
