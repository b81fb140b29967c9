"""The heap a long-running stream process sets aside before its loop."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from agent_blackbox.broker import freeze_startup_heap


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_objects_alive_at_the_freeze_are_left_out_of_collections(unfrozen: None) -> None:
    kept = [_Cycle() for _ in range(100)]
    freeze_startup_heap()
    assert gc.get_freeze_count() >= len(kept)
    assert not any(any(o is k for k in kept) for o in gc.get_objects(generation=2))


def test_garbage_cycles_are_collected_before_the_freeze(unfrozen: None) -> None:
    freed: list[int] = []

    class Watched(_Cycle):
        def __del__(self) -> None:
            freed.append(1)

    Watched()  # unreachable at once, but only the collector can free a cycle
    freeze_startup_heap()
    assert freed == [1]


def test_cycles_made_after_the_freeze_are_still_collected(unfrozen: None) -> None:
    freeze_startup_heap()
    freed: list[int] = []

    class Watched(_Cycle):
        def __del__(self) -> None:
            freed.append(1)

    Watched()
    gc.collect()
    assert freed == [1]
