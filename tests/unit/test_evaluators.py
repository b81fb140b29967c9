"""Evaluators: the built-in ones, what a user's may return, and how they are named."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from agent_blackbox.replayer import EvaluatorError, LlmCall, Outcome, ToolCall, evaluator
from agent_blackbox.replayer._evaluators import (
    Scorer,
    cost,
    equality,
    json_schema,
    latency,
    load_scorer,
    score_run,
    success,
    tool_calls,
)

TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def _answer(text: str | None = None, calls: list[tuple[str, str]] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [
            {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}}
            for i, (n, a) in enumerate(calls)
        ]
    return {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}


def _call(response: dict[str, Any] | None, **given: Any) -> LlmCall:
    return LlmCall("openai", "m", {"messages": [], "tools": [TOOL]}, response, **given)


def _run(output: Any = None, **given: Any) -> Outcome:
    return Outcome(run_id="r", status=given.pop("status", "succeeded"), output=output, **given)


def test_equality_by_output_fields_and_llm_answers() -> None:
    baseline = _run({"a": 1, "b": {"c": [1, 2]}, "at": "10:00"}, llm_calls=(_call(_answer("x")),))
    same = _run({"a": 1, "b": {"c": [1, 2]}, "at": "11:00"}, llm_calls=(_call(_answer("x")),))
    other = _run({"a": 2, "b": {"c": [1, 2, 3]}, "at": "10:00"}, llm_calls=(_call(_answer("y")),))
    plain, ignoring = equality(), equality(["$.at"])
    assert plain(baseline, baseline) == {
        "output_equal": True,
        "output_fields_equal": 1.0,
        "llm_answers_equal": 1.0,
    }
    assert plain(same, baseline)["output_equal"] is False
    assert plain(same, baseline)["output_fields_equal"] == pytest.approx(3 / 4)
    assert ignoring(same, baseline)["output_equal"] is True
    # $.a differs, and $.b.c's length: of the leaves a, b.c[0..2], at, four differ.
    found = ignoring(other, baseline)
    assert found["output_fields_equal"] == pytest.approx(0.0)
    assert found["llm_answers_equal"] == 0.0
    reexecuted = _run(has_output=False, llm_calls=(_call(_answer("x")),))
    assert ignoring(reexecuted, baseline) == {
        "output_equal": None,
        "output_fields_equal": None,
        "llm_answers_equal": 1.0,
    }


def test_json_schema_validity(tmp_path: Path) -> None:
    check = json_schema({"type": "object", "required": ["priority"]})
    assert check(_run({"priority": "high"}), _run()) == {"output_schema_valid": True}
    assert check(_run(None, status="failed"), _run()) == {"output_schema_valid": False}
    with pytest.raises(EvaluatorError, match="not valid"):
        json_schema({"type": "no-such-type"})
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"type": "object"}))
    assert load_scorer(f"json-schema={path}").name == f"json-schema={path}"
    with pytest.raises(EvaluatorError, match="cannot read"):
        load_scorer(f"json-schema={tmp_path / 'missing.json'}")


def test_tool_call_validity() -> None:
    asked = _call(_answer(calls=[("lookup", '{"city": "Oslo"}'), ("lookup", '{"town": 1}')]))
    undeclared = _call(_answer(calls=[("other", "{}")]))
    run = _run(
        llm_calls=(asked, undeclared),
        tool_calls=(ToolCall("lookup", {}), ToolCall("lookup", {}, error="KeyError: x")),
    )
    assert tool_calls(run, run) == {"tool_args_valid": 0.5, "tools_ok": 0.5}
    assert tool_calls(_run(), _run()) == {"tool_args_valid": None, "tools_ok": None}


def test_cost_latency_and_success() -> None:
    priced = _run(
        llm_calls=(
            _call(_answer("a"), cost_usd=Decimal("0.25"), latency_ms=10.0),
            _call(None, error="RateLimitError: slow down", latency_ms=5.0),
        ),
        duration_ms=40.0,
    )
    assert cost(priced, priced) == {"cost_usd": 0.25}  # the failed call is not billed
    unpriced = _run(llm_calls=(_call(_answer("a")),))
    assert cost(unpriced, unpriced) == {"cost_usd": None}
    assert cost(_run(), _run()) == {"cost_usd": 0.0}
    assert latency(priced, priced) == {"duration_ms": 40.0, "llm_latency_ms": 15.0}
    assert success(_run(status="failed"), _run()) == {"succeeded": False}
    assert Scorer("cost", cost).lower_is_better == {"cost_usd"}
    assert Scorer("success", success).lower_is_better == frozenset()


@evaluator(lower_is_better=("words",))
def words(run: Outcome, baseline: Outcome) -> dict[str, float]:
    return {"words": len(str(run.output).split())}


def test_a_scorer_scores_both_sides_and_refuses_what_is_not_a_score() -> None:
    baseline, variant = _run("one two"), _run("one two three")
    [pair] = Scorer("mine:words", words).pairs(baseline, variant)
    assert (pair.score, pair.baseline, pair.variant, pair.lower_is_better) == ("words", 2, 3, True)
    for returned, problem in (
        ([1.0], "returned a list"),
        ({"": 1.0}, "named a score"),
        ({"x": "high"}, "as a str"),
        ({"x": float("nan")}, "not finite"),
    ):
        with pytest.raises(EvaluatorError, match=problem):
            Scorer("bad", lambda run, base, r=returned: r).pairs(baseline, variant)


def test_one_evaluator_failing_leaves_the_others_scores() -> None:
    def broken(run: Outcome, baseline: Outcome) -> dict[str, float]:
        raise RuntimeError("the judge is away")

    def again(run: Outcome, baseline: Outcome) -> dict[str, float]:
        return {"succeeded": 0.5}

    scored = score_run(
        [Scorer("success", success), Scorer("judge", broken), Scorer("again", again)],
        _run(),
        _run(status="failed"),
    )
    assert [(p.score, p.baseline, p.variant) for p in scored.pairs] == [("succeeded", 1.0, 0.0)]
    assert scored.errors[0] == "evaluator judge raised RuntimeError: the judge is away"
    assert "given by both success and again" in scored.errors[1]


def test_specs_name_built_in_and_own_evaluators() -> None:
    assert load_scorer("cost").fn is cost
    assert load_scorer("equality=$.at,$.b").name == "equality=$.at,$.b"
    own = load_scorer("tests.unit.test_evaluators:words")
    assert own.fn is words
    assert own.lower_is_better == {"words"}
    for spec, problem in (
        ("nope", "is not an evaluator"),
        ("equality=at", "JSON paths"),
        ("cost=1", "is not an evaluator"),
        ("no_such_module_x:f", "cannot import"),
        ("tests.unit.test_evaluators:nothing", "has no function"),
    ):
        with pytest.raises(EvaluatorError, match=problem):
            load_scorer(spec)
