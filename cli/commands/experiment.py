"""``blackbox experiment``: fork recorded runs with a variant, score both sides, compare.

``run`` makes the experiment (and keeps it in the views), ``show`` prints a kept one
again, ``list`` lists them. The console shows the same on ``/experiments``.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import click
from rich.table import Table
from sqlalchemy import Engine

from agent_blackbox.cli._experiment_report import Progress, report
from agent_blackbox.cli._purpose import purpose_option
from agent_blackbox.cli._selection import run_selection, selection_options
from agent_blackbox.cli._wiring import Wiring, wired
from agent_blackbox.consumers import (
    ChosenRun,
    DatasetError,
    PriceTable,
    RunSelection,
    ViewExperiments,
    call_pricing,
    dataset_txn,
    experiment_txn,
    experiments_txn,
    select_runs_txn,
)
from agent_blackbox.outbox.storage import PostgresBlobs
from agent_blackbox.replayer import (
    DEFAULT_EVALUATORS,
    Experimenter,
    ExperimentPlan,
    ExperimentReport,
    ForkVariant,
    KafkaRunSource,
    ReexecuteVariant,
    SelectedRun,
    ToolMode,
    load_entry,
    load_scorer,
    run_experiment,
)
from agent_blackbox.replayer._access import opening, recording_keys
from agent_blackbox.replayer._evaluators import BUILT_IN
from agent_blackbox.replayer._experiment import Variant
from agent_blackbox.replayer._fork import TOOL_MODES
from agent_blackbox.replayer._reexecute import APIS, load_request_mapper
from agent_blackbox.schemas import BlackboxError, permission_refused, safe_console, safe_text

__all__ = ["experiment_group"]

_EVALUATORS_HELP = (
    "An evaluator: module:function (called as f(run, baseline) -> {score: number}), or "
    "one of the built-in ones: "
    + "; ".join(f"{name} ({scores})" for name, scores in BUILT_IN.items())
    + f". Repeatable. Default: {', '.join(DEFAULT_EVALUATORS)}."
)


@click.group("experiment")
def experiment_group() -> None:
    """Experiments on recorded runs: fork each with a variant, score both, compare."""


@experiment_group.command("run")
@click.argument("run_ids", nargs=-1, metavar="[RUN_ID]...")
@click.option("--dataset", default=None, help="The runs of this dataset (blackbox dataset).")
@selection_options
@click.option(
    "--agent",
    "factory_path",
    default=None,
    help="Fork factory module:function, called as factory(snapshot, base_url=, api_key=) "
    "(the agent's code under test).",
)
@click.option(
    "--set", "pairs", multiple=True, help="A change: model=…, prompt=…, flag.X=…, tag.X=…"
)
@click.option(
    "--base-url",
    "base_urls",
    multiple=True,
    metavar="[API=]URL",
    help="The model endpoint the variant calls (with --reexecute, one per API as "
    "openai=URL anthropic=URL when the runs called both).",
)
@click.option(
    "--api-key-env",
    default="OPENAI_API_KEY",
    show_default=True,
    help="Environment variable holding the endpoint's key (never recorded).",
)
@click.option(
    "--tools",
    type=click.Choice(TOOL_MODES),
    default="recorded-then-live",
    show_default=True,
    help="How the forks' tool calls are answered (see blackbox fork).",
)
@click.option(
    "--effects",
    type=click.Choice(["sandbox", "refuse"]),
    default="sandbox",
    show_default=True,
    help="sandbox: effects confirmed and written down, never sent; refuse: every one fails.",
)
@click.option(
    "--forks-in-memory", is_flag=True, help="Record the forks in memory, not as runs of their own."
)
@click.option(
    "--reexecute",
    is_flag=True,
    help="The variant re-sends each run's recorded LLM requests to --base-url instead of "
    "running the agent (a model or provider compared on the same prompts).",
)
@click.option(
    "--provider",
    "api",
    type=click.Choice(APIS),
    default=None,
    help="With --reexecute: the one API the endpoint speaks.",
)
@click.option(
    "--request-mapper",
    "mapper_path",
    default=None,
    help="With --reexecute: module:function through which every recorded request goes "
    "before it is re-sent (another model or wording; the endpoint's API for calls "
    "recorded with the other one).",
)
@click.option("--evaluator", "specs", multiple=True, metavar="SPEC", help=_EVALUATORS_HELP)
@click.option(
    "--tolerance",
    "tolerance_pairs",
    multiple=True,
    metavar="SCORE=X",
    help="How much worse a run's variant may score on SCORE before it counts as a "
    "regression (default 0: any worse).",
)
@click.option(
    "--confidence",
    type=click.FloatRange(0.5, 0.999),
    default=0.95,
    show_default=True,
    help="Confidence level of the intervals.",
)
@click.option(
    "--fail-on-regression", is_flag=True, help="Exit 1 when a run's variant regressed on a score."
)
@click.option("--name", default=None, help="A name for the experiment (default: its changes).")
@click.option(
    "--workers",
    type=click.IntRange(1, 32),
    default=4,
    show_default=True,
    help="Runs forked at once.",
)
@purpose_option(required=True)
@click.option("--json", "as_json", is_flag=True, help="The summary and every run's scores as JSON.")
def run_command(
    run_ids: tuple[str, ...],
    dataset: str | None,
    specs: tuple[str, ...],
    tolerance_pairs: tuple[str, ...],
    confidence: float,
    fail_on_regression: bool,
    name: str | None,
    workers: int,
    purpose: str,
    as_json: bool,
    **options: Any,
) -> None:
    """Fork the chosen recorded runs with a variant and score the recorded run and its
    fork with each evaluator; keep every run's scores and show, per score, each side's
    mean and the paired difference with confidence intervals, and the runs that
    regressed.

    \b
    The runs: RUN_IDs, --dataset NAME, or the filters (finished runs, newest first).
    The variant: --agent FACTORY with --set changes and --base-url (a fork of each run,
      tools recorded-then-live, effects sandboxed), or --reexecute --base-url URL
      (the recorded LLM requests re-sent, each through --request-mapper if given).

    \b
    Exit status:
      0  every run was forked and scored
      1  with --fail-on-regression: a run's variant scored worse than the run
      2  could not run: bad options, nothing chosen, a run that could not be forked or
         scored, the database or Kafka away
    """
    asked = _VariantOptions(**{f: options.pop(f) for f in _VariantOptions.__dataclass_fields__})
    selection = _selection(run_ids, dataset, options)
    tolerances = {
        k: _number(v, "--tolerance") for k, v in _pairs(tolerance_pairs, "--tolerance").items()
    }
    err = safe_console(stderr=True)
    wiring = wired()
    engine = wiring.engine()
    try:
        variant = asked.variant()
        scorers = tuple(load_scorer(spec) for spec in specs or DEFAULT_EVALUATORS)
        chosen, described = _chosen(engine, dataset, selection)
        plan = ExperimentPlan(
            experiment_id=str(uuid.uuid4()),
            name=name or _default_name(variant),
            runs=tuple(SelectedRun(r.run_id, r.tenant_id) for r in chosen),
            selection=described,
            variant=variant.describe(),
            evaluators=tuple(s.name for s in scorers),
            confidence=confidence,
            tolerances=tolerances,
            dataset=dataset,
        )
        experimenter = _experimenter(wiring, engine, variant, scorers, purpose)
        with Progress(err, len(chosen)) as advance:
            store = ViewExperiments(engine)
            found = run_experiment(plan, experimenter, store, workers=workers, done=advance)
    except BlackboxError as exc:
        if permission_refused(exc) is not None:
            raise  # the top-level command names the role to run as
        err.print(f"[red]error:[/] {safe_text(str(exc))}")
        sys.exit(2)
    finally:
        engine.dispose()
    report(found, as_json=as_json, fail_on_regression=fail_on_regression)
    sys.exit(found.exit_code(fail_on_regression=fail_on_regression))


def _selection(
    run_ids: tuple[str, ...], dataset: str | None, filters: dict[str, Any]
) -> RunSelection | None:
    """The runs' filters (None for a dataset).

    Raises:
        click.UsageError: a dataset with run ids or filters too.
    """
    if dataset is None:
        return run_selection(run_ids, **filters)
    if run_ids or any(v not in (None, (), False, 100) for v in filters.values()):
        raise click.UsageError("give --dataset, RUN_IDs or filters, not several")
    return None


def _pairs(pairs: tuple[str, ...], option: str) -> dict[str, str]:
    found = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not key=value", param_hint=option)
        found[key] = value
    return found


def _number(raw: str, option: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise click.BadParameter(f"{raw!r} is not a number", param_hint=option) from None
    if not 0 <= value < float("inf"):
        raise click.BadParameter(f"{raw!r}: give a number from 0", param_hint=option)
    return value


@dataclass(frozen=True, slots=True)
class _VariantOptions:
    """The options that describe the variant."""

    factory_path: str | None
    pairs: tuple[str, ...]
    base_urls: tuple[str, ...]
    api_key_env: str
    tools: ToolMode
    effects: str
    forks_in_memory: bool
    reexecute: bool
    api: str | None
    mapper_path: str | None

    def variant(self) -> Variant:
        """The variant the options describe.

        Raises:
            click.UsageError: options of the other kind of variant, or a missing one.
            BlackboxError: the factory or mapper cannot be loaded.
        """
        if not self.base_urls:
            raise click.UsageError("give --base-url: the model endpoint the variant calls")
        changes = _pairs(self.pairs, "--set")
        key = os.environ.get(self.api_key_env, "not-set")
        if self.reexecute:
            if self.factory_path or changes:
                raise click.UsageError(
                    "--reexecute re-sends recorded requests: it takes no --agent or --set"
                )
            path = self.mapper_path
            mapper = None if path is None else load_request_mapper(path)
            keys = dict.fromkeys(APIS, key)
            return ReexecuteVariant(_by_api(self.base_urls), keys, self.api, mapper, path)
        if self.api or self.mapper_path:
            raise click.UsageError("--provider and --request-mapper go with --reexecute")
        if self.factory_path is None:
            raise click.UsageError(
                "give --agent FACTORY (the fork factory of the code under test), or --reexecute"
            )
        if len(self.base_urls) != 1:
            raise click.UsageError("a fork calls one endpoint: give --base-url once")
        return ForkVariant(
            factory=load_entry(self.factory_path),
            factory_name=self.factory_path,
            base_url=self.base_urls[0],
            api_key=key,
            changes=changes,
            tools=self.tools,
            effects="refuse" if self.effects == "refuse" else "sandbox",
            in_memory=self.forks_in_memory,
        )


def _by_api(values: tuple[str, ...]) -> str | dict[str, str]:
    named = {}
    for value in values:
        api, sep, rest = value.partition("=")
        if sep and api in APIS:
            named[api] = rest
        elif len(values) == 1:
            return value
        else:
            raise click.BadParameter(
                "give one URL, or one per API as openai=URL anthropic=URL", param_hint="--base-url"
            )
    return named


def _chosen(
    engine: Engine, dataset: str | None, selection: RunSelection | None
) -> tuple[list[ChosenRun], dict[str, Any]]:
    """The runs, and how they were chosen in words (for the experiment's record).

    Raises:
        DatasetError: no such dataset, a run named that the views do not hold, or
            nothing chosen.
    """
    with engine.connect() as conn:
        if dataset is not None:
            found = dataset_txn(conn, dataset)
            if found is None:
                raise DatasetError(
                    f"no dataset {dataset} this login can see; blackbox dataset list shows them"
                )
            chosen = select_runs_txn(conn, RunSelection(run_ids=found.run_ids))
            return chosen, {"dataset": dataset, **found.selection}
        assert selection is not None
        chosen = select_runs_txn(conn, selection)
    if not chosen:
        raise DatasetError(
            "no finished run matches these filters in the views this login can see; check "
            "the filters, and that the view consumer has caught up (blackbox consume)"
        )
    return chosen, selection.to_dict()


def _experimenter(
    wiring: Wiring, engine: Engine, variant: Variant, scorers: Sequence[Any], purpose: str
) -> Experimenter:
    settings = wiring.settings
    index = wiring.read_side.run_index(engine)

    def events(run_id: str) -> list[Any]:
        return list(KafkaRunSource(settings, index, run_id))

    return Experimenter(
        variant=variant,
        scorers=tuple(scorers),
        events=events,
        reading=opening(lambda: engine, purpose=purpose),
        pricing=call_pricing(PriceTable.load(settings.price_file)),
        blobs=PostgresBlobs(engine),
        engine=engine,
        settings=settings,
        keys=recording_keys(),
    )


def _default_name(variant: Variant) -> str:
    described = variant.describe()
    if described["kind"] == "reexecute":
        return f"re-sent to {described['base_url']}"
    shown = [
        f"new {key}" if value.startswith("sha256:") else f"{key}={value}"
        for key, value in described["changes"].items()
    ]
    return ", ".join(shown) or f"fork with {described['agent']}"


@experiment_group.command("show")
@click.argument("experiment_id")
@click.option("--json", "as_json", is_flag=True, help="The summary and every run's scores as JSON.")
@click.option("--fail-on-regression", is_flag=True, help="Exit 1 when a run regressed.")
def show_command(experiment_id: str, as_json: bool, fail_on_regression: bool) -> None:
    """Show a kept experiment again: its summary, regressions and, with --json, every
    run's scores. Exit 0; 1 with --fail-on-regression when a run regressed; 2 when there
    is no such experiment."""
    found = _kept(experiment_id)
    report(found, as_json=as_json, fail_on_regression=fail_on_regression)
    sys.exit(1 if fail_on_regression and found.regressions else 0)


def _kept(experiment_id: str) -> ExperimentReport:
    err = safe_console(stderr=True)
    with wired().connection() as conn:
        kept = experiment_txn(conn, experiment_id)
    if kept is None:
        err.print(f"[red]error:[/] no experiment {safe_text(experiment_id)} this login can see")
        sys.exit(2)
    return ExperimentReport.kept(kept.experiment, kept.results)


@experiment_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per experiment.")
def list_command(as_json: bool) -> None:
    """List the experiments, newest first."""
    with wired().connection() as conn:
        found = experiments_txn(conn)
    if as_json:
        for experiment, scored in found:
            click.echo(json.dumps(_listed(experiment, scored), default=str))
        return
    table = Table(title="Experiments")
    table.add_column("id", no_wrap=True, min_width=36)  # to copy into `experiment show`
    for column in ("name", "created", "status", "runs", "evaluators"):
        table.add_column(column)
    for experiment, scored in found:
        table.add_row(
            safe_text(experiment.experiment_id),
            safe_text(experiment.name),
            experiment.created_at.strftime("%Y-%m-%d %H:%M"),
            experiment.status,
            f"{scored}/{experiment.planned}",
            safe_text(", ".join(experiment.evaluators)),
        )
    safe_console().print(table)


def _listed(experiment: Any, scored: int) -> Mapping[str, Any]:
    return {
        "experiment_id": experiment.experiment_id,
        "name": experiment.name,
        "created_at": experiment.created_at.isoformat(),
        "status": experiment.status,
        "runs": experiment.planned,
        "results": scored,
        "dataset": experiment.dataset,
        "variant": experiment.variant,
        "evaluators": list(experiment.evaluators),
    }
