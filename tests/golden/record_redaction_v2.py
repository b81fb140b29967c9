"""Records the golden history of a run redacted under redaction version 2.

    python -m tests.golden.record_redaction_v2 tests/golden/redaction/v2.avro

The archive sits in a folder of its own, out of the histories every reader of
``tests/golden/*.avro`` checks (the JVM consumer's figures among them). Run once, at
commit be361e0 (the last release whose default rules were version 2), with
the memory recorder: the archive is committed and must replay forever under version 2.
Its tool arguments hold values that version 2 and version 3 redact differently (an
image name with a density suffix, a bare order number that passes the card checks, a
percent-encoded credential name), so replaying it under any other version diverges.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from agent_blackbox.outbox import AgentRun, MemoryRecorder, Redactor, RunSnapshot
from agent_blackbox.replayer import write_archive

VALUES: dict[str, Any] = {
    "image": "logo@2x.png",
    "order": 4532015112830366,
    "query": "https://api.example.com/v1/items?api%5Fkey=Zq7vTb19Kx&q=1",
    "mail": "write to alice%40example.com",
}


def lookup(**values: Any) -> dict[str, Any]:
    """The tool: echoes what it was given, counted."""
    return {"fields": len(values)}


def agent(run: AgentRun, input: Any) -> Any:
    """Looks the values up with one tool call and returns how many it passed."""
    result = run.call("lookup", lookup, **input)
    return result["fields"]


def main(target: Path) -> None:
    recorder = MemoryRecorder(redaction=Redactor())
    recorder.record(agent, RunSnapshot(code_version="golden.1", input=VALUES), agent_id="golden")
    written = write_archive(target, recorder.events)
    print(f"wrote {written} events to {target}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
