"""A conversation agent for the payload benches: a support agent that talks with a
customer for a number of turns, each turn one LLM call over the whole conversation so
far (system prompt, tools, every earlier message) and, when the model asks for one, a
tool call whose result goes back into the conversation.

The model is a deterministic stand-in answering in the provider's own JSON (OpenAI chat
completions, or Anthropic messages), so the recorded bodies have the shape and the
growth of a real agent's: request ``n`` repeats requests ``1..n-1``.

Words come from a ``Prose`` source: :func:`invented_prose` makes up words (what the shared
dictionary was trained on), :func:`docstring_prose` takes sentences from the docstrings
of the Python standard library installed here (English the dictionary never saw; read
at run time, never stored in the project).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import pkgutil
import random
import string
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any

from agent_blackbox.outbox import AgentRun

Prose = Callable[[random.Random, int], str]
"""``(rng, words) -> text`` of about that many words."""

SYSTEM_PROMPT_WORDS = 400
TOOLS = [
    {
        "name": "lookup_order",
        "description": "Find an order by its number and return its items, status and dates.",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string", "description": "The order number."}},
            "required": ["order_id"],
        },
    },
    {
        "name": "refund",
        "description": "Refund part or all of an order to the original payment method.",
        "parameters": {
            "type": "object",
            "properties": {
                "order_id": {"type": "string"},
                "amount_cents": {"type": "integer", "minimum": 1},
                "reason": {"type": "string"},
            },
            "required": ["order_id", "amount_cents", "reason"],
        },
    },
    {
        "name": "search_help",
        "description": "Search the help centre articles and return the best matches.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
            "required": ["query"],
        },
    },
]


def invented_prose(rng: random.Random, words: int) -> str:
    """Made-up words of two to nine letters in sentences."""
    out = []
    for i in range(words):
        word = "".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9)))
        out.append(word.capitalize() if i % 12 == 0 else word)
        if i % 12 == 11:
            out[-1] += "."
    return " ".join(out)


@cache
def _sentences() -> tuple[str, ...]:
    found: list[str] = []
    for module in ("json", "email", "http", "logging", "unittest", "asyncio", "argparse"):
        package = __import__(module)
        names = [module] + [
            f"{module}.{m.name}"
            for m in pkgutil.iter_modules(getattr(package, "__path__", []))
            if not m.name.startswith("_")
        ]
        for name in names:
            try:
                mod = __import__(name, fromlist=["_"])
            except Exception:  # an optional module missing here
                continue
            for _, obj in inspect.getmembers(mod):
                doc = inspect.getdoc(obj) if callable(obj) else None
                if doc:
                    found.extend(s.strip() for s in doc.replace("\n", " ").split(". ") if s)
    return tuple(sorted(set(found)))


def docstring_prose(rng: random.Random, words: int) -> str:
    """Sentences of the standard library's docstrings, about ``words`` words."""
    sentences = _sentences()
    out: list[str] = []
    count = 0
    while count < words:
        sentence = rng.choice(sentences)
        out.append(sentence.rstrip(".") + ".")
        count += sentence.count(" ") + 1
    return " ".join(out)


def conversation_agent(turns: int, prose: Prose, *, provider: str = "openai") -> Any:
    """The agent entry point ``(run, input)``: ``input["seed"]`` seeds the customer."""

    def agent(run: AgentRun, input: Any) -> Any:
        rng = random.Random(input["seed"])
        system = "You are a support agent. " + prose(rng, SYSTEM_PROMPT_WORDS)
        messages: list[dict[str, Any]] = []
        if provider == "openai":
            messages.append({"role": "system", "content": system})
        replies = 0
        for turn in range(turns):
            messages.append({"role": "user", "content": prose(rng, rng.randint(20, 80))})
            request = _request(provider, system, messages, turn)
            response = run.llm(_model(prose), request, provider=provider)
            message, calls = _answer(provider, response)
            messages.append(message)
            for call_id, name, arguments in calls:
                result = run.call(name, _tool(prose), arguments)
                messages.append(_tool_result(provider, call_id, result))
            replies += 1
        return {"turns": replies, "messages": len(messages)}

    return agent


def _request(
    provider: str, system: str, messages: list[dict[str, Any]], turn: int
) -> dict[str, Any]:
    if provider == "anthropic":
        tools = [
            {"name": t["name"], "description": t["description"], "input_schema": t["parameters"]}
            for t in TOOLS
        ]
        return {
            "model": "claude-sonnet-4-5",
            "max_tokens": 1024,
            "system": system,
            "messages": list(messages),
            "tools": tools,
            "metadata": {"user_id": f"customer-{turn % 7}"},
        }
    return {
        "model": "gpt-4.1-mini",
        "temperature": 0.2,
        "messages": list(messages),
        "tools": [{"type": "function", "function": t} for t in TOOLS],
    }


def _model(prose: Prose) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    """A deterministic model: it asks for a tool every third turn, else answers."""

    def send(request: Mapping[str, Any]) -> dict[str, Any]:
        seed = hashlib.sha256(json.dumps(request["messages"][-1]).encode()).digest()
        rng = random.Random(seed)
        asks = len(request["messages"]) % 3 == 0
        text = prose(rng, rng.randint(30, 120))
        prompt = sum(len(json.dumps(m)) for m in request["messages"]) // 4
        call_id = f"call_{seed.hex()[:24]}"
        arguments = {"order_id": f"A-{rng.randint(10000, 99999)}"}
        if "system" in request:  # Anthropic
            content: list[dict[str, Any]] = [{"type": "text", "text": text}]
            if asks:
                content.append(
                    {"type": "tool_use", "id": call_id, "name": "lookup_order", "input": arguments}
                )
            return {
                "id": f"msg_{seed.hex()[:24]}",
                "type": "message",
                "role": "assistant",
                "model": request["model"],
                "content": content,
                "stop_reason": "tool_use" if asks else "end_turn",
                "stop_sequence": None,
                "usage": {"input_tokens": prompt, "output_tokens": len(text) // 4},
            }
        message: dict[str, Any] = {"role": "assistant", "content": None if asks else text}
        if asks:
            message["tool_calls"] = [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "lookup_order", "arguments": json.dumps(arguments)},
                }
            ]
        return {
            "id": f"chatcmpl-{seed.hex()[:24]}",
            "object": "chat.completion",
            "created": 1764892800,
            "model": request["model"],
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if asks else "stop",
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": len(text) // 4,
                "total_tokens": prompt + len(text) // 4,
            },
            "system_fingerprint": "fp_bench",
        }

    return send


def _answer(
    provider: str, response: Mapping[str, Any]
) -> tuple[dict[str, Any], list[tuple[str, str, dict[str, Any]]]]:
    if provider == "anthropic":
        content = response["content"]
        calls = [(b["id"], b["name"], b["input"]) for b in content if b["type"] == "tool_use"]
        return {"role": "assistant", "content": content}, calls
    message = dict(response["choices"][0]["message"])
    calls = [
        (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in message.get("tool_calls") or ()
    ]
    return message, calls


def _tool(prose: Prose) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def lookup(arguments: dict[str, Any]) -> dict[str, Any]:
        rng = random.Random(arguments["order_id"])
        return {
            "order_id": arguments["order_id"],
            "status": rng.choice(["shipped", "delivered", "returned", "processing"]),
            "items": [
                {"sku": f"SKU-{rng.randint(1000, 9999)}", "quantity": rng.randint(1, 3)}
                for _ in range(rng.randint(1, 4))
            ],
            "note": prose(rng, 25),
        }

    return lookup


def _tool_result(provider: str, call_id: str, result: Any) -> dict[str, Any]:
    text = json.dumps(result, sort_keys=True)
    if provider == "anthropic":
        return {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call_id, "content": text}],
        }
    return {"role": "tool", "tool_call_id": call_id, "content": text}
