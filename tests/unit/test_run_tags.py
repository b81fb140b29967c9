"""Run tags: checked when the snapshot is made, carried unsealed on ``run.started``
after redaction, read back by analytics and by a fork."""

from __future__ import annotations

from typing import Any

import pytest

from agent_blackbox.outbox import AgentRun, MemoryRecorder, Redactor, RunSnapshot
from agent_blackbox.replayer._fork import forked_snapshot
from agent_blackbox.schemas import MAX_TAGS, InvalidTag, digest, run_tags, tag_problem


def _agent(run: AgentRun, _: Any) -> str:
    return "done"


def test_tags_ride_on_run_started_and_read_back() -> None:
    recorder = MemoryRecorder()
    tags = {"prompt_version": "v2", "experiment": "greeting-b"}
    recorder.record(_agent, RunSnapshot(code_version="c1", tags=tags), agent_id="a")

    started = recorder.events[0]
    assert started.attributes["tag.prompt_version"] == "v2"
    assert run_tags(started.attributes) == tags
    assert all(not k.startswith("tag.") for e in recorder.events[1:] for k in e.attributes)


def test_a_tag_value_is_redacted_like_any_recorded_text() -> None:
    recorder = MemoryRecorder(redaction=Redactor())
    snapshot = RunSnapshot(code_version="c1", tags={"owner": "ada@example.com"})
    recorder.record(_agent, snapshot, agent_id="a")

    value = recorder.events[0].attributes["tag.owner"]
    assert "ada@example.com" not in value


@pytest.mark.parametrize(
    ("tags", "named"),
    [
        ({"Prompt": "v1"}, "'Prompt'"),
        ({"prompt version": "v1"}, "'prompt version'"),
        ({"p": ""}, "tag p"),
        ({"p": "x" * 129}, "tag p"),
        ({"p": "v1\nforged"}, "control"),
        ({"p": "v1\u202e"}, "control"),
        ({"p": 2}, "must be a string"),
        ({f"t{i}": "v" for i in range(MAX_TAGS + 1)}, f"at most {MAX_TAGS}"),
    ],
)
def test_a_tag_that_is_not_a_label_is_refused_when_the_snapshot_is_made(
    tags: dict[str, Any], named: str
) -> None:
    with pytest.raises(InvalidTag, match=named):
        RunSnapshot(code_version="c1", tags=tags)


def test_a_reader_drops_tags_someone_else_wrote_badly_onto_the_topic() -> None:
    attributes = {"tag.ok": "v1", "tag.BAD": "x", "tag.line": "a\nb", "code_version": "c"}
    assert run_tags(attributes) == {"ok": "v1"}
    assert tag_problem("ok", "v1") is None


def test_a_fork_keeps_the_parent_s_tags_and_can_change_one() -> None:
    parent = RunSnapshot(code_version="c1", tags={"prompt_version": "v1", "team": "x"})
    fork = forked_snapshot(parent, "parent-run", {"tag.prompt_version": "v2"})
    assert fork.tags == {"prompt_version": "v2", "team": "x"}
    assert fork.changes == {"tag.prompt_version": "v2"}


def test_run_started_names_its_prompt_templates_by_id_and_short_digest() -> None:
    recorder = MemoryRecorder()
    templates = {"triage": digest("You triage tickets."), "reply": digest("You reply.")}
    recorder.record(
        _agent, RunSnapshot(code_version="c1", prompt_templates=templates), agent_id="a"
    )

    named = recorder.events[0].attributes["prompt_templates"]
    short = {k: v.removeprefix("sha256:")[:12] for k, v in templates.items()}
    assert named == f"reply@{short['reply']},triage@{short['triage']}"
