"""Replays and forks in the console, in headless Chromium on the real stack: a ticket
run recorded through the OpenAI SDK against the local endpoint, forked with a changed
prompt by ``blackbox experiment run``, relayed and built into the views, then replayed
by a changed agent (a divergence kept in the replay results). The run page shows the
replay history, its first divergence in words, and the values behind it (recorded and
replayed) opened for a purpose; the fork's
diff page shows both runs side by side, opened for one purpose, one audit row per body
read; no text cut mid-word at 1280 px."""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from sqlalchemy import Engine, text

from agent_blackbox.cli import main
from agent_blackbox.schemas import Settings
from tests.conftest import Login
from tests.integration._browser import SCREENSHOTS, chromium, console, words_cut
from tests.integration._triage_server import (
    KEY,
    URGENT_PROMPT,
    TriageServer,
    catch_up,
    record_tickets,
)
from tests.integration._wait import eventually
from tests.integration.test_console_conversations import _audited

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

OUTAGE_TICKET = "T-00004"
"""An outage ticket: under the variant prompt its priority becomes ``urgent``."""


@dataclass
class Forked:
    parent: str
    fork: str
    experiment: str


def _env(settings: Settings) -> dict[str, str | None]:
    return {
        "BLACKBOX_DATABASE_URL": settings.database_url,
        "BLACKBOX_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "BLACKBOX_TOPIC": settings.topic,
        "BLACKBOX_PURPOSE": None,
        "BLACKBOX_KEK": None,
        "BLACKBOX_KEK_FILE": None,
        "OPENAI_API_KEY": KEY,
    }


def _forks_of(conn: object, parent: str) -> list[str]:
    rows = conn.execute(  # type: ignore[attr-defined]
        text(
            "SELECT run_id FROM blackbox_views.runs "
            "WHERE parent_run_id = :p AND status <> 'running'"
        ),
        {"p": parent},
    )
    return [str(r[0]) for r in rows]


@pytest.fixture
def forked(settings: Settings, engine: Engine) -> Forked:
    env = _env(settings)
    with TriageServer() as server:
        (parent,) = record_tickets(engine, settings, server.base_url, [OUTAGE_TICKET], "v1")
        catch_up(settings, engine, lambda conn: _count(conn, parent) == 1)
        arguments = ["experiment", "run", "--agent-id", "ticket-agent", "--prompt-version", "v1"]
        arguments += ["--limit", "1", "--agent", "agent_blackbox.examples.ticket_agent:fork_entry"]
        arguments += ["--set", f"prompt={URGENT_PROMPT}", "--base-url", server.base_url]
        arguments += ["--purpose", "try the urgent prompt", "--json"]
        made = CliRunner(env=env).invoke(main, arguments)
    assert made.exit_code in (0, 1), made.output
    catch_up(settings, engine, lambda conn: len(_forks_of(conn, parent)) == 1)
    with engine.connect() as conn:
        (fork,) = _forks_of(conn, parent)
        experiment = conn.execute(
            text("SELECT experiment_id FROM blackbox_views.experiment_runs WHERE fork_run_id = :f"),
            {"f": fork},
        ).scalar_one()
    # The parent replayed by a changed agent: a divergence kept with its code version.
    env["BLACKBOX_AGENTS"] = "ticket-agent=tests.integration.test_replay_kafka:changed_entry"
    env["BLACKBOX_PURPOSE"] = "release check of v3"
    replayed = CliRunner(env=env).invoke(main, ["replay", parent, "--code-version", "v3"])
    assert replayed.exit_code == 1, replayed.output
    assert "not kept" not in replayed.output, replayed.output
    return Forked(parent, fork, str(experiment))


def _count(conn: object, run_id: str) -> int:
    return int(
        conn.execute(  # type: ignore[attr-defined]
            text(
                "SELECT count(*) FROM blackbox_views.runs WHERE run_id = :r AND status <> 'running'"
            ),
            {"r": run_id},
        ).scalar_one()
    )


@pytest.fixture
def driver(
    settings: Settings, login: Login, tmp_path: Path
) -> Iterator[tuple[str, WebDriver, str]]:
    replayer = login("blackbox_replayer", tenant="*")
    url = replayer.url.render_as_string(hide_password=False)
    with console(settings, url, tmp_path / "web.log") as base, chromium() as chrome:
        chrome.set_window_size(1280, 1000)
        yield base, chrome, str(replayer.url.username)


def test_replay_history_and_a_fork_beside_its_parent(
    engine: Engine, forked: Forked, driver: tuple[str, WebDriver, str]
) -> None:
    base, chrome, principal = driver
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    chrome.get(f"{base}/runs/{forked.parent}")
    (row,) = chrome.find_elements(By.CSS_SELECTOR, "#replays tbody tr")
    cells = [c.text for c in row.find_elements(By.TAG_NAME, "td")]
    assert cells[1] == "v3"
    assert cells[2] == "DIVERGED"
    assert cells[3].startswith("argument_mismatch at #2")
    assert (
        row.find_element(By.CSS_SELECTOR, "a.divergence")
        .get_attribute(
            "href",
        )
        .endswith(f"/runs/{forked.parent}/events/2")
    )
    assert words_cut(chrome, "#replays th, #replays td, dl.facts") == []
    chrome.execute_script("document.getElementById('replays').scrollIntoView()")
    chrome.save_screenshot(str(SCREENSHOTS / "run-replays.png"))

    # The divergence in words for anyone; its values opened behind a purpose, from the
    # keyboard: the recorded ticket beside the one this replay's code asked for.
    detail = row.find_element(By.CSS_SELECTOR, ".divergence-detail").text
    assert "read_ticket" in detail
    assert f"{OUTAGE_TICKET}-x" not in detail  # words, never a value
    details = row.find_element(By.CSS_SELECTOR, "details.divergence-value")
    details.find_element(By.TAG_NAME, "summary").send_keys(Keys.ENTER)
    why = "why did the v3 replay diverge"
    details.find_element(By.NAME, "purpose").send_keys(why, Keys.ENTER)
    opened = eventually(
        lambda: chrome.find_elements(By.CSS_SELECTOR, ".divergence-values, #message"),
        what="the replay's values",
    )[0]
    assert "divergence-values" in (opened.get_attribute("class") or ""), opened.text
    (change,) = opened.find_elements(By.CSS_SELECTOR, "table.changes tbody tr")
    path, recorded, replayed = (c.text for c in change.find_elements(By.TAG_NAME, "td"))
    assert path == "args[0]"  # the tool's first argument
    assert (recorded, replayed) == (OUTAGE_TICKET, f"{OUTAGE_TICKET}-x")
    assert _audited(engine, forked.parent, why) == [(principal, "requested")]
    assert why not in chrome.current_url
    chrome.save_screenshot(str(SCREENSHOTS / "run-replay-values.png"))
    # A replay the run does not have is not found, and nothing is audited for it.
    assert _posted(f"{base}/runs/{forked.parent}/replays/999999/values", why) == 404
    assert _audited(engine, forked.parent, why) == [(principal, "requested")]

    # The fork's page links the diff; the diff asks for a purpose first.
    chrome.get(f"{base}/runs/{forked.parent}")
    chrome.find_element(By.CSS_SELECTOR, "a.fork-diff").click()
    eventually(lambda: chrome.find_elements(By.ID, "diff-form"), what="the diff page")
    assert chrome.find_element(By.ID, "experiment").get_attribute("href") == (
        f"{base}/experiments/{forked.experiment}"
    )  # the diff page names the experiment that made the fork
    chrome.get(f"{base}/runs/{forked.fork}")  # and so does the fork's own page
    assert str(chrome.find_element(By.ID, "experiment").get_attribute("href")).endswith(
        f"/experiments/{forked.experiment}"
    )
    chrome.get(f"{base}/runs/{forked.fork}/diff")
    assert (
        chrome.find_element(By.ID, "experiment")
        .get_attribute(
            "href",
        )
        .endswith(f"/experiments/{forked.experiment}")
    )
    assert chrome.find_elements(By.ID, "diff") == []  # nothing opened without a purpose
    purpose = "did the urgent prompt change the outage ticket"
    chrome.find_element(By.ID, "purpose").send_keys(purpose, Keys.ENTER)
    shown = eventually(
        lambda: chrome.find_elements(By.CSS_SELECTOR, "#diff, #message"), what="the diff"
    )[0]
    assert shown.get_attribute("id") == "diff", shown.text
    rows = shown.find_elements(By.CSS_SELECTOR, ":scope > li")
    marks = [r.find_element(By.CSS_SELECTOR, ".mark").text for r in rows]
    # The ticket read is the same on both sides; the LLM call's prompt and answer are not.
    assert marks == ["same", "differs"]
    tool, llm = rows
    assert all("read_ticket" in s.text for s in tool.find_elements(By.CSS_SELECTOR, ".side"))
    parent_side, fork_side = llm.find_elements(By.CSS_SELECTOR, ".side")
    assert "URGENT" not in parent_side.text
    assert "URGENT" in fork_side.text
    final = chrome.find_element(By.ID, "final-output")
    assert "differs" in (final.get_attribute("class") or "")
    left, right = final.find_elements(By.CSS_SELECTOR, ".side")
    assert '"priority": "normal"' in left.text
    assert '"priority": "urgent"' in right.text
    # One purpose, one audit row per body read on each side.
    assert _audited(engine, forked.parent, purpose) == [(principal, "requested")] * 2
    assert _audited(engine, forked.fork, purpose) == [(principal, "requested")] * 2
    assert purpose not in chrome.current_url
    assert words_cut(chrome, "dl.facts, #diff .head, #diff .role, #diff .mark, h1, h2") == []
    chrome.save_screenshot(str(SCREENSHOTS / "fork-diff.png"))


def _posted(url: str, purpose: str) -> int:
    """The status a form POST of ``purpose`` to ``url`` is answered with."""
    form = urllib.parse.urlencode({"purpose": purpose, "csrf": ""}).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=form), timeout=30) as got:
            return int(got.status)
    except urllib.error.HTTPError as refused:
        return int(refused.code)


def test_a_run_that_is_no_fork_has_no_diff(
    forked: Forked, driver: tuple[str, WebDriver, str]
) -> None:
    base, chrome, _ = driver
    chrome.get(f"{base}/runs/{forked.parent}/diff")
    assert "is not a fork" in chrome.find_element(By.TAG_NAME, "main").text
