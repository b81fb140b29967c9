"""Recording the official ``anthropic`` SDK (``pip install 'agent-blackbox[anthropic]'``).

:func:`capture_anthropic` gives back a real ``anthropic.Anthropic`` (or
``AsyncAnthropic``) whose HTTP transport records (see
:mod:`agent_blackbox.outbox.integrations.transport`): ``messages.create`` (plain, with
tools, streamed), ``messages.stream``, ``messages.count_tokens`` and their
``beta.messages`` twins, with every attribute and ``isinstance`` check of the original.

Recorded under provider ``"anthropic"``: each request's JSON body as sent and the answer
as received (a stream as its events, ``ping`` included), never a header (the key, the
auth token, the beta flags), the URL or ``extra_query``. In replay nothing is sent, and
the SDK builds its objects, and raises its exceptions, from the recorded HTTP answer.
"""

from __future__ import annotations

from typing import Any, TypeVar

import anthropic

from agent_blackbox.outbox.integrations._clients import gone_client_name, recording_client

__all__ = ["PROVIDER", "capture_anthropic"]

PROVIDER = "anthropic"
"""The provider name every Anthropic Messages API call is recorded under."""

C = TypeVar("C", anthropic.Anthropic, anthropic.AsyncAnthropic)


def capture_anthropic(client: C, run: Any = None) -> C:
    """A copy of ``client`` whose model calls are recorded (or answered, in replay).

    Args:
        client: an ``anthropic.Anthropic`` or ``anthropic.AsyncAnthropic``. In replay it
            never sends anything: no key or reachable URL is needed.
        run: the run the calls belong to; None (the usual) for the run in force where
            each call is made.

    Raises:
        TypeError: ``client`` is not an Anthropic SDK client.
    """
    if not isinstance(client, anthropic.Anthropic | anthropic.AsyncAnthropic):
        raise TypeError(
            "capture_anthropic takes anthropic.Anthropic or anthropic.AsyncAnthropic, "
            f"not {client!r}"
        )
    captured: C = client.with_options(http_client=recording_client(client._client, run=run))
    return captured


_GONE = {
    "CapturedAnthropic": "anthropic.Anthropic",
    "CapturedAsyncAnthropic": "anthropic.AsyncAnthropic",
    "RecordedStream": "anthropic.Stream",
    "AsyncRecordedStream": "anthropic.AsyncStream",
}
"""Names of the capture at the SDK level, which wrapped the client: what stands in for
each now that the capture gives back the SDK's own client."""


def __getattr__(name: str) -> object:
    gone_client_name(__name__, name, _GONE, capture="capture_anthropic")
