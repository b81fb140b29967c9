"""The test side of the recipes that run in the environment of their own
(``_compat_env``): the agent records and replays in a driver process (``_compat_driver``)
against each test's database and topic and the module's model server; the views are
read here."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path
from select import select as wait_readable
from typing import Any

from sqlalchemy import Engine, select

from agent_blackbox.consumers import events_index, runs_view
from agent_blackbox.schemas import Settings
from tests.integration._llm_server import LLMServer
from tests.integration.frameworks._compat_env import ROOT, CompatEnv
from tests.integration.frameworks._harness import Recorded, attributes_by_run, finished_attributes

DRIVER = "tests.integration.frameworks._compat_driver"
API_KEY = "sk-test-compat-0000"
ANSWER_TIMEOUT = 240.0
"""Seconds one request to the driver may take (a cold import of the frameworks included)."""


class Driver:
    """The agent side of a test module: one driver process in the environment of its own,
    talking to one model server, recording and replaying for each test on that test's
    settings (its database, topic and consumer group).

    Use as a context manager; the process is ended on exit.
    """

    def __init__(self, env: CompatEnv, model_url: str, log: Path) -> None:
        self.env = env
        self.model_url = model_url
        self.log = log
        self._process: subprocess.Popen[str] | None = None

    def __enter__(self) -> Driver:
        # Its stderr (the agent's libraries' output, a traceback) goes to a file: a pipe
        # nobody reads would block the process once full.
        with self.log.open("w") as stderr:
            self._process = subprocess.Popen(
                [str(self.env.python), "-m", DRIVER],
                cwd=ROOT,
                env=self._variables(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        return self

    def __exit__(self, *exc: object) -> None:
        process = self._process
        if process is None:
            return
        assert process.stdin is not None
        process.stdin.close()  # the driver ends at the end of its input
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        finally:
            if process.stdout is not None:
                process.stdout.close()

    def record(
        self,
        settings: Settings,
        entry: str,
        inputs: list[Any],
        *,
        agent_id: str,
        at_once: int = 1,
    ) -> Recorded:
        """Record one run of ``entry`` per input (``at_once`` at a time: async entries);
        asserts that none warned of an unrecorded call."""
        spec = {"entry": entry, "inputs": inputs, "agent_id": agent_id, "at_once": at_once}
        done = self.ask(settings, "record", spec)
        assert done["holes"] == [], f"the runs made unrecorded calls: {done['holes']}"
        return Recorded({run_id: (pair[0], pair[1]) for run_id, pair in done["runs"].items()})

    def replay(
        self,
        settings: Settings,
        entry: str,
        run_ids: list[str],
        *,
        changed: dict[str, Any] | None = None,
    ) -> list[dict[str, Any]]:
        """Replay the runs from Kafka under the driver's socket guard (asserting that it
        refused nothing); their reports, as ``ReplayReport.to_dict``. ``changed``: module
        attributes set for the replay (``{"package.module.NAME": value}``)."""
        spec = {"entry": entry, "run_ids": run_ids, "set": changed or {}}
        done = self.ask(settings, "replay", spec)
        assert done["refused"] == [], f"replay tried to connect to {done['refused']}"
        reports: list[dict[str, Any]] = done["reports"]
        return reports

    def assert_replays_offline(
        self, settings: Settings, entry: str, run_ids: list[str], *, model: LLMServer
    ) -> None:
        """Replay the runs (as :meth:`replay`); asserts that each passed and that the
        ``model`` server was asked nothing meanwhile."""
        sent = len(model.requests)
        reports = self.replay(settings, entry, run_ids)
        failed = [report for report in reports if report["result"] != "PASS"]
        assert (len(reports), failed) == (len(run_ids), [])
        assert len(model.requests) == sent, "the model server was asked during replay"

    def ask(self, settings: Settings, command: str, spec: dict[str, Any]) -> dict[str, Any]:
        """The driver's result of ``command`` on ``spec`` with ``settings``.

        Raises:
            AssertionError: the command failed, or the driver did (its output is in the
                message).
        """
        process = self._process
        assert process is not None, "the driver was not started"
        assert process.stdin is not None
        assert process.stdout is not None
        request = {"command": command, "settings": dataclasses.asdict(settings), "spec": spec}
        process.stdin.write(json.dumps(request) + "\n")
        process.stdin.flush()
        ready, _, _ = wait_readable([process.stdout], [], [], ANSWER_TIMEOUT)
        line = process.stdout.readline() if ready else ""
        if not line:
            raise AssertionError(
                f"the driver gave no answer to {command} (exit status {process.poll()}); "
                f"its output:\n{self._output()}"
            )
        answer = json.loads(line)
        if "error" in answer:
            raise AssertionError(f"the driver's {command} failed:\n{answer['error']}")
        result: dict[str, Any] = answer["result"]
        return result

    def _output(self) -> str:
        return self.log.read_text()[-6000:] if self.log.exists() else ""

    def _variables(self) -> dict[str, str]:
        # This process's variables but its own BLACKBOX_* ones: each request's settings rule.
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("BLACKBOX_")}
        return {**inherited, "OPENAI_BASE_URL": self.model_url, "OPENAI_API_KEY": API_KEY}


# The recipe's lines and its divergences ---------------------------------------------------


def recipe_line(recipe: Path, text: str, *, after: str) -> int:
    """The number of the first line of the ``recipe`` file holding ``text`` after the
    first line holding ``after``."""
    lines = recipe.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if after in line)
    return next(i for i, line in enumerate(lines[start:], start=start + 1) if text in line)


def assert_first_call_changed(
    report: dict[str, Any], *, recipe: Path, function: str, line: int, path: str
) -> None:
    """The replay ``report`` diverged with an ``argument_mismatch`` on the run's first
    model call (right after ``run.started``) at ``recipe``'s ``function`` and ``line``,
    naming ``path`` among what changed in the request."""
    divergence = report["divergence"]
    assert report["result"] == "DIVERGED"
    assert divergence["kind"] == "argument_mismatch"
    assert (divergence["expected_type"], divergence["actual_type"]) == ("llm.call", "llm.call")
    assert divergence["sequence"] == 2
    site = divergence["call_site"]
    assert Path(site["file"]) == recipe
    assert (site["function"], site["line"]) == (function, line)
    assert {"path": path} in divergence["changes"]


# What the views hold -------------------------------------------------------------------


def events_by_run(engine: Engine, run_ids: list[str]) -> dict[str, list[str]]:
    """Each run's event types in sequence order, from the views' events index."""
    query = (
        select(events_index.c.run_id, events_index.c.event_type)
        .where(events_index.c.run_id.in_(run_ids))
        .order_by(events_index.c.run_id, events_index.c.sequence)
    )
    found: dict[str, list[str]] = {run_id: [] for run_id in run_ids}
    with engine.connect() as conn:
        for run_id, event_type in conn.execute(query):
            found[run_id].append(event_type)
    return found


def holes_reported(engine: Engine, run_ids: list[str]) -> dict[str, str]:
    """The runs whose ``run.finished`` reports an unrecorded call: run id → the first."""
    return {
        run_id: str(attributes.get("unrecorded_call"))
        for run_id, attributes in finished_attributes(engine, run_ids).items()
        if "unrecorded_calls" in attributes
    }


def tools_called(engine: Engine, run_ids: list[str]) -> dict[str, int]:
    """How many ``tool.call`` events of the runs the views index, per tool."""
    calls = attributes_by_run(engine, run_ids, "tool.call", "tool").values()
    names = [str(name) for run_calls in calls for (name,) in run_calls]
    return {name: names.count(name) for name in set(names)}


def llm_call_attribute(engine: Engine, run_ids: list[str], name: str) -> list[str | None]:
    """The attribute ``name`` of every ``llm.call`` event of the runs (None where unset)."""
    calls = attributes_by_run(engine, run_ids, "llm.call", name).values()
    return [value for run_calls in calls for (value,) in run_calls]


def overlapped(engine: Engine, run_ids: list[str]) -> bool:
    """Whether the runs were all under way at one moment (each started before any of
    them finished), from the runs view."""
    query = select(runs_view.c.started_at, runs_view.c.finished_at).where(
        runs_view.c.run_id.in_(run_ids)
    )
    with engine.connect() as conn:
        spans = conn.execute(query).all()
    assert len(spans) == len(run_ids), f"runs missing from the runs view: {spans}"
    return bool(max(span[0] for span in spans) < min(span[1] for span in spans))
