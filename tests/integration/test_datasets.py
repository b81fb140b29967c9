"""``blackbox dataset`` (create, list, show, export, delete) and an experiment on a
dataset whose variant re-sends the recorded LLM requests, run as the replayer role; what
each role and tenant may see of them; and the experiment's exit status 2 when it
cannot run."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import Engine, text

from agent_blackbox.cli import main
from agent_blackbox.schemas import Settings
from tests.conftest import Login
from tests.integration._triage_server import (
    KEY,
    PRICE_FILE,
    TriageServer,
    catch_up,
    finished_rollups,
    record_tickets,
)

pytestmark = pytest.mark.integration

PURPOSE = "re-send the triage prompts"


@dataclass
class Small:
    settings: Settings
    engine: Engine
    server: TriageServer
    v1: dict[str, str]
    """Run id → ticket id of the four runs tagged v1."""
    prices: Path


@pytest.fixture
def small(settings: Settings, engine: Engine, tmp_path: Path) -> Iterator[Small]:
    prices = tmp_path / "prices.toml"
    prices.write_text(PRICE_FILE)
    priced = replace(settings, price_file=str(prices))
    with TriageServer() as server:
        ids = [f"T-{i:05d}" for i in range(6)]
        v1 = record_tickets(engine, priced, server.base_url, ids[:4], "v1")
        v2 = record_tickets(engine, priced, server.base_url, ids[4:], "v2")
        every = [*v1, *v2]
        catch_up(priced, engine, lambda conn: finished_rollups(conn, every) == len(every))
        yield Small(priced, engine, server, v1, prices)


def _cli(small: Small, engine: Engine, *args: str) -> Result:
    env = {
        "BLACKBOX_DATABASE_URL": engine.url.render_as_string(hide_password=False),
        "BLACKBOX_KAFKA_BOOTSTRAP": small.settings.kafka_bootstrap,
        "BLACKBOX_TOPIC": small.settings.topic,
        "BLACKBOX_PRICE_FILE": str(small.prices),
        "BLACKBOX_PURPOSE": None,
        "BLACKBOX_KEK": None,
        "BLACKBOX_KEK_FILE": None,
        "OPENAI_API_KEY": KEY,
    }
    return CliRunner(env=env).invoke(main, list(args))


def _newest_first(engine: Engine, run_ids: list[str]) -> list[str]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT run_id FROM blackbox_views.runs WHERE run_id = ANY (:ids) "
                "ORDER BY started_at DESC, run_id DESC"
            ),
            {"ids": run_ids},
        )
        return [str(r[0]) for r in rows]


def test_a_dataset_is_saved_shown_exported_and_experimented_on(
    small: Small, login: Login, tmp_path: Path
) -> None:
    replayer = login("blackbox_replayer", tenant="*")
    made = _cli(
        small,
        replayer,
        "dataset",
        "create",
        "triage-v1",
        "--agent-id",
        "ticket-agent",
        "--prompt-version",
        "v1",
        "--description",
        "the first four tickets",
    )
    assert made.exit_code == 0, made.output
    assert "4 runs" in made.stderr
    again = _cli(small, replayer, "dataset", "create", "triage-v1", *small.v1)
    assert again.exit_code == 2
    assert "exists already" in again.stderr
    badly = _cli(small, replayer, "dataset", "create", "Bad Name", *small.v1)
    assert badly.exit_code == 2
    assert "not a dataset name" in badly.stderr

    listed = _cli(small, replayer, "dataset", "list", "--json")
    [line] = [json.loads(x) for x in listed.stdout.splitlines()]
    assert (line["name"], line["runs"], line["tenants"]) == ("triage-v1", 4, ["default"])
    assert line["selection"]["tag.prompt_version"] == "v1"
    shown = json.loads(_cli(small, replayer, "dataset", "show", "triage-v1", "--json").stdout)
    assert shown["run_ids"] == _newest_first(small.engine, list(small.v1))

    out = tmp_path / "triage.jsonl"
    exported = _cli(small, replayer, "dataset", "export", "triage-v1", "-o", str(out))
    assert exported.exit_code == 0, exported.output
    events = [json.loads(x) for x in out.read_text().splitlines()]
    assert {e["run_id"] for e in events} == set(small.v1)
    assert sum(e["event_type"] == "run.started" for e in events) == 4

    ran = _cli(
        small,
        replayer,
        "experiment",
        "run",
        "--dataset",
        "triage-v1",
        "--reexecute",
        "--base-url",
        small.server.base_url,
        "--evaluator",
        "equality",
        "--evaluator",
        "cost",
        "--purpose",
        PURPOSE,
        "--json",
    )
    assert ran.exit_code == 0, ran.output
    report = json.loads(ran.stdout)
    assert report["dataset"] == "triage-v1"
    assert report["variant"]["kind"] == "reexecute"
    assert report["runs"]["scored"] == 4
    assert len(small.server.requests) == 4 + 6  # re-sent once each, after the recording
    scores = {s["score"]: s for s in report["scores"]}
    assert {k for k, s in scores.items() if s["runs"]} == {"cost_usd", "llm_answers_equal"}
    assert scores["output_equal"]["verdict"] == "not scored"  # no output without the agent
    assert scores["llm_answers_equal"]["variant"]["mean"] == 1.0  # the same prompt, answered so
    assert scores["cost_usd"]["difference"] == {"mean": 0.0, "low": 0.0, "high": 0.0}
    assert all(r["fork_run_id"] is None for r in report["results"])
    _seen_by_tenant(small, login, report["experiment_id"])

    assert _cli(small, replayer, "dataset", "delete", "triage-v1").exit_code == 0
    assert _cli(small, replayer, "dataset", "show", "triage-v1").exit_code == 2


def _seen_by_tenant(small: Small, login: Login, experiment_id: str) -> None:
    """A reader granted the runs' tenant sees the experiment and the dataset; a reader
    granted another tenant sees neither."""
    mine, other = (
        login("blackbox_reader", tenant="default"),
        login("blackbox_reader", tenant="acme"),
    )
    shown = _cli(small, mine, "experiment", "show", experiment_id, "--json")
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["runs"]["scored"] == 4
    listed = _cli(small, mine, "experiment", "list", "--json").stdout.splitlines()
    assert [json.loads(x)["experiment_id"] for x in listed] == [experiment_id]
    hidden = _cli(small, other, "experiment", "show", experiment_id, "--json")
    assert hidden.exit_code == 2
    assert _cli(small, other, "experiment", "list", "--json").stdout == ""
    assert _cli(small, other, "dataset", "list", "--json").stdout == ""
    with other.connect() as conn:
        rows = conn.execute(text("SELECT count(*) FROM blackbox_views.experiment_scores"))
        assert rows.scalar_one() == 0
    refused = _cli(small, mine, "dataset", "create", "mine", *small.v1)
    assert refused.exit_code == 2  # a reader writes nothing
    assert "blackbox_replayer" in refused.output


def test_an_experiment_that_cannot_run_exits_2(small: Small) -> None:
    base = ["experiment", "run", "--purpose", PURPOSE, "--base-url", small.server.base_url]
    fork = ["--agent", "agent_blackbox.examples.ticket_agent:fork_entry"]
    for args, said in (
        ([*fork, "--agent-id", "nobody"], "no finished run matches"),
        ([*fork, "--evaluator", "no-such-evaluator"], "is not an evaluator"),
        ([*fork, "--dataset", "none-such"], "no dataset none-such"),
        (["--agent", "no_such_module:entry"], "cannot import"),
        (["--agent-id", "ticket-agent"], "give --agent FACTORY"),
        ([*fork, "--reexecute"], "takes no --agent"),
    ):
        result = _cli(small, small.engine, *base, *args)
        assert result.exit_code == 2, (args, result.output)
        assert said in result.output, (args, result.output)
    with small.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM blackbox_views.experiments")).scalar() == 0
