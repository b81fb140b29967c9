"""Local model servers for the transport capture tests: the OpenAI- and
Anthropic-compatible test servers of the framework recipes, answering a few more APIs
and behaving as a real provider sometimes does.

:class:`ApiServer` (OpenAI-compatible) also serves the legacy completions API and
behaves by model name:

- ``held``: a stream that sends its first event, then holds the connection open until
  :attr:`ApiServer.release` is set (what a model thinking between tokens looks like);
- ``flaky``: the first request of each prompt fails with 429 and ``retry-after: 1`` (a
  whole second, as a provider under load says), the next one is answered.

It can sit behind a path prefix (``ApiServer(prefix="/team-a/llm")``), as an
OpenAI-compatible gateway does. :class:`ApiAnthropicServer` also counts tokens.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from tests.integration._llm_server import LLMServer, Reply
from tests.integration.frameworks._model import AgentAnthropicServer, AgentOpenAIServer

__all__ = ["ApiAnthropicServer", "ApiServer"]

_HELD = threading.local()
"""Whether the stream the current handler thread is about to send is held."""


class ApiServer(AgentOpenAIServer):
    """See the module's docstring."""

    name = "capture-api-test-server"

    def __init__(self, prefix: str = "") -> None:
        super().__init__()
        self.prefix = prefix
        self.release = threading.Event()
        """Set to let a held stream send the rest of its events."""
        self.holding = threading.Event()
        """Set once a held stream has sent its first event and waits."""
        self._failed: set[str] = set()

    @property
    def base_url(self) -> str:
        return super().base_url.replace(self.base_path, self.prefix + self.base_path, 1)

    def reply(self, path: str, request: Mapping[str, Any]) -> Reply:
        path = path.removeprefix(self.prefix)
        model = str(request.get("model") or "")
        _HELD.value = model == "held"
        if model == "flaky" and self._first_time(json.dumps(request, sort_keys=True)):
            error = {"message": "slow down", "type": "rate_limit_error", "code": "rate_limit"}
            return Reply(HTTPStatus.TOO_MANY_REQUESTS, {"error": error})
        if path == "/v1/completions":
            return _completion(request)
        return super().reply(path, {**request, "model": model})

    def _first_time(self, key: str) -> bool:
        with self._lock:
            first = key not in self._failed
            self._failed.add(key)
        return first

    def headers_for(self, status: int) -> dict[str, str]:
        return {"retry-after": "1"} if status == HTTPStatus.TOO_MANY_REQUESTS else {}

    def before_event(self, number: int) -> None:
        if number == 1 and getattr(_HELD, "value", False):
            self.holding.set()
            self.release.wait(timeout=30)


def _completion(request: Mapping[str, Any]) -> Reply:
    """A legacy completions answer: the prompt, echoed."""
    text = f"echo: {request.get('prompt')}"
    body = {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1_700_000_000,
        "model": request.get("model"),
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }
    return Reply(HTTPStatus.OK, body)


class ApiAnthropicServer(AgentAnthropicServer):
    """The Anthropic-compatible test server, also answering ``count_tokens``."""

    name = "capture-anthropic-test-server"

    def reply(self, path: str, request: Mapping[str, Any]) -> Reply:
        if path == "/v1/messages/count_tokens":
            words = len(json.dumps(request.get("messages")).split())
            return Reply(HTTPStatus.OK, {"input_tokens": words})
        return super().reply(path, request)


def stop_all(*servers: LLMServer) -> None:
    """Stop servers, releasing any held stream first."""
    for server in servers:
        if isinstance(server, ApiServer):
            server.release.set()
        server.stop()
