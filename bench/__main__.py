"""Run every bench in sequence: ``python -m bench``, or some: ``python -m bench NAME...``.

Figures go to stdout as JSON lines, progress and timings to stderr. A bench that fails
is reported and the others still run; the exit status is 1 if any failed.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence

from bench import (
    analytics,
    backup,
    capture,
    concurrency,
    consumer_resume,
    cpu,
    imports,
    latency,
    recorder,
    redaction,
    relay,
    replay,
    replay_command,
    scaleout,
    sealing,
    views,
)
from bench import console as console_bench
from bench._common import console

BENCHES: dict[str, Callable[[Sequence[str]], None]] = {
    "imports": imports.main,
    "recorder": recorder.main,
    "capture": capture.main,
    "sealing": sealing.main,
    "redaction": redaction.main,
    "relay": relay.main,
    "views": views.main,
    "cpu": cpu.main,
    "consumer_resume": consumer_resume.main,
    "replay": replay.main,
    "replay_command": replay_command.main,
    "concurrency": concurrency.main,
    "latency": latency.main,
    "console": console_bench.main,
    "scaleout": scaleout.main,
    "backup": backup.main,
    "analytics": analytics.main,
}


def main(argv: Sequence[str] | None = None) -> int:
    names = list(sys.argv[1:] if argv is None else argv) or list(BENCHES)
    if unknown := [name for name in names if name not in BENCHES]:
        console.print(f"unknown bench {', '.join(unknown)}; the benches: {', '.join(BENCHES)}")
        return 2
    failed: list[str] = []
    for name in names:
        bench = BENCHES[name]
        started = time.perf_counter()
        try:
            bench([])
        except Exception:
            console.print_exception()
            failed.append(name)
        console.log(f"bench {name}: {time.perf_counter() - started:.1f}s")
    if failed:
        console.log(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
