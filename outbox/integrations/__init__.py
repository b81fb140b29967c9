"""Recording the model calls an agent makes through the SDKs and frameworks it already
uses, at the HTTP transport (``httpx2``, and ``httpx`` for older clients):

- :func:`instrument`: every OpenAI and Anthropic client of the process records into the
  run in force where each call is made (opt-in, once per process);
- :func:`capture_openai` / :func:`capture_anthropic` (in :mod:`.openai` and
  :mod:`.anthropic`, each importing its SDK): a real SDK client that records;
- :func:`http_client` / :func:`async_http_client`: a client to pass as ``http_client=``
  to any SDK or framework that takes one;
- :class:`RecordingTransport` / :class:`AsyncRecordingTransport`: the transports
  themselves, around any other.

What is recorded, and how replay answers, is said in :mod:`.transport`.
"""

from agent_blackbox.outbox.integrations._clients import (
    async_http_client,
    http_client,
    recording_client,
)
from agent_blackbox.outbox.integrations._instrument import instrument, instrumented, uninstrument
from agent_blackbox.outbox.integrations.transport import (
    AsyncRecordingTransport,
    RecordingTransport,
)

__all__ = [
    "AsyncRecordingTransport",
    "RecordingTransport",
    "async_http_client",
    "http_client",
    "instrument",
    "instrumented",
    "recording_client",
    "uninstrument",
]
