"""``bench.replay``'s hot path: each stage timed over a sample of an archive, and a
broken chain refused rather than timed."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from agent_blackbox.replayer import read_archive, write_archive
from bench.replay import hot_path, record_archive


def test_each_stage_is_timed_over_the_sample(tmp_path: Path) -> None:
    path = tmp_path / "loop.avro"
    record_archive(path, 600)
    stages = hot_path(path, 400)
    assert set(stages) == {"read", "chain", "unpack"}
    assert all(us > 0 for us in stages.values()), stages


def test_a_broken_chain_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "loop.avro"
    record_archive(path, 300)
    envelopes = list(read_archive(path))
    envelopes[100] = replace(envelopes[100], chain_hash="f" * 64)
    broken = tmp_path / "broken.avro"
    write_archive(broken, envelopes)
    with pytest.raises(RuntimeError, match="chain breaks at sequence"):
        hot_path(broken, 300)
