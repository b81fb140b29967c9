"""``blackbox experiment`` over 50 recorded runs of the demo agent, comparing two prompt
versions against the local OpenAI-compatible endpoint: the kept per-run scores and the
summary (means, t intervals) are checked against SQL over the kept results and the
analytics views, and the console's page is opened in Chromium."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from sqlalchemy import Engine, text

from agent_blackbox.cli import main
from agent_blackbox.consumers import fork_experiment_txn
from agent_blackbox.schemas import Settings
from tests.integration._browser import SCREENSHOTS, chromium, console
from tests.integration._triage_server import (
    KEY,
    OUTPUT_SCHEMA,
    PRICE_FILE,
    URGENT_PROMPT,
    TriageServer,
    catch_up,
    finished_rollups,
    record_tickets,
)
from tests.integration._wait import eventually

pytestmark = pytest.mark.integration

RUNS = 50
PURPOSE = "compare the triage prompts"
T_975_49 = 2.009575237129866
"""Student's t, 97.5th percentile, 49 degrees of freedom (statistical tables)."""
TOLERANCES = ("duration_ms=5000", "llm_latency_ms=5000")
"""Latency wobbles from run to run on a shared machine: not what this test is about."""


@dataclass
class Recorded:
    settings: Settings
    engine: Engine
    server: TriageServer
    tickets: dict[str, str]
    """Run id → ticket id of the runs tagged v1."""
    schema: Path
    env: dict[str, str | None]


def _outage(ticket_id: str) -> bool:
    return int(ticket_id.removeprefix("T-")) % 5 == 4  # "Outage in the EU region ..."


@pytest.fixture
def recorded(settings: Settings, engine: Engine, tmp_path: Path) -> Iterator[Recorded]:
    prices = tmp_path / "prices.toml"
    prices.write_text(PRICE_FILE)
    schema = tmp_path / "triage.schema.json"
    schema.write_text(json.dumps(OUTPUT_SCHEMA))
    priced = replace(settings, price_file=str(prices))
    with TriageServer() as server:
        ids = [f"T-{i:05d}" for i in range(RUNS + 3)]
        tickets = record_tickets(engine, priced, server.base_url, ids[:RUNS], "v1")
        others = record_tickets(engine, priced, server.base_url, ids[RUNS:], "v2")
        every = [*tickets, *others]
        catch_up(priced, engine, lambda conn: finished_rollups(conn, every) == len(every))
        env = {
            "BLACKBOX_DATABASE_URL": settings.database_url,
            "BLACKBOX_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
            "BLACKBOX_TOPIC": settings.topic,
            "BLACKBOX_PRICE_FILE": str(prices),
            "BLACKBOX_PURPOSE": None,
            "BLACKBOX_KEK": None,
            "BLACKBOX_KEK_FILE": None,
            "OPENAI_API_KEY": KEY,
        }
        yield Recorded(priced, engine, server, tickets, schema, env)


def _experiment(recorded: Recorded, *extra: str) -> Result:
    arguments = [
        "experiment",
        "run",
        "--agent-id",
        "ticket-agent",
        "--prompt-version",
        "v1",
        "--limit",
        str(RUNS),
        "--agent",
        "agent_blackbox.examples.ticket_agent:fork_entry",
        "--set",
        f"prompt={URGENT_PROMPT}",
        "--set",
        "tag.prompt_version=v2",
        "--base-url",
        recorded.server.base_url,
        "--purpose",
        PURPOSE,
        *extra,
    ]
    return CliRunner(env=recorded.env).invoke(main, arguments)


EVALUATORS = (
    "--evaluator",
    "success",
    "--evaluator",
    "equality=$.received_at",
    "--evaluator",
    "tool-calls",
    "--evaluator",
    "cost",
    "--evaluator",
    "latency",
    "--evaluator",
    "tests.integration._experiment_evaluators:brevity",
)


def _scores(
    engine: Engine, experiment_id: str, score: str
) -> dict[str, tuple[float | None, float | None]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT run_id, baseline, variant FROM blackbox_views.experiment_scores "
                "WHERE experiment_id = :id AND score = :score"
            ),
            {"id": experiment_id, "score": score},
        ).all()
    return {r[0]: (r[1], r[2]) for r in rows}


def _sql_summary(engine: Engine, experiment_id: str) -> dict[str, dict[str, float]]:
    """Per score, from the kept rows: n, both means, the mean paired difference and the
    sample standard deviations of each side and of the differences."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                """
                SELECT score, count(*), avg(baseline), avg(variant), avg(variant - baseline),
                       coalesce(stddev_samp(baseline), 0), coalesce(stddev_samp(variant), 0),
                       coalesce(stddev_samp(variant - baseline), 0)
                  FROM blackbox_views.experiment_scores
                 WHERE experiment_id = :id AND baseline IS NOT NULL AND variant IS NOT NULL
                 GROUP BY score
                """
            ),
            {"id": experiment_id},
        ).all()
    names = ("n", "baseline", "variant", "difference", "sd_baseline", "sd_variant", "sd_difference")
    return {r[0]: dict(zip(names, map(float, r[1:]), strict=True)) for r in rows}


def _close(a: float | None, b: float) -> bool:
    return a is not None and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def _check_against_sql(summary: list[dict[str, Any]], sql: dict[str, dict[str, float]]) -> None:
    assert {s["score"] for s in summary} == set(sql)
    for s in summary:
        expected = sql[s["score"]]
        assert s["runs"] == expected["n"] == RUNS, s
        for side in ("baseline", "variant", "difference"):
            half = T_975_49 * expected[f"sd_{side}"] / math.sqrt(RUNS)
            shown = s[side]
            assert _close(shown["mean"], expected[side]), (s["score"], side, shown, expected)
            assert _close(shown["low"], expected[side] - half), (s["score"], side, shown)
            assert _close(shown["high"], expected[side] + half), (s["score"], side, shown)


def test_experiment_over_fifty_runs_compares_two_prompt_versions(recorded: Recorded) -> None:
    result = _experiment(
        recorded,
        *EVALUATORS,
        "--evaluator",
        f"json-schema={recorded.schema}",
        *(x for t in TOLERANCES for x in ("--tolerance", t)),
        "--fail-on-regression",
        "--json",
    )
    assert result.exit_code == 1, result.output  # regressions found, as asked to gate
    report = json.loads(result.stdout)
    experiment_id = report["experiment_id"]
    assert report["runs"] == {
        "runs": RUNS,
        "scored": RUNS,
        "not_run": 0,
        "evaluator_failed": 0,
        "variant_failed": 0,
    }
    assert report["variant"]["changes"]["tag.prompt_version"] == "v2"
    assert report["variant"]["changes"]["prompt"].startswith("sha256:")  # no prompt text kept
    engine, tickets = recorded.engine, recorded.tickets
    results = {r["run_id"]: r for r in report["results"]}
    assert set(results) == set(tickets)  # exactly the 50 runs tagged v1

    # Each kept score is what the runs did: the outage tickets changed priority.
    equal = _scores(engine, experiment_id, "output_equal")
    valid = _scores(engine, experiment_id, "output_schema_valid")
    for run_id, ticket in tickets.items():
        assert equal[run_id] == (1.0, 0.0 if _outage(ticket) else 1.0)
        assert valid[run_id] == (1.0, 0.0 if _outage(ticket) else 1.0)
    assert set(_scores(engine, experiment_id, "succeeded").values()) == {(1.0, 1.0)}
    assert set(_scores(engine, experiment_id, "tools_ok").values()) == {(1.0, 1.0)}
    # No tool was asked for by the model: kept unscored, and summed up as such.
    assert set(_scores(engine, experiment_id, "tool_args_valid").values()) == {(None, None)}

    # Costs: the recorded side's equals what the analytics views priced the run at, the
    # variant's what they priced its fork at (relayed and consumed now).
    forks = {run_id: r["fork_run_id"] for run_id, r in results.items()}
    made = list(forks.values())
    catch_up(recorded.settings, engine, lambda conn: finished_rollups(conn, made) == RUNS)
    with engine.connect() as conn:
        cost = dict(
            conn.execute(
                text(
                    "SELECT run_id, cost_usd FROM blackbox_views.run_rollups "
                    "WHERE run_id = ANY (:ids)"
                ),
                {"ids": [*forks, *forks.values()]},
            ).all()
        )
        parents = dict(
            conn.execute(
                text(
                    "SELECT run_id, parent_run_id FROM blackbox_views.runs "
                    "WHERE run_id = ANY (:ids)"
                ),
                {"ids": list(forks.values())},
            ).all()
        )
    assert parents == {fork: run_id for run_id, fork in forks.items()}
    with engine.connect() as conn:  # what a fork's own page can say of where it came from
        some_run, some_fork = next(iter(forks.items()))
        made_by = fork_experiment_txn(conn, some_fork)
    assert made_by == (experiment_id, report["name"], some_run)
    for run_id, (before, after) in _scores(engine, experiment_id, "cost_usd").items():
        assert isinstance(cost[run_id], Decimal)
        assert before == float(cost[run_id])
        assert after == float(cost[forks[run_id]])
        assert after > before  # the longer prompt

    # The summary: means and t intervals as SQL computes them over the kept rows.
    sql = _sql_summary(engine, experiment_id)
    scored = [s for s in report["scores"] if s["runs"]]
    _check_against_sql(scored, sql)
    by_score = {s["score"]: s for s in report["scores"]}
    assert by_score["tool_args_valid"]["verdict"] == "not scored"
    assert by_score["output_equal"]["verdict"] == "worse"
    assert by_score["cost_usd"]["verdict"] == "worse"
    assert by_score["summary_words"]["verdict"] == "no clear change"
    assert by_score["summary_words"]["difference"] == {"mean": 0.0, "low": 0.0, "high": 0.0}

    # The regressions, run by run: the outage tickets' output, and every run's cost.
    outages = {run_id for run_id, ticket in tickets.items() if _outage(ticket)}
    regressed = {(r["run_id"], r["score"]) for r in report["regressions"]}
    expected = {(run_id, "cost_usd") for run_id in tickets} | {
        (run_id, score)
        for run_id in outages
        for score in (
            "output_equal",
            "output_fields_equal",
            "output_schema_valid",
            "llm_answers_equal",
        )
    }
    assert regressed == expected

    shown = CliRunner(env=recorded.env).invoke(
        main, ["experiment", "show", experiment_id, "--json"]
    )
    assert shown.exit_code == 0, shown.output
    again = json.loads(shown.stdout)
    assert again["scores"] == report["scores"]
    assert again["regressions"] == report["regressions"]
    _page_shows_the_summary(recorded, experiment_id, sql, len({run for run, _ in expected}))

    # Had its process been killed before the end, the experiment would stay 'running'
    # for good: once no result has been kept for a while it is shown stalled instead.
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE blackbox_views.experiments SET status = 'running', finished_at = NULL "
                "WHERE experiment_id = :id"
            ),
            {"id": experiment_id},
        )
    assert _status(recorded, experiment_id) == "running"  # its results are fresh
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE blackbox_views.experiment_runs SET scored_at = scored_at - "
                "interval '1 hour' WHERE experiment_id = :id"
            ),
            {"id": experiment_id},
        )
    assert _status(recorded, experiment_id) == "stalled"


def _status(recorded: Recorded, experiment_id: str) -> str:
    shown = CliRunner(env=recorded.env).invoke(
        main, ["experiment", "show", experiment_id, "--json"]
    )
    assert shown.exit_code == 0, shown.output
    return str(json.loads(shown.stdout)["status"])


def _page_shows_the_summary(
    recorded: Recorded, experiment_id: str, sql: dict[str, dict[str, float]], regressions: int
) -> None:
    """The console's experiment page in Chromium: a row per score with both means, the
    difference and their intervals as SQL gives them, and the regressions by run."""
    settings = recorded.settings
    log = Path(SCREENSHOTS.parent / "experiment-web.log")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with console(settings, settings.database_url, log) as base, chromium() as driver:
        driver.set_window_size(1280, 1000)
        driver.get(f"{base}/experiments")
        listed = driver.find_elements(By.CSS_SELECTOR, "#experiments tbody tr")
        assert [r.find_element(By.CSS_SELECTOR, "td.n").text for r in listed] == ["50 / 50"]
        assert _fits(driver)
        driver.save_screenshot(str(SCREENSHOTS / "experiments.png"))
        _open_by_keyboard(driver, f"/experiments/{experiment_id}")
        eventually(lambda: driver.find_elements(By.ID, "scores"), what="the experiment page")
        assert _fits(driver), "the page is wider than the window: something is cut or hidden"
        rows = driver.find_elements(By.CSS_SELECTOR, "#scores tbody tr")
        shown = {r.get_attribute("data-score"): r for r in rows}
        assert set(shown) == {*sql, "tool_args_valid"}
        assert shown["tool_args_valid"].find_element(By.CSS_SELECTOR, "td.verdict").text == (
            "not scored"
        )
        for score, expected in sql.items():
            half = T_975_49 * expected["sd_difference"] / math.sqrt(RUNS)
            cell = shown[score].find_element(By.CSS_SELECTOR, "td.difference")
            assert _close(float(cell.get_attribute("data-mean") or "nan"), expected["difference"])
            assert _close(
                float(cell.get_attribute("data-low") or "nan"), expected["difference"] - half
            )
            assert _close(
                float(cell.get_attribute("data-high") or "nan"), expected["difference"] + half
            )
            for side in ("baseline", "variant"):
                mean = (
                    shown[score]
                    .find_element(By.CSS_SELECTOR, f"td.{side}")
                    .get_attribute("data-mean")
                )
                assert _close(float(mean or "nan"), expected[side])
        listed = driver.find_elements(By.CSS_SELECTOR, "#regressions tbody tr")
        assert len(listed) == regressions  # one row per run, its scores in it
        assert "paired" in driver.find_element(By.ID, "method").text
        forks = driver.find_elements(By.CSS_SELECTOR, "#experiment-runs a.fork-link")
        assert len(forks) == RUNS
        driver.save_screenshot(str(SCREENSHOTS / "experiment.png"))
        driver.execute_script("document.getElementById('regressions').scrollIntoView()")
        driver.save_screenshot(str(SCREENSHOTS / "experiment-regressions.png"))
        forks[0].click()
        eventually(lambda: driver.find_elements(By.ID, "parent"), what="the fork's run page")


def _open_by_keyboard(driver: WebDriver, path: str) -> None:
    """Tab through the page to the link to ``path`` and follow it with Enter."""
    body = driver.find_element(By.TAG_NAME, "body")
    for _ in range(40):
        body.send_keys(Keys.TAB)
        focused = driver.switch_to.active_element
        if (focused.get_attribute("href") or "").endswith(path):
            focused.send_keys(Keys.ENTER)
            return
    raise AssertionError(f"no link to {path} is reachable with the Tab key")


def _fits(driver: WebDriver) -> bool:
    """Whether the page is no wider than the window (nothing pushed off to the side)."""
    return bool(
        driver.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
    )
