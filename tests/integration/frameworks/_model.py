"""The model the framework recipes' agents talk to: the local OpenAI- and
Anthropic-compatible test servers, answering as a model in a tool loop would.

Offered tools, the model calls the first one (``parallel_tool_calls``: each); given a
tool's result (the last chat message is a ``tool`` message, the last Responses input item
a ``function_call_output``, the last Anthropic user turn a ``tool_result``), it answers
with text: ``"answer: <the result>"``. Without tools it echoes the last user text.
Embeddings are a fixed vector per input. Everything is decided by the request alone, so a
replay's recorded answers are exactly what the server would say again.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from tests.integration import _openai_server as openai_server
from tests.integration._anthropic_server import AnthropicServer
from tests.integration._llm_server import Reply
from tests.integration._openai_server import OpenAIServer

__all__ = ["AgentAnthropicServer", "AgentOpenAIServer", "MeetingServer", "tool_result_of"]


def tool_result_of(request: Mapping[str, Any]) -> str | None:
    """The tool result the request ends with, as text, or None."""
    messages = request.get("messages")
    if isinstance(messages, list) and messages:
        last = messages[-1]
        if last.get("role") == "tool":
            return _text(last.get("content"))
        content = last.get("content")
        if last.get("role") == "user" and isinstance(content, list):
            results = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]
            if results:
                return _text(results[-1].get("content"))
    items = request.get("input")
    if isinstance(items, list) and items:
        last = items[-1]
        if isinstance(last, dict) and last.get("type") == "function_call_output":
            return _text(last.get("output"))
    return None


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            str(part.get("text", "")) if isinstance(part, dict) else str(part) for part in content
        )
    return json.dumps(content)


class AgentOpenAIServer(OpenAIServer):
    """The OpenAI-compatible test server, closing each tool loop (see the module)."""

    name = "agent-openai-test-server"

    def reply(self, path: str, request: Mapping[str, Any]) -> Reply:
        if path == "/v1/embeddings":
            return Reply(HTTPStatus.OK, _embeddings(request))
        result = tool_result_of(request)
        if result is None:
            return openai_server.answer(path, request)
        final = {**request, "tools": [], "messages": [{"role": "user", "content": result}]}
        if path == "/v1/responses":
            final = {**request, "tools": [], "input": result}
        reply = openai_server.answer(path, final)
        return _answering(reply, result)


class MeetingServer(AgentOpenAIServer):
    """Holds each conversation's first model call until ``parties`` of them have arrived:
    the runs are proved in flight at once, not merely started together. Put it first
    among the bases of another :class:`AgentOpenAIServer` to hold that one's calls."""

    def __init__(self, parties: int = 2) -> None:
        super().__init__()
        self.meeting = threading.Barrier(parties, timeout=30)

    def reply(self, path: str, request: Mapping[str, Any]) -> Reply:
        if tool_result_of(request) is None:
            self.meeting.wait()
        return super().reply(path, request)


def _answering(reply: Reply, result: str) -> Reply:
    """``reply`` (an echo of ``result``) saying ``answer:`` instead of ``echo:``."""
    swap = json.dumps(f"echo: {result}")[1:-1], json.dumps(f"answer: {result}")[1:-1]
    if reply.events is not None:
        events = tuple(
            (name, data.replace("echo:", "answer:", 1) if "echo:" in data else data)
            for name, data in reply.events
        )
        return Reply(reply.status, events=events)
    body = json.loads(json.dumps(reply.body).replace(swap[0], swap[1]))
    return Reply(reply.status, body)


def _embeddings(request: Mapping[str, Any]) -> dict[str, Any]:
    given = request.get("input")
    texts = given if isinstance(given, list) else [given]
    data = [
        {"object": "embedding", "index": i, "embedding": [float(len(str(t)) % 7), 0.5, -0.25]}
        for i, t in enumerate(texts)
    ]
    usage = {"prompt_tokens": len(texts), "total_tokens": len(texts)}
    return {"object": "list", "data": data, "model": request.get("model"), "usage": usage}


class AgentAnthropicServer(AnthropicServer):
    """The Anthropic-compatible test server (it closes tool loops already)."""

    name = "agent-anthropic-test-server"
