"""The run console in a real headless Chromium, against the real stack: list, filter,
run page, event page, purpose, body and its audit row; hostile payloads render as text;
without a token the console serves loopback clients only."""

from __future__ import annotations

import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from sqlalchemy import Engine, text

from agent_blackbox.consumers import migrate_views
from agent_blackbox.outbox import AgentRun, Recorder, RunSnapshot
from agent_blackbox.schemas import Settings
from tests.conftest import Login
from tests.integration._agents import record_ticket_runs, ticket_ids
from tests.integration._backups import relay
from tests.integration._browser import (
    SCREENSHOTS,
    chromium,
    console,
    fetch,
    outside_address,
    words_cut,
)
from tests.integration._views import build_analytics, build_views
from tests.integration._wait import eventually

pytestmark = pytest.mark.integration

HOSTILE = (
    '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'
    "\x1b]0;retitled\x07\x1b[31mred\u202eevil"
)
HOSTILE_TOOL = 'lookup<img src=x onerror="window.__pwned=3">'


def _hostile_agent(run: AgentRun, _: Any) -> str:
    found = run.call(HOSTILE_TOOL, lambda q: {"answer": HOSTILE, "q": q}, "who")
    return str(found["answer"])


@pytest.fixture
def recorded(settings: Settings, engine: Engine) -> dict[str, Any]:
    migrate_views(settings.database_url)
    recorder = Recorder(engine, settings=settings)
    runs = record_ticket_runs(
        recorder, ticket_ids(6), tags=lambda t: {"prompt_version": f"v{int(t[-1]) % 2 + 1}"}
    )
    snapshot = RunSnapshot(code_version="evil-1", tags={"note": "<b>bold</b><script>x()</script>"})
    hostile, _ = recorder.record(_hostile_agent, snapshot, agent_id="hostile-agent")
    relay(engine, settings)
    total = sum(r.events for r in runs) + hostile.last_sequence
    build_views(settings, engine, expect=total)
    build_analytics(settings, engine, group="console-analytics", expect=total)
    return {"runs": runs, "hostile": hostile.run_id}


def _url(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=False)


def _audit_rows(engine: Engine, run_id: str, purpose: str) -> list[tuple[str, str]]:
    with engine.connect() as conn:
        return [
            (str(p), str(o))
            for p, o in conn.execute(
                text(
                    "SELECT principal, outcome FROM blackbox.access_audit "
                    "WHERE run_id = :r AND purpose LIKE :p"
                ),
                {"r": run_id, "p": f"%{purpose}"},
            )
        ]


def _opened_body(driver: WebDriver) -> str:
    """The body shown after the purpose form was sent (failing with the page's reason)."""
    shown = eventually(
        lambda: driver.find_elements(By.CSS_SELECTOR, "#body, #message, #withheld"),
        what="the answer to the purpose form",
    )[0]
    assert shown.get_attribute("id") == "body", shown.text
    return str(shown.text)


def _no_script_ran(driver: WebDriver) -> None:
    assert driver.execute_script("return window.__pwned === undefined")
    assert driver.find_elements(By.CSS_SELECTOR, "main script, main img, main iframe") == []


@dataclass
class Browsing:
    """A console on the recorded runs, as a replayer granted every tenant, and a browser."""

    base: str
    driver: WebDriver
    login: Engine
    log: Path


@pytest.fixture
def browsing(
    settings: Settings, login: Login, recorded: dict[str, Any], tmp_path: Path
) -> Iterator[Browsing]:
    replayer = login("blackbox_replayer", tenant="*")
    log = tmp_path / "web.log"
    with console(settings, _url(replayer), log) as base, chromium() as driver:
        yield Browsing(base, driver, replayer, log)


def test_list_filter_run_event_purpose_body_and_one_audit_row(
    engine: Engine, browsing: Browsing
) -> None:
    base, driver = browsing.base, browsing.driver
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    driver.get(f"{base}/runs")
    rows = driver.find_elements(By.CSS_SELECTOR, "#runs tbody tr")
    assert len(rows) == 7

    driver.find_element(By.NAME, "agent").send_keys("ticket-agent")
    driver.find_element(By.NAME, "prompt_version").send_keys("v2")
    driver.find_element(By.ID, "apply").click()
    eventually(lambda: "prompt_version=v2" in driver.current_url, what="the filter applied")
    rows = driver.find_elements(By.CSS_SELECTOR, "#runs tbody tr")
    assert len(rows) == 3
    assert {r.find_elements(By.TAG_NAME, "td")[11].text for r in rows} == {"v2"}

    rows[0].find_element(By.CSS_SELECTOR, "a.run-link").click()
    eventually(lambda: driver.find_elements(By.ID, "waterfall"), what="the run page")
    run_id = driver.find_element(By.ID, "run-id").text
    bars = driver.find_elements(By.CSS_SELECTOR, "#waterfall rect.bar")
    events = driver.find_elements(By.CSS_SELECTOR, "#events tbody tr")
    assert len(bars) == len(events) > 3
    assert driver.find_elements(By.CSS_SELECTOR, "#llm-calls tbody tr")
    assert driver.find_elements(By.CSS_SELECTOR, "#effects tbody tr")
    assert driver.find_element(By.ID, "replayability").text == "full"
    driver.save_screenshot(str(SCREENSHOTS / "run-page.png"))

    driver.find_element(By.CSS_SELECTOR, "#events a.t-llm-call").click()
    eventually(lambda: driver.find_elements(By.ID, "purpose-form"), what="the event page")
    metadata = driver.find_element(By.ID, "metadata").text
    assert "model" in metadata
    assert driver.find_elements(By.ID, "body") == []
    purpose = f"investigating ticket for run {run_id[:8]}"
    driver.find_element(By.ID, "purpose").send_keys(purpose)
    driver.find_element(By.ID, "open-body").click()
    shown = _opened_body(driver)
    assert '"raw_request"' in shown
    assert '"messages"' in shown
    assert purpose not in driver.current_url
    driver.save_screenshot(str(SCREENSHOTS / "event-body.png"))

    audit = _audit_rows(engine, run_id, purpose)
    assert audit == [(browsing.login.url.username, "requested")]
    web_log = browsing.log.read_text()
    assert "raw_request" not in web_log
    assert purpose not in web_log

    driver.get(f"{base}/charts?since=1h&by=prompt_version")
    summary = {
        row.find_elements(By.TAG_NAME, "td")[0].text: row.find_elements(By.TAG_NAME, "td")[1].text
        for row in driver.find_elements(By.CSS_SELECTOR, "#usage-summary tbody tr")
    }
    assert summary == {"v1": "3", "v2": "3"}  # one LLM call per ticket run
    assert driver.find_elements(By.CSS_SELECTOR, "polyline.line")
    assert driver.find_elements(By.CSS_SELECTOR, "circle.dot")
    _charts_read(driver)


def _charts_read(driver: WebDriver) -> None:
    """Each chart has ticks on both axes and a legend; no failed call is a 0-1 % scale."""
    sections = driver.find_elements(By.CSS_SELECTOR, "section.chart")
    assert len(sections) == 7
    for section in sections:
        assert len(section.find_elements(By.CSS_SELECTOR, ".y-axis text.tick")) >= 3
        assert section.find_elements(By.CSS_SELECTOR, ".x-axis text.tick")
        names = [t.text for t in section.find_elements(By.CSS_SELECTOR, "text.legend-name")]
        assert names == ["v1", "v2"]
    error_ticks = sections[-1].find_elements(By.CSS_SELECTOR, ".y-axis text.tick")
    assert error_ticks[-1].text == "1.0 %"
    driver.save_screenshot(str(SCREENSHOTS / "charts.png"))


def test_prompt_versions_side_by_side_by_keyboard(browsing: Browsing) -> None:
    base, driver = browsing.base, browsing.driver
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    driver.set_window_size(1280, 1000)
    driver.get(f"{base}/prompts?since=1h")
    agent = driver.find_element(By.NAME, "agent")
    assert agent.find_element(By.XPATH, "..").text.startswith("Agent")  # its label
    agent.send_keys("ticket-agent")
    for _ in range(10):  # Tab from the field reaches the button that sends the form
        driver.switch_to.active_element.send_keys(Keys.TAB)
        if driver.switch_to.active_element.get_attribute("id") == "compare":
            break
    driver.switch_to.active_element.send_keys(Keys.ENTER)
    eventually(lambda: "agent=ticket-agent" in driver.current_url, what="the comparison")
    rows = {
        cells[0].text: [c.text for c in cells]
        for cells in (
            r.find_elements(By.TAG_NAME, "td")
            for r in driver.find_elements(By.CSS_SELECTOR, "#prompt-versions tbody tr")
        )
    }
    assert sorted(rows) == ["v1", "v2"]
    for cells in rows.values():
        assert cells[1:3] == ["3", "3"]  # three runs, one LLM call each
        assert cells[7].startswith("0.0 % [0.0–")  # no failed call, and an upper bound
        assert cells[7].endswith("0 of 3")
        assert cells[8] == "no replays"
    assert words_cut(driver, "#prompt-versions, h1, form") == []
    assert driver.execute_script("return document.documentElement.scrollWidth") <= 1280
    driver.save_screenshot(str(SCREENSHOTS / "prompt-versions.png"))


def test_hostile_payloads_render_as_text_and_no_script_runs(
    recorded: dict[str, Any], browsing: Browsing
) -> None:
    base, driver = browsing.base, browsing.driver
    run_id = recorded["hostile"]
    driver.get(f"{base}/runs/{run_id}")
    _no_script_ran(driver)
    page = driver.find_element(By.TAG_NAME, "main").text
    assert "<b>bold</b><script>x()</script>" in page
    assert HOSTILE_TOOL in page

    driver.find_element(By.CSS_SELECTOR, "#events a.t-tool-call").click()
    eventually(lambda: driver.find_elements(By.ID, "purpose-form"), what="the event page")
    _no_script_ran(driver)
    driver.find_element(By.ID, "purpose").send_keys("security review of a hostile tool")
    driver.find_element(By.ID, "open-body").click()
    shown = _opened_body(driver)
    _no_script_ran(driver)
    assert "<script>window.__pwned = 1</script>" in shown
    assert 'onerror=\\"window.__pwned = 2\\"' in shown
    assert "\\u001b]0;retitled" in shown  # the terminal escape, as visible text
    assert "\\u202e" in shown  # the bidi override too
    assert "\x1b" not in driver.page_source
    assert "\u202e" not in driver.page_source
    driver.save_screenshot(str(SCREENSHOTS / "hostile-body.png"))


def test_without_a_token_only_loopback_clients_are_served(
    settings: Settings, engine: Engine, login: Login, recorded: dict[str, Any], tmp_path: Path
) -> None:
    outside = outside_address()
    if outside is None:
        pytest.skip("this machine has no address but loopback to come from")
    reader = login("blackbox_reader", tenant="*")
    with console(settings, _url(reader), tmp_path / "web.log", host="0.0.0.0") as base:
        port = base.rsplit(":", 1)[1]
        status, page = fetch(f"http://{outside}:{port}/runs")
        assert status == 403
        assert "serves its own machine only" in page
        assert recorded["hostile"] not in page
        # A forwarding header from the outside changes nothing.
        status, _ = fetch(f"http://{outside}:{port}/runs", headers={"X-Forwarded-For": "127.0.0.1"})
        assert status == 403
        status, page = fetch(f"{base}/runs")
        assert status == 200
        assert recorded["hostile"] in page
        with chromium() as driver:
            driver.get(f"http://{outside}:{port}/runs")
            assert "serves its own machine only" in driver.find_element(By.ID, "message").text
            assert driver.find_elements(By.ID, "runs") == []


def test_with_a_token_file_viewers_sign_in_and_scripts_send_a_bearer_token(
    settings: Settings, engine: Engine, login: Login, recorded: dict[str, Any], tmp_path: Path
) -> None:
    token = "yWWdl_yO_IraXzVZ0-KKTEGDrLRkHib_"  # generated: weak ones are refused
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# console viewers\nada {token}\n")
    tokens.chmod(stat.S_IRUSR | stat.S_IWUSR)
    reader = login("blackbox_reader", tenant="*")
    args = ("--token-file", str(tokens))
    with console(settings, _url(reader), tmp_path / "web.log", args=args) as base:
        status, page = fetch(f"{base}/runs")  # redirected to the sign-in form
        assert 'name="token"' in page
        assert recorded["hostile"] not in page
        assert fetch(f"{base}/runs", headers={"Authorization": "Bearer nope"})[0] == 401
        status, page = fetch(f"{base}/runs", headers={"Authorization": f"Bearer {token}"})
        assert status == 200
        assert recorded["hostile"] in page
        with chromium() as driver:
            driver.get(f"{base}/runs/{recorded['hostile']}")
            eventually(lambda: "/login" in driver.current_url, what="the sign-in page")
            driver.find_element(By.ID, "token").send_keys("wrong-token")
            driver.find_element(By.ID, "sign-in").click()
            message = eventually(
                lambda: driver.find_elements(By.ID, "message"), what="the refusal shown"
            )
            assert "not known" in message[0].text
            driver.find_element(By.ID, "token").send_keys(token)
            driver.find_element(By.ID, "sign-in").click()
            eventually(lambda: driver.find_elements(By.ID, "waterfall"), what="the run page")
            assert "ada" in driver.find_element(By.CSS_SELECTOR, ".viewer").text
            cookie = driver.get_cookie("blackbox_session")
            assert cookie is not None
            assert cookie["httpOnly"]
            assert cookie["sameSite"] == "Strict"
            driver.find_element(By.ID, "sign-out").click()
            eventually(lambda: "/login" in driver.current_url, what="signed out")
            driver.add_cookie(cookie)  # the old session, replayed
            driver.get(f"{base}/runs")
            assert "/login" in driver.current_url
    assert not re.search(re.escape(token), (tmp_path / "web.log").read_text())
