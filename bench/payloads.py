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
   ``replay_ratio`` is default over none (target: at least 0.90), and
   ``replay_over_tool_loop`` default over the tool loop of ``bench.replay``, replayed
   in the same rounds (target: at least 0.25; or at least 5,000 events/s);
4. ``llm_over_tool_p50_ratio``: the default store's recorder p50 per LLM call at turns
   20-50 over that of a tool call with about 1 KB of arguments, recorded between the
   conversations on the same database (target: at most 1.5);
5. what padding a compressed body to its size bucket costs (a sealed body is padded so
   its size hides what compressed well, ``schemas._padding``), over the default
   store's compressed bodies: ``padding_bytes_pct``, the bytes added in per cent of
   the compressed bytes, and ``padding_us_per_body``, padding and unpadding one body.

    python -m bench.payloads [--turns 50] [--runs 6] [--repeat 5]
"""

from __future__ import annotations

import argparse
import random
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
from bench.replay import loop_agent

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
    """The agent's run, timing what each ``llm`` costs beyond the model's own time, by
    turn (1-based)."""

    def __init__(self, run: AgentRun, latencies: list[tuple[int, float]]) -> None:
        self._run, self._latencies = run, latencies
        self._turn = 0

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
        self._turn += 1
        self._latencies.append((self._turn, (time.perf_counter() - began - spent) * 1000))
        return answer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._run, name)


TOOL_ARGUMENT_WORDS = 170
"""About 1 KB of text: the tool call an LLM call is compared with."""
TOOL_CALLS = 50
LATE_TURNS = range(20, 51)
"""The turns of a 50-turn conversation whose LLM calls are compared with a tool call."""
LLM_OVER_TOOL_TARGET = 1.5


def tool_latencies(recorder: Recorder, calls: int, seed: int) -> tuple[list[float], str]:
    """What each of ``calls`` tool calls with about 1 KB of arguments costs the agent,
    in one run; and the run's id. Each call's text is new: the recorder keeps what it
    scanned lately, and a text sent again would cost it nothing."""
    rng = random.Random(seed)
    arguments = [docstring_prose(rng, TOOL_ARGUMENT_WORDS) for _ in range(calls)]
    latencies: list[float] = []

    def entry(run: AgentRun, input: Any) -> None:
        for i, argument in enumerate(arguments):
            began = time.perf_counter()
            run.call("lookup", _echo, {"query": argument, "page": i})
            latencies.append((time.perf_counter() - began) * 1000)

    run, _ = recorder.record(entry, RunSnapshot(code_version="bench", input={}), agent_id="tool")
    return latencies, run.run_id


def _echo(arguments: dict[str, Any]) -> dict[str, Any]:
    return {"found": len(arguments["query"]), "page": arguments["page"]}


def recorder_latencies(
    settings: Settings, turns: int, runs: int
) -> tuple[dict[str, list[tuple[int, float]]], list[float], list[str]]:
    """p50 material for none and default, alternating runs on the same database (by
    turn), and for 1 KB tool calls on the default store between them."""
    recorders = {
        store: Recorder.from_settings(Settings(**{**_fields(settings), **STORES[store]}))
        for store in ("none", "default")
    }
    latencies: dict[str, list[tuple[int, float]]] = {"none": [], "default": []}
    tools: list[float] = []
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
        calls, run_id = tool_latencies(recorders["default"], TOOL_CALLS, seed=i)
        tools += calls if i > 0 else []
        run_ids.append(run_id)
    for recorder in recorders.values():
        recorder.engine.dispose()
    return latencies, tools, run_ids


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
            agents = (
                [loop_agent] * len(store.runs)
                if name == TOOL_LOOP
                else _agents(turns, len(store.runs))
            )
            events = sum(len(run) for run in store.runs)
            began = time.perf_counter()
            for run, agent in zip(store.runs, agents, strict=True):
                report = replay_run(run, agent, blobs=store.recorder)
                if not report.passed:
                    raise SystemExit(f"{name}: replay diverged: {report.divergence}")
            best[name] = max(best[name], events / (time.perf_counter() - began))
    return best


TOOL_LOOP = "tool-loop"
"""The runs of ``bench.replay``'s tool loop, replayed beside the conversations."""
TOOL_LOOP_EVENTS = 100
REPLAY_TARGET = 5000.0
REPLAY_OVER_TOOL_LOOP_TARGET = 0.25


def tool_loop(runs: int) -> Store:
    """``runs`` runs of the tool loop, recorded into memory with the default store."""
    recorder = MemoryRecorder(settings=Settings(**STORES["default"]))  # type: ignore[arg-type]
    out: list[list[Envelope]] = []
    for _ in range(runs):
        recorder.events.clear()
        snapshot = RunSnapshot(code_version="bench", input={"events": TOOL_LOOP_EVENTS})
        recorder.record(loop_agent, snapshot, agent_id="loop")
        out.append(list(recorder.events))
    return Store(out, recorder)


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
        latencies, tools, run_ids = recorder_latencies(settings, args.turns, args.runs + 1)
    try:
        p50 = {
            store: statistics.median(v for _, v in values) for store, values in latencies.items()
        }
        for store, value in p50.items():
            emit(BENCH, "recorder_p50_ms", value, unit="ms", store=store, **labels)
        late = statistics.median(v for t, v in latencies["default"] if t in LATE_TURNS)
        tool = statistics.median(tools)
        turns = f"{LATE_TURNS.start}-{LATE_TURNS.stop - 1}"
        emit(BENCH, "recorder_p50_ms", late, unit="ms", store="default", at_turns=turns, **labels)
        emit(BENCH, "tool_call_1kb_p50_ms", tool, unit="ms", store="default", **labels)
        emit(
            BENCH,
            "llm_over_tool_p50_ratio",
            late / tool,
            unit="x",
            target=LLM_OVER_TOOL_TARGET,
            at_least=False,
            at_turns=turns,
            **labels,
        )
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
        pair[TOOL_LOOP] = tool_loop(args.runs)
        rates = replay_rates(pair, args.turns, args.repeat)
    for store, rate in rates.items():
        target = REPLAY_TARGET if store == "default" else None
        emit(
            BENCH,
            "replay_events_per_s",
            rate,
            unit="events/s",
            store=store,
            target=target,
            **labels,
        )
    emit(
        BENCH,
        "replay_over_tool_loop",
        rates["default"] / rates[TOOL_LOOP],
        unit="x",
        target=REPLAY_OVER_TOOL_LOOP_TARGET,
        **labels,
    )
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
