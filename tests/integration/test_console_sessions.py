"""The console's search and session page in a real headless Chromium at 1280 px, on the
real stack, as a reader granted one tenant: the search box is labelled and reached by
the keyboard, finds runs by terms and by the words of their messages, says what is
wrong with a query it cannot read; the session page lists the session's runs in order
with their totals; no word of these pages is broken across lines. Screenshots are kept
in tests/output/console/."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from sqlalchemy import Engine

from agent_blackbox.schemas import Settings
from tests.conftest import Login
from tests.integration._browser import SCREENSHOTS, chromium, console, words_cut
from tests.integration._sessions import Recorded, record_sessions
from tests.integration._wait import eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

_UNLABELLED = """
return Array.from(document.querySelectorAll('main input:not([type=hidden]), main select'))
  .filter(e => e.labels.length === 0).map(e => e.name || e.id);
"""


@dataclass
class Browsing:
    base: str
    driver: WebDriver
    runs: dict[str, str]


@pytest.fixture
def browsing(
    settings: Settings, engine: Engine, login: Login, tmp_path: Path
) -> Iterator[Browsing]:
    recorded: Recorded = record_sessions(settings, engine)
    reader = login("blackbox_reader", tenant="acme")
    url = reader.url.render_as_string(hide_password=False)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with console(settings, url, tmp_path / "web.log") as base, chromium() as driver:
        driver.set_window_size(1280, 1000)
        yield Browsing(base, driver, recorded.runs)


def _listed(driver: WebDriver) -> list[str]:
    links = driver.find_elements(By.CSS_SELECTOR, "#runs tbody a.run-link")
    return [str(a.get_attribute("href")).rsplit("/", 1)[1] for a in links]


def _tab_to(driver: WebDriver, target: WebElement, *, most: int = 60) -> None:
    """Press Tab from the top of the page until ``target`` has the focus."""
    driver.find_element(By.TAG_NAME, "body").click()
    for _ in range(most):
        driver.switch_to.active_element.send_keys(Keys.TAB)
        if driver.switch_to.active_element == target:
            return
    raise AssertionError(f"{target.tag_name} is not reached by the keyboard in {most} tabs")


def test_search_by_keyboard_terms_words_and_a_clear_error(browsing: Browsing) -> None:
    driver, runs = browsing.driver, browsing.runs
    driver.get(f"{browsing.base}/runs")
    assert driver.execute_script(_UNLABELLED) == []
    assert driver.find_element(By.CSS_SELECTOR, "label.search").text.startswith("Search")
    assert len(_listed(driver)) == 5  # the reader's tenant only: globex's run is not there

    _tab_to(driver, driver.find_element(By.ID, "q"))
    driver.switch_to.active_element.send_keys("refund", Keys.ENTER)
    eventually(lambda: "q=refund" in driver.current_url, what="the search sent")
    assert _listed(driver) == [runs["sensitive"], runs["refund"]]
    assert "acme" in driver.find_element(By.ID, "searched-tenants").text
    assert words_cut(driver, "#runs td, #runs th, #filters") == []
    driver.save_screenshot(str(SCREENSHOTS / "search-words.png"))

    search = driver.find_element(By.ID, "q")
    search.clear()
    search.send_keys("tool:lookup_order error:KeyError", Keys.ENTER)
    eventually(lambda: "tool%3Alookup_order" in driver.current_url, what="the terms sent")
    assert _listed(driver) == [runs["tools"]]
    driver.save_screenshot(str(SCREENSHOTS / "search-terms.png"))

    search = driver.find_element(By.ID, "q")
    search.clear()
    search.send_keys("colour:red' OR 1=1 --", Keys.ENTER)
    message = eventually(lambda: driver.find_elements(By.ID, "message"), what="the error")[0]
    assert "colour: is not a search term" in message.text
    assert driver.find_elements(By.CSS_SELECTOR, "#runs") == []
    assert driver.find_elements(By.ID, "searched-tenants") == []  # nothing was searched
    # The query stays in the box, to be corrected.
    assert driver.find_element(By.ID, "q").get_attribute("value") == "colour:red' OR 1=1 --"
    driver.save_screenshot(str(SCREENSHOTS / "search-error.png"))


def test_session_page_lists_its_runs_in_order_with_totals(browsing: Browsing) -> None:
    driver, runs = browsing.driver, browsing.runs
    driver.get(f"{browsing.base}/runs?user=u-42")
    assert _listed(driver) == [runs["tools"], runs["refund"], runs["first"]]
    link = driver.find_element(By.CSS_SELECTOR, "#runs a.session-link")
    assert link.text == "chat-1"
    _tab_to(driver, link)
    driver.switch_to.active_element.send_keys(Keys.ENTER)
    eventually(lambda: driver.find_elements(By.ID, "session-totals"), what="the session page")
    assert driver.find_element(By.ID, "session-id").text == "chat-1"
    totals = {
        name: driver.find_element(By.ID, f"total-{name}").text
        for name in ("runs", "events", "llm-calls", "tool-calls", "errors", "tokens", "cost")
    }
    # The reader sees acme's three runs of chat-1 (globex's run of it is not its own).
    assert totals["runs"] == "3"
    assert totals["llm-calls"] == "5"
    assert totals["tool-calls"] == "2"
    assert totals["errors"] == "2"
    assert totals["cost"].startswith("$")
    order = driver.find_elements(By.CSS_SELECTOR, "#session-runs tbody a.run-link")
    assert [str(a.get_attribute("href")).rsplit("/", 1)[1] for a in order] == [
        runs["first"],
        runs["refund"],
        runs["tools"],
    ]
    assert words_cut(driver, "#session-runs td, #session-runs th, #session-totals") == []
    driver.save_screenshot(str(SCREENSHOTS / "session-page.png"))

    order[1].send_keys(Keys.ENTER)  # a run of the session opens from the keyboard
    eventually(lambda: driver.find_elements(By.ID, "run-id"), what="the run page")
    assert driver.find_element(By.ID, "run-id").text == runs["refund"]
    # The run page leads back to its session and to its user's runs.
    assert str(driver.find_element(By.ID, "session").get_attribute("href")).endswith(
        "/sessions/chat-1"
    )
    assert str(driver.find_element(By.ID, "user").get_attribute("href")).endswith("?user=u-42")

    driver.get(f"{browsing.base}/sessions/{quote('chat-3')}")  # the sealed run's session
    user = driver.find_element(By.CSS_SELECTOR, "#session-runs td.label")
    assert user.text.startswith("hmac-sha256:")
    assert user.text.endswith("…")  # cut short whole, the digest in its title
    assert str(user.get_attribute("title")).startswith("hmac-sha256:")
    assert words_cut(driver, "#session-runs td, #session-totals") == []
    driver.save_screenshot(str(SCREENSHOTS / "session-keyed-user.png"))

    driver.get(f"{browsing.base}/sessions/no-such-session")
    assert "no run of session no-such-session" in driver.find_element(By.TAG_NAME, "main").text
