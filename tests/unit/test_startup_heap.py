"""The heap a long-running stream process settles before its loop."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from agent_blackbox.broker import settle_heap


@pytest.fixture
def unsettled() -> Iterator[None]:
    threshold = gc.get_threshold()
    gc.unfreeze()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_objects_alive_at_the_freeze_are_left_out_of_collections(unsettled: None) -> None:
    kept = [_Cycle() for _ in range(100)]
    settle_heap()
    assert gc.get_freeze_count() >= len(kept)
    assert not any(any(o is k for k in kept) for o in gc.get_objects(generation=2))


def test_garbage_cycles_are_collected_before_the_freeze(unsettled: None) -> None:
    freed: list[int] = []

    class Watched(_Cycle):
        def __del__(self) -> None:
            freed.append(1)

    Watched()  # unreachable at once, but only the collector can free a cycle
    settle_heap()
    assert freed == [1]


def test_cycles_made_after_the_freeze_are_still_collected(unsettled: None) -> None:
    settle_heap()
    freed: list[int] = []

    class Watched(_Cycle):
        def __del__(self) -> None:
            freed.append(1)

    Watched()
    gc.collect()
    assert freed == [1]


def test_the_young_generation_is_collected_less_often(unsettled: None) -> None:
    older = gc.get_threshold()[1:]
    settle_heap()
    assert gc.get_threshold() == (50_000, *older)
