"""An agent process recording in group commit mode, for the crash test: it journals every
event it recorded (run, sequence, type) on stdout as the recorder returns, and is killed.

Two runs record at once:

- a background thread records without pause (reads, and an effect every ninth crossing)
  under a 20 ms / 16 events group, so the kill lands in the middle of its work;
- the main thread records three effects and then exactly 120 clock reads under a group
  that flushes only every 50 events, says ``blocked`` and waits: at the kill, its last 20
  reads are buffered, the 50 before them may still be in flight, and nothing else is
  unwritten.

    python _group_child.py DATABASE_URL
"""

from __future__ import annotations

import json
import sys
import threading

from sqlalchemy import create_engine

from agent_blackbox.outbox import GroupCommit, Recorder, Run, RunSnapshot

_print_lock = threading.Lock()


def journal(**line: object) -> None:
    with _print_lock:
        print(json.dumps(line), flush=True)


def effect(run: Run, n: int) -> None:
    run.effect("notify", lambda key: None, arguments={"n": n})
    journal(run=run.run_id, seq=run.last_sequence - 1, type="effect.intent")
    journal(run=run.run_id, seq=run.last_sequence, type="effect.receipt")


def read(run: Run, n: int) -> None:
    if n % 2:
        run.now()
        journal(run=run.run_id, seq=run.last_sequence, type="clock.read")
    else:
        run.call("lookup", lambda x: x, n)
        journal(run=run.run_id, seq=run.last_sequence, type="tool.call")


def busy(recorder: Recorder) -> None:
    n = 0
    while True:  # until the process is killed
        run = recorder.start_run(RunSnapshot("crash/1"), agent_id="busy")
        journal(run=run.run_id, seq=1, type="run.started")
        for _ in range(40):
            n += 1
            effect(run, n) if n % 9 == 0 else read(run, n)
        run.finish()
        journal(run=run.run_id, seq=run.last_sequence, type="run.finished")


def main(url: str) -> None:
    engine = create_engine(url, pool_size=4)
    busy_recorder = Recorder(engine, group_commit=GroupCommit(max_delay_ms=20, max_events=16))
    threading.Thread(target=busy, args=(busy_recorder,), daemon=True).start()
    recorder = Recorder(engine, group_commit=GroupCommit(max_delay_ms=600_000, max_events=50))
    run = recorder.start_run(RunSnapshot("crash/1"), agent_id="steady")
    journal(run=run.run_id, seq=1, type="run.started")
    for n in range(3):
        effect(run, n)
    for _ in range(120):
        run.now()
        journal(run=run.run_id, seq=run.last_sequence, type="clock.read")
    journal(blocked=run.run_id)
    sys.stdin.read()  # the test kills this process here


if __name__ == "__main__":
    main(sys.argv[1])
