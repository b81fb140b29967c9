"""An evaluator of a user's own, named on the command line as ``module:function``."""

from __future__ import annotations

from agent_blackbox.replayer import Outcome, Scores, evaluator


@evaluator(lower_is_better=("summary_words",))
def brevity(run: Outcome, baseline: Outcome) -> Scores:
    """How many words the triage summary has (fewer is better); none without output."""
    output = run.output if isinstance(run.output, dict) else {}
    summary = output.get("summary")
    return {"summary_words": None if summary is None else len(str(summary).split())}


def broken(run: Outcome, baseline: Outcome) -> Scores:
    """An evaluator that fails on every run."""
    raise RuntimeError("the judge is away")
