"""A weather desk on the OpenAI Agents SDK, recorded by agent-blackbox.

Wiring, once per process, the replaying one too (:func:`use_client`): the HTTP
transports record every model call into the run in force (and answer it from the log in
replay), the SDK's default client is the application's own ``AsyncOpenAI``, and the SDK's
tracing is off: its exporter posts spans, tool arguments and results among them, from a
thread of its own where no run is in force, so the recorder would not report it and a
replay would post again. The tool is the SDK's ``function_tool`` over
``agent_blackbox.tool``, in that order (the SDK reads the signature and docstring
through it).
"""

from __future__ import annotations

from typing import Any

from agents import (
    Agent,
    Model,
    Runner,
    function_tool,
    set_default_openai_client,
    set_tracing_disabled,
)
from openai import AsyncOpenAI
from openai.types.responses import ResponseTextDeltaEvent

import agent_blackbox as bb

MODEL = "gpt-4.1-mini"
INSTRUCTIONS = "You are a weather desk. Look the weather up with the tool, then answer briefly."


@function_tool
@bb.tool
def get_weather(city: str) -> str:
    """The weather in a city now.

    Args:
        city: the city's name.
    """
    return f"{city}: {12 + len(city) % 9} degrees and clear"


def use_client(client: AsyncOpenAI) -> None:
    """Wire the process: record every model call into the run in force, make ``client``
    the SDK's default one, and keep the SDK's tracing from exporting."""
    bb.instrument()
    set_default_openai_client(client, use_for_tracing=False)
    set_tracing_disabled(True)


class WeatherDesk:
    """Answers weather questions with one agent.

    Args:
        model: the SDK model to use (``OpenAIChatCompletionsModel``,
            ``OpenAIResponsesModel``), or a model name served by the default client.
    """

    def __init__(self, model: Model | str = MODEL, *, instructions: str = INSTRUCTIONS) -> None:
        self.agent = Agent(
            name="weather desk", instructions=instructions, model=model, tools=[get_weather]
        )

    async def answer(self, run: Any, question: str) -> str:
        """The agent's answer to ``question`` (a run's entry point)."""
        result = await Runner.run(self.agent, question)
        return str(result.final_output)

    async def answer_streamed(self, run: Any, question: str) -> str:
        """The same, streamed: the answer is put together from the text as it comes."""
        result = Runner.run_streamed(self.agent, question)
        pieces: list[str] = []
        async for event in result.stream_events():
            if event.type == "raw_response_event" and isinstance(
                event.data, ResponseTextDeltaEvent
            ):
                pieces.append(event.data.delta)
        return "".join(pieces)
