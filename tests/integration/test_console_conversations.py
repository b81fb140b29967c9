"""A run's conversation and its tree in the console, in a real headless Chromium on the
real stack: runs recorded through the OpenAI capture (parallel tool calls run in two
threads, one of which raises and is caught; a streamed answer) and the Anthropic capture
(tool_use, tool_result), relayed to Kafka and built into the views; the whole run
opened for one stated purpose, one access audit row per body read; the tree's names
and nesting; the caught tool error labelled as a tool error; no text cut mid-word at
1280 px."""

from __future__ import annotations

import contextvars
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from sqlalchemy import Engine, text

import agent_blackbox as bb
from agent_blackbox.consumers import migrate_views
from agent_blackbox.outbox import AgentRun, Recorder, RunSnapshot
from agent_blackbox.schemas import Settings
from tests.conftest import Login
from tests.integration._anthropic_server import AnthropicServer
from tests.integration._backups import relay
from tests.integration._browser import SCREENSHOTS, chromium, console, words_cut
from tests.integration._openai_server import OpenAIServer
from tests.integration._views import build_analytics, build_views
from tests.integration._wait import eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SYSTEM = "You answer weather questions. <b>Never</b> <script>window.__pwned = 1</script>"
QUESTION = "weather and time in city=Oslo"
OUTAGE = "the weather service is down"


def _function(name: str) -> dict[str, Any]:
    parameters = {"type": "object", "properties": {"city": {"type": "string"}}}
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


@bb.tool
def get_weather(city: str) -> str:
    raise LookupError(OUTAGE)


@bb.tool
def get_time(city: str) -> dict[str, str]:
    return {"city": city, "time": "09:00"}


TOOLS = {"get_weather": get_weather, "get_time": get_time}


def _openai_agent(client: openai.OpenAI) -> Any:
    """Ask with two tools; run both calls the model asks for in threads of their own
    (catching the one that fails); send the results back and stream the answer."""

    def entry(run: AgentRun, _input: Any) -> str:
        llm = bb.capture_openai(client)
        messages: list[Any] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": QUESTION},
        ]
        first = llm.chat.completions.create(
            model="gpt-test",
            messages=messages,
            tools=[_function("get_weather"), _function("get_time")],
            parallel_tool_calls=True,
        )
        calls = first.choices[0].message.tool_calls or []
        messages.append(first.choices[0].message.model_dump(exclude_none=True))

        def execute(call: Any) -> dict[str, Any]:
            arguments = json.loads(call.function.arguments)
            try:
                result: Any = TOOLS[call.function.name](**arguments)
            except LookupError as exc:  # caught: the model is told, the run carries on
                result = {"error": str(exc)}
            return {"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)}

        # Each thread runs in a copy of the agent's context, where the run in force is.
        with ThreadPoolExecutor(2) as pool:
            running = [pool.submit(contextvars.copy_context().run, execute, c) for c in calls]
            messages += [f.result() for f in running]
        stream = llm.chat.completions.create(model="gpt-test", messages=messages, stream=True)
        return "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)

    return entry


def _anthropic_agent(client: anthropic.Anthropic) -> Any:
    """A tool loop on the Messages API: tool_use, the tool, tool_result, the answer."""
    tool = {
        "name": "get_time",
        "description": "The time in a city.",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
    }

    def entry(run: AgentRun, _input: Any) -> str:
        llm = bb.capture_anthropic(client)
        messages: list[Any] = [{"role": "user", "content": "time in city=Rome"}]
        first = llm.messages.create(
            model="claude-test", max_tokens=64, system="Be brief.", messages=messages, tools=[tool]
        )
        use = next(block for block in first.content if block.type == "tool_use")
        found = get_time(**use.input)
        result = {"type": "tool_result", "tool_use_id": use.id, "content": json.dumps(found)}
        messages += [
            {"role": "assistant", "content": first.content},
            {"role": "user", "content": [result]},
        ]
        answer = llm.messages.create(
            model="claude-test", max_tokens=64, system="Be brief.", messages=messages, tools=[tool]
        )
        return str(answer.content[0].text)

    return entry


@pytest.fixture
def recorded(settings: Settings, engine: Engine) -> dict[str, str]:
    migrate_views(settings.database_url)
    recorder = Recorder(engine, settings=settings)
    with (
        OpenAIServer() as gpt,
        AnthropicServer() as claude,
        openai.OpenAI(base_url=gpt.base_url, api_key="sk-test", max_retries=0) as oa,
        anthropic.Anthropic(base_url=claude.base_url, api_key="sk-ant", max_retries=0) as an,
    ):
        snapshot = RunSnapshot(code_version="weather-1", input=QUESTION)
        first, said = recorder.record(_openai_agent(oa), snapshot, agent_id="weather-agent")
        second, _ = recorder.record(_anthropic_agent(an), snapshot, agent_id="time-agent")
    assert said.startswith("echo: ")
    relay(engine, settings)
    total = first.last_sequence + second.last_sequence
    build_views(settings, engine, expect=total)
    build_analytics(settings, engine, group="conversation-analytics", expect=total)
    return {"openai": first.run_id, "anthropic": second.run_id}


@dataclass
class Browsing:
    base: str
    driver: WebDriver
    login: Engine


@pytest.fixture
def browsing(
    settings: Settings, login: Login, recorded: dict[str, str], tmp_path: Path
) -> Iterator[Browsing]:
    replayer = login("blackbox_replayer", tenant="*")
    url = replayer.url.render_as_string(hide_password=False)
    with console(settings, url, tmp_path / "web.log") as base, chromium() as driver:
        driver.set_window_size(1280, 1000)
        yield Browsing(base, driver, replayer)


def _audited(engine: Engine, run_id: str, purpose: str) -> list[tuple[str, str]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT principal, outcome FROM blackbox.access_audit "
                "WHERE run_id = :r AND purpose = :p ORDER BY id"
            ),
            {"r": run_id, "p": f"console local: {purpose}"},
        )
        return [(str(p), str(o)) for p, o in rows]


def _open_conversation(driver: WebDriver, purpose: str, *, keyboard: bool = False) -> WebElement:
    """State ``purpose`` in the run page's form and send it (with the Enter key when
    ``keyboard``); the conversation shown."""
    if keyboard:
        driver.find_element(By.ID, "purpose").send_keys(purpose, Keys.ENTER)
    else:
        driver.find_element(By.ID, "purpose").send_keys(purpose)
        driver.find_element(By.ID, "open-conversation").click()
    shown = eventually(
        lambda: driver.find_elements(By.CSS_SELECTOR, "#conversation, #message"),
        what="the answer to the purpose form",
    )[0]
    assert shown.get_attribute("id") == "conversation", shown.text
    return shown


def _turns(item: WebElement, *, folded: bool = False) -> list[str]:
    """The role line of each turn of a call (the folded ones only when asked)."""
    turns = item.find_elements(By.CSS_SELECTOR, ":scope > .turn")
    if folded:
        turns = item.find_elements(By.CSS_SELECTOR, ":scope > details.folded > .turn") + turns
    return [
        t.find_element(By.CSS_SELECTOR, ".role").get_attribute("textContent") or "" for t in turns
    ]


def _tree(driver: WebDriver) -> list[tuple[int, str, str]]:
    """(depth, name, kind) of each span of the tree, depth first."""
    rows = []
    for li in driver.find_elements(By.CSS_SELECTOR, "#tree li.span"):
        depth = int(
            driver.execute_script(
                "let d = 0, e = arguments[0].parentElement;"
                "while (e && e.id !== 'tree') { if (e.tagName === 'LI') d++; e = e.parentElement; }"
                "return d;",
                li,
            )
        )
        row = li.find_element(By.CSS_SELECTOR, ".row")
        name = row.find_element(By.CSS_SELECTOR, ".name").text
        rows.append((depth, name, row.find_element(By.CSS_SELECTOR, ".kind").text))
    return rows


def test_an_openai_run_as_a_tree_and_a_conversation_opened_for_one_purpose(
    engine: Engine, recorded: dict[str, str], browsing: Browsing
) -> None:
    base, driver = browsing.base, browsing.driver
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    run_id = recorded["openai"]

    driver.get(f"{base}/runs")
    row = driver.find_element(By.XPATH, f"//a[contains(@href, '{run_id}')]/ancestor::tr")
    assert row.find_element(By.CSS_SELECTOR, ".tool-errors").text == "1 tool error"
    assert row.find_elements(By.CSS_SELECTOR, ".llm-errors") == []  # no LLM call failed
    assert "error" not in (row.get_attribute("class") or "")
    assert words_cut(driver, "#runs th, #runs td") == []
    driver.save_screenshot(str(SCREENSHOTS / "runs-tool-error.png"))

    driver.get(f"{base}/runs/{run_id}")
    assert driver.execute_script("return window.__pwned === undefined")
    assert driver.find_element(By.ID, "failures").text == "tool error"
    tree = _tree(driver)
    assert tree[0] == (0, "weather-agent", "run")
    top = [(name, kind) for depth, name, kind in tree if depth == 1]
    assert top == [
        ("run started", "run"),
        ("gpt-test", "LLM"),
        *sorted([("branch 1", "branch"), ("branch 2", "branch")]),
        ("gpt-test", "LLM"),
        ("run finished", "run"),
    ]
    # Each thread that ran a tool is a branch holding its tool call.
    nested = [(depth, name, kind) for depth, name, kind in tree if depth == 2]
    assert sorted(nested) == [(2, "get_time", "tool"), (2, "get_weather", "tool")]
    failed = driver.find_element(By.XPATH, "//li[contains(@class, 'failed')]")
    assert "get_weather" in failed.text
    assert "tool error: LookupError" in failed.text
    gpt = driver.find_elements(By.XPATH, "//li[contains(@class, 'k-llm')]")
    assert all("error" not in li.text for li in gpt)
    labels = [t.text for t in driver.find_elements(By.CSS_SELECTOR, "#waterfall text.rowlabel")]
    assert labels[:2] == ["run started", "gpt-test"]
    assert {"get_weather", "get_time", "branch 1", "branch 2"} <= set(labels)
    assert words_cut(driver, "#tree .row, dl.facts, #llm-calls td, #events td:not(.attrs)") == []
    driver.save_screenshot(str(SCREENSHOTS / "run-tree.png"))

    purpose = f"support ticket 5150: weather outage in run {run_id[:8]}"
    shown = _open_conversation(driver, purpose)
    assert driver.execute_script("return window.__pwned === undefined")
    items = shown.find_elements(By.CSS_SELECTOR, ":scope > li")
    kinds = [i.get_attribute("class") for i in items]
    # The two threads' tools finish in either order; the calls come before and after.
    assert kinds[0] == kinds[3] == "exchange"
    assert sorted(kinds[1:3]) == ["toolrun", "toolrun error"]

    first, second = (i for i in items if i.get_attribute("class") == "exchange")
    assert _turns(first) == ["system", "user", "assistant (answer)"]
    assert SYSTEM in first.find_element(By.CSS_SELECTOR, ".r-system pre").text
    calls = first.find_elements(By.CSS_SELECTOR, ".answer .toolcall")
    assert [c.find_element(By.TAG_NAME, "strong").text for c in calls] == [
        "get_weather",
        "get_time",
    ]
    assert '"city": "Oslo"' in calls[0].find_element(By.CSS_SELECTOR, "pre.json").text

    # The second call resends the first's turns (folded) and adds the tools' results.
    assert "3 earlier turns, as in call #" in second.find_element(By.CSS_SELECTOR, "summary").text
    assert _turns(second) == [
        "tool result of get_weather call_1",
        "tool result of get_time call_2",
        "assistant (answer)",
    ]
    outage = second.find_elements(By.CSS_SELECTOR, ".r-tool pre.json")[0].text
    assert outage == json.dumps({"error": OUTAGE}, indent=2)  # JSON in content, pretty
    assert "streamed" in second.find_element(By.CSS_SELECTOR, ".head").text
    answer = second.find_element(By.CSS_SELECTOR, ".answer pre.text").text
    assert answer == f"echo: {QUESTION}"  # assembled from the stream's chunks
    raw = second.find_element(By.CSS_SELECTOR, "details.raw")
    assert not raw.find_element(By.CSS_SELECTOR, "pre.json").is_displayed()
    raw.find_element(By.TAG_NAME, "summary").click()
    assert '"stream"' in raw.text  # the recorded events, one click away

    broken = shown.find_element(By.CSS_SELECTOR, "li.toolrun.error")
    assert "get_weather" in broken.find_element(By.CSS_SELECTOR, ".head").text
    assert broken.find_element(By.CSS_SELECTOR, ".turn.error .role").text == "tool error"
    assert f"LookupError: {OUTAGE}" in broken.text

    # One purpose opened the run: one audit row for each of its 4 bodies.
    audit = _audited(engine, run_id, purpose)
    assert audit == [(browsing.login.url.username, "requested")] * 4
    assert purpose not in driver.current_url
    assert words_cut(driver, "#conversation .head, #conversation .role") == []
    driver.execute_script("document.getElementById('conversation-heading').scrollIntoView()")
    driver.save_screenshot(str(SCREENSHOTS / "run-conversation.png"))


def test_an_anthropic_tool_loop_as_a_conversation(
    engine: Engine, recorded: dict[str, str], browsing: Browsing
) -> None:
    base, driver = browsing.base, browsing.driver
    run_id = recorded["anthropic"]
    driver.get(f"{base}/runs/{run_id}")
    assert [(d, n) for d, n, _ in _tree(driver)] == [
        (0, "time-agent"),
        (1, "run started"),
        (1, "claude-test"),
        (1, "get_time"),
        (1, "claude-test"),
        (1, "run finished"),
    ]
    assert driver.find_element(By.ID, "failures").text == "none"

    purpose = f"quality review of run {run_id[:8]}"
    shown = _open_conversation(driver, purpose, keyboard=True)
    first, tool, second = shown.find_elements(By.CSS_SELECTOR, ":scope > li")
    assert "messages" in first.find_element(By.CSS_SELECTOR, ".head").text
    assert _turns(first) == ["system", "user", "assistant (answer)"]
    (use,) = first.find_elements(By.CSS_SELECTOR, ".answer .toolcall")
    assert use.find_element(By.TAG_NAME, "strong").text == "get_time"
    assert '"city": "Rome"' in use.text
    assert "Let me look that up." in first.find_element(By.CSS_SELECTOR, ".answer").text
    assert tool.find_element(By.CSS_SELECTOR, ".tool").text == "get_time"
    assert '"time": "09:00"' in tool.find_element(By.CSS_SELECTOR, ".r-tool").text
    assert _turns(second) == ["tool result of get_time toolu_01", "assistant (answer)"]
    assert "3 earlier turns, as in call #2" in second.find_element(By.CSS_SELECTOR, "summary").text
    assert _turns(second, folded=True)[:3] == ["system", "user", "assistant"]
    assert "echo: tool_result:" in second.find_element(By.CSS_SELECTOR, ".answer").text
    raw = second.find_element(By.CSS_SELECTOR, "details.raw")
    raw.find_element(By.TAG_NAME, "summary").send_keys(Keys.ENTER)  # opened from the keyboard
    assert raw.get_attribute("open") is not None
    assert '"content_block_delta"' not in raw.text  # not streamed: the message as received
    assert '"tool_result"' in raw.text

    audit = _audited(engine, run_id, purpose)
    assert audit == [(browsing.login.url.username, "requested")] * 3
    driver.save_screenshot(str(SCREENSHOTS / "run-conversation-anthropic.png"))
