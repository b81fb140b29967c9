"""What LLM calls cost, on the real stack: runs recorded through the OpenAI and Anthropic
SDK captures against the local servers (plain and streamed, Chat Completions, Responses
and Messages, cached input and Anthropic cache writes), relayed, and priced by
``blackbox analytics`` with a user price file over the shipped table. The costs in the
views equal the ones computed here by hand; ``blackbox stats`` prints them; the
analytics process serves the cost counter; the console shows them in Chromium."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families
from selenium.webdriver.common.by import By
from sqlalchemy import Engine, text

import agent_blackbox as bb
from agent_blackbox.cli import main
from agent_blackbox.consumers import migrate_views
from agent_blackbox.outbox import AgentRun, Recorder, RunSnapshot
from agent_blackbox.schemas import Settings
from tests.conftest import Login
from tests.integration._anthropic_server import AnthropicServer
from tests.integration._anthropic_server import answer as anthropic_answer
from tests.integration._backups import relay
from tests.integration._browser import SCREENSHOTS, chromium, console, free_port
from tests.integration._llm_server import Reply
from tests.integration._openai_server import OpenAIServer
from tests.integration._openai_server import answer as openai_answer
from tests.integration._relays import ROOT, relay_env
from tests.integration._views import build_views
from tests.integration._wait import eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@dataclass(frozen=True)
class Usage:
    """What a local server reports a model used: the whole input, the part of it read
    from the cache, the part written to it (Anthropic), and the output."""

    input: int
    cached: int
    output: int
    written: int = 0


USAGE = {
    "gpt-4o-2024-08-06": Usage(input=120_000, cached=40_000, output=8_000),
    "gpt-4o-mini": Usage(input=50_000, cached=10_000, output=2_000),
    "gpt-4.1-mini-2025-04-14": Usage(input=30_000, cached=20_000, output=1_000),
    "claude-sonnet-4-5-20250929": Usage(input=74_000, cached=60_000, output=3_000, written=4_000),
    "claude-haiku-4-5": Usage(input=10_000, cached=8_000, output=500),
    "local-llama-3": Usage(input=1_000, cached=0, output=100),
    "acme-ft-1": Usage(input=1_000, cached=0, output=500),
}
"""Per model, so that every call's cost can be computed by hand below."""

EXPECTED = {
    # 80,000 × 2.50 + 40,000 × 1.25 + 8,000 × 10 (gpt-4o's prices), per million.
    "gpt-4o-2024-08-06": Decimal("0.33"),
    # 40,000 × 0.15 + 10,000 × 0.075 + 2,000 × 0.60, streamed with its usage at the end.
    "gpt-4o-mini": Decimal("0.00795"),
    # 10,000 × 0.40 + 20,000 × 0.10 + 1,000 × 1.60 (Responses API, gpt-4.1-mini).
    "gpt-4.1-mini-2025-04-14": Decimal("0.0076"),
    # 10,000 × 3 + 4,000 written × 3.75 + 60,000 read × 0.30 + 3,000 × 15.
    "claude-sonnet-4-5-20250929": Decimal("0.108"),
    # 2,000 × 1 + 8,000 × 0.10 + 500 × 5, streamed.
    "claude-haiku-4-5": Decimal("0.0053"),
    # The user file's price: 1,000 × 1.00 + 500 × 2.00.
    "acme-ft-1": Decimal("0.002"),
}
USER_PRICES = """
[openai."acme-ft-1"]
input = 1.00
output = 2.00
as_of = 2026-01-15
"""


def _with_usage(document: Any, usage: Usage, kind: str) -> Any:
    """``document`` (a reply body or a stream event) with every usage it reports made
    ``usage``, in the shape of ``kind`` (chat, responses, anthropic)."""
    if not isinstance(document, dict):
        return document
    shaped = {
        "chat": {
            "prompt_tokens": usage.input,
            "completion_tokens": usage.output,
            "total_tokens": usage.input + usage.output,
            "prompt_tokens_details": {"cached_tokens": usage.cached},
        },
        "responses": {
            "input_tokens": usage.input,
            "output_tokens": usage.output,
            "total_tokens": usage.input + usage.output,
            "input_tokens_details": {"cached_tokens": usage.cached},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
        "anthropic": {
            "input_tokens": usage.input - usage.cached - usage.written,
            "cache_creation_input_tokens": usage.written,
            "cache_read_input_tokens": usage.cached,
            "output_tokens": usage.output,
        },
    }[kind]
    changed = dict(document)
    if changed.get("usage") is not None:
        changed["usage"] = shaped
    for inner in ("message", "response"):  # message_start, response.completed
        if isinstance(changed.get(inner), dict):
            changed[inner] = _with_usage(changed[inner], usage, kind)
    return changed


def _priced_reply(reply: Reply, usage: Usage | None, kind: str) -> Reply:
    if usage is None:
        return reply
    if reply.events is None:
        return Reply(reply.status, _with_usage(reply.body, usage, kind))
    events = tuple(
        (name, data if data == "[DONE]" else json.dumps(_with_usage(json.loads(data), usage, kind)))
        for name, data in reply.events
    )
    return Reply(reply.status, events=events)


class PricedOpenAIServer(OpenAIServer):
    """The local OpenAI server reporting :data:`USAGE` for each model."""

    def reply(self, path: str, request: Mapping[str, Any]) -> Reply:
        kind = "responses" if path.endswith("/responses") else "chat"
        usage = USAGE.get(str(request.get("model")))
        return _priced_reply(openai_answer(path, request), usage, kind)


class PricedAnthropicServer(AnthropicServer):
    """The local Anthropic server reporting :data:`USAGE` for each model."""

    def reply(self, path: str, request: Mapping[str, Any]) -> Reply:
        usage = USAGE.get(str(request.get("model")))
        return _priced_reply(anthropic_answer(path, request), usage, "anthropic")


def _ask(model: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"hello from {model}"}]


def _openai_run(client: openai.OpenAI) -> Any:
    """Chat Completions plain, streamed with its usage, and the Responses API."""

    def entry(_run: AgentRun, _input: Any) -> str:
        sdk = bb.capture_openai(client)
        sdk.chat.completions.create(model="gpt-4o-2024-08-06", messages=_ask("a"))
        stream = sdk.chat.completions.create(
            model="gpt-4o-mini",
            messages=_ask("b"),
            stream=True,
            stream_options={"include_usage": True},
        )
        for _chunk in stream:
            pass
        sdk.responses.create(model="gpt-4.1-mini-2025-04-14", input="c")
        return "done"

    return entry


def _anthropic_run(client: anthropic.Anthropic) -> Any:
    """A Messages call with cache reads and writes, and a streamed one."""

    def entry(_run: AgentRun, _input: Any) -> str:
        sdk = bb.capture_anthropic(client)
        sdk.messages.create(model="claude-sonnet-4-5-20250929", max_tokens=64, messages=_ask("d"))
        with sdk.messages.stream(
            model="claude-haiku-4-5", max_tokens=64, messages=_ask("e")
        ) as stream:
            stream.get_final_message()
        return "done"

    return entry


def _unpriced_run(client: openai.OpenAI) -> Any:
    """A model with no price, a stream that reports no usage, a failed call (not billed,
    so no gap) and a model priced by the user's file only."""

    def entry(_run: AgentRun, _input: Any) -> str:
        sdk = bb.capture_openai(client)
        sdk.chat.completions.create(model="local-llama-3", messages=_ask("f"))
        for _chunk in sdk.chat.completions.create(model="gpt-4o", messages=_ask("g"), stream=True):
            pass
        with pytest.raises(openai.RateLimitError):
            sdk.chat.completions.create(model="fail-429", messages=_ask("h"))
        sdk.chat.completions.create(model="acme-ft-1", messages=_ask("i"))
        return "done"

    return entry


@dataclass
class Priced:
    runs: dict[str, str]
    """openai, anthropic, unpriced → run id."""
    counter: str
    """The analytics process's metrics page once every call was priced."""


def _scrape(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return str(answer.read().decode())
    except OSError:
        return None


def _costs_in(engine: Engine) -> dict[str, tuple[Decimal | None, int]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT run_id, cost_usd, unpriced_calls FROM blackbox_views.run_rollups")
        )
        return {r[0]: (r[1], int(r[2])) for r in rows}


@pytest.fixture
def priced(settings: Settings, engine: Engine, tmp_path: Path) -> Iterator[Priced]:
    """Three runs recorded, relayed, indexed, and priced by ``blackbox analytics`` (a
    child process, with ``BLACKBOX_PRICE_FILE`` and ``--metrics-port``)."""
    migrate_views(settings.database_url)
    recorder = Recorder(engine, settings=settings)
    runs: dict[str, str] = {}
    events = 0
    with (
        PricedOpenAIServer() as oai,
        PricedAnthropicServer() as claude,
        openai.OpenAI(base_url=oai.base_url, api_key="sk-test", max_retries=0) as gpt,
        anthropic.Anthropic(base_url=claude.base_url, api_key="sk-ant-test", max_retries=0) as ant,
    ):
        for name, entry, code, prompt in (
            ("openai", _openai_run(gpt), "c1", "p1"),
            ("anthropic", _anthropic_run(ant), "c2", "p2"),
            ("unpriced", _unpriced_run(gpt), "c2", "p1"),
        ):
            snapshot = RunSnapshot(code_version=code, tags={"prompt_version": prompt})
            run, output = recorder.record(entry, snapshot, agent_id="cost-agent")
            assert output == "done"
            runs[name] = run.run_id
            events += run.last_sequence
    relay(engine, settings)
    build_views(settings, engine, expect=events)
    prices = tmp_path / "prices.toml"
    prices.write_text(USER_PRICES, encoding="utf-8")
    port = free_port()
    env = {**relay_env(settings), "BLACKBOX_PRICE_FILE": str(prices)}
    group = f"costs-{uuid.uuid4().hex[:8]}"  # a group (and static member) of its own
    command = [sys.executable, "-m", "cli", "analytics", "--group", group, "--metrics-port"]
    log = tmp_path / "analytics.log"
    with log.open("wb") as out:
        child = subprocess.Popen(
            [*command, str(port)], env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        eventually(
            lambda: (
                _costs_in(engine).get(runs["unpriced"], (None, 0))[1] == 2
                and len(_costs_in(engine)) == 3
            ),
            timeout=60,
            what=f"the analytics priced every run ({log})",
        )
        url = f"http://127.0.0.1:{port}/metrics"
        page = eventually(
            lambda: (p := _scrape(url)) and "acme-ft-1" in p and p,
            timeout=30,
            what="the cost counter served",
        )
        yield Priced(runs, str(page))
    finally:
        child.terminate()
        child.wait(timeout=30)


def _calls(engine: Engine) -> dict[str, tuple[Decimal | None, Any, int | None]]:
    """model → (cost, the day of its price, cache writes) of every recorded LLM call."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT model, cost_usd, price_as_of, cache_write_tokens "
                "FROM blackbox_views.llm_calls"
            )
        )
        return {r[0]: (r[1], r[2], r[3]) for r in rows}


def test_costs_in_the_views_equal_the_hand_computed_ones(priced: Priced, engine: Engine) -> None:
    calls = _calls(engine)
    assert {model: cost for model, (cost, _, _) in calls.items()} == {
        **EXPECTED,
        "local-llama-3": None,  # no price: unknown, never zero
        "gpt-4o": None,  # priced, but its stream reported no usage
        "fail-429": None,  # failed: not billed
    }
    assert calls["claude-sonnet-4-5-20250929"][2] == 4_000
    assert calls["gpt-4o-2024-08-06"][1].isoformat() == "2025-11-20"  # the shipped price's day
    assert calls["acme-ft-1"][1].isoformat() == "2026-01-15"  # the user file's
    assert all(isinstance(cost, Decimal) for cost, _, _ in calls.values() if cost is not None)

    runs = _costs_in(engine)
    openai_run = EXPECTED["gpt-4o-2024-08-06"] + EXPECTED["gpt-4o-mini"]
    openai_run += EXPECTED["gpt-4.1-mini-2025-04-14"]
    anthropic_run = EXPECTED["claude-sonnet-4-5-20250929"] + EXPECTED["claude-haiku-4-5"]
    assert runs == {
        priced.runs["openai"]: (openai_run, 0),
        priced.runs["anthropic"]: (anthropic_run, 0),
        priced.runs["unpriced"]: (EXPECTED["acme-ft-1"], 2),
    }
    assert openai_run == Decimal("0.34555")

    with engine.connect() as conn:
        by_prompt = dict(
            conn.execute(
                text(
                    "SELECT prompt_version, sum(cost_usd) FROM blackbox_views.llm_usage "
                    "WHERE bucket_size = 'hour' GROUP BY 1"
                )
            ).all()
        )
    assert by_prompt == {"p1": openai_run + EXPECTED["acme-ft-1"], "p2": anthropic_run}


def test_stats_print_the_costs_per_model_prompt_and_code_version(
    priced: Priced, settings: Settings
) -> None:
    runner = CliRunner(env={"BLACKBOX_DATABASE_URL": settings.database_url})

    def stats(by: str) -> dict[str | None, dict[str, Any]]:
        shown = runner.invoke(main, ["stats", "--by", by, "--since", "1h", "--json"])
        assert shown.exit_code == 0, shown.output
        return {line[by]: line for line in map(json.loads, shown.stdout.splitlines())}

    by_model = stats("model")
    assert {m: line["cost_usd"] for m, line in by_model.items()} == {
        **{model: str(cost) for model, cost in EXPECTED.items()},
        "local-llama-3": None,
        "gpt-4o": None,
        "fail-429": None,
    }
    assert {m for m, line in by_model.items() if line["unpriced_calls"]} == {
        "local-llama-3",
        "gpt-4o",
    }
    assert by_model["claude-sonnet-4-5-20250929"]["cached_tokens"] == 60_000
    by_code = stats("code_version")
    assert (by_code["c1"]["cost_usd"], by_code["c1"]["unpriced_calls"]) == ("0.34555", 0)
    assert (by_code["c2"]["cost_usd"], by_code["c2"]["unpriced_calls"]) == ("0.1153", 2)
    by_prompt = stats("prompt_version")
    assert (by_prompt["p1"]["cost_usd"], by_prompt["p1"]["unpriced_calls"]) == ("0.34755", 2)
    by_run = stats("run")
    assert by_run[priced.runs["anthropic"]]["cost_usd"] == "0.1133"

    table = runner.invoke(main, ["stats", "--by", "prompt_version", "--since", "1h"])
    assert table.exit_code == 0, table.output
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in table.stdout.splitlines()]
    shown = {cells[0]: cells[6:8] for cells in rows if cells and cells[0] in ("p1", "p2")}
    assert shown == {"p1": ["$0.348", "2"], "p2": ["$0.113", ""]}
    assert "cost: $0.461 (2 unpriced calls not included)" in table.stdout


def test_the_analytics_process_serves_the_cost_counter(priced: Priced) -> None:
    served = {
        (sample.name, sample.labels["provider"], sample.labels["model"]): sample.value
        for family in text_string_to_metric_families(priced.counter)
        for sample in family.samples
        if sample.name in ("blackbox_llm_cost_usd_total", "blackbox_llm_unpriced_calls_total")
    }
    dollars = {(p, m): v for (n, p, m), v in served.items() if n.startswith("blackbox_llm_cost")}
    assert dollars == {
        ("anthropic" if model.startswith("claude") else "openai", model): float(cost)
        for model, cost in EXPECTED.items()
    }
    unpriced = {(p, m): v for (n, p, m), v in served.items() if "unpriced" in n}
    assert unpriced == {("openai", "local-llama-3"): 1.0, ("openai", "gpt-4o"): 1.0}


def test_the_console_shows_the_costs(
    priced: Priced, settings: Settings, login: Login, tmp_path: Path
) -> None:
    reader = login("blackbox_reader", tenant="*")
    url = reader.url.render_as_string(hide_password=False)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with console(settings, url, tmp_path / "web.log") as base, chromium() as driver:
        driver.set_window_size(1280, 1000)
        driver.get(f"{base}/runs")
        header = [th.text for th in driver.find_elements(By.CSS_SELECTOR, "#runs thead th")]
        column = header.index("Cost")
        shown = {
            row.find_element(By.CSS_SELECTOR, "a.run-link")
            .get_attribute("href")
            .rsplit("/", 1)[1]: row.find_elements(By.TAG_NAME, "td")[column].text
            for row in driver.find_elements(By.CSS_SELECTOR, "#runs tbody tr")
        }
        assert shown == {
            priced.runs["openai"]: "$0.346",
            priced.runs["anthropic"]: "$0.113",
            priced.runs["unpriced"]: "$0.002 + 2 unpriced",
        }
        driver.save_screenshot(str(SCREENSHOTS / "cost-runs.png"))

        driver.get(f"{base}/runs/{priced.runs['unpriced']}")
        eventually(lambda: driver.find_elements(By.ID, "cost"), what="the run page")
        assert driver.find_element(By.ID, "cost").text.startswith("$0.002 + 2 unpriced")
        header = [th.text for th in driver.find_elements(By.CSS_SELECTOR, "#llm-calls thead th")]
        column = header.index("Cost")
        per_call = [
            row.find_elements(By.TAG_NAME, "td")[column].text
            for row in driver.find_elements(By.CSS_SELECTOR, "#llm-calls tbody tr")
        ]
        assert per_call == ["unpriced", "unpriced", "", "$0.002"]
        driver.save_screenshot(str(SCREENSHOTS / "cost-run.png"))

        driver.get(f"{base}/runs/{priced.runs['openai']}")
        eventually(lambda: driver.find_elements(By.ID, "cost"), what="the run page")
        assert driver.find_element(By.ID, "cost").text == "$0.346"

        driver.get(f"{base}/charts?since=1h&by=model")
        eventually(lambda: driver.find_elements(By.ID, "window-cost"), what="the charts page")
        total = driver.find_element(By.ID, "window-cost").text
        assert total.startswith("Cost in this window: $0.461 + 2 unpriced")
        header = [
            th.text for th in driver.find_elements(By.CSS_SELECTOR, "#usage-summary thead th")
        ]
        column = header.index("Cost")
        summary = {
            row.find_elements(By.TAG_NAME, "td")[0].text: row.find_elements(By.TAG_NAME, "td")[
                column
            ].text
            for row in driver.find_elements(By.CSS_SELECTOR, "#usage-summary tbody tr")
        }
        assert summary["claude-sonnet-4-5-20250929"] == "$0.108"
        assert summary["local-llama-3"] == "1 unpriced"
        assert summary["fail-429"] == "-"
        titles = [h.text for h in driver.find_elements(By.CSS_SELECTOR, "section.chart h2")]
        assert any(t.startswith("Cost") for t in titles)
        driver.save_screenshot(str(SCREENSHOTS / "cost-charts.png"))
