"""The agent side of the framework tests that run in the environment of their own
(``_compat_env``): records runs of a recipe's entry point, and replays recorded runs
from Kafka, for the test process that checks what landed.

One process serves a test module (imports of the frameworks cost seconds, paid once).
Run it in that environment from the repository's root (there is no pytest there)::

    python -m tests.integration.frameworks._compat_driver

It reads one JSON request per line on stdin and answers each with one JSON line on
stdout, ``{"result": ...}`` or ``{"error": "<traceback>"}``; everything else the agent's
libraries print goes to stderr. A request names the ``settings`` (the test's database,
topic and consumer group: ``Settings`` fields), the ``command`` and its ``spec``. The
model server is the one of ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY``, for the process's
life (the recipes build one client per process, as an application does).

- ``record``: ``{"entry": "module:function", "inputs": [...], "agent_id": ...,
  "at_once": N}`` → ``{"runs": {run_id: [input, output]}, "holes": [...]}`` (the
  unrecorded calls warned about); an ``async`` entry records ``at_once`` runs at a time
  in one event loop, through the same process-wide clients.
- ``replay``: ``{"entry": ..., "run_ids": [...], "set": {"module.NAME": value}}`` →
  ``{"reports": [report, ...], "refused": [address, ...]}``: each run read back from
  Kafka through the views' run index and replayed, all under a socket guard that lets
  only Postgres and Kafka through (``refused`` lists what else was tried); ``set``
  changes module attributes of the agent for this replay (a prompt edited since).
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import sys
import traceback
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from sqlalchemy import create_engine

from agent_blackbox.outbox import UnrecordedCallWarning
from agent_blackbox.schemas import Settings
from tests.integration._guard import SocketGuard, service_ports
from tests.integration.frameworks._harness import (
    record_runs,
    record_runs_async,
    replay_from_kafka,
)


def load(path: str) -> Any:
    """The object ``module:attribute`` names."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def record(settings: Settings, spec: dict[str, Any]) -> dict[str, Any]:
    entry = load(spec["entry"])
    inputs, agent_id = spec["inputs"], spec["agent_id"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UnrecordedCallWarning)
        if inspect.iscoroutinefunction(entry):
            at_once = int(spec.get("at_once", 1))
            done = record_runs_async(settings, entry, inputs, agent_id=agent_id, at_once=at_once)
        else:
            engine = create_engine(settings.database_url)
            try:
                done = record_runs(settings, engine, entry, inputs, agent_id=agent_id)
            finally:
                engine.dispose()
    holes = [str(w.message) for w in caught if issubclass(w.category, UnrecordedCallWarning)]
    return {"runs": {run_id: list(pair) for run_id, pair in done.runs.items()}, "holes": holes}


def replay(settings: Settings, spec: dict[str, Any]) -> dict[str, Any]:
    entry = load(spec["entry"])
    engine = create_engine(settings.database_url)
    try:
        with changed(spec.get("set", {})), SocketGuard(service_ports(settings)) as guard:
            reports = [
                replay_from_kafka(settings, engine, run_id, entry).to_dict()
                for run_id in spec["run_ids"]
            ]
    finally:
        engine.dispose()
    return {"reports": reports, "refused": [repr(address) for address in guard.refused]}


@contextmanager
def changed(attributes: dict[str, Any]) -> Iterator[None]:
    """Module attributes (``package.module.NAME``) set to the values given, for the block."""
    saved = []
    try:
        for target, value in attributes.items():
            module_name, _, name = target.rpartition(".")
            module = importlib.import_module(module_name)
            saved.append((module, name, getattr(module, name)))
            setattr(module, name, value)
        yield
    finally:
        for module, name, value in reversed(saved):
            setattr(module, name, value)


COMMANDS = {"record": record, "replay": replay}


def answer(line: str) -> dict[str, Any]:
    """The answer to one request line."""
    try:
        request = json.loads(line)
        settings = Settings(**request["settings"])
        return {"result": COMMANDS[request["command"]](settings, request["spec"])}
    except Exception:
        return {"error": traceback.format_exc()}


def protocol_stream() -> TextIO:
    """The process's stdout for the answers alone: whatever else writes to stdout (Python
    or native code) goes to stderr from now on."""
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return answers


def main() -> int:
    answers = protocol_stream()
    for line in sys.stdin:
        if line.strip():
            answers.write(json.dumps(answer(line), default=str) + "\n")
            answers.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
