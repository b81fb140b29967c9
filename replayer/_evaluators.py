"""Evaluators: functions that score what a run did.

An evaluator is a plain function ``evaluator(run, baseline) -> {name: score}``: it is
called twice for every recorded run of an experiment, once as ``(baseline, baseline)``
for the recorded run's scores and once as ``(variant, baseline)`` for the variant's, so a
score that compares with the recorded run (output equality, a judge's preference) gives
the recorded run its reference value and the variant its own. A score is a number
(``True`` is 1), or None where it does not apply (no output to check, no price known).
Higher is better unless the evaluator names the score in ``lower_is_better`` (see
:func:`evaluator`). An LLM-as-judge is one more such function.

The built-in ones are named on the command line by a word (:data:`BUILT_IN`); your own
by ``module:function``.
"""

from __future__ import annotations

import importlib
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from agent_blackbox.replayer._fork_diff import changes_between
from agent_blackbox.replayer._outcomes import LlmCall, Outcome
from agent_blackbox.schemas import BlackboxError, declared_tool_schemas

Scores = Mapping[str, float | int | bool | None]
"""What an evaluator returns: score name → a number, or None where it does not apply."""

SCORE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,62}")
_LOWER = "lower_is_better"


class Evaluator(Protocol):
    """``evaluator(run, baseline) -> {name: score}``; see the module."""

    def __call__(self, run: Outcome, baseline: Outcome, /) -> Scores: ...


class EvaluatorError(BlackboxError):
    """An evaluator cannot be loaded, or what it returned is not a set of scores."""


E = TypeVar("E", bound=Callable[..., Any])


def evaluator(*, lower_is_better: Iterable[str] = ()) -> Callable[[E], E]:
    """Mark a function as an evaluator whose scores named in ``lower_is_better`` improve
    as they fall (a cost, a latency, a count of mistakes); every other score it returns
    improves as it rises. A plain function without it is an evaluator too."""
    names = frozenset(lower_is_better)

    def mark(fn: E) -> E:
        setattr(fn, _LOWER, names)  # read back by Scorer.lower_is_better
        return fn

    return mark


@dataclass(frozen=True, slots=True)
class ScorePair:
    """One score of one run: the recorded run's and the variant's."""

    score: str
    evaluator: str
    lower_is_better: bool
    baseline: float | None
    variant: float | None


@dataclass(frozen=True, slots=True)
class Scorer:
    """An evaluator under the name it was given by (``equality``, ``mymod:judge``)."""

    name: str
    fn: Evaluator

    @property
    def lower_is_better(self) -> frozenset[str]:
        return frozenset(getattr(self.fn, _LOWER, frozenset()))

    def pairs(self, baseline: Outcome, variant: Outcome) -> list[ScorePair]:
        """The recorded run's and the variant's scores, by name.

        Raises:
            EvaluatorError: the evaluator raised, or returned something that is not
                scores (named, with what was wrong).
        """
        before = self._scores(baseline, baseline)
        after = self._scores(variant, baseline)
        lower = self.lower_is_better
        return [
            ScorePair(name, self.name, name in lower, before.get(name), after.get(name))
            for name in sorted(before.keys() | after.keys())
        ]

    def _scores(self, run: Outcome, baseline: Outcome) -> dict[str, float | None]:
        try:
            given = self.fn(run, baseline)
        except Exception as exc:  # a user's evaluator: anything can fail
            raise EvaluatorError(
                f"evaluator {self.name} raised {type(exc).__name__}: {exc}"
            ) from exc
        if not isinstance(given, Mapping):
            raise EvaluatorError(
                f"evaluator {self.name} returned a {type(given).__name__}; return a mapping "
                "of score name to number, e.g. {'exact': 1.0}"
            )
        return {_name(self.name, k): _number(self.name, k, v) for k, v in given.items()}


def _name(evaluator: str, name: object) -> str:
    if not isinstance(name, str) or SCORE_NAME.fullmatch(name) is None:
        raise EvaluatorError(
            f"evaluator {evaluator} named a score {name!r}: use 1-63 letters, digits, "
            "'_', '.' or '-', starting with a letter"
        )
    return name


def _number(evaluator: str, name: str, value: object) -> float | None:
    if value is None:
        return None
    if not isinstance(value, (int, float)):
        raise EvaluatorError(
            f"evaluator {evaluator} scored {name} as a {type(value).__name__}; a score is "
            "a number, or None where it does not apply"
        )
    number = float(value)
    if not math.isfinite(number):
        raise EvaluatorError(f"evaluator {evaluator} scored {name} as {number}: not finite")
    return number


def score_run(scorers: Sequence[Scorer], baseline: Outcome, variant: Outcome) -> ScoredRun:
    """Every scorer's scores of one run; an evaluator that fails is named in
    :attr:`ScoredRun.errors` and the others' scores are kept."""
    pairs: list[ScorePair] = []
    errors: list[str] = []
    failed: list[str] = []
    owners: dict[str, str] = {}
    for scorer in scorers:
        try:
            found = scorer.pairs(baseline, variant)
        except EvaluatorError as exc:
            errors.append(str(exc))
            failed.append(scorer.name)
            continue
        for pair in found:
            if pair.score in owners:
                errors.append(
                    f"score {pair.score} is given by both {owners[pair.score]} and "
                    f"{scorer.name}; kept the first"
                )
                failed.append(scorer.name)
                continue
            owners[pair.score] = scorer.name
            pairs.append(pair)  # kept even unscored: "no run had it" is worth saying
    return ScoredRun(tuple(pairs), tuple(errors), tuple(dict.fromkeys(failed)))


@dataclass(frozen=True, slots=True)
class ScoredRun:
    pairs: tuple[ScorePair, ...]
    errors: tuple[str, ...] = ()
    """What went wrong, in full (an evaluator's own message may quote what it read)."""
    failed: tuple[str, ...] = ()
    """The evaluators that failed, by name."""


# The built-in evaluators ---------------------------------------------------------------


@evaluator()
def success(run: Outcome, baseline: Outcome) -> Scores:
    """``succeeded``: 1 when the run ended ``succeeded``, else 0."""
    return {"succeeded": run.status == "succeeded"}


def equality(ignore: Sequence[str] = ()) -> Evaluator:
    """Output equality with the recorded run, leaving out the JSON paths in ``ignore``
    (``$.received_at``: that value and all under it).

    Scores: ``output_equal`` (1 when the whole output is the same), ``output_fields_equal``
    (the share of leaf values, of both outputs, that are the same at the same path) and
    ``llm_answers_equal`` (the share of LLM calls, by position, whose answer has the same
    text, finish reason and tool calls). The output scores are None for a variant that
    has no output (``--reexecute``), the last one when neither made an LLM call.
    """
    left_out = tuple(ignore)

    def scores(run: Outcome, baseline: Outcome) -> Scores:
        answers = _answers_equal(run.llm_calls, baseline.llm_calls)
        if not (run.has_output and baseline.has_output):
            return {"output_equal": None, "output_fields_equal": None, "llm_answers_equal": answers}
        paths = _leaves(run.output) | _leaves(baseline.output)
        paths = {p for p in paths if not _ignored(p, left_out)}
        changed = {
            c.path
            for c in changes_between(baseline.output, run.output)
            if not _ignored(c.path, left_out)
        }
        differing = {p for p in paths if any(_under(p, c) or _under(c, p) for c in changed)}
        return {
            "output_equal": not changed,
            "output_fields_equal": 1.0 if not paths else 1 - len(differing) / len(paths),
            "llm_answers_equal": answers,
        }

    return evaluator()(scores)


def _leaves(value: Any, path: str = "$") -> set[str]:
    if isinstance(value, Mapping) and value:
        return {p for k, v in value.items() for p in _leaves(v, f"{path}.{k}")}
    if isinstance(value, list) and value:
        return {p for i, v in enumerate(value) for p in _leaves(v, f"{path}[{i}]")}
    return {path}


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith((prefix + ".", prefix + "["))


def _ignored(path: str, ignore: Sequence[str]) -> bool:
    return any(_under(path, prefix) for prefix in ignore)


def _answers_equal(run: Sequence[LlmCall], baseline: Sequence[LlmCall]) -> float | None:
    count = max(len(run), len(baseline))
    if not count:
        return None
    same = sum(
        1
        for a, b in zip(run, baseline, strict=False)
        if a.error is None and b.error is None and _content(a) == _content(b)
    )
    return same / count


def _content(call: LlmCall) -> dict[str, Any]:
    answer = call.answer
    return {k: answer[k] for k in ("text", "finish_reason", "tool_calls")}


def json_schema(schema: Mapping[str, Any]) -> Evaluator:
    """``output_schema_valid``: 1 when the run's output is valid under the JSON Schema
    ``schema``, else 0 (None for a variant that has no output).

    Raises:
        EvaluatorError: ``schema`` is not a valid JSON Schema.
    """
    from jsonschema.exceptions import SchemaError
    from jsonschema.validators import validator_for

    kind = validator_for(dict(schema))
    try:
        kind.check_schema(dict(schema))
    except SchemaError as exc:
        raise EvaluatorError(f"the JSON Schema is not valid: {exc.message}") from exc
    check = kind(dict(schema))

    def scores(run: Outcome, baseline: Outcome) -> Scores:
        if not run.has_output:
            return {"output_schema_valid": None}
        return {"output_schema_valid": bool(check.is_valid(run.output))}

    return evaluator()(scores)


@evaluator()
def tool_calls(run: Outcome, baseline: Outcome) -> Scores:
    """Tool-call validity. ``tool_args_valid``: the share of the tool calls its LLM asked
    for whose arguments are JSON valid under the schema the request declared for that
    tool (None when it asked for none with a declared schema). ``tools_ok``: the share
    of its tool calls that did not raise (None when it called no tool)."""
    checked = [v for call in run.llm_calls for v in _argument_verdicts(call)]
    tools = run.tool_calls
    return {
        "tool_args_valid": sum(checked) / len(checked) if checked else None,
        "tools_ok": sum(t.error is None for t in tools) / len(tools) if tools else None,
    }


def _argument_verdicts(call: LlmCall) -> Iterable[bool]:
    from jsonschema.exceptions import SchemaError
    from jsonschema.validators import validator_for

    declared = declared_tool_schemas((call.request or {}).get("tools"))
    for choice in call.answer["tool_calls"]:
        for asked in choice:
            schema = declared.get(asked.get("name"))
            if schema is None:
                continue
            try:
                kind = validator_for(dict(schema))
                kind.check_schema(dict(schema))
            except SchemaError:
                continue  # a schema of the agent's that is itself broken: no verdict
            yield bool(kind(dict(schema)).is_valid(asked.get("arguments")))


@evaluator(lower_is_better=("cost_usd",))
def cost(run: Outcome, baseline: Outcome) -> Scores:
    """``cost_usd``: what the run's LLM calls cost by the price table (None when a call
    that did not fail has no known price)."""
    spent = run.cost_usd
    return {"cost_usd": None if spent is None else float(spent)}


@evaluator(lower_is_better=("duration_ms", "llm_latency_ms"))
def latency(run: Outcome, baseline: Outcome) -> Scores:
    """``duration_ms``: the run from its start to its end; ``llm_latency_ms``: its LLM
    calls' latencies summed (None when it made none)."""
    return {"duration_ms": run.duration_ms, "llm_latency_ms": run.llm_latency_ms}


BUILT_IN: Mapping[str, str] = {
    "success": "succeeded: 1 when the run ended succeeded",
    "equality[=PATH,...]": "output_equal, output_fields_equal, llm_answers_equal (PATHs left out)",
    "json-schema=FILE": "output_schema_valid: the output is valid under the JSON Schema in FILE",
    "tool-calls": "tool_args_valid, tools_ok",
    "cost": "cost_usd (lower is better)",
    "latency": "duration_ms, llm_latency_ms (lower is better)",
}
"""The built-in evaluators by the word that names them, and the scores each gives."""

DEFAULT_EVALUATORS = ("success", "equality", "tool-calls", "cost", "latency")


def load_scorer(spec: str) -> Scorer:
    """The evaluator ``spec`` names: a built-in word (see :data:`BUILT_IN`), with its
    argument after ``=`` where it takes one, or ``module:function``.

    Raises:
        EvaluatorError: no such built-in, a missing or bad argument, a module that does
            not import, a name that is not a function.
    """
    if ":" in spec:
        return Scorer(spec, _imported(spec))
    word, sep, argument = spec.partition("=")
    plain: dict[str, Evaluator] = {
        "success": success,
        "tool-calls": tool_calls,
        "cost": cost,
        "latency": latency,
    }
    if word in plain and not sep:
        return Scorer(word, plain[word])
    if word == "equality":
        paths = [p.strip() for p in argument.split(",") if p.strip()]
        if any(not p.startswith("$") for p in paths):
            raise EvaluatorError(f"{spec!r}: give JSON paths such as $.received_at,$.id")
        return Scorer(spec, equality(paths))
    if word == "json-schema" and argument:
        return Scorer(spec, json_schema(_schema_file(Path(argument))))
    names = ", ".join(BUILT_IN)
    raise EvaluatorError(
        f"{spec!r} is not an evaluator: give one of {names}, or module:function for your own"
    )


def _imported(spec: str) -> Evaluator:
    module_name, _, attribute = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # the user's module ran its own code: anything can fail
        raise EvaluatorError(
            f"cannot import {module_name!r} for evaluator {spec!r}: {type(exc).__name__}: "
            f"{exc}; check that it is importable (PYTHONPATH)"
        ) from exc
    found = getattr(module, attribute, None)
    if found is None or not callable(found):
        raise EvaluatorError(
            f"module {module_name!r} has no function {attribute!r}; an evaluator is "
            "called as evaluator(run, baseline) -> {name: score}"
        )
    return found  # type: ignore[no-any-return]


def _schema_file(path: Path) -> Mapping[str, Any]:
    try:
        schema = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise EvaluatorError(f"cannot read the JSON Schema {path}: {exc.strerror}") from exc
    except ValueError as exc:
        raise EvaluatorError(f"the JSON Schema {path} is not JSON: {exc}") from exc
    if not isinstance(schema, Mapping):
        raise EvaluatorError(f"the JSON Schema {path} is not a JSON object")
    return schema
