"""LlamaIndex's OpenAI LLM, recorded on the real stack and replayed offline: the recipe
``agent_blackbox.examples.recipes.llama_index`` (``docs/guides/frameworks/llama-index.md``).

``llama-index-llms-openai`` (every release to 0.8.3) needs ``openai<3``, below the dev
pins, so the agent runs in the environment of its own (``_compat_env``, ``openai`` 2.x
on the legacy ``httpx``), in a subprocess, against this test's database, topic and
model server; the views and the model server's requests are checked here.

The model calls the tool it is offered with the ``name=value`` words of the question,
then answers ``answer: <the tool's result>``: two model calls and one tool call a run.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine

from agent_blackbox.schemas import Settings
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
from tests.integration.frameworks._harness import CITIES, RUNS, city_of, publish
from tests.integration.frameworks._model import AgentOpenAIServer

pytestmark = [pytest.mark.integration]

RECIPE = "agent_blackbox.examples.recipes.llama_index"
ENTRY = f"{RECIPE}:answer"
AGENT_ENTRY = f"{RECIPE}:answer_with_agent"
RECIPE_FILE = ROOT / "examples" / "recipes" / "llama_index.py"
CHANGED = "request.messages[0].content"
"""Where the edited system prompt shows in the first model call's request."""
AGENT_ID = "llama-index-recipe"
ONE_RUN = ["run.started", "llm.call", "tool.call", "llm.call", "run.finished"]


def question(number: int) -> str:
    return f"How warm is it in city={CITIES[number % len(CITIES)]} right now"


def expected_answer(given: str) -> str:
    """What the agent answers: the model's ``answer:`` with the tool's result."""
    city = city_of(given)
    return f"answer: {city}: {5 + sum(map(ord, city)) % 20} degrees celsius, clear sky"


@pytest.fixture(scope="module")
def model() -> Iterator[AgentOpenAIServer]:
    with AgentOpenAIServer() as server:
        yield server


def test_runs_record_and_replay_offline(
    driver: Driver, model: AgentOpenAIServer, settings: Settings, engine: Engine
) -> None:
    inputs = [question(n) for n in range(RUNS)]
    before = len(model.requests)
    recorded = driver.record(settings, ENTRY, inputs, agent_id=AGENT_ID)
    assert len(recorded.runs) == RUNS
    assert [output for _, output in recorded.runs.values()] == list(map(expected_answer, inputs))
    assert len(model.requests) - before == 2 * RUNS

    publish(settings, engine)
    events = events_by_run(engine, recorded.run_ids)
    assert events == dict.fromkeys(recorded.run_ids, ONE_RUN)
    assert tools_called(engine, recorded.run_ids) == {"get_weather": RUNS}
    assert holes_reported(engine, recorded.run_ids) == {}

    driver.assert_replays_offline(settings, ENTRY, recorded.run_ids, model=model)


@pytest.mark.parametrize(
    ("entry", "function", "call"),
    [
        (ENTRY, "answer", "chat_with_tools("),
        (AGENT_ENTRY, "answer_with_agent", "def answer_with_agent("),
    ],
    ids=["tool-loop", "function-agent"],
)
def test_prompt_change_diverges_at_the_recipes_line(
    driver: Driver, settings: Settings, engine: Engine, entry: str, function: str, call: str
) -> None:
    recorded = driver.record(settings, entry, [question(3)], agent_id=AGENT_ID)
    publish(settings, engine)

    edited = {f"{RECIPE}.SYSTEM_PROMPT": "You answer questions about the weather, briefly."}
    [report] = driver.replay(settings, entry, recorded.run_ids, changed=edited)

    # The FunctionAgent calls the model from a task its workflow made, where no line of
    # the agent's is on the stack or in the task's origin: the entry itself is named.
    line = recipe_line(RECIPE_FILE, call, after=f"def {function}(")
    assert_first_call_changed(
        report, recipe=RECIPE_FILE, function=function, line=line, path=CHANGED
    )


def test_two_function_agents_at_once_record_their_own_calls(
    driver: Driver, model: AgentOpenAIServer, settings: Settings, engine: Engine
) -> None:
    inputs = [question(0), question(1)]
    recorded = driver.record(settings, AGENT_ENTRY, inputs, agent_id=AGENT_ID, at_once=2)
    assert [output for _, output in recorded.runs.values()] == list(map(expected_answer, inputs))
    publish(settings, engine)

    # Both runs have the same shape: a call recorded into the other run shows in the
    # counts, or as a divergence of the replays (each answer names its own city).
    assert events_by_run(engine, recorded.run_ids) == dict.fromkeys(recorded.run_ids, ONE_RUN)
    assert overlapped(engine, recorded.run_ids), "the two runs were not under way at once"
    # The FunctionAgent streams the model's answers: recorded as streams, replayed so.
    assert llm_call_attribute(engine, recorded.run_ids, "streamed") == ["true"] * 4

    driver.assert_replays_offline(settings, AGENT_ENTRY, recorded.run_ids, model=model)
