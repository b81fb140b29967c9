"""What importing the agent-facing package costs: an agent process pays it at every start.

Each figure is the median of ``--runs`` fresh interpreters (after one that compiles the
bytecode, so the disk cache is warm and no ``.pyc`` is written while measuring):

- ``outbox_import_ms``: ``python -X importtime -c "import agent_blackbox.outbox"``, the
  cumulative time importtime reports for the package (target: under 150 ms);
- ``recorder_import_ms``: wall time of ``from agent_blackbox.outbox import Recorder,
  RunSnapshot`` in a fresh process, next to ``sqlalchemy_floor_ms``, the wall time of
  ``import sqlalchemy`` alone in the same run: a recorder that writes to Postgres cannot
  cost less than its database library;
- ``memory_recorder_import_ms``: the same for ``MemoryRecorder`` (agent unit tests).

Each run also checks that none of the pipeline's machinery (Kafka's client, alembic,
prometheus-client, rich) was imported, and fails if one was.

    python -m bench.imports [--runs 7]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
from collections.abc import Sequence

from bench._common import emit, stage

BENCH = "imports"
TARGET_MS = 150.0
FORBIDDEN = ("confluent_kafka", "alembic", "prometheus_client", "rich")
_CUMULATIVE = re.compile(r"import time:\s+\d+ \|\s+(\d+) \| agent_blackbox\.outbox$")


def _python(code: str, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *options, "-c", code], capture_output=True, text=True, check=True
    )


def importtime_ms() -> float:
    """The cumulative import time of ``agent_blackbox.outbox`` in a fresh process."""
    report = _python("import agent_blackbox.outbox", "-X", "importtime").stderr
    found = [int(m.group(1)) for m in map(_CUMULATIVE.search, report.splitlines()) if m]
    if not found:
        raise RuntimeError("importtime reported no line for agent_blackbox.outbox")
    return found[-1] / 1000.0


def wall_ms(statement: str) -> float:
    """Wall time of ``statement`` in a fresh process, checking what it imported."""
    code = (
        "import sys, time\n"
        "started = time.perf_counter()\n"
        f"{statement}\n"
        "took = time.perf_counter() - started\n"
        f"loaded = [m for m in {FORBIDDEN!r} if m in sys.modules]\n"
        "print(took * 1000.0, ','.join(loaded))\n"
    )
    took, _, loaded = _python(code).stdout.strip().partition(" ")
    if loaded and "sqlalchemy" not in statement:
        raise RuntimeError(f"{statement!r} imported {loaded}")
    return float(took)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args(argv)
    statements = {
        "recorder_import_ms": "from agent_blackbox.outbox import Recorder, RunSnapshot",
        "memory_recorder_import_ms": "from agent_blackbox.outbox import MemoryRecorder",
        "sqlalchemy_floor_ms": "import sqlalchemy",
    }
    with stage("compile once"):
        importtime_ms()
        for statement in statements.values():
            wall_ms(statement)
    with stage(f"{args.runs} fresh interpreters per figure"):
        outbox = [importtime_ms() for _ in range(args.runs)]
        walls = {
            figure: [wall_ms(statement) for _ in range(args.runs)]
            for figure, statement in statements.items()
        }
    emit(
        BENCH,
        "outbox_import_ms",
        statistics.median(outbox),
        unit="ms",
        target=TARGET_MS,
        at_least=False,
        runs=args.runs,
    )
    for figure, values in walls.items():
        emit(BENCH, figure, statistics.median(values), unit="ms", runs=args.runs)


if __name__ == "__main__":
    main()
