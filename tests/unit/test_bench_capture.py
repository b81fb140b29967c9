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


def _measured(shape: capture.Shape, base_url: str, samples: capture.Samples) -> list[str]:
    """Measure one round of ``shape`` (sync or async, as it says) on the variants with no
    recorder or the memory one, into ``samples``; the variants' names."""
    if shape.mode == "sync":
        variants = capture.sync_variants({"none": None, "memory": MemoryRecorder()}, base_url)
        capture.measure_sync(variants, shape, rounds=1, samples=samples)
        return sorted(variants)

    async def measured() -> list[str]:
        memory = AsyncMemoryRecorder()
        variants = capture.async_variants({"none": None, "memory": memory}, base_url)
        await capture.measure_async(variants, shape, rounds=1, samples=samples)
        return sorted(variants)

    return asyncio.run(measured())


@pytest.mark.parametrize("shape", capture.SHAPES, ids=lambda s: s.key)
def test_variants_make_and_record_the_calls(
    server: FakeLLM, shape: capture.Shape, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorded: list[int] = []
    _count_rounds(monkeypatch, recorded)
    samples: capture.Samples = defaultdict(list)

    names = _measured(shape, server.base_url, samples)

    assert names == ["raw", "sdk-memory", "transport-memory"]
    _checked(samples, shape, names)
    # One llm.call per call of the two captures: a run of warm-up and a measured run each.
    assert sorted(recorded) == sorted([capture.WARMUP] * 2 + [capture.BATCH] * 2)


def test_the_report_prints_a_figure_per_line_and_a_summary(
    server: FakeLLM, capsys: pytest.CaptureFixture[str]
) -> None:
    shape = capture.Shape("sync", "stream_paced", "short")
    samples: capture.Samples = defaultdict(list)
    _measured(shape, server.base_url, samples)

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
