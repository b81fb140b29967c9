"""The run id rule: what a run id may be, how a refusal reads, and how the console quotes
an id in a link."""

from __future__ import annotations

import uuid

import pytest

from agent_blackbox.console._templates import page_templates, url_quoted
from agent_blackbox.outbox import MemoryRecorder, RunOptions, RunSnapshot
from agent_blackbox.schemas import RUN_ID_RULE, InvalidRunId, check_run_id, is_run_id


@pytest.mark.parametrize(
    "run_id", [str(uuid.uuid4()), "a", "R2", "order-17:retry.2_b", "9" + "x" * 127]
)
def test_ids_of_the_alphabet_are_run_ids(run_id: str) -> None:
    assert check_run_id(run_id) == run_id
    assert RunOptions(agent_id="a", run_id=run_id).run_id == run_id


@pytest.mark.parametrize(
    "run_id",
    ["", ".", "..", "-x", "_x", "a/b", "a b", "a\nb", "é", "a%2F", "x" * 129, "a#b", "a?b"],
)
def test_anything_else_is_refused_naming_the_id_and_the_rule(run_id: str) -> None:
    assert not is_run_id(run_id)
    with pytest.raises(InvalidRunId) as refused:
        RunOptions(agent_id="a", run_id=run_id)
    assert RUN_ID_RULE in str(refused.value)
    assert repr(run_id)[:20] in str(refused.value)
    assert isinstance(refused.value, ValueError)


def test_a_refused_id_records_nothing() -> None:
    recorder = MemoryRecorder()
    with pytest.raises(InvalidRunId):
        recorder.record(lambda run, _: 1, RunSnapshot(code_version="c"), agent_id="a", run_id="..")
    assert list(recorder.events) == []


def test_a_long_refused_id_is_cut_in_the_message() -> None:
    with pytest.raises(InvalidRunId) as refused:
        check_run_id("\x1b" * 1000)
    assert "(1000 characters)" in str(refused.value)
    assert "\x1b" not in str(refused.value)
    assert len(str(refused.value)) < 400


def test_the_console_quotes_an_id_whole_in_links() -> None:
    assert url_quoted("../runs/x y") == "..%2Fruns%2Fx%20y"
    assert url_quoted({"session": "a/b&c"}) == "session=a%2Fb%26c"
    rendered = (
        page_templates()
        .from_string('<a href="/runs/{{ i|urlencode }}">')
        .render(i='"><script>/../')
    )
    assert rendered == '<a href="/runs/%22%3E%3Cscript%3E%2F..%2F">'
