"""A travel desk on pydantic-ai, recorded by agent-blackbox.

Wiring: each model's provider gets ``http_client=bb.async_http_client()``, an HTTP
client whose transport records every model call into the run in force (one client serves
every run, each recording its own calls). Or, instead, the process calls
``bb.instrument()`` once and builds its models as usual (``"openai:gpt-4o-mini"``).
The tools are pydantic-ai's ``@agent.tool`` / ``@agent.tool_plain`` over ``@bb.tool``,
in that order: pydantic-ai reads the name, signature and docstring through it, and the
``RunContext`` a tool takes is left out of what is recorded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic_ai import Agent, RunContext
from pydantic_ai.models import Model
from pydantic_ai.models.anthropic import AnthropicModel
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.anthropic import AnthropicProvider
from pydantic_ai.providers.openai import OpenAIProvider

import agent_blackbox as bb

OPENAI_MODEL = "gpt-4o-mini"
ANTHROPIC_MODEL = "claude-haiku-4-5"
INSTRUCTIONS = (
    "You are a travel desk. Look up the weather and the local time of the city with the "
    "tools, then answer briefly."
)


class Forecast(BaseModel):
    """The desk's answer as data."""

    city: str
    summary: str


@dataclass
class Traveller:
    """Who is asking: the dependencies of a run."""

    units: str = "celsius"


def openai_chat_model(base_url: str, api_key: str, *, name: str = OPENAI_MODEL) -> Model:
    """An OpenAI (Chat Completions) model whose calls are recorded."""
    provider = OpenAIProvider(
        base_url=base_url, api_key=api_key, http_client=bb.async_http_client()
    )
    return OpenAIChatModel(name, provider=provider)


def openai_responses_model(base_url: str, api_key: str, *, name: str = OPENAI_MODEL) -> Model:
    """An OpenAI (Responses API) model whose calls are recorded."""
    provider = OpenAIProvider(
        base_url=base_url, api_key=api_key, http_client=bb.async_http_client()
    )
    return OpenAIResponsesModel(name, provider=provider)


def anthropic_model(base_url: str, api_key: str, *, name: str = ANTHROPIC_MODEL) -> Model:
    """An Anthropic model whose calls are recorded (pydantic-ai sends them through the
    SDK's ``client.beta.messages``)."""
    provider = AnthropicProvider(
        base_url=base_url, api_key=api_key, http_client=bb.async_http_client()
    )
    return AnthropicModel(name, provider=provider)


def travel_agent(model: Model | str, *, instructions: str = INSTRUCTIONS) -> Agent[Traveller, str]:
    """The agent and its two tools."""
    agent = Agent(model, deps_type=Traveller, instructions=instructions)

    @agent.tool
    @bb.tool
    async def weather(ctx: RunContext[Traveller], city: str) -> str:
        """The weather in a city now.

        Args:
            city: the city's name.
        """
        return f"{city}: 21 degrees {ctx.deps.units} and clear"

    @agent.tool_plain
    @bb.tool
    def local_time(city: str) -> str:
        """The local time in a city.

        Args:
            city: the city's name.
        """
        return f"09:{len(city):02d} in {city}"

    return agent


class TravelDesk:
    """Answers travellers' questions with one agent, shared by every run; each method
    is a run's entry point (``entry(run, question)``).

    Args:
        model: the pydantic-ai model, or a model name (``"openai:gpt-4o-mini"``) once
            ``bb.instrument()`` was called.
        instructions: the agent's system prompt.
    """

    def __init__(self, model: Model | str, *, instructions: str = INSTRUCTIONS) -> None:
        self.agent = travel_agent(model, instructions=instructions)

    async def answer(self, run: Any, question: str) -> str:
        """The agent's answer to ``question``."""
        result = await self.agent.run(question, deps=Traveller())
        return result.output

    async def answer_streamed(self, run: Any, question: str) -> str:
        """The same, streamed: the answer put together from the text as it comes."""
        async with self.agent.run_stream(question, deps=Traveller()) as result:
            pieces = [piece async for piece in result.stream_text(delta=True)]
        return "".join(pieces)

    async def forecast(self, run: Any, question: str) -> dict[str, Any]:
        """The answer as a :class:`Forecast` (pydantic-ai's structured output)."""
        result = await self.agent.run(question, deps=Traveller(), output_type=Forecast)
        return result.output.model_dump()
