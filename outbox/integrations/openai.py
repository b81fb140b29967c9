"""Recording the official ``openai`` SDK (``pip install 'agent-blackbox[openai]'``).

:func:`capture_openai` gives back a real ``openai.OpenAI`` (or ``AsyncOpenAI``): the same
client, with its HTTP transport wrapped in a recording one (see
:mod:`agent_blackbox.outbox.integrations.transport`). Every attribute, ``with_options``,
``with_raw_response``, ``with_streaming_response``, ``beta`` and ``isinstance`` checks
work as on the original, so frameworks that take an OpenAI client take this one.

Recorded under provider ``"openai"``: chat completions, Responses, completions,
embeddings and moderations of any OpenAI-compatible server, each request's JSON body as
sent (``extra_body`` merged) and the answer as received (a stream as its events), never
a header, the URL or the key. In replay nothing is sent and the SDK builds its objects,
and raises its exceptions, from the recorded HTTP answer.
"""

from __future__ import annotations

from typing import Any, TypeVar

import openai

from agent_blackbox.outbox.integrations._clients import gone_client_name, recording_client

__all__ = ["PROVIDER", "capture_openai"]

PROVIDER = "openai"
"""The provider name every call to an OpenAI-compatible API is recorded under."""

C = TypeVar("C", openai.OpenAI, openai.AsyncOpenAI)


def capture_openai(client: C, run: Any = None) -> C:
    """A copy of ``client`` whose model calls are recorded (or answered, in replay).

    Args:
        client: an ``openai.OpenAI`` or ``openai.AsyncOpenAI`` (or a subclass: Azure). In
            replay it never sends anything: no key or reachable URL is needed.
        run: the run the calls belong to; None (the usual) for the run in force where
            each call is made, so one client serves concurrent runs.

    Raises:
        TypeError: ``client`` is not an OpenAI SDK client.
    """
    if not isinstance(client, openai.OpenAI | openai.AsyncOpenAI):
        raise TypeError(f"capture_openai takes openai.OpenAI or openai.AsyncOpenAI, not {client!r}")
    captured: C = client.with_options(http_client=recording_client(client._client, run=run))
    return captured


_GONE = {
    "CapturedOpenAI": "openai.OpenAI",
    "CapturedAsyncOpenAI": "openai.AsyncOpenAI",
    "RecordedStream": "openai.Stream",
    "AsyncRecordedStream": "openai.AsyncStream",
}
"""Names of the capture at the SDK level, which wrapped the client: what stands in for
each now that the capture gives back the SDK's own client."""


def __getattr__(name: str) -> object:
    gone_client_name(__name__, name, _GONE, capture="capture_openai")
