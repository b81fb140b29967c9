"""The recorder's front: who a run belongs to (RunOptions), and the errors of misuse."""

from __future__ import annotations

import os

import pytest

from agent_blackbox.keystore import DataKeyStore, KeystoreError, LocalKeyProvider
from agent_blackbox.outbox import MemoryRecorder, RunNotActive, RunOptions, RunSnapshot

SNAPSHOT = RunSnapshot(code_version="api/1", input={"n": 1})


def test_keywords_beside_options_replace_their_fields() -> None:
    recorder = MemoryRecorder()
    options = RunOptions(agent_id="a", tenant_id="t1", subject_ids=("s-1",))
    run = recorder.start_run(SNAPSHOT, options, tenant_id="t2")
    [started] = recorder.events
    assert (started.agent_id, started.tenant_id, started.subject_ids) == ("a", "t2", ("s-1",))
    assert run.core.identity.tenant_id == "t2"


def test_keywords_alone_still_describe_a_run() -> None:
    recorder = MemoryRecorder()
    run, output = recorder.record(
        lambda r, i: r.call("double", lambda n: 2 * n, i["n"]),
        SNAPSHOT,
        agent_id="a",
        subject_ids=["s-1"],  # type: ignore[arg-type]  # a list is taken as a tuple
    )
    assert output == 2
    assert {e.subject_ids for e in recorder.events} == {("s-1",)}
    assert run.last_sequence == 3


def test_a_run_without_an_agent_is_refused_before_anything_is_recorded() -> None:
    recorder = MemoryRecorder()
    with pytest.raises(TypeError, match="agent_id"):
        recorder.start_run(SNAPSHOT)
    with pytest.raises(ValueError, match="agent_id must be a non-empty string"):
        recorder.start_run(SNAPSHOT, agent_id="")
    with pytest.raises(ValueError, match="subject_ids is a tuple"):
        RunOptions(agent_id="a", subject_ids="customer-1")  # type: ignore[arg-type]
    assert recorder.events == []


def test_a_memory_recorder_refuses_a_run_id_it_has_and_keys_it_cannot_keep() -> None:
    recorder = MemoryRecorder()
    recorder.start_run(SNAPSHOT, agent_id="a", run_id="r-1")
    with pytest.raises(RunNotActive, match="r-1 exists already"):
        recorder.start_run(SNAPSHOT, agent_id="a", run_id="r-1")
    assert len(recorder.events) == 1
    keys = DataKeyStore(LocalKeyProvider({"v1": os.urandom(32)}))
    with pytest.raises(KeystoreError, match="keeps no data keys"):
        MemoryRecorder(keys=keys)


@pytest.mark.parametrize(
    ("name", "where"),
    [
        ("Relay", "agent_blackbox.outbox.relay"),
        ("ensure_topic", "agent_blackbox.broker"),
        ("capture_openai", "agent_blackbox.outbox.integrations.openai"),
        ("ReplayRun", "agent_blackbox.replayer"),
    ],
)
def test_a_name_that_moved_out_of_the_agents_package_says_where_it_is(
    name: str, where: str
) -> None:
    with pytest.raises(ImportError, match=where):
        exec(f"from agent_blackbox.outbox import {name}")
