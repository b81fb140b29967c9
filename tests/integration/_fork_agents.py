"""A weather agent for the fork and re-execution tests: it asks a model (through the
official SDK, captured) which cities to look up, looks each up with a tool, and asks
again, streamed, for an answer. Which cities it looks up is the model's choice, so a
fork with another model can make tool calls its parent never made.

The client is captured once, for every run (``capture_openai(client)``): each call is
recorded into the run in force where it is made, the recording run, the fork's run or
the replay run alike."""

from __future__ import annotations

import json
from typing import Any

from openai import AsyncOpenAI, OpenAI

from agent_blackbox.outbox import AgentRun, AsyncRun, RunSnapshot
from agent_blackbox.outbox.integrations.openai import capture_openai
from agent_blackbox.replayer import fork_replay_entry
from agent_blackbox.replayer._fork import REPLAY_BASE_URL

MODEL = "weather-small"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}

LIVE_CALLS: list[str] = []
"""The cities the live weather service was asked about (tests clear it)."""


def weather_service(city: str) -> dict[str, Any]:
    LIVE_CALLS.append(city)
    return {"city": city, "temp_c": len(city) * 3}


class WeatherAgent:
    def __init__(self, client: OpenAI, model: str, *, stream_usage: bool = False) -> None:
        self.client = capture_openai(client)
        self.model = model
        self.stream_usage = stream_usage

    def run(self, run: AgentRun, input: Any) -> dict[str, Any]:
        client = self.client
        messages: list[Any] = [{"role": "user", "content": input["question"]}]
        plan = client.chat.completions.create(
            model=self.model, messages=messages, tools=[WEATHER_TOOL]
        )
        calls = plan.choices[0].message.tool_calls or []
        found = [
            run.call("get_weather", weather_service, json.loads(c.function.arguments)["city"])  # type: ignore[union-attr]
            for c in calls
        ]
        messages.append({"role": "user", "content": json.dumps(found)})
        options = {"stream_options": {"include_usage": True}} if self.stream_usage else {}
        stream = client.chat.completions.create(
            model=self.model, messages=messages, stream=True, **options
        )
        text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        return {"weather": found, "answer": text}


class WeatherOutage(Exception):
    """The async agent's own failure, when its snapshot's ``outage`` flag says so."""


class AsyncWeatherAgent:
    """:class:`WeatherAgent` for asyncio code: the same calls, awaited."""

    def __init__(self, client: AsyncOpenAI, model: str, *, outage: bool = False) -> None:
        self.client = client
        self.model = model
        self.outage = outage

    async def run(self, run: AsyncRun, input: Any) -> dict[str, Any]:
        client = capture_openai(self.client, run)
        messages: list[Any] = [{"role": "user", "content": input["question"]}]
        plan = await client.chat.completions.create(
            model=self.model, messages=messages, tools=[WEATHER_TOOL]
        )
        calls = plan.choices[0].message.tool_calls or []
        found = [
            await run.call("get_weather", weather_service, json.loads(c.function.arguments)["city"])  # type: ignore[union-attr]
            for c in calls
        ]
        if self.outage:
            raise WeatherOutage("the weather service is down")
        messages.append({"role": "user", "content": json.dumps(found)})
        stream = await client.chat.completions.create(
            model=self.model, messages=messages, stream=True
        )
        text = "".join(
            [chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices]
        )
        return {"weather": found, "answer": text}


def async_fork_entry(snapshot: RunSnapshot, *, base_url: str, api_key: str) -> Any:
    """The fork factory of the async agent (``--set flag.outage=yes`` makes it fail)."""
    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    outage = snapshot.flags.get("outage") == "yes"
    return AsyncWeatherAgent(client, snapshot.model_ids[0], outage=outage).run


def snapshot(question: str = "Weather for my trip?") -> RunSnapshot:
    return RunSnapshot(code_version="weather/1", input={"question": question}, model_ids=(MODEL,))


def fork_entry(snapshot: RunSnapshot, *, base_url: str, api_key: str) -> Any:
    """The fork factory: the model the (changed) snapshot names, at ``base_url``."""
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    return WeatherAgent(client, snapshot.model_ids[0]).run


def plain_replay_entry(run: AgentRun, input: Any) -> Any:
    """The agent as production builds it, for replay (the client is never called)."""
    client = OpenAI(base_url=REPLAY_BASE_URL, api_key="replay", max_retries=0)
    return WeatherAgent(client, MODEL).run(run, input)


replay_entry = fork_replay_entry(fork_entry, runs=plain_replay_entry)
"""Replays plain runs as production built them, and forks as their factory did."""
