"""Unrecorded nondeterminism: direct reads of the clock, randomness, UUIDs and the
environment by the agent's own modules are reported with their call site, in replay
and (opt-in) while recording; library calls are not; the guard restores everything."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import os
import random
import secrets
import sys
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from agent_blackbox.outbox import (
    AsyncMemoryRecorder,
    MemoryRecorder,
    NondeterminismGuard,
    NondeterminismWarning,
    RunSnapshot,
    UnrecordedNondeterminism,
)
from agent_blackbox.replayer import ReplayReport, replay_run
from agent_blackbox.schemas import Envelope

PACKAGE = "sbx_agent_pkg"
LIBRARY = "sbx_library"

AGENT_SOURCE = """
import datetime
import os
import secrets
import threading
import time
import uuid
from datetime import date
from datetime import datetime as Datetime
from random import random

import sbx_library


def clock_agent(run, value):
    recorded = run.now()
    started = time.time()  # mark:time
    return {"late": started > 0, "year": recorded.year > 2000}


def random_agent(run, value):
    draw = random()  # mark:random
    return {"small": draw < 2}


def library_agent(run, value):
    stamp = sbx_library.stamp()
    run.random()
    return {"stamped": stamp > 0}


def everything_agent(run, value):
    seen = []
    seen.append(datetime.datetime.now())  # mark:datetime.now
    seen.append(Datetime.utcnow())  # mark:datetime.utcnow
    seen.append(date.today())  # mark:date.today
    seen.append(os.environ.get("HOME"))  # mark:os.environ
    seen.append(os.getenv("HOME"))  # mark:os.getenv
    seen.append(uuid.uuid4())  # mark:uuid.uuid4
    seen.append(os.urandom(4))  # mark:os.urandom
    seen.append(secrets.token_hex(4))  # mark:secrets.token_hex
    worker = threading.Thread(target=_in_a_thread, args=(seen,))
    worker.start()
    worker.join()
    return {"n": len(seen), "dt": isinstance(seen[0], Datetime), "d": isinstance(seen[2], date)}


def _in_a_thread(seen):
    seen.append(time.time_ns())  # mark:time.time_ns


def looping_agent(run, value):
    total = 0.0
    for _ in range(3):
        total += time.time()  # mark:loop
    return {"ok": total > 0}


def failing_agent(run, value):
    time.time()  # mark:failing
    raise ValueError("boom")


def record(recorder, entry, snapshot):
    return recorder.record(entry, snapshot, agent_id="sbx")


async def async_agent(run, value):
    return {"late": time.time() > 0}  # mark:async


async def record_async(recorder, snapshot):
    return await recorder.record(async_agent, snapshot, agent_id="sbx")
"""

LIBRARY_SOURCE = """
import time
import uuid


def stamp():
    uuid.uuid4()
    return time.time()
"""


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    root = tmp_path_factory.mktemp("sandbox")
    (root / PACKAGE).mkdir()
    (root / PACKAGE / "__init__.py").write_text("")
    (root / PACKAGE / "agent.py").write_text(AGENT_SOURCE)
    (root / f"{LIBRARY}.py").write_text(LIBRARY_SOURCE)
    sys.path.insert(0, str(root))
    try:
        __import__(f"{PACKAGE}.agent")
        yield sys.modules[f"{PACKAGE}.agent"]
    finally:
        sys.path.remove(str(root))
        for name in (f"{PACKAGE}.agent", PACKAGE, LIBRARY):
            sys.modules.pop(name, None)


def _line(marker: str) -> int:
    lines = AGENT_SOURCE.splitlines()
    return next(n for n, text in enumerate(lines, 1) if text.endswith(f"# mark:{marker}"))


def _recorded(entry: Any) -> list[Envelope]:
    recorder = MemoryRecorder()
    with contextlib.suppress(ValueError):  # the failing agent's failure is recorded
        recorder.record(entry, RunSnapshot("sbx.1", {}), agent_id="sbx")
    return list(recorder.events)


def _replayed(entry: Any, **options: Any) -> ReplayReport:
    return replay_run(_recorded(entry), entry, **options)


def _patched_state() -> list[Any]:
    environ = type(os.environ)
    return [
        time.time,
        time.time_ns,
        random.random,
        random.choice,
        uuid.uuid4,
        uuid.uuid1,
        os.urandom,
        os.getenv,
        secrets.token_hex,
        datetime.datetime,
        datetime.date,
        dict(vars(environ)),
    ]


def test_an_agent_reading_the_clock_is_reported_with_its_line(agent: ModuleType) -> None:
    report = _replayed(agent.clock_agent)
    assert report.passed, report.to_dict()  # a warning by default
    assert report.result == "PASS"
    [found] = report.nondeterminism
    assert found.what == "time.time"
    assert found.kind == "unrecorded_nondeterminism"
    assert found.call_site.function == "clock_agent"
    assert found.call_site.line == _line("time")
    assert found.call_site.file == agent.__file__
    entry = report.to_dict()["nondeterminism"][0]
    assert entry["kind"] == "unrecorded_nondeterminism"
    assert entry["call_site"]["line"] == _line("time")
    assert "time.time" in found.describe()


def test_a_name_imported_from_random_is_caught(agent: ModuleType) -> None:
    report = _replayed(agent.random_agent)
    assert [(n.what, n.call_site.line) for n in report.nondeterminism] == [
        ("random.random", _line("random"))
    ]
    assert agent.random is random.random  # rebound back after the replay


def test_library_code_reading_the_clock_is_not_reported(agent: ModuleType) -> None:
    report = _replayed(agent.library_agent)
    assert report.passed
    assert report.nondeterminism == ()


def test_every_kind_of_read_is_caught_also_in_a_thread_the_agent_starts(
    agent: ModuleType,
) -> None:
    report = _replayed(agent.everything_agent)
    assert report.passed, report.to_dict()
    found = {n.what: n.call_site.line for n in report.nondeterminism}
    expected = [
        "datetime.now",
        "datetime.utcnow",
        "date.today",
        "os.environ",
        "os.getenv",
        "uuid.uuid4",
        "os.urandom",
        "secrets.token_hex",
        "time.time_ns",
    ]
    assert found == {what: _line(what) for what in expected}


def test_the_guarded_datetime_classes_build_real_ones(agent: ModuleType) -> None:
    with NondeterminismGuard([PACKAGE]):
        made = agent.datetime.datetime(2020, 1, 2)
        parsed = agent.Datetime.fromisoformat("2020-01-02T03:04:05")
        assert type(made) is datetime.datetime
        assert type(parsed) is datetime.datetime
        assert isinstance(datetime.datetime(2020, 1, 1), agent.Datetime)
        assert not isinstance(datetime.date(2020, 1, 1), agent.Datetime)
        assert agent.datetime.timezone is datetime.timezone
    assert agent.datetime is datetime
    assert agent.Datetime is datetime.datetime


def test_a_call_site_is_reported_once_with_its_count(agent: ModuleType) -> None:
    [found] = _replayed(agent.looping_agent).nondeterminism
    assert (found.call_site.line, found.count) == (_line("loop"), 3)


def test_failure_mode_makes_the_run_fail(agent: ModuleType) -> None:
    report = _replayed(agent.clock_agent, nondeterminism="fail")
    assert not report.passed
    assert report.divergence is None
    assert report.result == "NONDETERMINISTIC"
    assert report.to_dict()["nondeterminism_policy"] == "fail"
    clean = _replayed(agent.library_agent, nondeterminism="fail")
    assert clean.passed


def test_an_unknown_policy_is_refused(agent: ModuleType) -> None:
    with pytest.raises(ValueError, match="use 'warn' or 'fail'"):
        _replayed(agent.clock_agent, nondeterminism="loud")


def test_named_modules_are_watched_too(agent: ModuleType) -> None:
    report = _replayed(agent.library_agent, agent_modules=[LIBRARY])
    assert {n.what for n in report.nondeterminism} == {"time.time", "uuid.uuid4"}
    assert {n.call_site.function for n in report.nondeterminism} == {"stamp"}


def test_the_guard_restores_everything_also_on_error(agent: ModuleType) -> None:
    before = _patched_state()
    names = dict(vars(agent))
    inside: list[Any] = []

    def fail() -> None:
        with NondeterminismGuard([PACKAGE]):
            inside.extend([time.time, agent.Datetime])
            raise RuntimeError("the agent failed")

    with pytest.raises(RuntimeError):
        fail()
    assert inside[0] is not before[0]
    assert inside[1] is not datetime.datetime
    assert _patched_state() == before
    assert dict(vars(agent)) == names


def test_a_failing_agent_is_replayed_and_everything_restored(agent: ModuleType) -> None:
    before = _patched_state()
    report = _replayed(agent.failing_agent)
    assert report.passed, report.to_dict()  # it failed the same way as recorded
    assert [n.call_site.line for n in report.nondeterminism] == [_line("failing")]
    assert _patched_state() == before


def test_overlapping_guards_each_see_their_own_modules(agent: ModuleType) -> None:
    before = _patched_state()
    outer = NondeterminismGuard([PACKAGE])
    inner = NondeterminismGuard([LIBRARY])
    with outer:
        with inner:
            agent.library_agent(_FakeRun(), None)
        agent.random_agent(_FakeRun(), None)
        assert random.random is not before[2]  # the outer guard is still in place
    assert [r.what for r in outer.reads] == ["random.random"]
    assert {r.what for r in inner.reads} == {"uuid.uuid4", "time.time"}
    assert _patched_state() == before


def test_wrappers_held_installed_serve_guard_after_guard(agent: ModuleType) -> None:
    """A batch holds the wrappers installed: each guard entered in it still sees only
    its own reads, the agent's names are its own again between guards, a call outside
    a guard passes through, and everything is restored when the hold ends."""
    before = _patched_state()
    names = dict(vars(agent))
    with NondeterminismGuard.installed():
        held = _patched_state()
        assert held[0] is not before[0]  # time.time is the wrapper
        assert time.time() > 0  # and passes the call through, outside any guard
        reports = [_replayed(agent.clock_agent) for _ in range(3)]
        assert [[n.what for n in r.nondeterminism] for r in reports] == [["time.time"]] * 3
        assert dict(vars(agent)) == names  # rebound back after each replay
        assert _patched_state() == held  # still installed between the guards
    assert _patched_state() == before
    assert dict(vars(agent)) == names


def test_a_guard_outliving_the_hold_keeps_the_wrappers_until_it_exits(
    agent: ModuleType,
) -> None:
    before = _patched_state()
    guard = NondeterminismGuard([PACKAGE])
    hold = NondeterminismGuard.installed()
    hold.__enter__()
    with guard:
        hold.__exit__(None, None, None)
        agent.random_agent(_FakeRun(), None)
        assert random.random is not before[2]
    assert [r.what for r in guard.reads] == ["random.random"]
    assert _patched_state() == before


class _FakeRun:
    def random(self) -> float:
        return 0.5


def test_recording_watches_nothing_by_default(
    agent: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BLACKBOX_RECORD_NONDETERMINISM", raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        agent.record(MemoryRecorder(), agent.clock_agent, RunSnapshot("sbx.1", {}))


def test_recording_in_warn_mode_warns_at_the_agents_line(agent: ModuleType) -> None:
    recorder = MemoryRecorder(nondeterminism="warn")
    before = _patched_state()
    with pytest.warns(NondeterminismWarning, match="time.time") as caught:
        _, output = agent.record(recorder, agent.clock_agent, RunSnapshot("sbx.1", {}))
    assert output == {"late": True, "year": True}
    assert [(Path(w.filename), w.lineno) for w in caught] == [(Path(agent.__file__), _line("time"))]
    assert _patched_state() == before  # the watch ended with the run


def test_an_async_recorder_watches_too(agent: ModuleType) -> None:
    recorder = AsyncMemoryRecorder(nondeterminism="warn")
    with pytest.warns(NondeterminismWarning) as caught:
        asyncio.run(agent.record_async(recorder, RunSnapshot("sbx.1", {})))
    assert [w.lineno for w in caught] == [_line("async")]


def test_recording_in_fail_mode_raises_at_the_read(
    agent: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BLACKBOX_RECORD_NONDETERMINISM", "fail")
    recorder = MemoryRecorder()
    with pytest.raises(UnrecordedNondeterminism, match=r"run\.now\(\)"):
        agent.record(recorder, agent.clock_agent, RunSnapshot("sbx.1", {}))
    [*_, finished] = recorder.events
    assert finished.event_type == "run.finished"  # recorded as the run's failure


def test_recording_watches_the_entrys_package_wherever_record_is_called(
    agent: ModuleType,
) -> None:
    # The test module calls record: the agent's code is the entry's, in another package.
    recorder = MemoryRecorder(nondeterminism="warn")
    with pytest.warns(NondeterminismWarning, match="time.time") as caught:
        recorder.record(agent.clock_agent, RunSnapshot("sbx.1", {}), agent_id="sbx")
    assert [(Path(w.filename), w.lineno) for w in caught] == [(Path(agent.__file__), _line("time"))]
    failing = AsyncMemoryRecorder(nondeterminism="fail")
    with pytest.raises(UnrecordedNondeterminism):
        asyncio.run(failing.record(agent.async_agent, RunSnapshot("sbx.1", {}), agent_id="sbx"))


def test_a_bad_recording_mode_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BLACKBOX_RECORD_NONDETERMINISM", "sometimes")
    with pytest.raises(ValueError, match="BLACKBOX_RECORD_NONDETERMINISM"):
        MemoryRecorder()
