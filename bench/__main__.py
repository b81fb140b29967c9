"""Run every bench in sequence: ``python -m bench``.

Figures go to stdout as JSON lines, progress and timings to stderr. A bench that fails
is reported and the others still run; the exit status is 1 if any failed.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence

from bench import (
    concurrency,
    consumer_resume,
    imports,
    recorder,
    redaction,
    relay,
    replay,
    sealing,
    views,
)
from bench._common import console

BENCHES: dict[str, Callable[[Sequence[str]], None]] = {
    "imports": imports.main,
    "recorder": recorder.main,
    "sealing": sealing.main,
    "redaction": redaction.main,
    "relay": relay.main,
    "views": views.main,
    "consumer_resume": consumer_resume.main,
    "replay": replay.main,
    "concurrency": concurrency.main,
}


def main() -> int:
    failed: list[str] = []
    for name, bench in BENCHES.items():
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
