"""Compressed payloads: bytes stored, recorder latency and replay throughput of a
50-turn conversation agent, with and without compression.

The agent (``bench._conversation``) is a support agent whose every LLM call sends the
whole conversation so far, in the OpenAI and the Anthropic shape (half the runs each),
with English sentences the shared dictionary never saw. Three things are measured, each
against the uncompressed store (``payload_compression=none``, every request whole)
measured in the same run:

1. ``llm_bytes_per_body``, the mean stored payload of an ``llm.call``, for each store:
   none, deflate, zstd without and with the shared dictionary, requests by reference
   alone, and the default (by reference, zstd with the dictionary);
   ``llm_bytes_reduction`` is none over default (target: at least 5);
2. ``recorder_p50_ms``: what one ``run.llm`` costs the agent through the Postgres
   recorder, the model's own time taken out, p50 over every call; runs of the two
   stores alternate, so both see the same database. ``recorder_p50_ratio`` is default
   over none (target: at most 1.10);
3. ``replay_events_per_s``: the recorded runs re-driven in process (``replay_run``:
   every body opened, every request rebuilt), the best of ``--repeat``;
   ``replay_ratio`` is default over none (target: at least 0.90);
4. what padding a compressed body to its size bucket costs (a sealed body is padded so
   its size hides what compressed well, ``schemas._padding``), over the default
   store's compressed bodies: ``padding_bytes_pct``, the bytes added in per cent of
   the compressed bytes, and ``padding_us_per_body``, padding and unpadding one body.

    python -m bench.payloads [--turns 50] [--runs 6] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent_blackbox.outbox import AgentRun, MemoryRecorder, Recorder, RunSnapshot
from agent_blackbox.replayer import replay_run
from agent_blackbox.schemas import Envelope, EventType, Settings, split_encoding
from agent_blackbox.schemas._padding import pad, unpad
from bench._common import bench_settings, drop_runs, emit, stage
from bench._conversation import conversation_agent, docstring_prose

BENCH = "payloads"
REDUCTION_TARGET = 5.0
RECORDER_RATIO_TARGET = 1.10
REPLAY_RATIO_TARGET = 0.90

STORES: dict[str, dict[str, str]] = {
    "none": {"payload_compression": "none", "llm_request_references": "off"},
    "deflate": {"payload_compression": "deflate", "llm_request_references": "off"},
    "zstd-nodict": {"payload_compression": "zstd-nodict", "llm_request_references": "off"},
    "zstd": {"payload_compression": "zstd", "llm_request_references": "off"},
    "references": {"payload_compression": "none", "llm_request_references": "on"},
    "default": {"payload_compression": "zstd", "llm_request_references": "on"},
}
"""Each store measured: its settings."""


def _provider(index: int) -> str:
    return "anthropic" if index % 2 else "openai"


def _agents(turns: int, runs: int) -> list[Callable[[AgentRun, Any], Any]]:
    return [conversation_agent(turns, docstring_prose, provider=_provider(i)) for i in range(runs)]


@dataclass(frozen=True, slots=True)
class Store:
    """Runs recorded into memory with one store's settings."""

    runs: list[list[Envelope]]
    recorder: MemoryRecorder
    """Holds the bodies stored out of line (over the blob threshold)."""

    def stored_bytes(self, envelope: Envelope) -> int:
        """The bytes kept for ``envelope``'s body, in line or in the blob store."""
        if envelope.payload is not None:
            return len(envelope.payload)
        return len(self.recorder.read(envelope.payload_ref or ""))

    def mean_bytes(self, *, llm_only: bool) -> float:
        return statistics.fmean(
            self.stored_bytes(e)
            for run in self.runs
            for e in run
            if not llm_only or e.event_type == EventType.LLM_CALL
        )


def recorded(store: str, turns: int, runs: int) -> Store:
    """The runs recorded into memory with the store's settings."""
    recorder = MemoryRecorder(settings=Settings(**STORES[store]))  # type: ignore[arg-type]
    out: list[list[Envelope]] = []
    for i, agent in enumerate(_agents(turns, runs)):
        recorder.events.clear()
        snapshot = RunSnapshot(code_version="bench", input={"seed": i})
        recorder.record(agent, snapshot, agent_id=f"support-{_provider(i)}")
        out.append(list(recorder.events))
    return Store(out, recorder)


def padding_cost(store: Store) -> tuple[float, float]:
    """Padding ``store``'s compressed bodies to their size buckets, as the recorder does
    before sealing one: the bytes added (per cent of the compressed bytes) and the
    microseconds to pad and unpad a body."""
    bodies = [
        e.payload
        for run in store.runs
        for e in run
        if e.payload is not None and split_encoding(e.payload_encoding)[0] is not None
    ]
    began = time.perf_counter()
    padded = [pad(body) for body in bodies]
    for body in padded:
        unpad(body, "bench")
    seconds = time.perf_counter() - began
    compressed = sum(map(len, bodies))
    added = sum(map(len, padded)) - compressed
    return 100 * added / compressed, 1e6 * seconds / len(bodies)


class _Timed:
    """The agent's run, timing what each ``llm`` costs beyond the model's own time."""

    def __init__(self, run: AgentRun, latencies: list[float]) -> None:
        self._run, self._latencies = run, latencies

    def llm(
        self,
        send: Callable[[Mapping[str, Any]], Mapping[str, Any]],
        request: Mapping[str, Any],
        **options: Any,
    ) -> Mapping[str, Any]:
        spent = 0.0

        def timed(request: Mapping[str, Any]) -> Mapping[str, Any]:
            nonlocal spent
            began = time.perf_counter()
            try:
                return send(request)
            finally:
                spent = time.perf_counter() - began

        began = time.perf_counter()
        answer = self._run.llm(timed, request, **options)
        self._latencies.append((time.perf_counter() - began - spent) * 1000)
        return answer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._run, name)


def recorder_latencies(
    settings: Settings, turns: int, runs: int
) -> tuple[dict[str, list[float]], list[str]]:
    """p50 material for none and default, alternating runs on the same database."""
    recorders = {
        store: Recorder.from_settings(Settings(**{**_fields(settings), **STORES[store]}))
        for store in ("none", "default")
    }
    latencies: dict[str, list[float]] = {"none": [], "default": []}
    run_ids: list[str] = []
    agents = _agents(turns, runs)
    for i, agent in enumerate(agents):
        for store in ("none", "default") if i % 2 == 0 else ("default", "none"):
            timed = latencies[store] if i > 0 else []  # the first pair warms up

            def entry(run: AgentRun, input: Any, agent: Any = agent, timed: Any = timed) -> Any:
                return agent(_Timed(run, timed), input)

            snapshot = RunSnapshot(code_version="bench", input={"seed": i})
            run, _ = recorders[store].record(entry, snapshot, agent_id="support")
            run_ids.append(run.run_id)
    for recorder in recorders.values():
        recorder.engine.dispose()
    return latencies, run_ids


def _fields(settings: Settings) -> dict[str, Any]:
    return {name: getattr(settings, name) for name in settings.__dataclass_fields__}


def replay_rates(stores: Mapping[str, Store], turns: int, repeat: int) -> dict[str, float]:
    """Events per second of replaying each store's runs in process, the best of
    ``repeat`` rounds; the stores take turns within a round, so that both see the same
    machine."""
    best = dict.fromkeys(stores, 0.0)
    for round_ in range(repeat):
        for name in sorted(stores, reverse=round_ % 2 == 1):
            store = stores[name]
            agents = _agents(turns, len(store.runs))
            events = sum(len(run) for run in store.runs)
            began = time.perf_counter()
            for run, agent in zip(store.runs, agents, strict=True):
                report = replay_run(run, agent, blobs=store.recorder)
                if not report.passed:
                    raise SystemExit(f"{name}: replay diverged: {report.divergence}")
            best[name] = max(best[name], events / (time.perf_counter() - began))
    return best


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=50, help="turns of each conversation")
    parser.add_argument("--runs", type=int, default=6, help="conversations per store")
    parser.add_argument("--repeat", type=int, default=5, help="replays of each store")
    args = parser.parse_args(argv)
    labels = {"turns": args.turns, "runs": args.runs}

    with stage("recording into memory"):
        stored = {store: recorded(store, args.turns, args.runs) for store in STORES}
    sizes = {name: store.mean_bytes(llm_only=True) for name, store in stored.items()}
    for name, size in sizes.items():
        emit(BENCH, "llm_bytes_per_body", size, unit="bytes", store=name, **labels)
    for name in ("none", "default"):
        every = stored[name].mean_bytes(llm_only=False)
        emit(BENCH, "bytes_per_event", every, unit="bytes", store=name, **labels)
    reduction = sizes["none"] / sizes["default"]
    emit(BENCH, "llm_bytes_reduction", reduction, unit="x", target=REDUCTION_TARGET, **labels)
    added, micros = padding_cost(stored["default"])
    emit(BENCH, "padding_bytes_pct", added, unit="%", store="default", **labels)
    emit(BENCH, "padding_us_per_body", micros, unit="us", store="default", **labels)

    settings = bench_settings(BENCH)
    with stage("recording through Postgres"):
        latencies, run_ids = recorder_latencies(settings, args.turns, args.runs + 1)
    try:
        p50 = {store: statistics.median(values) for store, values in latencies.items()}
        for store, value in p50.items():
            emit(BENCH, "recorder_p50_ms", value, unit="ms", store=store, **labels)
        emit(
            BENCH,
            "recorder_p50_ratio",
            p50["default"] / p50["none"],
            unit="x",
            target=RECORDER_RATIO_TARGET,
            at_least=False,
            **labels,
        )
    finally:
        engine = Recorder.from_settings(settings).engine
        drop_runs(engine, run_ids)
        engine.dispose()

    with stage("replaying"):
        pair = {name: stored[name] for name in ("none", "default")}
        rates = replay_rates(pair, args.turns, args.repeat)
    for store, rate in rates.items():
        emit(BENCH, "replay_events_per_s", rate, unit="events/s", store=store, **labels)
    emit(
        BENCH,
        "replay_ratio",
        rates["default"] / rates["none"],
        unit="x",
        target=REPLAY_RATIO_TARGET,
        **labels,
    )


if __name__ == "__main__":
    main()
