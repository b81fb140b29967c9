"""A run as a tree of spans, from the views' metadata: nested by branch of concurrent
work, named by model, tool or effect, with durations and errors named by what failed;
the waterfall draws the same spans, labelled by name."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from agent_blackbox.console._charts import fitted, waterfall
from agent_blackbox.console._templates import tree_html
from agent_blackbox.console._tree import Span, failures, run_tree
from agent_blackbox.consumers import RunEvent

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


def _event(
    sequence: int, event_type: str, at_ms: float, latency_ms: float | None = None, **attributes: str
) -> RunEvent:
    return RunEvent(
        sequence=sequence,
        event_id=f"e{sequence}",
        event_type=event_type,
        recorded_at=T0 + timedelta(milliseconds=at_ms),
        attributes=attributes,
        latency_ms=latency_ms,
        sealed=False,
        out_of_line=False,
    )


def _run() -> list[RunEvent]:
    """A run that asks a model, fans out two tasks (one of which spawns a third), catches
    a tool's error, and sends a notification."""
    return [
        _event(1, "run.started", 0, code_version="v1"),
        _event(2, "llm.call", 120, 100, model="gpt-test", provider="openai", total_tokens="17"),
        # Completion order differs from start order: branch 2 finished first.
        _event(
            3, "tool.call", 180, 30, tool="get_weather", started="4", branch="2", parent_branch="0"
        ),
        _event(
            4, "llm.call", 200, 60, model="claude-test", started="5", branch="3", parent_branch="1"
        ),
        _event(5, "tool.call", 230, 95, tool="search", started="3", branch="1", parent_branch="0"),
        _event(6, "tool.call", 240, 5, tool="lookup", error="LookupError"),
        _event(7, "clock.read", 241, clock="wall"),
        _event(8, "effect.intent", 250, effect="send_email", idempotency_key="k1"),
        _event(
            9, "effect.receipt", 290, effect="send_email", idempotency_key="k1", status="confirmed"
        ),
        _event(10, "run.finished", 300, status="succeeded"),
    ]


def _names(span: Span) -> list[tuple[int, str]]:
    return [(depth, s.name) for depth, s in span.walk()]


def test_spans_nest_by_branch_and_parent_and_are_named_by_what_they_crossed() -> None:
    tree = run_tree(_run(), name="support-agent")
    assert _names(tree) == [
        (0, "support-agent"),
        (1, "run started"),
        (1, "gpt-test"),
        (1, "branch 1"),  # started (3) before branch 2 (4), though it finished later
        (2, "search"),
        (2, "branch 3"),  # spawned by branch 1
        (3, "claude-test"),
        (1, "branch 2"),
        (2, "get_weather"),
        (1, "lookup"),
        (1, "clock (wall)"),
        (1, "send_email"),
        (2, "send_email"),  # the receipt, under its intent
        (1, "run finished"),
    ]
    assert tree.detail == "succeeded"


def test_durations_run_from_start_to_end() -> None:
    spans = {s.name: s for _, s in run_tree(_run(), name="a").walk() if s.kind != "receipt"}
    assert spans["gpt-test"].duration_ms == 100
    assert spans["a"].duration_ms == 300
    # Branch 1 runs from search's start (135 ms) to its end (230 ms); branch 3 inside it.
    assert spans["branch 1"].duration_ms == 95
    assert spans["branch 3"].start >= spans["branch 1"].start
    assert spans["branch 1"].order == 3  # its first crossing's start number
    # An intent lasts until its receipt came.
    assert spans["send_email"].duration_ms == 40
    assert spans["send_email"].timed
    assert not spans["clock (wall)"].timed


def test_a_caught_tool_error_is_a_tool_error_not_a_failed_llm_call() -> None:
    events = [*_run()[:-1], _event(11, "llm.call", 295, 3, model="m", error="RateLimitError")]
    tree = run_tree(events, name="a")
    spans = {s.name: s for _, s in tree.walk()}
    assert spans["lookup"].error == "tool error: LookupError"
    assert spans["m"].error == "LLM error: RateLimitError"
    assert spans["gpt-test"].error is None
    assert failures(tree) == {"tool error": 1, "LLM error": 1}
    assert tree.detail == "running"  # no run.finished yet


def test_a_failed_run_and_a_failed_effect_are_named_so() -> None:
    events = [
        _event(1, "run.started", 0),
        _event(2, "effect.intent", 10, effect="charge"),
        _event(3, "effect.receipt", 20, effect="charge", status="unknown"),
        _event(4, "run.finished", 30, status="failed", error="TimeoutError"),
    ]
    tree = run_tree(events, name="a")
    assert [s.error for _, s in tree.walk() if s.error] == [
        "effect unknown",
        "run failed: TimeoutError",
    ]


def test_the_waterfall_labels_each_bar_by_its_span_in_tree_order() -> None:
    fall = waterfall(run_tree(_run(), name="a"))
    assert [b.name for b in fall.bars][:6] == [
        "run started",
        "gpt-test",
        "branch 1",
        "search",
        "branch 3",
        "claude-test",
    ]
    search = next(b for b in fall.bars if b.name == "search")
    assert search.sequence == 5
    assert search.indent > fall.bars[0].indent  # nested one level deeper
    assert "tool search" in search.label
    assert "branch 1" in search.label
    branch = next(b for b in fall.bars if b.name == "branch 1")
    assert branch.sequence is None
    assert "branch" in branch.css
    lookup = next(b for b in fall.bars if b.name == "lookup")
    assert "err" in lookup.css
    assert "tool error: LookupError" in lookup.label


def test_a_long_name_is_cut_between_words_never_inside_one() -> None:
    assert fitted("short", 20) == "short"
    assert fitted("send the weekly customer report", 20) == "send the weekly…"
    assert fitted("lookup_customer_records_by_email", 20) == "lookup_customer…"
    assert fitted("x" * 40, 10) == "x" * 9 + "…"  # one part longer than the room


def test_a_branch_lasts_until_the_last_branch_it_spawned_ended() -> None:
    events = [
        _event(1, "run.started", 0),
        _event(2, "tool.call", 100, 50, tool="plan", branch="1", parent_branch="0"),
        _event(3, "tool.call", 400, 100, tool="act", branch="2", parent_branch="1"),
    ]
    tree = run_tree(events, name="a")
    assert _names(tree) == [
        (0, "a"),
        (1, "run started"),
        (1, "branch 1"),
        (2, "plan"),
        (2, "branch 2"),
        (3, "act"),
    ]
    branch = tree.children[1]
    assert (branch.start, branch.end) == (T0 + timedelta(milliseconds=50), events[2].recorded_at)


def test_the_tree_is_written_as_balanced_nested_lists_with_every_name_escaped() -> None:
    hostile = '<img src=x onerror="alert(1)">\u202e'
    events = [*_run()[:5], _event(6, "tool.call", 240, 5, tool=hostile, error=hostile)]
    page = str(tree_html(run_tree(events, name=hostile), "/runs/r"))
    assert "<img" not in page
    assert "&lt;img src=x onerror=&#34;alert(1)&#34;&gt;\\u202e" in page
    assert "\u202e" not in page
    for tag in ("li", "ul", "details"):
        assert page.count(f"<{tag}") == page.count(f"</{tag}>"), tag
    assert page.count("<li") == len(events) + 4  # and the run and its three branches
    assert '<a href="/runs/r/events/5">search</a>' in page
