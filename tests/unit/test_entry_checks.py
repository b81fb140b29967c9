"""An entry point's checks (its signature, whether it is a coroutine function) are
worked out once per entry and give each entry its own answer, also for callables that
cannot be a dictionary key."""

from __future__ import annotations

from typing import Any

from agent_blackbox.replayer._driver import _ENTRIES_KEPT, entry_problem, is_async_entry


def good(run: Any, input: Any) -> Any:
    return input


def bad(run: Any) -> Any:
    return None


async def coroutine(run: Any, input: Any) -> Any:
    return input


class Unhashable:
    __hash__ = None  # type: ignore[assignment]

    def __eq__(self, other: object) -> bool:
        return self is other

    async def __call__(self, run: Any, input: Any) -> Any:
        return input


def test_each_entry_gets_its_own_answer_every_time() -> None:
    for _ in range(3):
        assert entry_problem(good) is None
        problem = entry_problem(bad)
        assert problem is not None
        assert "cannot be called as entry(run, input)" in problem
        assert not is_async_entry(good)
        assert is_async_entry(coroutine)


def test_an_entry_without_a_hash_is_checked_each_time() -> None:
    entry = Unhashable()
    assert entry_problem(entry) is None
    assert is_async_entry(entry)


def test_many_entries_are_answered_alike() -> None:
    """More entries than are kept: the oldest answers are worked out again."""
    made: list[tuple[Any, bool]] = []
    for i in range(_ENTRIES_KEPT + 20):
        if i % 2:
            made.append((lambda run, input: input, True))
        else:
            made.append((lambda run: run, False))
    for entry, takes_input in made * 2:
        assert (entry_problem(entry) is None) is takes_input
