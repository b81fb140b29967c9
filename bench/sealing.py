"""The cost of envelope encryption: sealing per event, and the recorder with it on and off.

Two recorders share one database in the same process: one plain, one encrypting every
run under its own data key (AES-256-GCM, wrapped by a key-encryption key generated for
the bench). Their calls are timed in alternating rounds, so both see the same machine.
Figures: the time to seal one tool-call body next to packing it plain, an output digest
keyed (HMAC-SHA256, for sensitive classes) next to plain SHA-256, and the recorder's
p50 and p99 per call with encryption off and on, with their ratio (target: at most 1.2).

    python -m bench.sealing [--events 2000] [--rounds 4]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence

from sqlalchemy import create_engine

from agent_blackbox.keystore import AesGcmSealer, DataKeyStore, LocalKeyProvider
from agent_blackbox.outbox import Recorder, RunSnapshot
from agent_blackbox.schemas import (
    DataKey,
    Digester,
    KeyedDigest,
    PayloadContext,
    PayloadPipeline,
    digest,
)
from bench._common import bench_settings, drop_runs, emit, percentile, progress, stage

BENCH = "sealing"
RATIO_TARGET = 1.2
BODY = {
    "tool": "lookup",
    "arguments_json": '{"args":[42],"kwargs":{"customer":"c-1042"}}',
    "result_json": '{"note":"' + "x" * 300 + '"}',
    "error": None,
    "latency_ms": 0.01,
}


def pack_cost(pipeline: PayloadPipeline, key: DataKey | None, *, n: int = 20_000) -> float:
    """Microseconds to encode and seal one tool-call body."""
    started = time.perf_counter()
    for i in range(n):
        pipeline.pack("tool.call", 1, BODY, PayloadContext("run", i + 1, "e", "t", data_key=key))
    return (time.perf_counter() - started) / n * 1e6


def digest_cost(take: Digester, *, n: int = 50_000) -> float:
    """Microseconds to take the output digest of one tool call."""
    output = {"result": {"note": "x" * 300, "id": 42}, "error": None}
    started = time.perf_counter()
    for _ in range(n):
        take(output)
    return (time.perf_counter() - started) / n * 1e6


def noop(value: int) -> int:
    return value


def timed_calls(recorder: Recorder, events: int, run_ids: list[str]) -> list[float]:
    """Milliseconds per ``run.call`` over ``events`` calls of one fresh run."""
    run = recorder.start_run(RunSnapshot(code_version="bench"), agent_id=BENCH)
    run_ids.append(run.run_id)
    latencies = []
    for i in range(events):
        before = time.perf_counter_ns()
        run.call("noop", noop, i)
        latencies.append((time.perf_counter_ns() - before) / 1e6)
    run.finish()
    return latencies


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2_000, help="timed calls per round")
    parser.add_argument("--rounds", type=int, default=4, help="alternating rounds of each")
    args = parser.parse_args(argv)
    store = DataKeyStore(LocalKeyProvider({"bench": os.urandom(32)}))
    key = DataKey("dk-bench", os.urandom(32))
    emit(BENCH, "pack_plain_us", pack_cost(PayloadPipeline(), None), unit="us")
    sealed = PayloadPipeline(sealer=AesGcmSealer())
    emit(BENCH, "pack_sealed_us", pack_cost(sealed, key), unit="us")
    emit(BENCH, "digest_sha256_us", digest_cost(digest), unit="us")
    emit(BENCH, "digest_hmac_us", digest_cost(KeyedDigest(os.urandom(32))), unit="us")
    settings = bench_settings(BENCH)
    engine = create_engine(settings.database_url, pool_size=4)
    plain = Recorder(engine, settings=settings)
    encrypted = Recorder(engine, settings=settings, keys=store)
    run_ids: list[str] = []
    latencies: dict[str, list[float]] = {"off": [], "on": []}
    try:
        with stage("recorder with encryption off and on"), progress() as bar:
            task = bar.add_task("alternating rounds", total=args.rounds * 2)
            for recorder in (plain, encrypted):  # warm-up: connections, caches
                timed_calls(recorder, 200, run_ids)
            for _ in range(args.rounds):
                for mode, recorder in (("off", plain), ("on", encrypted)):
                    latencies[mode] += timed_calls(recorder, args.events, run_ids)
                    bar.advance(task)
    finally:
        drop_runs(engine, run_ids)
        engine.dispose()
    p50 = {mode: percentile(values, 50) for mode, values in latencies.items()}
    for mode, values in latencies.items():
        emit(BENCH, "recorder_p50_ms", p50[mode], unit="ms", encryption=mode)
        emit(BENCH, "recorder_p99_ms", percentile(values, 99), unit="ms", encryption=mode)
    emit(
        BENCH,
        "recorder_p50_ratio",
        p50["on"] / p50["off"],
        unit="x",
        target=RATIO_TARGET,
        at_least=False,
    )


if __name__ == "__main__":
    main()
