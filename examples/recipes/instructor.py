"""instructor: a structured answer from the model, recorded.

The agent reads a weather question, has the model extract a :class:`WeatherQuery` from
it (instructor forces a call of a tool shaped like the model, and validates what comes
back), and asks the weather service (a tool recorded through ``agent_blackbox.tool``).
When the model's arguments fail validation, instructor asks again with the error, up to
``max_retries`` times: each ask is a model call of its own, recorded and replayed.

The wiring is one line: instructor patches an OpenAI client, and the client it patches is
a recording one (``agent_blackbox.capture_openai``). One client per process serves every
run: each call records into the run in force where it is made.
"""

from __future__ import annotations

import functools
from typing import Any

import instructor
import openai
from pydantic import BaseModel, field_validator

import agent_blackbox as bb

MODEL = "gpt-4o-mini"
INSTRUCTIONS = "Extract the city and the unit of temperature the user asks the weather in."
UNITS = ("celsius", "fahrenheit")


class WeatherQuery(BaseModel):
    """What the user asks: the weather where, and in which unit."""

    city: str
    unit: str

    @field_validator("unit")
    @classmethod
    def known_unit(cls, unit: str) -> str:
        # The message goes back to the model when instructor asks again: say the fix.
        if unit not in UNITS:
            raise ValueError(f"{unit!r} is not a unit we report in; use unit=celsius")
        return unit


@bb.tool
def get_weather(city: str, unit: str) -> dict[str, Any]:
    """The current weather in ``city``, in ``unit`` (a stand-in for a weather API)."""
    celsius = 5 + sum(map(ord, city)) % 20
    degrees = celsius if unit == "celsius" else round(celsius * 9 / 5 + 32)
    return {"city": city, "temperature": degrees, "unit": unit, "sky": "clear"}


@functools.cache
def client() -> instructor.Instructor:
    """The process's model client (``OPENAI_API_KEY``, ``OPENAI_BASE_URL``), recording."""
    return instructor.from_openai(bb.capture_openai(openai.OpenAI()))


@functools.cache
def async_client() -> instructor.AsyncInstructor:
    """The async twin of :func:`client`."""
    return instructor.from_openai(bb.capture_openai(openai.AsyncOpenAI()))


def _messages(question: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": INSTRUCTIONS},
        {"role": "user", "content": question},
    ]


def answer(run: object, question: str) -> dict[str, Any]:
    """The entry point: extract the query, ask the weather service, answer."""
    query = client().chat.completions.create(
        model=MODEL,
        response_model=WeatherQuery,
        messages=_messages(question),
        max_retries=2,
    )
    return {"query": query.model_dump(), "weather": get_weather(query.city, query.unit)}


def answer_streamed(run: object, question: str) -> dict[str, Any]:
    """:func:`answer` with the query streamed as the model writes it
    (``create_partial``: what a user interface shows meanwhile)."""
    partials = client().chat.completions.create_partial(
        model=MODEL,
        response_model=WeatherQuery,
        messages=_messages(question),
    )
    shown = [partial.model_dump() for partial in partials]
    query = shown[-1]  # the last partial is the whole query
    return {"query": query, "weather": get_weather(query["city"], query["unit"])}


async def answer_async(run: object, question: str) -> dict[str, Any]:
    """:func:`answer` for asyncio (``instructor.AsyncInstructor``)."""
    query = await async_client().chat.completions.create(
        model=MODEL,
        response_model=WeatherQuery,
        messages=_messages(question),
        max_retries=2,
    )
    return {"query": query.model_dump(), "weather": get_weather(query.city, query.unit)}
