"""instructor, recorded on the real stack and replayed offline: the recipe
``agent_blackbox.examples.recipes.instructor`` (``docs/guides/frameworks/instructor.md``).

instructor cannot share the dev environment (its ``jiter<0.15`` against ``openai>=3.4``),
so the agent runs in the environment of its own (``_compat_env``, ``openai`` 2.x on the
legacy ``httpx``), in a subprocess, against this test's database, topic and model
server; the views and the model server's requests are checked here.

The model extracts a :class:`WeatherQuery` through a forced tool call whose arguments
are the ``name=value`` words of the question. A question asking in ``unit=kelvin`` fails
the model's validation, and instructor asks again with the error (its retry path); the
model here reads the fix the error names (``unit=celsius``), so the second ask passes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from sqlalchemy import Engine

from agent_blackbox.schemas import Settings
from tests.integration import _openai_server as openai_server
from tests.integration._llm_server import Reply
from tests.integration._openai_server import OpenAIServer
from tests.integration.frameworks._compat import (
    Driver,
    assert_first_call_changed,
    events_by_run,
    holes_reported,
    llm_call_attribute,
    overlapped,
    recipe_line,
    tools_called,
)
from tests.integration.frameworks._compat_env import ROOT
from tests.integration.frameworks._harness import CITIES, RUNS, publish

pytestmark = [pytest.mark.integration]

RECIPE = "agent_blackbox.examples.recipes.instructor"
ENTRY = f"{RECIPE}:answer"
ASYNC_ENTRY = f"{RECIPE}:answer_async"
STREAMED_ENTRY = f"{RECIPE}:answer_streamed"
RECIPE_FILE = ROOT / "examples" / "recipes" / "instructor.py"
CHANGED = "request.messages[0].content"
"""Where the edited instructions show in the first model call's request."""
AGENT_ID = "instructor-recipe"


class CorrectableServer(OpenAIServer):
    """The OpenAI-compatible test server, as a model that takes a correction: asked
    again after instructor's validation error (the conversation ends with the ``tool``
    message that carries it), its tool call reads the ``name=value`` words of the user's
    text and then those of the error, so a fix the error names wins."""

    name = "correctable-openai-test-server"

    def reply(self, path: str, request: Mapping[str, Any]) -> Reply:
        messages = request.get("messages") or []
        if messages and messages[-1].get("role") == "tool" and request.get("tools"):
            users = [m["content"] for m in messages if m.get("role") == "user"]
            told = {"role": "user", "content": f"{users[-1]} {messages[-1]['content']}"}
            request = {**request, "messages": [*messages, told]}
        return openai_server.answer(path, request)


def question(number: int) -> str:
    """The ``number``-th question: every fifth asks in kelvin (one retry)."""
    unit = "kelvin" if number % 5 == 0 else ("celsius", "fahrenheit")[number % 2]
    return f"What is the weather in city={CITIES[number % len(CITIES)]} unit={unit} today"


def asks(given: str) -> int:
    """How many model calls the question takes: one, or two after a kelvin."""
    return 2 if "unit=kelvin" in given else 1


def extracted(given: str) -> dict[str, str]:
    """What the agent should extract from ``given`` (kelvin corrected to celsius)."""
    words = dict(word.split("=", 1) for word in given.split() if "=" in word)
    unit = "celsius" if words["unit"] == "kelvin" else words["unit"]
    return {"city": words["city"], "unit": unit}


@pytest.fixture(scope="module")
def model() -> Iterator[CorrectableServer]:
    with CorrectableServer() as server:
        yield server


def test_runs_record_and_replay_offline(
    driver: Driver, model: CorrectableServer, settings: Settings, engine: Engine
) -> None:
    inputs = [question(n) for n in range(RUNS)]
    before = len(model.requests)
    recorded = driver.record(settings, ENTRY, inputs, agent_id=AGENT_ID)
    assert len(recorded.runs) == RUNS
    for given, output in recorded.runs.values():
        assert output["query"] == extracted(given)
        assert output["weather"]["unit"] == extracted(given)["unit"]
    retried = sum(asks(given) - 1 for given in inputs)
    assert retried > 0, "no question took instructor's retry path"
    assert len(model.requests) - before == RUNS + retried

    publish(settings, engine)
    events = events_by_run(engine, recorded.run_ids)
    for run_id, (given, _) in recorded.runs.items():
        calls = ["llm.call"] * asks(given)
        assert events[run_id] == ["run.started", *calls, "tool.call", "run.finished"]
    assert tools_called(engine, recorded.run_ids) == {"get_weather": RUNS}
    assert holes_reported(engine, recorded.run_ids) == {}

    driver.assert_replays_offline(settings, ENTRY, recorded.run_ids, model=model)


def test_prompt_change_diverges_at_the_recipes_line(
    driver: Driver, settings: Settings, engine: Engine
) -> None:
    recorded = driver.record(settings, ENTRY, [question(1)], agent_id=AGENT_ID)
    publish(settings, engine)

    edited = {f"{RECIPE}.INSTRUCTIONS": "Extract the city the user asks about."}
    [report] = driver.replay(settings, ENTRY, recorded.run_ids, changed=edited)

    line = recipe_line(RECIPE_FILE, "create(", after="def answer")
    assert_first_call_changed(
        report, recipe=RECIPE_FILE, function="answer", line=line, path=CHANGED
    )


def test_streamed_extraction_records_the_stream_and_replays_it(
    driver: Driver, model: CorrectableServer, settings: Settings, engine: Engine
) -> None:
    inputs = [question(n) for n in (1, 2, 3)]  # no kelvin: one streamed ask each
    recorded = driver.record(settings, STREAMED_ENTRY, inputs, agent_id=AGENT_ID)
    for given, output in recorded.runs.values():
        assert output["query"] == extracted(given)
    publish(settings, engine)

    expected = ["run.started", "llm.call", "tool.call", "run.finished"]
    assert events_by_run(engine, recorded.run_ids) == dict.fromkeys(recorded.run_ids, expected)
    assert llm_call_attribute(engine, recorded.run_ids, "streamed") == ["true"] * 3

    driver.assert_replays_offline(settings, STREAMED_ENTRY, recorded.run_ids, model=model)


def test_two_runs_at_once_record_their_own_calls(
    driver: Driver, model: CorrectableServer, settings: Settings, engine: Engine
) -> None:
    # One question retries (two model calls), the other not: a call recorded into the
    # wrong run shows in the counts.
    inputs = [question(0), question(1)]
    recorded = driver.record(settings, ASYNC_ENTRY, inputs, agent_id=AGENT_ID, at_once=2)
    for given, output in recorded.runs.values():
        assert output["query"] == extracted(given)
    publish(settings, engine)

    events = events_by_run(engine, recorded.run_ids)
    for run_id, (given, _) in recorded.runs.items():
        calls = ["llm.call"] * asks(given)
        assert events[run_id] == ["run.started", *calls, "tool.call", "run.finished"]
    assert overlapped(engine, recorded.run_ids), "the two runs were not under way at once"

    driver.assert_replays_offline(settings, ASYNC_ENTRY, recorded.run_ids, model=model)
