"""How the shared zstd dictionary ``schemas/dictionaries/payload-d1.zdict`` was made.

Bodies are what the recorder stores before compressing: runs of the conversation agent
(``bench._conversation``, OpenAI and Anthropic shapes, invented words only, so that the
dictionary holds the structure every body repeats and no one's text) recorded with
compression off and requests stored by reference, as the recorder stores them by
default. The samples are every payload of those runs; zstd's trainer (COVER) picks the
dictionary from them.

A dictionary in use never changes: payloads name it by number. Running this again
writes a file for review; shipping a new one means a new number in
``schemas/_compression.py``, with the old one kept.

    python -m bench.dictionary [--out payload-dN.zdict] [--id N] [--runs 60]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import zstandard

from agent_blackbox.outbox import MemoryRecorder, RunSnapshot
from agent_blackbox.schemas import Settings
from bench._common import console
from bench._conversation import conversation_agent, invented_prose

DICTIONARY_BYTES = 32 * 1024


def samples(runs: int) -> list[bytes]:
    """The payloads of ``runs`` conversations, half in each provider's shape."""
    recorder = MemoryRecorder(settings=Settings(payload_compression="none"))
    for i in range(runs):
        provider = "anthropic" if i % 2 else "openai"
        agent = conversation_agent(10 + i % 30, invented_prose, provider=provider)
        snapshot = RunSnapshot(code_version="dictionary", input={"seed": 1000 + i})
        recorder.record(agent, snapshot, agent_id=f"support-{provider}")
    return [e.payload for e in recorder.events if e.payload is not None]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("payload-d1.zdict"))
    parser.add_argument("--id", type=int, default=1)
    parser.add_argument("--runs", type=int, default=60)
    args = parser.parse_args(argv)
    bodies = samples(args.runs)
    console.print(f"{len(bodies)} payloads, {sum(map(len, bodies))} bytes")
    trained = zstandard.train_dictionary(
        DICTIONARY_BYTES, bodies, dict_id=args.id, level=3, k=200, d=8, threads=-1
    )
    args.out.write_bytes(trained.as_bytes())
    console.print(f"wrote {args.out} ({len(trained.as_bytes())} bytes, id {trained.dict_id()})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
