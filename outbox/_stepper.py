"""Walking a generator of steps: the loop every sans-IO driver of the write side is built
around (the SQL plans of ``_postgres.py`` and ``_direct.py``)."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, Generic, TypeVar, cast

T = TypeVar("T")

S = TypeVar("S")


class Stepper(Generic[S, T]):
    """Walks a generator of steps: :meth:`next` gives the step to do (None once the
    generator returned); :meth:`reply` sends back what the step gave, :meth:`fail` an
    exception for the generator to handle; :meth:`result` is what the generator
    returned. A driver is a loop around one of these."""

    def __init__(self, steps: Generator[S, Any, T]) -> None:
        self._steps = steps
        self._reply: Any = None
        self._failed: BaseException | None = None
        self._value: T | None = None

    def next(self) -> S | None:
        failed, self._failed = self._failed, None
        try:
            if failed is not None:
                return self._steps.throw(failed)
            return self._steps.send(self._reply)
        except StopIteration as done:
            self._value = done.value
            return None

    def reply(self, value: Any) -> None:
        self._reply = value

    def fail(self, exc: BaseException) -> None:
        self._failed = exc

    def result(self) -> T:
        return cast(T, self._value)
