"""Capture overhead against the peers (``python -m bench.capture --peers``): what one
LLM call of a growing conversation costs the agent with this project's durable recorder,
with Langfuse's OpenAI drop-in, and with the OpenInference instrumentor, each over the
raw ``openai`` SDK.

Each variant lives in a worker process of its own (the peers patch the SDK or install a
global tracer provider, and their background exporters must not bill another variant's
process), and makes the same sync ``chat.completions.create`` calls against the instant
local server (``bench._fake_llm``, every answer in one write):

- ``raw``: the SDK alone (the floor);
- ``durable``: ``agent_blackbox.capture_openai`` inside a run of the Postgres recorder
  with no group commit (one transaction per event), on a database of the bench's own;
- ``langfuse``: ``langfuse.openai.OpenAI``, exporting its spans in the background to the
  local server (which accepts anything);
- ``openinference``: ``OpenAIInstrumentor`` with a batching OTLP exporter to the same.

A round has every worker hold the same 50-turn support conversation (system prompt, then
a user message and an assistant reply a turn, English the compression dictionary never
saw; the request grows from about 3 KB to about 59 KB) in lockstep: each turn goes to
every worker before the next turn goes to any, in an order rotated every turn; the first
round warms up. The calls of one turn are thus made within a few tens of milliseconds of
each other, and each variant's call is paired with the raw SDK's call of the same turn of
the same round: on a shared machine the speed of the CPU moves by a third from one second
to the next, which conversations taken in turn (a second and a half each) would bill to
whichever variant ran then. Per variant, over turns 20-50: the p50 of the latency added
to the paired raw call, and the CPU of the calling thread per call added to the raw
SDK's; over whole conversations, the process's CPU per call (all-in: background
exporters and the flush at the end included), added to the raw SDK's; and the added p50
at the first three turns (about 3 KB) against the last five (55-59 KB). The last line
compares the durable recorder with Langfuse against the issue's targets. A peer that is
not installed (``pip install -e '.[bench-peers]'``) is left out and named.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import random
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, nullcontext, suppress
from dataclasses import dataclass
from importlib.util import find_spec
from multiprocessing.connection import Connection
from typing import Any

from bench._common import console, emit, stage
from bench._conversation import SYSTEM_PROMPT_WORDS, TOOLS, docstring_prose

BENCH = "capture"
TURNS = 50
MEASURED = range(20, TURNS + 1)
"""The turns (1-based) whose calls the headline figures are over."""
SMALL = range(1, 4)
LARGE = range(TURNS - 4, TURNS + 1)
P50_MARGIN_MS = 0.5
"""The durable recorder's added p50 may exceed Langfuse's by this much."""
SIZE_GAP_MS = 0.5
"""The durable recorder's added p50 at 59 KB may exceed that at 3 KB by this much."""
PEERS: dict[str, str] = {"langfuse": "langfuse", "openinference": "openinference"}
"""Each peer and the module it needs."""


@dataclass(frozen=True, slots=True)
class Call:
    """One call as the worker saw it."""

    turn: int
    wall_ms: float
    cpu_ms: float
    """CPU of the calling thread."""


@dataclass(frozen=True, slots=True)
class Conversation:
    calls: list[Call]
    process_cpu_ms: float
    """CPU of the whole worker process over the conversation, flush included."""


def conversation_turns(seed: int) -> tuple[str, list[tuple[str, str]]]:
    """The system prompt and each turn's user message and assistant reply."""
    rng = random.Random(seed)
    system = "You are a support agent. " + docstring_prose(rng, SYSTEM_PROMPT_WORDS)
    turns = [
        (docstring_prose(rng, rng.randint(20, 80)), docstring_prose(rng, rng.randint(75, 135)))
        for _ in range(TURNS)
    ]
    return system, turns


def requests(seed: int) -> Iterator[dict[str, Any]]:
    """The keyword arguments of each turn's call."""
    system, turns = conversation_turns(seed)
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    tools = [{"type": "function", "function": t} for t in TOOLS]
    for user, reply in turns:
        messages.append({"role": "user", "content": user})
        yield {
            "model": "gpt-4.1-mini",
            "temperature": 0.2,
            "messages": list(messages),
            "tools": tools,
        }
        messages.append({"role": "assistant", "content": reply})


# In the worker --------------------------------------------------------------------------


def _client(variant: str, base_url: str, database_url: str | None) -> tuple[Any, Any]:
    """The variant's client, and a factory of the context each conversation runs in."""
    if variant == "langfuse":
        os.environ.update(
            LANGFUSE_PUBLIC_KEY="pk-lf-bench",
            LANGFUSE_SECRET_KEY="sk-lf-bench",
            LANGFUSE_HOST=base_url.removesuffix("/v1"),
            LANGFUSE_BASE_URL=base_url.removesuffix("/v1"),
        )
        from langfuse import get_client
        from langfuse.openai import OpenAI as LangfuseOpenAI

        client = LangfuseOpenAI(base_url=base_url, api_key="bench", max_retries=0)
        return client, _flushing(get_client().flush)
    import openai

    client = openai.OpenAI(base_url=base_url, api_key="bench", max_retries=0)
    if variant == "openinference":
        from openinference.instrumentation.openai import OpenAIInstrumentor
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        # A long conversation is over the SDK's attribute limit, which it logs per span.
        logging.getLogger("opentelemetry.attributes").setLevel(logging.ERROR)
        provider = TracerProvider()
        exporter = OTLPSpanExporter(endpoint=base_url.removesuffix("/v1") + "/v1/traces")
        provider.add_span_processor(BatchSpanProcessor(exporter))
        OpenAIInstrumentor().instrument(tracer_provider=provider)
        return client, _flushing(provider.force_flush)
    if variant == "durable":
        return _durable(client, database_url)
    return client, lambda: nullcontext()


def _flushing(flush: Callable[[], Any]) -> Callable[[], AbstractContextManager[Any]]:
    class Flushed(AbstractContextManager[Any]):
        def __exit__(self, *_: object) -> None:
            flush()

    return Flushed


def _durable(client: Any, database_url: str | None) -> tuple[Any, Any]:
    from sqlalchemy import create_engine

    import agent_blackbox as bb
    from agent_blackbox.keystore import DataKeyStore
    from agent_blackbox.outbox import Recorder, RunSnapshot
    from agent_blackbox.schemas import Settings

    assert database_url is not None
    settings = Settings.from_env()
    settings = Settings(
        **{
            **{n: getattr(settings, n) for n in settings.__dataclass_fields__},
            "database_url": database_url,
        }
    )
    engine = create_engine(database_url, pool_size=2)
    recorder = Recorder(engine, settings=settings, keys=DataKeyStore.from_env(), group_commit=None)
    snapshot = RunSnapshot(code_version="bench")
    return bb.capture_openai(client), lambda: recorder.start_run(snapshot, agent_id="bench-peers")


class Conversing:
    """One conversation under way in a worker: its context entered, the next turn's
    request ready, every call timed."""

    def __init__(
        self, client: Any, context: Callable[[], AbstractContextManager[Any]], seed: int
    ) -> None:
        self._client = client
        self._requests = enumerate(requests(seed), start=1)
        self._began = time.process_time()
        self._stack = ExitStack()
        self._stack.enter_context(context())

    def call(self) -> Call:
        """Make the next turn's call."""
        turn, request = next(self._requests)
        cpu, wall = time.thread_time_ns(), time.perf_counter_ns()
        self._client.chat.completions.create(**request)
        return Call(
            turn, (time.perf_counter_ns() - wall) / 1e6, (time.thread_time_ns() - cpu) / 1e6
        )

    def end(self) -> float:
        """Leave the conversation's context (a peer flushes what it buffered); the
        process's CPU milliseconds since it began."""
        self._stack.close()
        return (time.process_time() - self._began) * 1000


def converse(
    client: Any, context: Callable[[], AbstractContextManager[Any]], seed: int
) -> Conversation:
    """One whole conversation, every call timed."""
    conversing = Conversing(client, context, seed)
    calls = [conversing.call() for _ in range(TURNS)]
    return Conversation(calls, conversing.end())


def worker(variant: str, base_url: str, database_url: str | None, conn: Connection) -> None:
    """A worker's loop, until None: a seed begins a conversation (answered with None),
    each ``"turn"`` makes its next call (answered with the :class:`Call`), ``"end"``
    ends it (answered with the process's CPU milliseconds over it)."""
    client, context = _client(variant, base_url, database_url)
    conn.send("ready")
    conversing: Conversing | None = None
    while (order := conn.recv()) is not None:
        if order == "turn":
            assert conversing is not None
            conn.send(conversing.call())
        elif order == "end":
            assert conversing is not None
            conn.send(conversing.end())
            conversing = None
        else:
            conversing = Conversing(client, context, order)
            conn.send(None)
    conn.close()


# In the parent ------------------------------------------------------------------------


@dataclass(slots=True)
class Worker:
    name: str
    process: multiprocessing.process.BaseProcess
    conn: Connection
    conversations: list[Conversation]

    def calls(self, turns: range) -> list[Call]:
        return [c for conv in self.conversations for c in conv.calls if c.turn in turns]

    def p50(self, turns: range) -> float:
        return statistics.median(c.wall_ms for c in self.calls(turns))

    def added_p50(self, floor: Worker, turns: range) -> float:
        """The p50 of the latency this worker's calls added to ``floor``'s calls of the
        same turns of the same rounds (made in lockstep, moments apart)."""
        pairs = zip(self.calls(turns), floor.calls(turns), strict=True)
        return statistics.median(mine.wall_ms - theirs.wall_ms for mine, theirs in pairs)

    def cpu(self, turns: range) -> float:
        return statistics.fmean(c.cpu_ms for c in self.calls(turns))

    def all_in_cpu(self) -> float:
        calls = sum(len(c.calls) for c in self.conversations)
        return sum(c.process_cpu_ms for c in self.conversations) / calls


def available() -> tuple[list[str], list[str]]:
    """The peers installed here, and those that are not."""
    there = [peer for peer, module in PEERS.items() if find_spec(module) is not None]
    return there, [peer for peer in PEERS if peer not in there]


def start(names: Sequence[str], base_url: str, database_url: str) -> list[Worker]:
    context = multiprocessing.get_context("spawn")
    workers = []
    for name in names:
        mine, theirs = context.Pipe()
        url = database_url if name == "durable" else None
        process = context.Process(target=worker, args=(name, base_url, url, theirs), daemon=True)
        process.start()
        workers.append(Worker(name, process, mine, []))
    for w in workers:
        if w.conn.recv() != "ready":
            raise RuntimeError(f"the {w.name} worker did not start")
    return workers


def stop(workers: Sequence[Worker]) -> None:
    for w in workers:
        with suppress(OSError):  # already gone
            w.conn.send(None)
        w.process.join(timeout=30)
        if w.process.is_alive():
            w.process.terminate()
            w.process.join()


def _each(workers: Sequence[Worker], order: Any) -> list[Any]:
    """Send ``order`` to every worker, then collect their answers."""
    for w in workers:
        w.conn.send(order)
    return [w.conn.recv() for w in workers]


def measure(workers: Sequence[Worker], conversations: int) -> None:
    """One warm-up round, then ``conversations`` rounds, each a conversation that every
    worker holds in lockstep: a turn goes to each worker, in an order rotated every
    turn, before the next turn goes to any."""
    for round_ in range(conversations + 1):
        _each(workers, round_)
        calls: dict[str, list[Call]] = {w.name: [] for w in workers}
        for turn in range(TURNS):
            cut = (round_ + turn) % len(workers)
            for w in [*workers[cut:], *workers[:cut]]:
                w.conn.send("turn")
                calls[w.name].append(w.conn.recv())
        for w, cpu in zip(workers, _each(workers, "end"), strict=True):
            if round_:
                w.conversations.append(Conversation(calls[w.name], cpu))


def report(workers: Mapping[str, Worker], labels: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Every variant's figures over the raw SDK's; returns them by variant."""
    raw = workers["raw"]
    figures: dict[str, dict[str, float]] = {}
    for name, w in workers.items():
        if name == "raw":
            continue
        mine = {
            "added_p50_ms": w.added_p50(raw, MEASURED),
            "added_cpu_ms_per_call": w.cpu(MEASURED) - raw.cpu(MEASURED),
            "added_all_in_cpu_ms_per_call": w.all_in_cpu() - raw.all_in_cpu(),
            "added_p50_small_ms": w.added_p50(raw, SMALL),
            "added_p50_large_ms": w.added_p50(raw, LARGE),
        }
        figures[name] = mine
        for figure, value in mine.items():
            emit(BENCH, figure, value, unit="ms", capture=name, **labels)
    emit(BENCH, "p50_ms", raw.p50(MEASURED), unit="ms", capture="raw", **labels)
    emit(BENCH, "cpu_ms_per_call", raw.cpu(MEASURED), unit="ms", capture="raw", **labels)
    return figures


def verdict(figures: Mapping[str, Mapping[str, float]], labels: Mapping[str, Any]) -> None:
    """The durable recorder against Langfuse, and against its own overhead at 3 KB."""
    durable = figures["durable"]
    gap = durable["added_p50_large_ms"] - durable["added_p50_small_ms"]
    emit(BENCH, "durable_size_gap_ms", gap, unit="ms", target=SIZE_GAP_MS, at_least=False, **labels)
    langfuse = figures.get("langfuse")
    if langfuse is None:
        return
    over = durable["added_p50_ms"] - langfuse["added_p50_ms"]
    emit(
        BENCH,
        "durable_over_langfuse_p50_ms",
        over,
        unit="ms",
        target=P50_MARGIN_MS,
        at_least=False,
        **labels,
    )
    cpu = durable["added_cpu_ms_per_call"] - langfuse["added_all_in_cpu_ms_per_call"]
    emit(
        BENCH,
        "durable_cpu_over_langfuse_all_in_ms",
        cpu,
        unit="ms",
        target=0.0,
        at_least=False,
        **labels,
    )


def run_peers(
    database_url: str, base_url: str, *, conversations: int, machine: Mapping[str, Any]
) -> None:
    """Measure every variant installed here; see the module's docstring."""
    there, missing = available()
    if missing:
        console.log(
            f"not installed, left out: {', '.join(missing)} (pip install -e '.[bench-peers]')"
        )
    sizes = [len(json.dumps(r)) for r in requests(0)]
    labels = {
        "turns": f"{MEASURED.start}-{MEASURED.stop - 1}",
        "request_kb": f"{sizes[0] / 1024:.0f}-{sizes[-1] / 1024:.0f}",
        "conversations": conversations,
        **machine,
    }
    workers = start(["raw", "durable", *there], base_url, database_url)
    try:
        with stage(f"{conversations} conversations of {TURNS} turns, {len(workers)} workers"):
            measure(workers, conversations)
    finally:
        stop(workers)
    figures = report({w.name: w for w in workers}, labels)
    verdict(figures, labels)
