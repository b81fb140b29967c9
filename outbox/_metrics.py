"""The recorder's own metric, in the process's default Prometheus registry: an agent that
serves its metrics (``prometheus_client.start_http_server``) shows it with its own.

An agent that does not use Prometheus never loads it: the counter is made when the
first failure is counted, or at import when the agent has loaded Prometheus already.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from agent_blackbox.schemas import BlackboxError

if TYPE_CHECKING:
    from prometheus_client import Counter

_LOCK = threading.Lock()
_COUNTER: list[Counter] = []
_UNRECORDED: list[Counter] = []


def write_failures() -> Counter:
    """``blackbox_recorder_write_failures_total{kind}``, made on first use."""
    with _LOCK:
        if not _COUNTER:
            from prometheus_client import Counter  # loaded only when used

            _COUNTER.append(
                Counter(
                    "blackbox_recorder_write_failures",
                    "Events (or run starts) the recorder could not write; the agent got "
                    "the error. kind: its class (DatabaseUnavailable, PayloadTooLarge, ...).",
                    ["kind"],
                )
            )
        return _COUNTER[0]


def unrecorded_llm_requests() -> Counter:
    """``blackbox_unrecorded_llm_requests_total{provider}``, made on first use: model
    calls a recording client passed through because no run was in force."""
    with _LOCK:
        if not _UNRECORDED:
            from prometheus_client import Counter  # loaded only when used

            _UNRECORDED.append(
                Counter(
                    "blackbox_unrecorded_llm_requests",
                    "Model calls made through a recording client (or an instrumented SDK) "
                    "outside any run, passed through unrecorded. provider: the API's shape.",
                    ["provider"],
                )
            )
        return _UNRECORDED[0]


@contextmanager
def counting_failures() -> Iterator[None]:
    """Count a recorder error raised inside as a write failure, and raise it on."""
    try:
        yield
    except BlackboxError as exc:
        write_failures().labels(type(exc).__name__).inc()
        raise


if "prometheus_client" in sys.modules:
    write_failures()
