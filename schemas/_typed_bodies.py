"""Version 1 to 2 of ``run.started``, ``tool.call``, ``effect.receipt`` and ``run.finished``.

Version 2 only adds fields with null defaults (the codec of a typed value; the module,
arguments and kind of an error), so Avro resolution alone reads a v1 body as v2. These
migrators give the same bodies as resolution does, at the cost of a plain decode: replay
reads a tool call for every other event of a typical run, and resolving each one would
cost it a good part of its throughput.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_ERROR_V2 = {"module": None, "args_json": None, "kind": None}


def _error_v2(error: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return None if error is None else {**error, **_ERROR_V2}


def run_started_v1_to_v2(body: Mapping[str, Any]) -> dict[str, Any]:
    """A v1 ``run.started``: its input is plain JSON."""
    return {**body, "input_codec": None}


def tool_call_v1_to_v2(body: Mapping[str, Any]) -> dict[str, Any]:
    """A v1 ``tool.call``: its result is plain JSON, its error a type and a message."""
    return {**body, "result_codec": None, "error": _error_v2(body["error"])}


def effect_receipt_v1_to_v2(body: Mapping[str, Any]) -> dict[str, Any]:
    """A v1 ``effect.receipt``: its result is plain JSON, its error a type and a message."""
    return {**body, "result_codec": None, "error": _error_v2(body["error"])}


def run_finished_v1_to_v2(body: Mapping[str, Any]) -> dict[str, Any]:
    """A v1 ``run.finished``: its error is a type and a message."""
    return {**body, "error": _error_v2(body["error"])}
