"""``agent_blackbox.testing`` used as an agent author uses it: a test suite of their own,
in a folder of its own, run by pytest in a fresh process, enabling the fixtures in its
``conftest.py``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

CONFTEST = 'pytest_plugins = ["agent_blackbox.testing.fixtures"]\n'

AGENT_TESTS = """
import asyncio

import agent_blackbox as bb
from agent_blackbox.testing import replay

CALLS = []


@bb.tool
def lookup(order_id: str) -> dict:
    CALLS.append(order_id)
    return {"order": order_id, "status": "shipped"}


def agent(run: bb.AgentRun, question: dict) -> str:
    order = lookup(question["order_id"])
    return f"{order['order']} is {order['status']}"


def other_agent(run: bb.AgentRun, question: dict) -> str:
    order = lookup(question["order_id"] + "-2")
    return f"{order['order']} is {order['status']}"


async def async_agent(run: bb.AsyncRun, question: dict) -> str:
    order = await run.call("lookup", lambda o: {"order": o}, question["order_id"])
    return order["order"]


def test_a_recorded_run_replays(blackbox_recorder):
    assert blackbox_recorder.events == []
    snapshot = bb.RunSnapshot("orders/1", {"order_id": "A-1"})
    run, answer = blackbox_recorder.record(agent, snapshot, agent_id="orders")
    assert answer == "A-1 is shipped"
    assert [e.event_type for e in blackbox_recorder.events] == [
        "run.started", "tool.call", "run.finished"
    ]
    CALLS.clear()
    report = replay(blackbox_recorder, agent)
    assert report.passed, report.divergence
    assert CALLS == []  # replay answered the tool from the recording


def test_a_changed_agent_diverges(blackbox_recorder):
    assert blackbox_recorder.events == []  # a recorder of this test's own
    blackbox_recorder.record(agent, bb.RunSnapshot("orders/1", {"order_id": "B-2"}), agent_id="o")
    report = replay(blackbox_recorder, other_agent)
    assert report.result == "DIVERGED"
    assert report.divergence.kind == "argument_mismatch"


def test_an_async_agent(blackbox_async_recorder):
    snapshot = bb.RunSnapshot("orders/async", {"order_id": "C-3"})
    asyncio.run(blackbox_async_recorder.record(async_agent, snapshot, agent_id="orders"))
    assert bb.replay(blackbox_async_recorder.events, async_agent).passed
"""


def test_an_agents_own_suite_records_and_replays_with_the_fixtures(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST, encoding="utf-8")
    (tmp_path / "test_agent.py").write_text(AGENT_TESTS, encoding="utf-8")
    (tmp_path / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")  # its own rootdir
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout


def test_without_the_plugin_the_fixtures_are_not_there(tmp_path: Path) -> None:
    """They are opt-in: installing the package adds nothing to other suites."""
    (tmp_path / "test_agent.py").write_text(AGENT_TESTS, encoding="utf-8")
    (tmp_path / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert done.returncode == 1
    assert "fixture 'blackbox_recorder' not found" in done.stdout
