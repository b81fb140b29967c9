"""The network guard: a call that leaves the process from a run's code without crossing a
boundary is a hole. While recording it is reported on ``run.finished`` and warned about
(``warn``, the default), refused and the run failed (``fail``), or ignored (``off``); in
replay it is refused and reported as an ``unrecorded_call`` divergence naming the host,
the port and the agent's line, also when the agent catches the refusal, unless the
replay allows the network (``allow_network=True``, ``blackbox replay --allow-network``).
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from click.testing import CliRunner

from agent_blackbox.cli import main
from agent_blackbox.outbox import (
    AsyncMemoryRecorder,
    MemoryRecorder,
    RunSnapshot,
    UnrecordedCall,
    UnrecordedCallWarning,
)
from agent_blackbox.replayer import DivergenceKind, replay_run, write_archive
from agent_blackbox.schemas import Envelope
from tests.integration.frameworks._harness import instrumented
from tests.unit._api_servers import ApiServer

pytestmark = pytest.mark.timeout(60)

LINES: list[int] = []
"""The line of each agent's unrecorded call, as the agent reached it."""
SEEN: list[BaseException] = []
"""What the agents below caught."""


@pytest.fixture
def server() -> Iterator[ApiServer]:
    with ApiServer() as running:
        yield running


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BLACKBOX_RECORD_NETWORK", raising=False)  # the default: warn
    LINES.clear()
    SEEN.clear()


def port_of(server: ApiServer) -> int:
    return int(server.base_url.rsplit(":", 1)[1].split("/", 1)[0])


# Agents with a hole -----------------------------------------------------------------------


def raw_socket(run: Any, given: Any) -> str:
    LINES.append(sys._getframe().f_lineno + 2)
    try:
        with socket.create_connection(("127.0.0.1", given["port"]), timeout=5):
            return "reached"
    except ConnectionRefusedError as exc:  # handled: the agent goes on without it
        SEEN.append(exc)
        return "refused"


def plain_http(run: Any, given: Any) -> str:
    LINES.append(sys._getframe().f_lineno + 3)
    url = f"http://127.0.0.1:{given['port']}/v1/chat/completions"
    try:
        with urllib.request.urlopen(url, data=b'{"model": "m", "messages": []}', timeout=5):
            return "reached"
    except urllib.error.URLError as exc:
        SEEN.append(exc.reason if isinstance(exc.reason, BaseException) else exc)
        return "refused"


def record(entry: Any, port: int) -> tuple[list[Envelope], Any]:
    recorder = MemoryRecorder()
    _, output = recorder.record(entry, RunSnapshot("t", {"port": port}), agent_id="holes")
    return recorder.events, output


def finished(events: list[Envelope]) -> dict[str, str]:
    assert events[-1].event_type == "run.finished"
    return dict(events[-1].attributes)


# Recording -----------------------------------------------------------------------------------


@pytest.mark.parametrize("agent", [raw_socket, plain_http], ids=["socket", "urllib"])
def test_a_connection_through_no_boundary_is_reported_and_warned(
    server: ApiServer, agent: Any
) -> None:
    port = port_of(server)
    with pytest.warns(UnrecordedCallWarning, match=f"127.0.0.1:{port}") as warned:
        events, output = record(agent, port)
    assert output == "reached"
    attributes = finished(events)
    assert attributes["status"] == "succeeded"
    assert attributes["unrecorded_calls"] == "1"
    assert attributes["unrecorded_call"].startswith(f"connection to 127.0.0.1:{port} at ")
    assert f"{agent.__name__} ({__file__}:{LINES[0]})" in attributes["unrecorded_call"]
    (warning,) = [w for w in warned if issubclass(w.category, UnrecordedCallWarning)]
    assert (warning.filename, warning.lineno) == (__file__, LINES[0])  # the agent's line


def test_in_fail_mode_the_connection_is_refused_and_the_run_fails(
    server: ApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BLACKBOX_RECORD_NETWORK", "fail")
    events, output = record(plain_http, port_of(server))
    assert output == "refused"  # the agent caught the refusal and went on
    assert isinstance(SEEN[0], UnrecordedCall)
    assert "BLACKBOX_RECORD_NETWORK=fail" in str(SEEN[0])
    assert server.requests == []  # nothing went out
    attributes = finished(events)
    assert (attributes["status"], attributes["error"]) == ("failed", "UnrecordedCall")
    assert attributes["unrecorded_calls"] == "1"


def test_in_off_mode_a_connection_is_ignored(
    server: ApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BLACKBOX_RECORD_NETWORK", "off")
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        events, output = record(raw_socket, port_of(server))
    assert output == "reached"
    assert "unrecorded_calls" not in finished(events)
    assert not [w for w in warned if issubclass(w.category, UnrecordedCallWarning)]


def test_an_sdk_client_that_records_nothing_is_a_hole(server: ApiServer) -> None:
    client = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)

    def agent(run: Any, given: Any) -> str | None:
        reply = client.chat.completions.create(model="m", messages=[])
        return reply.choices[0].message.content

    with pytest.warns(UnrecordedCallWarning):
        events, _ = record(agent, 0)
    assert [e.event_type for e in events] == ["run.started", "run.finished"]
    # A kept-alive pool sends it: the request is named, not only the connection.
    assert finished(events)["unrecorded_call"].startswith("POST /v1/chat/completions to 127.0")
    assert "agent (" in finished(events)["unrecorded_call"]
    # The library frame is the SDK's, which the agent called, not the HTTP library's.
    assert "site-packages/openai/" in finished(events)["unrecorded_call"]


def test_a_request_an_instrumented_client_does_not_record_is_a_hole(server: ApiServer) -> None:
    client = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)

    def agent(run: Any, given: Any) -> str:
        try:
            client.models.list()  # not a model call: nothing to record it as
        except openai.APIStatusError as exc:
            return str(exc.status_code)
        return "listed"

    with instrumented(), pytest.warns(UnrecordedCallWarning):
        events, output = record(agent, 0)
    assert output == "501"  # the test server serves no GET
    attributes = finished(events)
    assert attributes["unrecorded_calls"] == "1"  # the request, not its connection too
    assert attributes["unrecorded_call"].startswith(
        f"GET /v1/models to 127.0.0.1:{port_of(server)}"
    )


def test_a_connection_from_an_async_run_is_reported(server: ApiServer) -> None:
    async def agent(run: Any, given: Any) -> str:
        _, writer = await asyncio.open_connection("127.0.0.1", given["port"])
        writer.close()
        await writer.wait_closed()
        return "reached"

    async def main() -> list[Envelope]:
        recorder = AsyncMemoryRecorder()
        await recorder.record(agent, RunSnapshot("t", {"port": port_of(server)}), agent_id="a")
        return recorder.events

    with pytest.warns(UnrecordedCallWarning):
        events = asyncio.run(main())
    assert finished(events)["unrecorded_call"].startswith(
        f"connection to 127.0.0.1:{port_of(server)}"
    )


# Replay ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("agent", [raw_socket, plain_http], ids=["socket", "urllib"])
def test_replay_refuses_the_call_as_an_unrecorded_call_even_when_the_agent_catches_it(
    server: ApiServer, agent: Any
) -> None:
    port = port_of(server)
    with pytest.warns(UnrecordedCallWarning):
        events, _ = record(agent, port)
    before = len(server.requests)
    SEEN.clear()

    report = replay_run(events, agent)
    assert isinstance(SEEN[0], UnrecordedCall)  # refused, as a refused connection
    assert isinstance(SEEN[0], ConnectionRefusedError)
    divergence = report.divergence
    assert divergence is not None
    assert divergence.kind == DivergenceKind.UNRECORDED_CALL
    assert divergence.actual_name == f"connection to 127.0.0.1:{port}"
    # The next recorded event is named, here the run's end (not "no event").
    assert divergence.expected_type == "run.finished"
    assert "expected run.finished" in divergence.describe()
    site = divergence.call_site
    assert site is not None
    assert (site.function, site.line) == (agent.__name__, LINES[-1])
    assert len(server.requests) == before  # nothing went out


def test_replay_with_the_network_allowed_lets_it_through_and_says_so(server: ApiServer) -> None:
    port = port_of(server)
    with pytest.warns(UnrecordedCallWarning):
        events, _output = record(plain_http, port)
    report = replay_run(events, plain_http, allow_network=True)
    assert report.passed
    assert report.result == "LIMITED"
    assert report.levels == {"control_flow": "pass", "state": "pass", "content": "limited"}
    assert report.limited is not None
    assert "went online through no boundary" in report.limited
    assert "truncated" not in report.limited
    (note,) = report.notes
    assert note.startswith(f"went online: connection to 127.0.0.1:{port} at plain_http")
    assert len(server.requests) == 2  # it did go out, as asked


def test_a_replayed_run_with_an_unrecorded_call_before_other_events_names_the_next_one(
    server: ApiServer,
) -> None:
    def agent(run: Any, given: Any) -> str:
        answer = raw_socket(run, given)
        run.call("note", lambda text: text.upper(), answer)
        return answer

    with pytest.warns(UnrecordedCallWarning):
        events, _ = record(agent, port_of(server))
    report = replay_run(events, agent)
    assert report.divergence is not None
    assert (report.divergence.expected_type, report.divergence.expected_name) == (
        "tool.call",
        "note",
    )
    assert report.divergence.sequence == 2


# The command ------------------------------------------------------------------------------

HOLE_PORT: list[int] = []
"""The port the command's replay entry connects to (set by the test)."""


def replay_entry(run: Any, given: Any) -> str:
    """``plain_http`` as ``blackbox replay`` loads it: the port the test serves on now."""
    return plain_http(run, {"port": HOLE_PORT[-1]})


def test_the_replay_command_shows_the_unrecorded_call_and_allows_the_network(
    server: ApiServer, tmp_path: Path
) -> None:
    port = port_of(server)
    HOLE_PORT.append(port)
    with pytest.warns(UnrecordedCallWarning):
        events, _ = record(replay_entry, 0)
    archive = tmp_path / "holes.avro"
    write_archive(archive, events)
    arguments = ["replay", events[0].run_id, "--archive", str(archive), "--purpose", "holes"]
    arguments += ["--agent", f"{__name__}:replay_entry"]

    refused = CliRunner().invoke(main, arguments)
    assert refused.exit_code == 1, refused.output
    shown = " ".join(refused.stdout.split())  # as printed, lines wrapped to the terminal
    assert "DIVERGED" in shown
    for part in ("unrecorded_call", f"network connection to 127.0.0.1:{port}", "plain_http"):
        assert part in shown, part
    assert "replay with --allow-network" in shown  # what to do about it
    as_json = CliRunner().invoke(main, [*arguments, "--json"])
    divergence = json.loads(as_json.stdout.splitlines()[0])["divergence"]
    assert (divergence["kind"], divergence["expected_type"]) == ("unrecorded_call", "run.finished")

    allowed = CliRunner().invoke(main, [*arguments, "--allow-network"])
    assert allowed.exit_code == 0, allowed.output
    shown = " ".join(allowed.stdout.split())
    assert "LIMITED" in shown
    assert f"went online: connection to 127.0.0.1:{port}" in shown
    assert len(server.requests) == 2  # recorded, and the allowed replay
