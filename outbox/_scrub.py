"""Redaction at the boundaries: what a crossing records, scrubbed before the first write.

The same scrubbing runs in record mode (on what is about to be recorded) and in replay
(on what the code hands over now), so digests compare like with like. The rules in force
are recorded in ``run.started``; a replay rebuilds them from there, so a run replays
with the rules it was recorded under whatever the configuration is today.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from agent_blackbox.outbox._boundaries import Crossing, error_info
from agent_blackbox.outbox._redaction import Redactor
from agent_blackbox.outbox._values import encode_value, restore_tags
from agent_blackbox.schemas import canonical_text

RULES_ATTRIBUTE = "redaction"
"""On ``run.started``: the redaction rules the run was recorded under (canonical JSON)."""
FIRED_ATTRIBUTE = "redacted"
"""On any event: the rules that replaced something in it, comma-separated."""


class _ScrubbedError(Exception):
    """An error whose message was redacted; recorded as the original type and the
    scrubbed message."""

    def __init__(self, recorded_error: dict[str, str]) -> None:
        super().__init__(recorded_error["message"])
        self.recorded_error = recorded_error


class Scrub:
    """Applies one :class:`Redactor` to every value a boundary records.

    Args:
        redactor: the rules; None scrubs nothing (runs recorded before redaction existed).
    """

    def __init__(self, redactor: Redactor | None) -> None:
        self._redactor = redactor

    @classmethod
    def recorded_in(cls, attributes: Mapping[str, str]) -> Scrub:
        """The scrubbing a run was recorded with, from its ``run.started`` attributes."""
        raw = attributes.get(RULES_ATTRIBUTE)
        return cls(None if raw is None else Redactor.from_config(json.loads(raw)))

    def rules_text(self) -> str | None:
        """The rules as ``run.started`` records them."""
        return None if self._redactor is None else canonical_text(self._redactor.config)

    def value(self, value: Any, fired: set[str]) -> Any:
        """``value`` with every rule applied; the rules that fired are added to ``fired``."""
        if self._redactor is None or self._redactor.inert(value):
            return value
        redacted = self._redactor.redact(value)
        fired.update(redacted.fired)
        return redacted.value

    def encoded(self, value: Any, fired: set[str], *, path: str) -> Any:
        """``value`` in the tagged encoding that keeps its type, then scrubbed (the tags
        and typed scalars kept: redaction applies to strings).

        Raises:
            NotSerialisable: ``value`` would not come back with its type (names ``path``).
        """
        encoded = encode_value(value, path=path)
        scrubbed = self.value(encoded, fired)
        return encoded if scrubbed is encoded else restore_tags(encoded, scrubbed)

    def arguments(
        self, args: tuple[Any, ...], kwargs: Mapping[str, Any], fired: set[str]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Positional and keyword arguments, scrubbed as one value (so ``api_key=`` and a
        path rule like ``kwargs.customer.email`` apply)."""
        if not kwargs and (self._redactor is None or self._redactor.inert(args)):
            return args, {}
        scrubbed = self.value({"args": list(args), "kwargs": dict(kwargs)}, fired)
        return tuple(scrubbed["args"]), scrubbed["kwargs"]

    def error(self, error: BaseException | None, fired: set[str]) -> BaseException | None:
        """``error`` as it is recorded: its message and arguments scrubbed."""
        info = error_info(error)
        if error is None or info is None or self._redactor is None:
            return error
        scrubbed = {**info, "message": self.value(info["message"], fired)}
        if "args_json" in info:
            args = json.loads(info["args_json"])
            scrubbed["args_json"] = canonical_text(restore_tags(args, self.value(args, fired)))
        if scrubbed == info:
            return error
        return _ScrubbedError(scrubbed)

    @staticmethod
    def mark(crossing: Crossing, fired: set[str]) -> Crossing:
        """``crossing`` noting which rules fired (names only, never values)."""
        if not fired:
            return crossing
        attributes = {**crossing.attributes, FIRED_ATTRIBUTE: ",".join(sorted(fired))}
        return replace(crossing, attributes=attributes)
