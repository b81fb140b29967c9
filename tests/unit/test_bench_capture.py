"""The capture bench's measuring functions, on a few calls and the memory recorder only,
so that ``python -m bench.capture`` cannot rot unnoticed (its figures are not checked
here: timings belong to the bench, never to a test)."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from collections.abc import Iterator

import pytest

from agent_blackbox.outbox import AsyncMemoryRecorder, MemoryRecorder
from agent_blackbox.schemas import EventType
from bench import capture
from bench._fake_llm import FakeLLM

pytestmark = [pytest.mark.timeout(120)]

CHUNKS = 4


@pytest.fixture(autouse=True)
def few_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capture, "BATCH", 3)
    monkeypatch.setattr(capture, "WARMUP", 1)


@pytest.fixture(scope="module")
def server() -> Iterator[FakeLLM]:
    with FakeLLM(chunks=CHUNKS, delay_ms=1.0) as running:
        yield running


def _llm_calls(recorder: MemoryRecorder | AsyncMemoryRecorder) -> int:
    return sum(1 for e in recorder.events if e.event_type == EventType.LLM_CALL)


def _count_rounds(monkeypatch: pytest.MonkeyPatch, recorded: list[int]) -> None:
    """Keep the llm.call events of each round in ``recorded`` as its run ends (before
    the variant forgets them)."""
    forget = capture._forget

    def counted(recorder: MemoryRecorder | AsyncMemoryRecorder) -> None:
        recorded.append(_llm_calls(recorder))
        forget(recorder)

    monkeypatch.setattr(capture, "_forget", counted)


def _checked(samples: capture.Samples, shape: capture.Shape, names: list[str]) -> None:
    for name in names:
        got = samples[shape.key, name]
        assert len(got) == capture.BATCH, name  # one round, the warm-up left out
        assert all(s.total_ms > 0 and s.cpu_ms >= 0 for s in got)
        if shape.stream:
            # the role chunk, the content chunks and the finish chunk, for every capture
            assert {s.chunks for s in got} == {CHUNKS}, name
            assert all(s.first_ms is not None and s.first_ms <= s.total_ms for s in got)
        else:
            assert all(s.first_ms is None and s.chunks == 0 for s in got)


@pytest.mark.parametrize(
    "shape", [s for s in capture.SHAPES if s.mode == "sync"], ids=lambda s: s.key
)
def test_sync_variants_make_and_record_the_calls(
    server: FakeLLM, shape: capture.Shape, monkeypatch: pytest.MonkeyPatch
) -> None:
    memory = MemoryRecorder()
    recorded: list[int] = []
    _count_rounds(monkeypatch, recorded)
    variants = capture.sync_variants({"none": None, "memory": memory}, server.base_url)
    samples: capture.Samples = defaultdict(list)

    capture.measure_sync(variants, shape, rounds=1, samples=samples)

    assert sorted(variants) == ["raw", "sdk-memory", "transport-memory"]
    _checked(samples, shape, sorted(variants))
    # One llm.call per call of the two captures: a run of warm-up and a measured run each.
    assert sorted(recorded) == sorted([capture.WARMUP] * 2 + [capture.BATCH] * 2)


@pytest.mark.parametrize(
    "shape", [s for s in capture.SHAPES if s.mode == "async"], ids=lambda s: s.key
)
def test_async_variants_make_and_record_the_calls(
    server: FakeLLM, shape: capture.Shape, monkeypatch: pytest.MonkeyPatch
) -> None:
    memory = AsyncMemoryRecorder()
    recorded: list[int] = []
    _count_rounds(monkeypatch, recorded)
    samples: capture.Samples = defaultdict(list)

    async def measured() -> list[str]:
        variants = capture.async_variants({"none": None, "memory": memory}, server.base_url)
        await capture.measure_async(variants, shape, rounds=1, samples=samples)
        return sorted(variants)

    names = asyncio.run(measured())

    _checked(samples, shape, names)
    assert sorted(recorded) == sorted([capture.WARMUP] * 2 + [capture.BATCH] * 2)


def test_the_report_prints_a_figure_per_line_and_a_summary(
    server: FakeLLM, capsys: pytest.CaptureFixture[str]
) -> None:
    memory = MemoryRecorder()
    variants = capture.sync_variants({"none": None, "memory": memory}, server.base_url)
    shape = capture.Shape("sync", "stream_paced", "short")
    samples: capture.Samples = defaultdict(list)
    capture.measure_sync(variants, shape, rounds=1, samples=samples)

    added = capture.report(samples, [shape])
    capture.summary(added, seconds=1.0)

    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    figures = {(line["figure"], line.get("capture"), line.get("recorder")) for line in lines}
    assert ("first_chunk_added_p50_ms", "transport", "memory") in figures
    assert ("added_cpu_ms_per_call", "sdk", "memory") in figures
    ttfc = [line for line in lines if line["figure"] == "first_chunk_added_p99_ms"]
    assert {line["target"] for line in ttfc} == {capture.TTFC_TARGET_MS}
    assert all(line["cores"] and line["cpu"] for line in lines)
    last = lines[-1]
    assert last["figure"] == "summary"
    assert set(last["added_p50_ms"][shape.key]) == {"transport-memory", "sdk-memory"}
