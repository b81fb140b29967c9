"""What importing the agent-facing package costs: an agent process pays it at every start.

Each figure is the median of ``--runs`` fresh interpreters (after one that compiles the
bytecode, so the disk cache is warm and no ``.pyc`` is written while measuring):

- ``front_door_import_ms`` and ``outbox_import_ms``: ``python -X importtime -c "import
  agent_blackbox"`` (and ``agent_blackbox.outbox``), the cumulative time importtime
  reports for the package: what the lazy front door costs before a name is used
  (target: under 150 ms each);
- ``agent_import_ms``: wall time of ``import agent_blackbox; from agent_blackbox import
  Recorder, tool, instrument`` in a fresh process, what an agent that records through
  the Postgres recorder and captures its SDK clients imports; next to it
  ``sqlalchemy_floor_ms`` and ``httpx2_floor_ms``, the wall times of ``import
  sqlalchemy`` and ``import httpx2`` alone in the same run (a recorder that writes to
  Postgres cannot cost less than its database library, nor a capture of the SDKs' HTTP
  transport less than their HTTP library), and ``agent_import_over_floors_ms``, what
  the agent import costs beyond both: the project's own modules and what they need;
- ``recorder_import_ms``: the same for ``from agent_blackbox import Recorder,
  RunSnapshot``; ``memory_recorder_import_ms`` for ``from agent_blackbox.testing import
  MemoryRecorder`` (agent unit tests).

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
_CUMULATIVE = re.compile(r"import time:\s+\d+ \|\s+(\d+) \| (\S+)$")


def _python(code: str, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *options, "-c", code], capture_output=True, text=True, check=True
    )


def importtime_ms(module: str) -> float:
    """The cumulative import time of ``module`` in a fresh process."""
    report = _python(f"import {module}", "-X", "importtime").stderr
    found = [
        int(m.group(1))
        for m in map(_CUMULATIVE.search, report.splitlines())
        if m and m.group(2) == module
    ]
    if not found:
        raise RuntimeError(f"importtime reported no line for {module}")
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
    packages = {
        "front_door_import_ms": "agent_blackbox",
        "outbox_import_ms": "agent_blackbox.outbox",
    }
    statements = {
        "agent_import_ms": (
            "import agent_blackbox\nfrom agent_blackbox import Recorder, tool, instrument"
        ),
        "recorder_import_ms": "from agent_blackbox import Recorder, RunSnapshot",
        "memory_recorder_import_ms": "from agent_blackbox.testing import MemoryRecorder",
        "sqlalchemy_floor_ms": "import sqlalchemy",
        "httpx2_floor_ms": "import httpx2",
    }
    with stage("compile once"):
        for module in packages.values():
            importtime_ms(module)
        for statement in statements.values():
            wall_ms(statement)
    with stage(f"{args.runs} fresh interpreters per figure"):
        cumulative = {
            figure: [importtime_ms(module) for _ in range(args.runs)]
            for figure, module in packages.items()
        }
        walls = {
            figure: [wall_ms(statement) for _ in range(args.runs)]
            for figure, statement in statements.items()
        }
    for figure, values in cumulative.items():
        _median(figure, values, args.runs, target=TARGET_MS)
    for figure, values in walls.items():
        _median(figure, values, args.runs, target=None)
    floors = statistics.median(walls["sqlalchemy_floor_ms"]) + statistics.median(
        walls["httpx2_floor_ms"]
    )
    over = statistics.median(walls["agent_import_ms"]) - floors
    emit(BENCH, "agent_import_over_floors_ms", over, unit="ms", target=None, runs=args.runs)


def _median(figure: str, values: list[float], runs: int, *, target: float | None) -> None:
    emit(
        BENCH,
        figure,
        statistics.median(values),
        unit="ms",
        target=target,
        at_least=False,
        runs=runs,
    )


if __name__ == "__main__":
    main()
