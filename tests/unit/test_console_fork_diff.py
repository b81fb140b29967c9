"""Unit tests of the fork diff's line-up of two runs' calls."""

from __future__ import annotations

from agent_blackbox.console._conversation import Exchange, Item, Part, ToolRun, Turn, Withheld
from agent_blackbox.console._fork_diff import align, final_output


def _llm(seq: int, answer: str, model: str = "gpt-4o-mini", prompt: str = "hi") -> Exchange:
    return Exchange(
        sequence=seq,
        provider="openai",
        model=model,
        api="chat completions",
        turns=(Turn("user", (Part("text", prompt),)),),
        answer=(Turn("assistant", (Part("text", answer),)),),
        error=None,
        streamed=None,
        raw_request="{}",
        raw_response="{}",
    )


def _tool(seq: int, name: str, args: str = "{}", result: str = "ok") -> ToolRun:
    return ToolRun(seq, name, Part("json", args), Part("text", result), None, 3.0)


def _pairs(rows: list) -> list[tuple[int | None, int | None, bool]]:
    return [
        (
            None if r.parent is None else r.parent.sequence,
            None if r.fork is None else r.fork.sequence,
            r.differs,
        )
        for r in rows
    ]


def test_same_calls_in_other_sequences_line_up_and_do_not_differ() -> None:
    parent: list[Item] = [_llm(2, "a"), _tool(4, "lookup"), _llm(6, "done")]
    fork: list[Item] = [_llm(3, "a"), _tool(5, "lookup"), _llm(9, "done")]
    assert _pairs(align(parent, fork)) == [(2, 3, False), (4, 5, False), (6, 9, False)]


def test_a_changed_prompt_differs_where_it_changed_only() -> None:
    parent: list[Item] = [_llm(2, "a", prompt="be brief"), _tool(4, "lookup")]
    fork: list[Item] = [_llm(2, "a", prompt="be thorough"), _tool(4, "lookup")]
    assert _pairs(align(parent, fork)) == [(2, 2, True), (4, 4, False)]


def test_a_tool_result_or_argument_change_differs() -> None:
    parent: list[Item] = [_tool(1, "lookup", args='{"q": 1}'), _tool(2, "pay", result="ok")]
    fork: list[Item] = [_tool(1, "lookup", args='{"q": 2}'), _tool(2, "pay", result="refused")]
    assert [r.differs for r in align(parent, fork)] == [True, True]


def test_an_extra_call_leaves_a_gap_not_a_shift() -> None:
    parent: list[Item] = [_llm(1, "a"), _llm(5, "z")]
    fork: list[Item] = [_llm(1, "a"), _tool(3, "search"), _llm(5, "z")]
    assert _pairs(align(parent, fork)) == [(1, 1, False), (None, 3, True), (5, 5, False)]


def test_a_call_the_fork_did_not_make_stands_alone_on_the_parent_side() -> None:
    parent: list[Item] = [_tool(1, "refund"), _llm(2, "x")]
    fork: list[Item] = [_llm(2, "x")]
    assert _pairs(align(parent, fork)) == [(1, None, True), (2, 2, False)]


def test_replaced_blocks_pair_in_order_and_leave_the_rest() -> None:
    parent: list[Item] = [_tool(1, "a"), _tool(2, "b")]
    fork: list[Item] = [_llm(1, "x", model="m1")]
    rows = align(parent, fork)
    assert _pairs(rows) == [(1, 1, True), (2, None, True)]


def test_withheld_bodies_and_empty_runs() -> None:
    assert align([], []) == []
    w: list[Item] = [Withheld(4, "llm.call", "key forgotten")]
    assert _pairs(align(w, w)) == [(4, 4, False)]
    assert _pairs(align(w, [])) == [(4, None, True)]


def test_final_output_is_the_last_llm_answer() -> None:
    items: list[Item] = [_llm(1, "first"), _llm(3, "last"), _tool(5, "log")]
    assert final_output(items)[0].parts[0].text == "last"
    assert final_output([_tool(1, "x")]) == ()
