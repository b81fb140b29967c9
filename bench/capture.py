"""Capture overhead: what recording one model call at the HTTP transport adds to the raw
``openai`` SDK, beside the SDK-level capture it replaced, against the same local server.

Five variants make the same ``chat.completions.create`` calls, interleaved in one
process (rounds of a few calls each, the order rotated every round, the first round of
each kind of call left out as warm-up):

- ``raw``: the SDK with nothing recorded, outside any run (the floor);
- ``transport`` on the ``memory`` and on the ``postgres`` recorder: a client from
  ``agent_blackbox.capture_openai`` inside a run in force (one run per round);
- ``sdk`` on both recorders: the capture shipped before the transport (see
  ``bench._sdk_capture``, the previous implementation kept for this comparison).

The ``postgres`` recorder is the durable one (one transaction per event, no group
commit) on a database of its own, created for the run and dropped after it. The server
(``bench._fake_llm``) runs in a child process and answers at once: a completion in one
write, a stream of ``--chunks`` events in one write, or, for ``stream_paced``, the same
events ``--chunk-delay-ms`` apart, so that a capture holding the stream back shows in the
time to the first chunk. Each call is made sync and async, with a short request and a
grown multi-turn one (~40 KB, ``request_kb`` on each figure).

Per variant and kind of call: the latency p50 and p99 (to the last chunk for a stream,
the stream closed), the time to the first chunk of a stream (p50, p99), and the CPU time
of the calling thread per call and to the first chunk (means: on a shared machine the
wall-clock figures carry the other tenants' load, the CPU ones much less); for a
capture, each also as ``added_*``: its figure minus the raw SDK's. The added time to the
first chunk has the issue's target: within 5 ms of the raw client. Each line names the
machine (cores, CPU model); a last ``summary`` line gives the transport's worst added
time to the first chunk (p50 against the target, p99 and each request size beside it),
each cell's added p50 and CPU, and the load average.

Recording costs mostly the recorder's own work on the request before it is sent (the
redaction scan, canonical JSON and its digest: about 3 ms of CPU for 40 KB here) and on
the answer after it came; a grown request also costs the SDK itself tens of milliseconds.

    python -m bench.capture [--calls 40] [--paced-calls 20] [--chunks 10]
                            [--chunk-delay-ms 2]

The defaults (61 s on this project's 2-core machine while other work kept its load
average near 7; 20 s of it CPU) come from ``CAPTURE_CALLS``, ``CAPTURE_PACED_CALLS``,
``CAPTURE_CHUNKS`` and ``CAPTURE_CHUNK_DELAY_MS`` when set, which is how ``python -m
bench`` scales it up.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from functools import cache
from typing import Any

import openai
from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import create_async_engine

import agent_blackbox as bb
from agent_blackbox.keystore import DataKeyStore
from agent_blackbox.outbox import (
    AsyncMemoryRecorder,
    AsyncRecorder,
    MemoryRecorder,
    Recorder,
    RunSnapshot,
)
from agent_blackbox.schemas import Settings
from bench import _sdk_capture
from bench._capture_peers import run_peers
from bench._common import console, emit, own_database, percentile, stage
from bench._conversation import TOOLS, docstring_prose
from bench._fake_llm import FakeLLM

BENCH = "capture"
TTFC_TARGET_MS = 5.0
BATCH = 10
"""Calls a variant makes in one round (and one run)."""
WARMUP = 3
"""Calls of each variant before each kind of call is measured (not counted)."""
GROWN_SHARE = 3
"""A grown request is measured on a third as many calls (each costs the SDK more)."""
GROWN_BYTES = 40_000
PACE_HEADER = {"x-bench-pace": "1"}
"""Asks the fake server for a paced stream; a header, so it is never recorded."""
SNAPSHOT = RunSnapshot(code_version="bench")
AGENT = "bench-capture"

VARIANTS: tuple[tuple[str, str], ...] = (
    ("raw", "none"),
    ("transport", "memory"),
    ("transport", "postgres"),
    ("sdk", "memory"),
    ("sdk", "postgres"),
)
"""Each variant as (capture, recorder)."""


def variant_name(capture: str, recorder: str) -> str:
    return capture if recorder == "none" else f"{capture}-{recorder}"


@dataclass(frozen=True, slots=True)
class Shape:
    """One kind of call: sync or async, whole or streamed, short or grown request."""

    mode: str
    call: str
    size: str

    @property
    def stream(self) -> bool:
        return self.call != "create"

    @property
    def key(self) -> str:
        return f"{self.mode}/{self.call}/{self.size}"

    def request(self) -> dict[str, Any]:
        """The keyword arguments of ``chat.completions.create``."""
        extra: dict[str, Any] = {"stream": True} if self.stream else {}
        if self.call == "stream_paced":
            extra["extra_headers"] = PACE_HEADER
        return {**conversation(self.size), **extra}


SHAPES = tuple(
    Shape(mode, call, size)
    for mode in ("sync", "async")
    for call, size in (
        ("create", "short"),
        ("create", "grown"),
        ("stream", "short"),
        ("stream_paced", "short"),
        ("stream_paced", "grown"),
    )
)
"""What is measured: a grown request costs the SDK itself tens of milliseconds (it walks
every message), so it is streamed paced only, where the time to the first chunk is."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One call as the agent saw it."""

    total_ms: float
    first_ms: float | None
    """Time to the first chunk of a stream."""
    cpu_ms: float
    """CPU time of the calling thread."""
    first_cpu_ms: float | None
    """CPU time of the calling thread to the first chunk of a stream: what the time to
    the first chunk costs the agent's process, whatever else runs on the machine."""
    chunks: int
    """Chunks of a stream the agent iterated (0 for a whole answer)."""


Samples = dict[tuple[str, str], list[Sample]]
"""Samples by (shape key, variant name)."""


# What is sent ------------------------------------------------------------------------


@cache
def conversation(size: str) -> dict[str, Any]:
    """A request body: a short question, or a support conversation grown over many turns
    to about :data:`GROWN_BYTES` of JSON (English the compression dictionary never saw)."""
    rng = random.Random(7)
    if size == "short":
        messages = [
            {"role": "system", "content": "You are a support agent. Answer briefly."},
            {"role": "user", "content": "Where is my order A-48213? It was due on Monday."},
        ]
        return {"model": "gpt-4.1-mini", "messages": messages}
    system = "You are a support agent. " + docstring_prose(rng, 400)
    messages = [{"role": "system", "content": system}]
    while len(json.dumps(messages)) < GROWN_BYTES:
        for role, words in (("user", (60, 200)), ("assistant", (150, 400))):
            messages.append({"role": role, "content": docstring_prose(rng, rng.randint(*words))})
    messages.append({"role": "user", "content": "And can you refund the second item?"})
    tools = [{"type": "function", "function": t} for t in TOOLS]
    return {"model": "gpt-4.1-mini", "temperature": 0.2, "messages": messages, "tools": tools}


def request_kb(size: str) -> float:
    return round(len(json.dumps(conversation(size))) / 1024, 1)


# One call ------------------------------------------------------------------------------


def _sample(began: int, cpu: int, first: tuple[int, int] | None, chunks: int) -> Sample:
    now, cpu_now = time.perf_counter_ns(), time.thread_time_ns()
    first_ms = (first[0] - began) / 1e6 if first else None
    first_cpu_ms = (first[1] - cpu) / 1e6 if first else None
    return Sample((now - began) / 1e6, first_ms, (cpu_now - cpu) / 1e6, first_cpu_ms, chunks)


def call_sync(client: Any, request: Mapping[str, Any]) -> Sample:
    """One call of a sync client; a stream iterated to its end and closed."""
    cpu, began = time.thread_time_ns(), time.perf_counter_ns()
    answer = client.chat.completions.create(**request)
    if not request.get("stream"):
        return _sample(began, cpu, None, 0)
    first, chunks = None, 0
    for _ in answer:
        first = first or (time.perf_counter_ns(), time.thread_time_ns())
        chunks += 1
    answer.close()
    return _sample(began, cpu, first, chunks)


async def call_async(client: Any, request: Mapping[str, Any]) -> Sample:
    """:func:`call_sync` for an async client."""
    cpu, began = time.thread_time_ns(), time.perf_counter_ns()
    answer = await client.chat.completions.create(**request)
    if not request.get("stream"):
        return _sample(began, cpu, None, 0)
    first, chunks = None, 0
    async for _ in answer:
        first = first or (time.perf_counter_ns(), time.thread_time_ns())
        chunks += 1
    await answer.close()
    return _sample(began, cpu, first, chunks)


# The variants ----------------------------------------------------------------------------


class SyncVariant:
    """One variant's sync client, and a run to call it in for each round.

    Args:
        capture: ``raw``, ``transport`` or ``sdk``.
        recorder: the recorder of its runs (None for ``raw``).
        base_url: the fake server's.
    """

    def __init__(
        self, capture: str, recorder: Recorder | MemoryRecorder | None, base_url: str
    ) -> None:
        self.capture, self.recorder = capture, recorder
        self.client = openai.OpenAI(base_url=base_url, api_key="bench", max_retries=0)
        if capture == "transport":
            self.client = bb.capture_openai(self.client)
        self.run_ids: list[str] = []

    @contextmanager
    def round(self) -> Iterator[Any]:
        """The client to call for one round: in a run of its own when it records."""
        if self.recorder is None:
            yield self.client
            return
        with self.recorder.start_run(SNAPSHOT, agent_id=AGENT) as run:
            if self.capture == "sdk":
                yield _sdk_capture.CapturedOpenAI(self.client, run)
            else:
                yield self.client
        self.run_ids.append(run.run_id)
        _forget(self.recorder)


class AsyncVariant:
    """The async twin of :class:`SyncVariant`."""

    def __init__(
        self, capture: str, recorder: AsyncRecorder | AsyncMemoryRecorder | None, base_url: str
    ) -> None:
        self.capture, self.recorder = capture, recorder
        self.client = openai.AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0)
        if capture == "transport":
            self.client = bb.capture_openai(self.client)
        self.run_ids: list[str] = []

    @asynccontextmanager
    async def round(self) -> AsyncIterator[Any]:
        if self.recorder is None:
            yield self.client
            return
        async with await self.recorder.start_run(SNAPSHOT, agent_id=AGENT) as run:
            if self.capture == "sdk":
                yield _sdk_capture.CapturedAsyncOpenAI(self.client, run)
            else:
                yield self.client
        self.run_ids.append(run.run_id)
        _forget(self.recorder)


def _forget(recorder: Any) -> None:
    """A memory recorder keeps every envelope; the bench needs none of them."""
    if isinstance(recorder, MemoryRecorder | AsyncMemoryRecorder):
        recorder.events.clear()
        recorder.blobs.clear()


# Measuring ---------------------------------------------------------------------------


def _rotated(names: Sequence[str], turn: int) -> list[str]:
    cut = turn % len(names)
    return [*names[cut:], *names[:cut]]


def measure_sync(
    variants: Mapping[str, SyncVariant], shape: Shape, *, rounds: int, samples: Samples
) -> None:
    """``rounds`` rounds of :data:`BATCH` calls of each variant, after one of
    :data:`WARMUP` calls; each round in a run of its own, the variants' order rotated."""
    request = shape.request()
    for turn in range(rounds + 1):
        for name in _rotated(list(variants), turn):
            with variants[name].round() as client:
                got = [call_sync(client, request) for _ in range(BATCH if turn else WARMUP)]
            if turn:
                samples[shape.key, name] += got


async def measure_async(
    variants: Mapping[str, AsyncVariant], shape: Shape, *, rounds: int, samples: Samples
) -> None:
    """The async twin of :func:`measure_sync`."""
    request = shape.request()
    for turn in range(rounds + 1):
        for name in _rotated(list(variants), turn):
            async with variants[name].round() as client:
                got = [await call_async(client, request) for _ in range(BATCH if turn else WARMUP)]
            if turn:
                samples[shape.key, name] += got


def rounds_of(shape: Shape, *, calls: int, paced_calls: int) -> int:
    """Rounds that make at least the calls asked for of each variant."""
    wanted = paced_calls if shape.call == "stream_paced" else calls
    if shape.size == "grown":
        wanted //= GROWN_SHARE
    return max(1, -(-wanted // BATCH))


# Figures ---------------------------------------------------------------------------------


@cache
def machine() -> dict[str, int | str]:
    """The labels every figure carries: cores and CPU model."""
    model = "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            model = next((ln.split(":", 1)[1].strip() for ln in info if "model name" in ln), model)
    except OSError:
        pass  # not Linux
    return {"cores": os.cpu_count() or 0, "cpu": model}


@dataclass(frozen=True, slots=True)
class Cell:
    """The figures of one variant on one kind of call."""

    p50: float
    p99: float
    cpu: float
    first_p50: float | None
    first_p99: float | None
    first_cpu: float | None

    @classmethod
    def of(cls, samples: Sequence[Sample]) -> Cell:
        totals = [s.total_ms for s in samples]
        firsts = [s.first_ms for s in samples if s.first_ms is not None]
        first_cpus = [s.first_cpu_ms for s in samples if s.first_cpu_ms is not None]
        return cls(
            percentile(totals, 50),
            percentile(totals, 99),
            statistics.fmean(s.cpu_ms for s in samples),
            percentile(firsts, 50) if firsts else None,
            percentile(firsts, 99) if firsts else None,
            statistics.fmean(first_cpus) if first_cpus else None,
        )

    def minus(self, floor: Cell) -> Cell:
        def less(mine: float | None, theirs: float | None) -> float | None:
            return None if mine is None or theirs is None else mine - theirs

        return Cell(
            self.p50 - floor.p50,
            self.p99 - floor.p99,
            self.cpu - floor.cpu,
            less(self.first_p50, floor.first_p50),
            less(self.first_p99, floor.first_p99),
            less(self.first_cpu, floor.first_cpu),
        )


def _emit_cell(cell: Cell, *, added: bool, labels: Mapping[str, Any]) -> None:
    prefix = "added_" if added else ""
    emit(BENCH, f"{prefix}p50_ms", cell.p50, unit="ms", **labels)
    emit(BENCH, f"{prefix}p99_ms", cell.p99, unit="ms", **labels)
    emit(BENCH, f"{prefix}cpu_ms_per_call", cell.cpu, unit="ms", **labels)
    target = TTFC_TARGET_MS if added else None
    for q, value in (("p50", cell.first_p50), ("p99", cell.first_p99)):
        if value is not None:
            name = f"first_chunk_{prefix}{q}_ms"
            emit(BENCH, name, value, unit="ms", target=target, at_least=False, **labels)
    if cell.first_cpu is not None:
        emit(BENCH, f"first_chunk_{prefix}cpu_ms", cell.first_cpu, unit="ms", **labels)


def report(samples: Samples, shapes: Sequence[Shape]) -> dict[str, dict[str, Cell]]:
    """Print each cell's figures; the added cells, by shape key and variant name."""
    added: dict[str, dict[str, Cell]] = defaultdict(dict)
    for shape in shapes:
        floor = Cell.of(samples[shape.key, "raw"])
        for capture, recorder in VARIANTS:
            name = variant_name(capture, recorder)
            found = samples.get((shape.key, name))
            if not found:
                continue
            labels: dict[str, int | str] = {
                "mode": shape.mode,
                "call": shape.call,
                "size": shape.size,
                "request_kb": str(request_kb(shape.size)),
                "capture": capture,
                "recorder": recorder,
                "calls": len(found),
                **machine(),
            }
            cell = Cell.of(found)
            _emit_cell(cell, added=False, labels=labels)
            if name != "raw":
                added[shape.key][name] = cell.minus(floor)
                _emit_cell(added[shape.key][name], added=True, labels=labels)
    return added


def _worst_ttfc(added: Mapping[str, Mapping[str, Cell]], size: str, q: str) -> float | None:
    """The transport's largest added time to the first chunk on streams of ``size``."""
    found = [
        getattr(cell, f"first_{q}")
        for key, cells in added.items()
        if key.endswith(f"/{size}")
        for name, cell in cells.items()
        if name.startswith("transport") and getattr(cell, f"first_{q}") is not None
    ]
    return max(found) if found else None


def _table(added: Mapping[str, Mapping[str, Cell]], field: str) -> dict[str, Any]:
    return {
        key: {name: _rounded(getattr(cell, field)) for name, cell in cells.items()}
        for key, cells in added.items()
        if any(getattr(cell, field) is not None for cell in cells.values())
    }


def summary(added: Mapping[str, Mapping[str, Cell]], *, seconds: float) -> dict[str, Any]:
    """The last line: the transport's worst added time to the first chunk (p50, against
    the target; p99 and each request size beside it), and every cell's added p50, CPU
    per call and time to the first chunk."""
    worst = {
        f"{size}_{q}": _rounded(_worst_ttfc(added, size, q))
        for size in ("short", "grown")
        for q in ("p50", "p99")
    }
    headline = max((v for k, v in worst.items() if k.endswith("p50") and v is not None), default=0)
    line: dict[str, Any] = {"bench": BENCH, "figure": "summary"}
    line.update(
        value=round(headline, 3),
        target=TTFC_TARGET_MS,
        unit="ms",
        met=headline <= TTFC_TARGET_MS,
        value_is="the transport's worst first_chunk_added_p50_ms over every stream",
        transport_first_chunk_added_ms=worst,
        added_p50_ms=_table(added, "p50"),
        added_cpu_ms_per_call=_table(added, "cpu"),
        first_chunk_added_p50_ms=_table(added, "first_p50"),
        seconds=round(seconds, 1),
        loadavg=" ".join(f"{x:.2f}" for x in os.getloadavg()),
        **machine(),
    )
    print(json.dumps(line), flush=True)
    return line


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


# The run -------------------------------------------------------------------------------


def sync_variants(
    recorders: Mapping[str, Recorder | MemoryRecorder | None], base_url: str
) -> dict[str, SyncVariant]:
    """The variants whose recorder is among ``recorders`` (by recorder name)."""
    return {
        variant_name(capture, recorder): SyncVariant(capture, recorders[recorder], base_url)
        for capture, recorder in VARIANTS
        if recorder in recorders
    }


def async_variants(
    recorders: Mapping[str, AsyncRecorder | AsyncMemoryRecorder | None], base_url: str
) -> dict[str, AsyncVariant]:
    """The async twin of :func:`sync_variants`."""
    return {
        variant_name(capture, recorder): AsyncVariant(capture, recorders[recorder], base_url)
        for capture, recorder in VARIANTS
        if recorder in recorders
    }


@dataclass(frozen=True, slots=True)
class Plan:
    calls: int
    paced_calls: int


def run_sync(settings: Settings, server: FakeLLM, plan: Plan, samples: Samples) -> None:
    engine = create_engine(settings.database_url, pool_size=2)
    keys = DataKeyStore.from_env()
    durable = Recorder(engine, settings=settings, keys=keys, group_commit=None)
    recorders = {"none": None, "memory": MemoryRecorder(settings=settings), "postgres": durable}
    variants = sync_variants(recorders, server.base_url)
    try:
        for shape in (s for s in SHAPES if s.mode == "sync"):
            with stage(f"capture {shape.key}"):
                rounds = rounds_of(shape, calls=plan.calls, paced_calls=plan.paced_calls)
                measure_sync(variants, shape, rounds=rounds, samples=samples)
    finally:
        engine.dispose()


async def run_async(settings: Settings, server: FakeLLM, plan: Plan, samples: Samples) -> None:
    engine = create_async_engine(settings.database_url, pool_size=2)
    keys = DataKeyStore.from_env()
    durable = AsyncRecorder(engine, settings=settings, keys=keys, group_commit=None)
    memory = AsyncMemoryRecorder(settings=settings)
    recorders = {"none": None, "memory": memory, "postgres": durable}
    variants = async_variants(recorders, server.base_url)
    try:
        for shape in (s for s in SHAPES if s.mode == "async"):
            with stage(f"capture {shape.key}"):
                rounds = rounds_of(shape, calls=plan.calls, paced_calls=plan.paced_calls)
                await measure_async(variants, shape, rounds=rounds, samples=samples)
    finally:
        await engine.dispose()


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name) or default)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--calls", type=int, default=_env_int("CAPTURE_CALLS", 40), help="per variant and call"
    )
    parser.add_argument(
        "--paced-calls",
        type=int,
        default=_env_int("CAPTURE_PACED_CALLS", 20),
        help="of paced streams",
    )
    parser.add_argument("--chunks", type=int, default=_env_int("CAPTURE_CHUNKS", 10))
    parser.add_argument(
        "--chunk-delay-ms",
        type=float,
        default=float(os.environ.get("CAPTURE_CHUNK_DELAY_MS") or 2.0),
    )
    parser.add_argument(
        "--peers",
        type=int,
        metavar="CONVERSATIONS",
        help="measure against Langfuse and OpenInference instead (bench._capture_peers)",
    )
    args = parser.parse_args(argv)
    if args.peers:
        with own_database(Settings.from_env(), "capture") as settings, FakeLLM() as server:
            run_peers(
                settings.database_url, server.base_url, conversations=args.peers, machine=machine()
            )
        return
    plan = Plan(args.calls, args.paced_calls)
    began = time.perf_counter()
    samples: Samples = defaultdict(list)
    with (
        own_database(Settings.from_env(), "capture") as settings,
        FakeLLM(chunks=args.chunks, delay_ms=args.chunk_delay_ms) as server,
    ):
        console.log(f"fake server on {server.base_url}, requests of {request_kb('grown')} KB")
        run_sync(settings, server, plan, samples)
        asyncio.run(run_async(settings, server, plan, samples))
    added = report(samples, SHAPES)
    summary(added, seconds=time.perf_counter() - began)


if __name__ == "__main__":
    main()
