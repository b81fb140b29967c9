"""``import agent_blackbox as bb``: a handful of names in the user's words, each loaded on
first use, and ``bb.replay`` of a run's envelopes (runs found through the settings are
replayed in tests/integration/test_front_door_replay.py)."""

from __future__ import annotations

import asyncio
import secrets
import subprocess
import sys

import pytest

import agent_blackbox as bb
import agent_blackbox.outbox as write_side
import agent_blackbox.replayer as replayer
from agent_blackbox.keystore import AccessDenied
from agent_blackbox.outbox import integrations
from agent_blackbox.outbox.integrations import anthropic as anthropic_capture
from agent_blackbox.outbox.integrations import openai as openai_capture
from agent_blackbox.replayer import DivergenceKind, UnknownAgent, replay_run
from agent_blackbox.schemas import BlackboxError, NotSerialisable, Settings
from agent_blackbox.testing import AsyncMemoryRecorder, MemoryRecorder, replay

pytestmark = pytest.mark.timeout(120)

FRONT_DOOR = [
    "AgentRun",
    "AsyncRecorder",
    "AsyncRun",
    "BlackboxError",
    "EffectOutcome",
    "EffectRejected",
    "NotSerialisable",
    "Recorder",
    "ReplayReport",
    "Run",
    "RunSnapshot",
    "async_http_client",
    "capture_anthropic",
    "capture_openai",
    "current_run",
    "http_client",
    "instrument",
    "replay",
    "tool",
    "uninstrument",
]
HEAVY = ("confluent_kafka", "alembic", "prometheus_client", "rich")


def _loaded_after(code: str, watched: tuple[str, ...]) -> list[str]:
    """Which of ``watched`` a fresh interpreter has imported after running ``code``."""
    report = f"print(','.join(m for m in {watched!r} if m in sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", f"import sys\n{code}\n{report}"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return [m for m in done.stdout.strip().split(",") if m]


def test_the_front_door_lists_exactly_its_names() -> None:
    assert dir(bb) == FRONT_DOOR
    assert sorted(bb.__all__) == FRONT_DOOR


def test_each_name_is_the_object_of_the_part_behind_the_door() -> None:
    homes = {
        **dict.fromkeys(FRONT_DOOR, write_side),
        "replay": None,
        "ReplayReport": replayer,
        "capture_openai": openai_capture,
        "capture_anthropic": anthropic_capture,
        "http_client": integrations,
        "async_http_client": integrations,
        "instrument": integrations,
        "uninstrument": integrations,
    }
    for name, home in homes.items():
        if home is not None:
            assert getattr(bb, name) is getattr(home, name), name
    assert bb.BlackboxError is BlackboxError
    assert bb.NotSerialisable is NotSerialisable


def test_a_name_not_at_the_door_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError):
        bb.MemoryRecorder  # noqa: B018 - at agent_blackbox.testing, not at the door
    with pytest.raises(AttributeError):
        bb.outbox_backlog_txn  # noqa: B018


def test_importing_the_door_loads_no_part() -> None:
    watched = ("sqlalchemy", "agent_blackbox.outbox", "agent_blackbox.schemas", *HEAVY)
    assert _loaded_after("import agent_blackbox", watched) == []


def test_an_agent_recording_through_the_door_loads_the_recorder_only() -> None:
    agent = "import agent_blackbox\nfrom agent_blackbox import Recorder, tool, instrument\n"
    elsewhere = ("agent_blackbox.replayer", "agent_blackbox.consumers")
    assert _loaded_after(agent, HEAVY + elsewhere) == []
    assert _loaded_after(agent, ("agent_blackbox.outbox._recorder",)) == [
        "agent_blackbox.outbox._recorder"
    ]


def test_no_name_of_the_door_loads_pipeline_machinery() -> None:
    """Replay's names included: replaying a run's envelopes needs no Kafka client."""
    every = "import agent_blackbox as bb\nfor name in bb.__all__:\n    getattr(bb, name)\n"
    assert _loaded_after(every, HEAVY) == []


def test_the_testing_module_loads_the_replayer_only_to_replay_and_never_kafka() -> None:
    assert _loaded_after("import agent_blackbox.testing", ("agent_blackbox.replayer",)) == []
    test = (
        "from agent_blackbox import RunSnapshot\n"
        "from agent_blackbox.testing import MemoryRecorder, replay\n"
        "recorder = MemoryRecorder()\n"
        "def agent(run, value):\n"
        "    return run.call('double', lambda n: 2 * n, value)\n"
        "recorder.record(agent, RunSnapshot('probe', 1), agent_id='probe')\n"
        "assert replay(recorder, agent).passed\n"
    )
    assert _loaded_after(test, HEAVY) == []


def _agent(run: bb.AgentRun, value: dict[str, int]) -> int:
    doubled = run.call("double", lambda n: 2 * n, value["n"])
    return doubled + run.randint(0, 0)


def _changed(run: bb.AgentRun, value: dict[str, int]) -> int:
    return run.call("double", lambda n: 2 * n, value["n"] + 1)  # a different argument


def _recorded(*inputs: int) -> MemoryRecorder:
    recorder = MemoryRecorder()
    for n in inputs:
        recorder.record(_agent, bb.RunSnapshot("front-door/1", {"n": n}), agent_id="a")
    return recorder


def test_replay_of_a_runs_envelopes_passes_and_a_change_diverges() -> None:
    recorder = _recorded(2)
    passed = bb.replay(recorder.events, _agent)
    assert (passed.result, passed.events) == ("PASS", 4)
    diverged = bb.replay(recorder.events, _changed)
    assert diverged.divergence is not None
    assert (diverged.divergence.kind, diverged.divergence.sequence) == (
        DivergenceKind.ARGUMENT_MISMATCH,
        2,
    )


def test_replay_takes_the_entry_as_an_import_path() -> None:
    recorder = _recorded(3)
    assert bb.replay(recorder.events, f"{__name__}:_agent").passed
    with pytest.raises(UnknownAgent, match="has no 'nowhere'"):
        bb.replay(recorder.events, f"{__name__}:nowhere")


def test_replay_says_what_it_cannot_take() -> None:
    several = _recorded(1, 2)
    with pytest.raises(ValueError, match=r"2 runs were recorded .* say which with run_id="):
        bb.replay(several.events, _agent)
    with pytest.raises(ValueError, match="nothing to replay"):
        bb.replay([], _agent)
    with pytest.raises(TypeError, match="a run id, a list of run ids, or the envelopes"):
        bb.replay([1, 2], _agent)  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="give 'warn' or 'fail'"):
        bb.replay(several.events, _agent, nondeterminism="never")  # type: ignore[call-overload]


def test_a_run_id_without_a_purpose_is_refused_before_anything_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("BLACKBOX_PURPOSE", raising=False)
    # Nothing listens here: the refusal comes before any connection is tried.
    monkeypatch.setenv("BLACKBOX_DATABASE_URL", "postgresql+psycopg://nobody@127.0.0.1:9/none")
    with pytest.raises(AccessDenied, match="pass purpose= or set BLACKBOX_PURPOSE"):
        bb.replay("some-run", _agent)
    with pytest.raises(AccessDenied, match="too short"):
        bb.replay(["some-run"], _agent, purpose="x")


def test_testing_replay_picks_a_run_of_a_recorder_by_id() -> None:
    recorder = _recorded(1, 2)
    second = recorder.events[-1].run_id
    report = replay(recorder, _agent, run_id=second)
    assert (report.run_id, report.result) == (second, "PASS")
    with pytest.raises(ValueError, match="run nope was not recorded here"):
        replay(recorder, _agent, run_id="nope")
    with pytest.raises(ValueError, match="nothing was recorded"):
        replay(MemoryRecorder(), _agent)


def test_testing_replay_reads_bodies_the_recorder_kept_out_of_line() -> None:
    recorder = MemoryRecorder(settings=Settings(blob_threshold_bytes=1_024))
    big = secrets.token_hex(4_096)  # random: compression keeps it over the threshold

    def agent(run: bb.AgentRun, value: str) -> str:
        return run.call("echo", lambda text: text, value)

    recorder.record(agent, bb.RunSnapshot("blobs/1", big), agent_id="a")
    assert recorder.blobs  # the body went out of line
    assert replay(recorder, agent).passed
    without = bb.replay(recorder.events, agent)  # envelopes alone: no blob reader
    assert without.result == "ERROR"
    assert "agent_blackbox.testing.replay(recorder, agent)" in str(without.error)
    assert replay_run(recorder.events, agent, blobs=recorder).passed


def test_an_async_agent_replays_from_an_async_memory_recorder() -> None:
    async def agent(run: bb.AsyncRun, value: dict[str, int]) -> int:
        return await run.call("double", lambda n: 2 * n, value["n"])

    recorder = AsyncMemoryRecorder()
    snapshot = bb.RunSnapshot("front-door/async", {"n": 4})
    asyncio.run(recorder.record(agent, snapshot, agent_id="a"))
    report = replay(recorder, agent)  # type: ignore[arg-type]
    assert report.passed, report.divergence and report.divergence.describe()
